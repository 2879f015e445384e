"""--init for an EAGLE run (`specjax.train.eagle3.train(init=)`): a drafter trained on the
target, checked to be of the kind, shape and draft vocabulary the run trains, whose weights
replace a fresh start's."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.heads import eagle
from specjax.io.sidecar import check_target
from specjax.model.transformer import Model
from specjax.train.state import TrainError


def check_init(init: eagle.Drafter, dc: eagle.DrafterConfig, target: Model) -> None:
    """`init` must be a drafter trained on `target`, of the kind, shape and draft vocabulary
    size of a fresh start of this run (`dc`). Its layer's other settings (RoPE, norm epsilon)
    are its own, and kept."""
    if not isinstance(init, eagle.Drafter):
        raise TrainError(f"init must be an EAGLE drafter from specjax.load, got "
                         f"{type(init).__name__}")
    try:
        check_target(init, target)
    except ValueError as e:
        raise TrainError(str(e)) from None
    if init.config.subset_size != dc.subset_size and dc.kind == "eagle3":
        raise TrainError(f"{init.name} drafts over {init.config.subset_size} ids; this run's "
                         f"draft_vocab is {dc.subset_size}")
    shape = ("d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff")
    mine = {f.name: getattr(init.config, f.name) for f in dataclasses.fields(dc)
            if f.name != "layer"} | {f: getattr(init.config.layer, f) for f in shape}
    run = {f.name: getattr(dc, f.name) for f in dataclasses.fields(dc)
           if f.name != "layer"} | {f: getattr(dc.layer, f) for f in shape}
    differ = [f for f in run if mine[f] != run[f]]
    if differ:
        shown = ", ".join(f"{f} {mine[f]!r} (this run: {run[f]!r})" for f in differ[:3])
        raise TrainError(f"{init.name} is not the drafter this run trains: {shown}")


def init_weights(init: eagle.Drafter, trainable):
    """`init`'s weights, in float32, in place of a fresh start's (`trainable`)."""
    if set(init.params) != set(trainable):
        raise TrainError(f"{init.name} holds {sorted(init.params)}; this run trains "
                         f"{sorted(trainable)}")
    weights = {k: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), init.params[k])
               for k in trainable}
    if jax.tree.map(jnp.shape, weights) != jax.tree.map(jnp.shape, trainable):
        raise TrainError(f"{init.name}'s weights differ in shape from this run's")
    return weights
