"""Training drafters for a target, in JAX: the layer beside `bench` and `testing` (it reads the
public API and the heads, and nothing below it reads it). Needs optax (`pip install
specjax[train]`).

    from specjax.train import eagle3
    sequences = eagle3.continuations(target, prompts, max_new_tokens=64)
    data = eagle3.features(target, sequences)
    drafter = eagle3.train(target, data, eagle3.TrainConfig(steps=2000), checkpoint="run/")
    specjax.save_drafter(drafter, "out", format="eagle")     # the EAGLE repo's layout

    from specjax.train import medusa                          # Medusa-1 heads, same features
    heads = medusa.train(target, data, medusa.TrainConfig(steps=500), checkpoint="run2/")
    specjax.save_heads(heads, "out2", format="medusa")       # FasterDecoding's layout

`python -m specjax train data | eagle3 | medusa` runs the same stages from the command line
(docs/training.md).
"""
