"""Training drafters for a target, in JAX: the layer beside `bench` and `testing` (it reads the
public API and the heads, and nothing below it reads it). Needs optax (`pip install
specjax[train]`).

    from specjax.train import data, draft, eagle3, medusa
    sequences = eagle3.continuations(target, prompts, max_new_tokens=64)
    states = eagle3.features(target, sequences)                # the taps and final states
    drafter = eagle3.train(target, states, eagle3.TrainConfig(steps=2000), checkpoint="run/")
    specjax.io.eagle.save_drafter(drafter, "out", format="eagle")   # the EAGLE repo's layout

    eagle1 = eagle3.train(target, states, eagle3.TrainConfig(kind="eagle1"))   # EAGLE-1/2
    heads = medusa.train(target, states, medusa.TrainConfig(steps=500))         # Medusa-1
    specjax.io.medusa.save_heads(heads, "out2", format="medusa")    # FasterDecoding's layout
    small = draft.train(target, states, draft.TrainConfig(steps=500))           # a draft model
    specjax.io.checkpoint.save(small, "out3")                          # a LlamaForCausalLM

`data` writes and reads resumable shards of continuations (`data.import_shards` reads the
shipped drafter's `data/eagle2`), `prompts` and `stdlib` make the built-in prompt sets, and
`state` holds what every trainer shares: checkpoints that resume bit for bit, the progress bar,
data parallelism on a mesh. `python -m specjax train data | features | eagle3 | eagle | medusa
| draft` runs the same stages from the command line (docs/training.md).
"""
