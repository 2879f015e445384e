"""The loss an EAGLE drafter trains on, and one optimizer step (`specjax.train.eagle3.train`).

The loss. Pair s of a sequence is (g_s, x_s): the drafter's feature input and token s, in slot s
of its own cache, attending to the pairs before it exactly as in decoding
(`specjax.api.drafters.drafter_log_probs` computes the same first pass; a published drafter's
slot 0 is read only by itself, `KVCache.first`). Its output predicts x_{s+1}, scored by the
cross-entropy of its logits against the target's distribution at s restricted to the draft
vocabulary and renormalised (soft labels, as EAGLE-3 and SpecForge train), on the positions
whose next token the target generated.

EAGLE-1/2 (`TrainConfig(kind="eagle1")`, `train eagle`): the same passes over the same pairs,
with g_s the target's final-normed state f_{s-1} and the target's own LM head, frozen; the
output at s is a predicted feature, so the loss is EAGLE-1's: the SmoothL1 distance of out_s
to f_s plus a tenth of the cross-entropy (the EAGLE repo's weights).

Training-time test (EAGLE-3's answer to the drafter feeding on its own outputs when it drafts
more than one token). Pass 0 reads the target's features, g_s = fc(taps_{s-1}) (zeros at s = 0).
Pass i > 0 reads the previous pass's outputs, g_s = out_{s-1}, and is weighted decay^i. This is
stricter than drafting, where only the chain's own slots hold the drafter's outputs and the
context holds the target's features (the EAGLE repo builds a mask for that); it needs no mask
beyond the causal one, and gradients flow through the fed-back outputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.heads import eagle
from specjax.model.cache import KVCache
from specjax.train.state import optimizer

# EAGLE-1's loss (Li et al. 2024, and the EAGLE repo's weights): the features' SmoothL1
# regression, plus a tenth of the tokens' cross-entropy.
CLASSIFICATION_WEIGHT = 0.1


def loss(trainable, frozen, batch, config: eagle.DrafterConfig, unroll: int, decay: float):
    """The weighted cross-entropy of the training-time-test passes (module docstring), and each
    pass's [loss, top-1 agreement with the target] for the log."""
    # EAGLE-3 trains its own head; EAGLE-1/2 reads the target's, frozen.
    weights = {**trainable, "proj": trainable.get("lm_head", frozen["head"])}
    tokens, mask = batch["tokens"], batch["mask"]
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    soft = jax.nn.softmax(jnp.einsum("BTD,SD->BTS", batch["final"], frozen["head"]), axis=-1)
    g = eagle.from_target(weights, config, batch["tapped"])
    g = jnp.concatenate([jnp.zeros_like(g[:, :1]), g[:, :-1]], axis=1)      # g_s = f_{s-1}
    if "noise" in batch:                # EAGLE-1's: on the target's features, not slot 0's zeros
        g = g.at[:, 1:].add(batch["noise"][:, 1:])
    count = jnp.maximum(jnp.sum(mask), 1.0)
    total, parts = 0.0, []
    for i in range(unroll):
        cache = KVCache.init(config.layer, b, t, first=config.first_slot)
        out, _ = eagle.draft_features(weights, config, frozen["embed"], g, tokens, positions,
                                      cache)
        logits = eagle.draft_logits(weights, config, out)
        ce = -jnp.sum(jnp.sum(soft * jax.nn.log_softmax(logits), -1) * mask) / count
        agree = jnp.sum((jnp.argmax(logits, -1) == jnp.argmax(soft, -1)) * mask) / count
        if config.kind == "eagle3":
            total = total + decay ** i * ce
        else:                           # out_s predicts the target's feature f_s itself
            error = jnp.abs(out - batch["final"])
            smooth_l1 = jnp.mean(jnp.where(error < 1.0, 0.5 * error ** 2, error - 0.5), -1)
            regression = jnp.sum(smooth_l1 * mask) / count
            total = total + decay ** i * (regression + CLASSIFICATION_WEIGHT * ce)
        parts.append(jnp.stack([ce, agree]))
        g = jnp.concatenate([g[:, :1], out[:, :-1]], axis=1)                 # g_s = out_{s-1}
    return total, jnp.stack(parts)


@functools.partial(jax.jit, static_argnums=(0, 1))
def step(dc: eagle.DrafterConfig, config, trainable, opt_state, batch, frozen):
    """One optimizer step under `config` (an `eagle3.TrainConfig`; one program per drafter shape, settings and batch shape: runs that
    share them, as a resumed one and its original, share it)."""
    (_, parts), grads = jax.value_and_grad(loss, has_aux=True)(
        trainable, frozen, batch, dc, config.unroll, config.decay)
    updates, opt_state = optimizer(config).update(grads, opt_state, trainable)
    return jax.tree.map(jnp.add, trainable, updates), opt_state, parts
