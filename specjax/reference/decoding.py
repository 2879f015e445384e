"""The decoding methods as whole loops over one sequence, in plain NumPy: autoregressive sampling,
speculative sampling with a draft model (Chen et al. 2023, Algorithm 2, its four Steps named as
in docs/walkthrough.md), n-gram drafting (prompt lookup) and a token tree of draft candidates.

Each method takes the target (and the draft), the prompt's token ids, the number of new tokens,
a NumPy `Generator` and the sampling settings, and returns the new tokens. A model is a loaded
`specjax.Model`, or any function from a token list to logits [T, V] after each of its positions
(`forward` with its model bound; `specjax.testing` passes memoized ones). No cache: each call
reads the whole sequence again, and the draft's and the target's distributions come from the
same `probs`, as in the engine. Every step appends 1 to k + 1 tokens; the loop stops once n are
out and returns exactly n, as `specjax.generate` does with `max_new_tokens`.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from specjax.reference.model import forward, plain
from specjax.reference.sampling import (RULES, coupled_verify_row, draw, gumbel_draw, probs,
                                        settings, verify_row, verify_tree)


def autoregressive(target, prompt, n: int, rng: np.random.Generator, sampling=None) -> list[int]:
    """n tokens, each drawn from the target's distribution after everything before it."""
    target, tokens, s = _logits_of(target), _start(prompt, n, rng), settings(sampling)
    end = len(tokens) + n
    while len(tokens) < end:
        tokens.append(draw(rng, probs(target(tokens)[-1], s)))
    return tokens[end - n:]


def speculative(target, draft, prompt, n: int, rng: np.random.Generator, sampling=None,
                k: int = 4) -> list[int]:
    """Algorithm 2 of Chen et al. 2023 as a whole loop: `speculative_step` until n tokens are
    out. Each token is distributed as `autoregressive`'s (Theorem 1), whatever the draft."""
    target, draft, s = _logits_of(target), _logits_of(draft), settings(sampling)
    tokens = _start(prompt, n, rng)
    end = len(tokens) + n
    _positive("k", k)
    while len(tokens) < end:
        tokens += speculative_step(draft, target, tokens, k, rng, s)
    return tokens[end - n:end]


def speculative_step(draft, target, tokens: list[int], k: int, rng: np.random.Generator,
                     sampling=None) -> list[int]:
    """Draft k tokens, score them with one target call, accept a prefix, draw one more.

    `draft` and `target` map a token list to logits [T, V]. Returns the 1 to k + 1 tokens the
    row appends.
    """
    s = settings(sampling)
    # Step 1 (draft): x_1..x_k autoregressively, keeping each p_i the draft drew x_i from.
    drafted, p = [], []
    for _ in range(k):
        p_i = probs(draft(tokens + drafted)[-1], s)                         # [V]
        drafted.append(draw(rng, p_i))
        p.append(p_i)
    # Step 2 (score): one target call on the last token and every draft gives q_1..q_{k+1}.
    q = np.array([probs(row, s) for row in target(tokens + drafted)[-(k + 1):]])  # [k + 1, V]
    # Steps 3 and 4 (accept or resample, bonus), on fresh uniform draws.
    n, next_dist = verify_row(np.array(p), q, drafted, rng.random(k))
    return drafted[:n] + [draw(rng, next_dist)]


