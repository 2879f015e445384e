"""DFlash decoding (arXiv 2602.06036): a block drafter proposes a chain in one call.

The drafter (`specjax.heads.dflash`) keeps a KV cache of the context: slot s holds the keys and
values of the target's fused features at position s. Its slots line up with the target's.

One step, for every row at once, in Algorithm 2's Steps (docs/walkthrough.md):

  Step 1 (draft): one drafter call reads the context the last step committed (the target's tapped
     states at the m = accepted + 1 positions it verified, `Carry.features` and
     `Carry.pending`; written to the drafter's cache) and the block: the row's last token
     x_{L-1} at slot L - 1 and `block_size - 1` mask tokens after it. Block position j's
     logits give the draft of position L - 1 + j, for every j at once. Each draft is the argmax
     ("top" candidates: greedy rows) or a draw from its own position's distribution p_j
     ("iid": sampling rows), given the row's sampling settings. A row with penalties, a bias
     or a constraint steers position j's logits by its drafts before j (`steered_drafts`:
     the positions are then drawn in turn, from the same one drafter call).
  Steps 2 to 4 (score, accept or resample, bonus): the first k drafts are a chain (a token
     tree of one child per node), which one target call scores and `rejection.verify_tree`
     walks with the rule exact for how they were drawn (`trees.step`): a draw from p_j is
     accepted with probability min(1, q_j / p_j), and on a rejection the next token comes
     from the residual.
  Then commit, and keep the target's tapped states along the accepted path: the next step's
     context.

Why it is exact: the drafts depend only on committed tokens, the target's states at committed
positions and the step's drafting key, never on the verification's coins, and each draft's
p_j is the law it was drawn from given all of that (the drafts of one block are drawn
independently of each other, which the chain rule allows: a proposal may be any law fixed
before the draw; a steered position's law is fixed given the drafts before it, which the
chain rule allows as well). So Theorem 1 holds for the chain as it does for a draft model's.

The prefill writes the prompt's context (all positions before its last token) to the drafter's
cache in one call, so a step's context window is at most k + 1 positions wide; entries of the
window past a row's real context are written, then overwritten by the block before anything
reads them (the window starts at L - 1 - pending, and pending <= k + 1 <= block_size).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import trees
from specjax.decoding.config import Drafting
from specjax.decoding.extras import any_nan, pad_vocab, steered, steering
from specjax.decoding.prefill import prefill
from specjax.decoding.state import DecodeState, drafting_keys
from specjax.heads import dflash
from specjax.model.cache import KVCache
from specjax.sampling.logits import probs_from_logits


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFlashSpec(Drafting):
    """A DFlash block drafter (`specjax.heads.dflash`): k drafts of one block, or a tree."""
    name: ClassVar[str] = "dflash"
    dflash_config: dflash.DFlashConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Carry:
    """What DFlash carries from step to step (`DecodeState.carry`)."""
    draft_cache: KVCache    # the drafter's: slot s holds the context's keys and values at s
    features: jax.Array     # [B, k + 1, n D] the target's tapped states not read yet
    pending: jax.Array      # [B] how many of them there are (the first `pending` entries)


def init(spec, weights, prompts, prompt_length):
    """Prefill: the target's cache and tapped states, then the drafter's context for every
    prompt position before the last (the first step feeds the last token in the block)."""
    config = spec.method.dflash_config
    prefilled = prefill(weights.target, spec.target_config, prompts, prompt_length,
                        spec.buffer_length, hidden="all", shards=spec.data_shards,
                        taps=config.taps)
    features = prefilled.hidden                          # [B, P, D'] the states it reads
    b, p = prompts.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    cache = dflash.context_kv(weights.drafter, config, features, positions,
                              KVCache.init(config.layer, b, spec.buffer_length), prefill=True)
    width = spec.method.k + 1
    carry = Carry(cache, jnp.zeros((b, width, features.shape[-1]), features.dtype),
                  jnp.zeros_like(prompt_length))
    return prefilled.cache, carry


def layout(spec, rows, cache) -> Carry:
    """The carry's layout on a device mesh (`decoding.sharding`): the drafter's cache whole on
    each device of a row block (its weights are replicated)."""
    return Carry(cache(spec.method.dflash_config.layer, False, 0), rows, rows)


def draft(spec, weights, state: DecodeState, keys):
    """Step 1 (draft): the block's drafts, from `keys` ([B], or [B, k] one per position by
    position: `state.drafting_keys`). Returns the chain's `Candidates` (node 0 the row's last
    token, nodes 1..k the first k drafts) and the drafter's cache."""
    config, carry = spec.method.dflash_config, state.carry
    b, width = carry.features.shape[:2]
    block_size, k = config.block_size, spec.method.k
    rows = jnp.arange(b)
    root = state.length - 1                                                      # [B]
    context_slots = (root - carry.pending)[:, None] + jnp.arange(width, dtype=jnp.int32)
    block_slots = root[:, None] + jnp.arange(block_size, dtype=jnp.int32)
    block = jnp.full((b, block_size), config.mask_token_id, jnp.int32)
    block = block.at[:, 0].set(state.tokens[rows, root])
    states, cache = dflash.draft_block(weights.drafter, config, weights.target["embed"],
                                       carry.features, context_slots, block, block_slots,
                                       carry.draft_cache)
    logits = dflash.draft_logits(config, weights.target, spec.target_config,
                                 states[:, 1:k + 1])                             # [B, k, V]
    logits = pad_vocab(logits, spec.vocab_size)
    nan = any_nan(logits)
    if spec.method.candidates == "top":
        drafts = lax.cond(steering(state), lambda: steered_drafts(spec, state, logits, keys)[0],
                          lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32))
        probs = None
    else:
        def free():
            p = probs_from_logits(logits, state.settings.sampling)              # [B, k, V]
            # One candidate per position (its tokens; a width of 1 is always filled).
            cand = jax.vmap(spec.rules.candidates, in_axes=(None, 0, 0, 0, None))(
                spec.method.candidates, keys, logits, p, 1)[0]                          # [B, k, 1]
            return cand[..., 0].astype(jnp.int32), p
        drafts, p = lax.cond(steering(state), lambda: steered_drafts(spec, state, logits, keys),
                             free)
        probs = jnp.concatenate([p, jnp.zeros_like(p[:, :1])], axis=1)          # [B, k + 1, V]
    tokens = jnp.concatenate([block[:, :1], drafts], axis=1)                    # [B, k + 1]
    candidates = trees.Candidates(tokens, jnp.ones(tokens.shape, bool), probs,
                                  trees.SCHEMES[spec.method.candidates], spec.method.tree, nan)
    return candidates, cache


