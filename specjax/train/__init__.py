"""Training drafters for a target, in JAX: the layer beside `bench` and `testing` (it reads the
public API and the heads, and nothing below it reads it). Needs optax (`pip install
specjax[train]`).

    from specjax.train import eagle3
    sequences = eagle3.continuations(target, prompts, max_new_tokens=64)
    data = eagle3.features(target, sequences)
    drafter = eagle3.train(target, data, eagle3.TrainConfig(steps=2000), checkpoint="run/")
    specjax.save_drafter(drafter, "out", format="eagle")     # the EAGLE repo's layout

`python -m specjax train eagle3` runs the same stages from the command line (docs/training.md).
"""
