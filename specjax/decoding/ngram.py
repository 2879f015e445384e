"""N-gram (prompt-lookup) decoding, exact under sampling as well as greedy.

Lookup policy (per row, on the whole sequence so far, prompt and generated tokens alike): for
n = max_n, max_n - 1, .., min_n, take the row's last n tokens and search for their most recent
earlier occurrence, one that starts before the suffix itself does. The first n that matches
wins, and the draft is the (up to) K tokens that followed that occurrence. A row with no match,
or one shorter than n + 1 tokens, drafts nothing at that step and the target emits one token.

Verification is the same `rejection.verify` as speculative sampling: a lookup is a
deterministic draft, that is a one-hot draft distribution p. Token x is then accepted with
probability q(x), and after a rejection the next token comes from q with x removed and the rest
renormalised. So the output is distributed exactly as the target's, at any temperature; at
temperature 0 it is the target's greedy output. (The reference implementations of prompt
lookup are greedy-only.) Positions past a row's lookup get p = 0 and are never accepted, so the
token after the last real draft is drawn from q itself.

With a token tree (`spec.method.tree`), several earlier occurrences of the suffix are kept, most recent
first for each n from the longest, and their continuations are merged into a trie laid on the
static tree: the rank-r child of a node is the r-th distinct token that follows the node's path
among the continuations agreeing with it (`lookup_tree`). Lookups that disagree then fill
sibling branches instead of being thrown away, and every node is a deterministic candidate.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.decoding import config, lookahead, trace, trees
from specjax.decoding.prefill import prefill
from specjax.decoding.speculative import score_and_verify
from specjax.decoding.state import DecodeState, commit, drafting_keys


@dataclasses.dataclass(frozen=True, kw_only=True)
class NGramSpec(config.Drafting):
    """Prompt lookup: the longest suffix of max_ngram down to min_ngram tokens that recurs."""
    name: ClassVar[str] = "ngram"
    max_ngram: int = 3
    min_ngram: int = 1
    lookahead: config.Lookahead = config.Lookahead()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Carry:
    """What n-gram decoding carries from step to step (`DecodeState.carry`): a lookup needs
    nothing but the token buffer, so only a schedule's state."""
    lookahead: jax.Array | None    # [B] the heuristic schedule's draft lengths, else None


def init(spec, weights, prompts, prompt_length):
    """Prefill: the target reads the prompts [B, P]. Returns its cache and the `Carry`."""
    cache = prefill(weights.target, spec.target_config, prompts, prompt_length,
                    spec.buffer_length, shards=spec.data_shards).cache
    return cache, Carry(lookahead.initial_lengths(spec, prompts.shape[0]))


def layout(spec, rows, cache) -> Carry:
    """The carry's layout on a device mesh (`decoding.sharding`)."""
    return Carry(rows if spec.method.lookahead.schedule == "heuristic" else None)


def lookup(tokens, length, k: int, max_n: int, min_n: int):
    """Draft tokens for one row by prompt lookup.

    Args:
      tokens: [M] the row's token buffer; only tokens[:length] are real.
      length: [] the row's length.
    Returns:
      draft [K] int32 (garbage past `count`) and count [] int32 in 0..K.
    """
    m = tokens.shape[0]
    starts = jnp.arange(m, dtype=jnp.int32)
    found = jnp.zeros((), bool)
    continuation = jnp.zeros((), jnp.int32)
    for n in range(max_n, min_n - 1, -1):        # longest n-gram first
        suffix = lax.dynamic_slice(tokens, (jnp.maximum(length - n, 0),), (n,))
        match = jnp.ones((m,), bool)
        for i in range(n):                          # match[j]: tokens[j:j+n] == suffix
            match = match & (jnp.roll(tokens, -i) == suffix[i])
        # Strictly earlier than the suffix (j < length - n), so at least one token follows.
        match = match & (starts < length - n)
        hit = match.any() & ~found
        latest = m - 1 - jnp.argmax(match[::-1])    # the most recent occurrence
        continuation = jnp.where(hit, latest + n, continuation)
        found = found | hit
    count = jnp.where(found, jnp.minimum(k, length - continuation), 0)
    return lax.dynamic_slice(tokens, (continuation,), (k,)), count.astype(jnp.int32)


