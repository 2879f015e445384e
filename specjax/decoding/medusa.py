"""Medusa decoding (Cai et al. 2024): the target's own extra heads fill a token tree.

One step, for every row at once, in Algorithm 2's Steps (docs/walkthrough.md):

  Step 1 (draft): the heads read the target's hidden state h at the position before the row's
     last token x (the state whose LM head produced x) and give K distributions: head d's is
     the draft p_d for the token d places after x. The tree's rank-r child at depth d is the
     r-th candidate of head d: its r-th most likely token ("top"), or draws from p_d
     ("distinct": without replacement, "iid": independent), made afresh at each node of depth
     d - 1 with that node's own randomness.
  Step 2 (score): the target scores x and every node in one call with tree attention
     (`decoding.trees`).
  Steps 3 and 4 (accept or resample, bonus): `rejection.verify_tree` accepts a path and draws
     one more token with the rule exact for the candidate scheme; the same call's hidden state
     at the last accepted node is the h of the next step, so the heads cost no extra target
     work.

Why it is exact: the heads' distributions depend only on the target's past (the accepted
tokens), never on the verification's coins, and each node's children are drawn from the p it
is verified with, so `verify_tree`'s Theorem 1 argument applies unchanged: a path-independent
p is still a draft distribution (Medusa's heads ignore the tokens between h and the node;
that costs acceptance, not exactness).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import trees
from specjax.decoding.config import Drafting
from specjax.decoding.extras import any_nan, steered, steering
from specjax.decoding.prefill import prefill
from specjax.decoding.state import DecodeState, drafting_keys, last_tokens
from specjax.heads import medusa
from specjax.sampling.logits import probs_from_logits


@dataclasses.dataclass(frozen=True, kw_only=True)
class MedusaSpec(Drafting):
    """Medusa's heads (`specjax.heads.medusa`) over their tree."""
    name: ClassVar[str] = "medusa"
    heads_config: medusa.HeadsConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Carry:
    """What Medusa carries from step to step (`DecodeState.carry`)."""
    hidden: jax.Array    # [B, D] the target's final hidden state before each row's last token


def init(spec, weights, prompts, prompt_length):
    """Prefill: the target reads the prompts [B, P], keeping the hidden state the heads read
    first. Returns its cache and the `Carry`."""
    prefilled = prefill(weights.target, spec.target_config, prompts, prompt_length,
                        spec.buffer_length, hidden="last", shards=spec.data_shards)
    return prefilled.cache, Carry(prefilled.hidden)


def layout(spec, rows, cache) -> Carry:
    """The carry's layout on a device mesh (`decoding.sharding`)."""
    return Carry(rows)


def candidate_tree(spec, heads, state: DecodeState, keys) -> trees.Candidates:
    """Step 1 (draft), with one key per depth `keys` [B, D]: the heads' `trees.Candidates` (the draft distribution at each node [B, n, V],
    None for "top" candidates), from the hidden state the last call left."""
    tree, scheme, vocab = spec.method.tree, spec.method.candidates, spec.vocab_size
    b, n, width = state.length.shape[0], tree.size + 1, tree.max_width
    sub_logits = medusa.subset_logits(heads, state.carry.hidden, tree.max_depth,
                                      kernels=spec.target_config.kernels)         # [B, D, S]

    def expand(d, tokens, valid, probs):
        # Head d's logits are the same under every parent; a row with controls or a
        # constraint steers them at each parent given its path (`trees.steered_subset`).
        parents = tree.level(d - 1)
        size = parents.stop - parents.start
        paths = trees.drafted_before(tree, tokens)[:, parents.start:parents.stop]  # [B, P, D]
        if scheme == "top":
            def steered_top():
                level = jnp.broadcast_to(sub_logits[:, d - 1][:, None],
                                         (b, size, sub_logits.shape[-1]))           # [B, P, S]
                here = trees.steered_subset(spec, state, heads["ids"], level, paths)
                return heads["ids"][lax.top_k(here, width)[1]]                 # [B, P, W]
            def free_top():            # the same candidates under every parent
                best = lax.top_k(sub_logits[:, d - 1], width)[1]                  # [B, W]
                return jnp.broadcast_to(heads["ids"][best][:, None], (b, size, width))
            cand = lax.cond(steering(state), steered_top, free_top)
            return cand, jnp.ones(cand.shape, bool), probs
        logits = medusa.full_logits(heads, sub_logits[:, d - 1], vocab)         # [B, V]
        logits = jnp.broadcast_to(logits[:, None], (b, size, vocab))            # [B, P, V]
        def steered_probs():
            here = steered(spec, state, logits, paths)
            return here, probs_from_logits(here, state.settings.sampling)
        def free_probs():              # one distribution, the same under every parent
            p = probs_from_logits(logits[:, 0], state.settings.sampling)
            return logits, jnp.broadcast_to(p[:, None], logits.shape)
        logits, p = lax.cond(steering(state), steered_probs, free_probs)
        probs = probs.at[:, parents.start:parents.stop].set(p)
        cand, filled = jax.vmap(spec.rules.candidates, in_axes=(None, 0, 0, 0, None))(
            scheme, keys[:, d - 1], logits, p, width)                     # [B, P, W]
        return cand, filled, probs

    probs = None if scheme == "top" else jnp.zeros((b, n, vocab), jnp.float32)
    tokens, valid, probs = trees.fill(tree, last_tokens(state, 1)[0][:, 0], expand, probs)
    return trees.Candidates(tokens, valid, probs, trees.SCHEMES[scheme], tree,
                            any_nan(state.carry.hidden))


def step(spec, weights, state: DecodeState) -> DecodeState:
    hidden = state.carry.hidden
    keys = drafting_keys(spec, state, spec.method.tree.max_depth)
    # Step 1 (draft): the heads' candidates, from the hidden state the last call left.
    candidates = candidate_tree(spec, weights.heads, state, keys.draft)
    # Steps 2 to 4 (score, accept or resample, bonus): one target call over the tree, the walk,
    # then commit (`trees.step`); the same
    # call's state at the last accepted node is the next step's hidden state. Finished rows
    # keep theirs.
    active = ~state.done
    state, verified = trees.step(spec, weights, state, candidates, keys.verify)
    new_hidden = jnp.take_along_axis(verified.features, verified.n_accepted[:, None, None],
                                     axis=1)[:, 0]
    return state.replace(carry=Carry(jnp.where(active[:, None], new_hidden, hidden)))