def steered_drafts(spec, state: DecodeState, logits, keys):
    """The block's drafts [B, k] under each row's controls and automaton: position j's logits
    are steered given the drafts before it (`extras.steered`), so the positions are drawn in
    turn (from key j of the row's key), each from its steered law p_j [B, k, V], which the
    verification reads. A sampled p_j is zero for "top" candidates (the argmax)."""
    # Position j's key: the position's own (by position), or j folded into the row's.
    position_key = ((lambda keys, j: keys[:, j]) if spec.rules.by_position else
                    (lambda keys, j: jax.vmap(jax.random.fold_in, (0, None))(keys, j)))
    b, k, vocab = logits.shape

    def position(j, carry):
        drafts, probs = carry
        drafted = jnp.where(jnp.arange(k) < j, drafts, -1)[:, None, :]           # [B, 1, k]
        here = steered(spec, state, lax.dynamic_slice_in_dim(logits, j, 1, 1), drafted)
        if spec.method.candidates == "top":
            return drafts.at[:, j].set(jnp.argmax(here[:, 0], -1).astype(jnp.int32)), probs
        p = probs_from_logits(here, state.settings.sampling)                    # [B, 1, V]
        cand = jax.vmap(spec.rules.candidates, in_axes=(None, 0, 0, 0, None))(
            spec.method.candidates, position_key(keys, j), here, p, 1)[0]
        return (drafts.at[:, j].set(cand[:, 0, 0].astype(jnp.int32)),
                lax.dynamic_update_slice_in_dim(probs, p, j, 1))

    return lax.fori_loop(0, k, position, (jnp.zeros((b, k), jnp.int32),
                                          jnp.zeros((b, k, vocab), jnp.float32)))


def step(spec, weights, state: DecodeState) -> DecodeState:
    keys = drafting_keys(spec, state, spec.method.k, draft="one")
    candidates, draft_cache = draft(spec, weights, state, keys.draft)
    active = ~state.done
    state, verified = trees.step(spec, weights, state, candidates, keys.verify, draft_calls=1,
                                 taps=spec.method.dflash_config.taps)
    old = state.carry
    return state.replace(carry=Carry(
        draft_cache, jnp.where(active[:, None, None], verified.features, old.features),
        jnp.where(active, verified.n_accepted + 1, old.pending)))