def step(spec, weights, state: DecodeState) -> DecodeState:
    """One step for every row: the chain below, or a token tree (`tree_step`)."""
    if spec.method.tree is not None:
        return tree_step(spec, weights, state)
    k, vocab, lengths = spec.method.k, spec.vocab_size, state.carry.lookahead
    # Step 1 (draft): a lookup; a one-hot p makes it a deterministic draft.
    draft_tokens, count = jax.vmap(lookup, in_axes=(0, 0, None, None, None))(
        state.tokens, state.length, k, spec.method.max_ngram, spec.method.min_ngram)          # [B, K], [B]
    # The heuristic schedule caps a row's draft at its current length (`lookahead`).
    count = jnp.minimum(count, lookahead.draft_limit(spec, state, lengths))
    drafted = jnp.arange(k) < count[:, None]                                     # [B, K]
    draft_probs = jax.nn.one_hot(draft_tokens, vocab) * drafted[..., None]       # [B, K, V]
    # Steps 2 to 4 (score, accept or resample, bonus): as speculative sampling's.
    keys = drafting_keys(spec, state, k, draft="none").verify
    if spec.method.lookahead.schedule == "constant":
        verified = score_and_verify(spec, weights, state, draft_tokens, draft_probs,
                                    keys, num_drafted=count)
    else:
        verified = lookahead.ragged_score_and_verify(
            score_and_verify, spec, weights, state, draft_tokens, draft_probs, keys,
            jnp.where(state.done, 0, count))
    state = trace.record(spec, state, draft_tokens, count, verified)
    state = state.replace(carry=Carry(lookahead.update(spec, state, lengths, count,
                                                       verified.n_accepted)))
    # Then commit.
    return commit(spec, state, verified.new, verified.n_accepted, verified.cache, drafted=count,
                  nan=verified.nan, scores=verified.scores)


def lookup_tree(tokens, length, tree, max_n: int, min_n: int):
    """The candidates of a token tree for one row by prompt lookup.

    Args:
      tokens: [M] the row's token buffer; only tokens[:length] are real.
      length: [] the row's length.
      tree: the static `Tree`.
    Returns:
      node tokens [n] int32 (node 0 is the row's last token) and filled [n] bool.
    """
    m, depth, n = tokens.shape[0], tree.max_depth, tree.size + 1
    per_n = max(1, int(np.sum(tree.children[:, 0] < 0)))   # the tree's leaves: at most that
    starts = jnp.arange(m, dtype=jnp.int32)                 # many distinct continuations
    begin, found = [], []
    for ngram in range(max_n, min_n - 1, -1):               # longest n-gram first
        suffix = lax.dynamic_slice(tokens, (jnp.maximum(length - ngram, 0),), (ngram,))
        match = starts < length - ngram                     # at least one token follows
        for i in range(ngram):
            match = match & (jnp.roll(tokens, -i) == suffix[i])
        latest, where = lax.top_k(jnp.where(match, starts, -1), per_n)   # most recent first
        begin.append(where + ngram)
        found.append(latest >= 0)
    begin, found = jnp.concatenate(begin), jnp.concatenate(found)         # [C], in priority
    span = begin[:, None] + jnp.arange(depth, dtype=jnp.int32)            # [C, D]
    continuation = tokens[jnp.minimum(span, m - 1)]
    available = found[:, None] & (span < length)                          # [C, D]

    earlier = np.tril(np.ones((len(begin),) * 2, bool), -1)   # earlier[c, c']: c' before c
    ranks = jnp.arange(tree.max_width)

    def expand(d, node_token, filled, path):
        """The candidates of depth d's parents P: the distinct tokens that follow each one's
        path among the continuations agreeing with it, in priority order."""
        parents = np.array(tree.level(d - 1))                                      # numpy [P]
        if d > 1:                       # the parents' paths: their parent's, then their token
            path = path.at[parents].set(
                path[tree.parent[parents]].at[:, d - 2].set(node_token[parents]))
        # agree[i, c]: continuation c reaches depth d and follows the path of parent i.
        agree = available[None, :, d - 1] & filled[parents][:, None]               # [P, C]
        agree = agree & jnp.all(continuation[None, :, :d - 1] == path[parents][:, None, :d - 1],
                                axis=-1)
        token = continuation[:, d - 1]                                             # [C]
        same = (token[:, None] == token[None, :]) & earlier                        # [C, C]
        first = agree & ~jnp.any(agree[:, None, :] & same[None], axis=-1)          # [P, C]
        rank = jnp.cumsum(first, axis=-1) - 1                                      # [P, C]
        chosen = first[:, None, :] & (rank[:, None, :] == ranks[None, :, None])    # [P, W, C]
        return (jnp.sum(jnp.where(chosen, token, 0), axis=-1), jnp.any(chosen, axis=-1), path)

    path = jnp.zeros((n, depth), jnp.int32)                   # each node's tokens from the root
    return trees.fill(tree, tokens[length - 1], expand, path)[:2]     # the tokens and filled


def tree_step(spec, weights, state: DecodeState) -> DecodeState:
    # Step 1 (draft): the lookups' trie; every node is a deterministic candidate.
    tokens, filled = jax.vmap(lookup_tree, in_axes=(0, 0, None, None, None))(
        state.tokens, state.length, spec.method.tree, spec.method.max_ngram, spec.method.min_ngram)   # [B, n]
    candidates = trees.Candidates(tokens, filled, None, "deterministic", spec.method.tree)
    # Steps 2 to 4 (score, accept or resample, bonus): one target call over the tree, the walk,
    # then commit (`trees.step`).
    keys = drafting_keys(spec, state, spec.method.tree.max_depth, draft="none").verify
    return trees.step(spec, weights, state, candidates, keys)[0]