def ngram_lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens by prompt lookup: for n = max_ngram down to min_ngram, the most recent
    earlier occurrence of the last n tokens (one that starts before they do), and the tokens
    that followed it. The longest n that occurs wins; none gives no draft. The engine's rule
    (`specjax.decoding.ngram.lookup`), so that greedy tokens match."""
    for size in range(max_ngram, min_ngram - 1, -1):
        suffix = tokens[-size:]
        for start in range(len(tokens) - size - 1, -1, -1):              # most recent first
            if tokens[start:start + size] == suffix:
                return tokens[start + size:start + size + k]
    return []


def ngram(target, prompt, n: int, rng: np.random.Generator, sampling=None, k: int = 4,
          max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """N-gram decoding: speculative sampling whose drafts are a lookup (`ngram_lookup`). A
    lookup is a deterministic draft, a one-hot p: x is accepted with probability q(x) and a
    rejection leaves q without x, so the output follows the target at any temperature."""
    target, tokens, s = _logits_of(target), _start(prompt, n, rng), settings(sampling)
    end = len(tokens) + n
    _positive("k", k)
    _positive("min_ngram", min_ngram)
    _positive("max_ngram", max_ngram)
    if max_ngram < min_ngram:
        raise ValueError(f"max_ngram ({max_ngram}) must be >= min_ngram ({min_ngram})")
    while len(tokens) < end:
        # Step 1 (draft): a lookup, 0 to k tokens.
        drafted = ngram_lookup(tokens, k, max_ngram, min_ngram)
        # Step 2 (score): one target call gives q after the last token and after each draft.
        q = np.array([probs(row, s) for row in target(tokens + drafted)[-(len(drafted) + 1):]])
        # Steps 3 and 4 (accept or resample, bonus), each draft's p the one-hot of its token.
        m, next_dist = verify_row(np.eye(q.shape[-1])[drafted], q, drafted,
                                  rng.random(len(drafted)))
        tokens += drafted[:m] + [draw(rng, next_dist)]
    return tokens[end - n:end]


def speculative_tree(target, draft, prompt, n: int, rng: np.random.Generator, sampling=None,
                     widths=(2, 2), rule: str = "without_replacement") -> list[int]:
    """Speculative sampling over a token tree: `widths[d]` draft candidates under every node of
    depth d, drawn as `rule` says (i.i.d. from the draft, without replacement, or its top
    tokens: "deterministic"), verified by the walk over siblings (`verify_tree`)."""
    target, draft, s = _logits_of(target), _logits_of(draft), settings(sampling)
    tokens = _start(prompt, n, rng)
    end = len(tokens) + n
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if isinstance(widths, (str, bytes)) or not widths:
        raise ValueError(f"widths must be a non-empty list of integers >= 1, got {widths!r}")
    for w in widths:
        _positive("each of widths", w)
    while len(tokens) < end:
        # Step 1 (draft): the tree level by level; node 0 is the root, the row's last token,
        # and each node is the list of tokens from the root to it.
        nodes, children, p_at, level = [[]], [[]], {}, [0]
        for width in widths:
            below = []
            for node in level:
                p_at[node] = probs(draft(tokens + nodes[node])[-1], s)     # [V]
                for x in _candidates(rng, p_at[node], width, rule):
                    children[node].append(len(nodes))
                    below.append(len(nodes))
                    nodes.append(nodes[node] + [x])
                    children.append([])
            level = below
        # Step 2 (score): the target after every node. The engine scores the whole tree in one
        # call, each node attending to its ancestors only; without a cache, a call per node.
        q = np.array([probs(target(tokens + branch)[-1], s) for branch in nodes])  # [nodes, V]
        # The leaves have no children, so their p is never read.
        p = np.array([p_at.get(i, np.zeros(q.shape[-1])) for i in range(len(nodes))])
        # Steps 3 and 4 (accept or resample, bonus): the walk, then one more token.
        own = [tokens[-1]] + [branch[-1] for branch in nodes[1:]]        # each node's token
        u = rng.random((len(widths), max(widths)))                       # [depth, W]
        path, next_dist = verify_tree(children, own, p, q, u, rule)
        tokens += (nodes[path[-1]] if path else []) + [draw(rng, next_dist)]
    return tokens[end - n:end]


def position_noise(seed: int, position: int, vocab: int) -> np.ndarray:
    """The Gumbel noise [V] of one position of a row under the coupled rule: a function of the
    seed and the position alone (here NumPy's; the engine's comes from JAX keys)."""
    return np.random.default_rng([seed, position]).gumbel(size=vocab)


def coupled_autoregressive(target, prompt, n: int, seed: int, sampling=None) -> list[int]:
    """Autoregressive sampling by Gumbel-max with position noise: token t is
    argmax(log q_t + g(seed, t)). The law is `autoregressive`'s; the draws are keyed by position."""
    target, s = _logits_of(target), settings(sampling)
    tokens = _start(prompt, n, np.random.default_rng(seed))
    end = len(tokens) + n
    while len(tokens) < end:
        q = probs(target(tokens)[-1], s)
        tokens.append(gumbel_draw(q, position_noise(seed, len(tokens), len(q))))
    return tokens[end - n:]


def coupled_speculative(target, draft, prompt, n: int, seed: int, sampling=None,
                        k: int = 4) -> list[int]:
    """Speculative decoding under the coupled rule: the draft proposes argmax(log p_t + g_t) with
    the position's noise, one target call scores the drafts, and they are kept while they equal
    the target's draws (`coupled_verify_row`). The tokens are `coupled_autoregressive`'s for the
    same seed, whatever the draft."""
    target, draft, s = _logits_of(target), _logits_of(draft), settings(sampling)
    tokens = _start(prompt, n, np.random.default_rng(seed))
    end = len(tokens) + n
    _positive("k", k)
    while len(tokens) < end:
        at = len(tokens)                   # the position of the first draft
        drafted = []
        for i in range(k):
            p_i = probs(draft(tokens + drafted)[-1], s)
            drafted.append(gumbel_draw(p_i, position_noise(seed, at + i, len(p_i))))
        q = np.array([probs(row, s) for row in target(tokens + drafted)[-(k + 1):]])
        g = np.array([position_noise(seed, at + i, q.shape[-1]) for i in range(k + 1)])
        m, next_token = coupled_verify_row(q, drafted, g)
        tokens += drafted[:m] + [next_token]
    return tokens[end - n:end]


def _candidates(rng, p: np.ndarray, width: int, rule: str) -> list[int]:
    """A node's `width` candidates from its draft distribution p [V]; fewer without replacement
    when p has fewer tokens."""
    if rule == "iid":
        return [draw(rng, p) for _ in range(width)]
    if rule == "deterministic":
        return [int(x) for x in np.argsort(-p, kind="stable")[:width]]
    drawn, left = [], p.copy()
    while len(drawn) < width and left.sum() > 0:
        drawn.append(draw(rng, left / left.sum()))
        left[drawn[-1]] = 0.0
    return drawn


def _logits_of(model):
    """A function from a token list to logits [T, V]: `model` itself if it is one, else the
    reference's forward pass of the loaded model (its weights converted once)."""
    return model if callable(model) else functools.partial(forward, plain(model))


def _start(prompt, n, rng) -> list[int]:
    """The prompt as a list of ids, once the method's common arguments are checked."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    _positive("n", n)
    tokens = [int(t) for t in np.asarray(prompt).reshape(-1)]
    if not tokens or any(t < 0 for t in tokens):
        raise ValueError(f"prompt must be a non-empty list of token ids, got {prompt!r}")
    return tokens


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
