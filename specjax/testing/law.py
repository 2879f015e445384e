"""What a lossless sampler must reproduce: small context-dependent target/draft pairs, the exact
law of their short continuations, and the models' logits for every context a sampler may ask.

A pair is two tiny random Llama models over a small vocabulary (V = 6 for the suite's pair, 32
for the wide one), the draft made from the target by adding noise to every weight, so that they
agree on half to two thirds of the drafts, as a real pair does. Their next-token distributions
depend on the whole context, unlike the fixed per-position distributions some peers test with,
so a sampler that reads the wrong position, or keeps a rejected token in its context, changes
the law and is seen.

The law of the L-token continuations of a prompt is enumerated: all V^L of them, each the
product of the target's next-token probabilities along it, after temperature, top-k and top-p
(`specjax.sampling.logits`, the one definition of "the distribution sampled from").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.api.forward import kernels_of
from specjax.io import checkpoint
from specjax.model.cache import KVCache
from specjax.model.config import ModelConfig
from specjax.model.params import draw_normal, init_params, stack_layers, unstack_layers
from specjax.model.transformer import Model, cast_params, forward
from specjax.sampling.logits import SamplingParams, probs_from_logits

__all__ = ["Lookup", "PAIRS", "Pair", "build_pair", "close_pair", "controlled", "exact_law",
           "llama_config", "pair", "warp", "write_pairs"]


def llama_config(vocab=8, d=16, layers=1, heads=2, kv_heads=1, positions=128) -> ModelConfig:
    """A tiny Llama: d model width, `layers` layers, MHA/GQA/MQA by `kv_heads`."""
    return ModelConfig(arch="llama", vocab_size=vocab, d_model=d, n_layers=layers,
                       n_heads=heads, n_kv_heads=kv_heads, head_dim=d // heads, d_ff=2 * d,
                       max_positions=positions, norm_eps=1e-6, activation="silu",
                       tie_embeddings=False)


@functools.lru_cache(maxsize=None)
def close_pair(vocab=6, std=1.0, noise=0.5, seed=1) -> tuple[Model, Model]:
    """A tiny target and a draft made from it by adding noise to every weight: they agree often
    but not always, like a real draft, so both branches of verification get exercised."""
    config = llama_config(vocab, layers=2)
    target = Model(config, init_params(config, jax.random.key(seed), std))
    # The noise is drawn layer by layer, a key per layer's array, as it was while layers were
    # stored one by one: a seed gives the same pair (and the tests' pinned numbers) as before.
    per_layer = dict(target.params, layers=unstack_layers(target.params["layers"]))
    leaves, treedef = jax.tree.flatten_with_path(per_layer)
    keys = jax.random.split(jax.random.key(seed + 1000), len(leaves))
    noisy = [a + noise * std * draw_normal(path[-1].key, a.shape, k)
             for (path, a), k in zip(leaves, keys)]
    draft = jax.tree.unflatten(treedef, noisy)
    return target, Model(target.config, dict(draft, layers=stack_layers(draft["layers"])))


# `forward` jitted: one compiled program per config (the kernels it names included, as in
# `decoding.loop`) and call width, shared by every law computed.
_decode_call = jax.jit(forward, static_argnums=1)


def exact_law(target: Model, prompt, sampling: SamplingParams, length: int,
              controls: dict | None = None, automaton=None, eos_ids=()) -> np.ndarray:
    """P(continuation) under the target for all V^length continuations of `prompt`, in
    lexicographic order, float64: each is the product of the target's next-token probabilities
    (`probs_from_logits`, the distribution every sampler is exact for) along it.

    The probabilities are computed as decoding computes them: the prompt into a KV cache, then
    one token at a time, with the CPU kernels chosen as `generate` chooses them. In float32
    any formulation gives the same law to float32 rounding; in bfloat16 the model that runs is
    also how its attention is computed (XLA's full-sequence attention rounds the scores to
    bfloat16, the kernel that decoding reads the cache with sums them in float32), and the law
    must be that model's.

    `controls` (`generate`'s keywords: repetition_penalty, presence_penalty, frequency_penalty,
    logit_bias, min_tokens, with eos_ids for min_tokens) are applied at each position, given
    the prompt and the continuation before it, by `controlled`: this module's numpy statement
    of the rule of `specjax.sampling.logits`.

    With an `automaton` (`specjax.sampling.constraints.Automaton`), each position's logits are
    masked to the tokens its state after the continuation so far allows, and `eos_ids` in its
    accepting states; with `eos_ids`, a continuation that has emitted one ends: every later
    token is that id, with probability 1 (the sampler's rows stop; pad them so)."""
    config = target.config.replace(kernels=kernels_of())     # as `generate` runs it
    vocab = config.vocab_size
    continuations = np.array(list(itertools.product(range(vocab), repeat=length)), np.int32)
    seqs = np.concatenate([np.tile(np.array(prompt, np.int32), (len(continuations), 1)),
                           continuations], axis=1)                     # [V^length, P + length]
    positions = np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape)
    cache = KVCache.init(config, len(seqs), seqs.shape[1])
    logits = []
    for start, stop in [(0, len(prompt))] + [(t, t + 1) for t in
                                              range(len(prompt), seqs.shape[1] - 1)]:
        out, cache = _decode_call(target.params, config, seqs[:, start:stop],
                                  positions[:, start:stop], cache)
        logits.append(out[:, -1])
    logits = jnp.stack(logits, axis=1)                                  # [V^length, length, V]
    if controls:
        logits = np.stack([controlled(np.asarray(logits[:, t]), prompt, continuations[:, :t],
                                      **controls) for t in range(length)], axis=1)
    if automaton is not None:
        logits = np.array(logits, np.float32)
        state = np.full(len(continuations), automaton.start)
        for t in range(length):
            live = state >= 0
            allowed = np.where(live[:, None], automaton.table[np.maximum(state, 0)] >= 0, False)
            allowed[:, list(eos_ids)] |= (live & automaton.accepting[np.maximum(state, 0)])[:, None]
            logits[:, t] = np.where(allowed, logits[:, t], -np.inf)
            nxt = automaton.table[np.maximum(state, 0), continuations[:, t] % automaton.table.shape[1]]
            state = np.where(live, nxt, -1)
    probs = np.asarray(probs_from_logits(logits, sampling), np.float64)
    picked = np.take_along_axis(probs, continuations[..., None], axis=-1)[..., 0]
    if eos_ids:
        ended = np.isin(continuations, list(eos_ids))
        after = np.cumsum(ended, axis=1) - ended > 0        # an EOS came before position t
        picked = np.where(after, np.where(ended, 1.0, 0.0), picked)
    law = picked.prod(axis=1)
    assert abs(law.sum() - 1) < 1e-5
    return law


def controlled(logits, prompt, output, *, repetition_penalty=1.0, presence_penalty=0.0,
               frequency_penalty=0.0, logit_bias=None, min_tokens=0, eos_ids=()) -> np.ndarray:
    """The controls of `specjax.sampling.controls` in plain numpy (float32), as OpenAI, vLLM and
    transformers state them: logits [N, V] of N contexts, each the `prompt` (one for all) then
    its own `output` so far ([N, m] tokens) -> [N, V]. In order: add the bias; mask the EOS ids
    while fewer than `min_tokens` are generated; divide a positive logit by the repetition
    penalty, or multiply a negative one, for a token in the prompt or the output; subtract the
    frequency penalty per time a token was generated and the presence penalty once."""
    x = np.array(logits, np.float32)
    n, vocab = x.shape
    output = np.asarray(output, np.int64).reshape(n, -1)
    for token, bias in (logit_bias or {}).items():
        x[:, token] += np.float32(bias)
    if output.shape[1] < min_tokens:
        x[:, list(eos_ids)] = -np.inf
    count = np.zeros((n, vocab), np.int64)
    for j in range(output.shape[1]):
        count[np.arange(n), output[:, j]] += 1
    seen = (count > 0) | np.isin(np.arange(vocab), np.asarray(prompt))[None, :]
    r = np.float32(repetition_penalty)
    x = np.where(seen, np.where(x > 0, x / r, x * r), x)
    return (x - np.float32(frequency_penalty) * count.astype(np.float32)
            - np.float32(presence_penalty) * (count > 0)).astype(np.float32)


def warp(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """`probs_from_logits` in plain numpy (float64), for reference samplers written in numpy:
    temperature, then top-k, then top-p over what top-k left, then min-p, then softmax;
    temperature 0 is the one-hot of the argmax. Ties in the logits are not handled as the library does (by id),
    which the random pairs here never have. [..., V] -> [..., V]."""
    x = np.asarray(logits, np.float64)
    if sampling.temperature == 0:
        return np.eye(x.shape[-1])[np.argmax(x, axis=-1)]
    x = (x - x.max(axis=-1, keepdims=True)) / sampling.temperature
    order = np.argsort(-x, axis=-1, kind="stable")               # ids, most likely first
    ranked = np.take_along_axis(x, order, axis=-1)
    keep = np.arange(x.shape[-1]) < (sampling.top_k or x.shape[-1])
    ranked = np.where(keep, ranked, -np.inf)
    probs = np.exp(ranked) / np.exp(ranked).sum(axis=-1, keepdims=True)
    # The nucleus: a rank is kept while the mass strictly before it is < top_p.
    before = np.cumsum(probs, axis=-1) - probs
    ranked = np.where(before < sampling.top_p, ranked, -np.inf)
    # Min-p: rank 0 holds the largest probability, and renormalising keeps the ratios.
    ranked = np.where(np.exp(ranked - ranked[..., :1]) >= sampling.min_p, ranked, -np.inf)
    out = np.empty_like(x)
    np.put_along_axis(out, order, np.exp(ranked) / np.exp(ranked).sum(axis=-1, keepdims=True),
                      axis=-1)
    return out


@dataclasses.dataclass(frozen=True, eq=False)     # compared and hashed by identity
class Pair:
    """A target and a draft over one small vocabulary, with the prompt the check continues.

    `target` and `draft` are specjax models (`forward` runs them; `specjax.io.checkpoint.save`
    writes them as Hugging Face checkpoints, for clients in other frameworks). `lookup()` gives
    a sampler written in numpy the logits of every context it may ask for."""

    name: str
    target: Model
    draft: Model
    prompt: tuple[int, ...]
    about: str = ""

    @property
    def vocab(self) -> int:
        return self.target.config.vocab_size

    def lookup(self) -> "Lookup":
        """The pair's `Lookup`, one per pair: its tables are filled once and shared by every
        check of the pair."""
        return _lookup(self)


# The pairs by name. "close" is the suite's pair (tests/exactness/test_distribution.py): the draft is the
# target plus noise, and they agree on about half of the drafts.
# "wide" has V = 32, above the 10 likeliest tokens that llama.cpp's draft sampler keeps: its
# draft puts a fair share of its mass outside its own top 10 (`tests/kit/test_llamacpp.py`), which a
# 6-token vocabulary never reaches. Its law has 32^L cells, so its checks use L <= 3.
PAIRS = {
    "close": dict(about="the suite's pair: V = 6, 2 layers, draft = target + noise",
                  vocab=6, std=0.5, noise=0.15, prompt=(1, 4, 2, 1, 4)),
    "wide": dict(about="V = 32 (above llama.cpp's draft top-10), 2 layers, draft = target + "
                       "noise", vocab=32, std=0.3, noise=0.15, prompt=(3, 17, 8, 29, 3)),
}

# Each pair ships as two Hugging Face checkpoint directories, <name>-target and <name>-draft:
# drawing the weights takes JAX a few dozen small compilations (half a minute on a loaded
# 2-core host); reading them takes a moment. `build_pair` draws them again, bit for bit
# (tests/kit/test_conformance.py compares; `write_pairs` rewrites the files).
SHIPPED = Path(__file__).resolve().parent / "pairs"


def build_pair(name: str) -> Pair:
    """One of `PAIRS`, its weights drawn from its seeds."""
    spec = _spec(name)
    target, draft = close_pair(vocab=spec["vocab"], std=spec["std"], noise=spec["noise"])
    return Pair(name, target, draft, spec["prompt"], spec["about"])


@functools.lru_cache(maxsize=None)
def pair(name: str = "close") -> Pair:
    """One of `PAIRS` by name, read from the shipped checkpoints."""
    spec = _spec(name)
    target, draft = (checkpoint.load(SHIPPED / f"{name}-{role}") for role in ("target", "draft"))
    return Pair(name, target, draft, spec["prompt"], spec["about"])


def write_pairs(directory: Path = SHIPPED) -> None:
    """Writes every pair of `PAIRS` as the checkpoints `pair` reads."""
    for name in PAIRS:
        built = build_pair(name)
        for role, model in (("target", built.target), ("draft", built.draft)):
            checkpoint.save(model, Path(directory) / f"{name}-{role}")


def _spec(name: str) -> dict:
    if name not in PAIRS:
        raise ValueError(f"unknown pair {name!r}; known: {', '.join(PAIRS)}")
    return PAIRS[name]


class Lookup:
    """The raw next-token logits of a pair's models after every short continuation of the
    prompt, computed on first use a whole level at a time (all V^m continuations of length m in
    one batched forward pass) and then read by table lookup, so that a numpy sampler over
    100,000 rows asks for thousands of contexts at the cost of an index.

        logits = lookup.target(tokens, lengths)      # tokens [N, W], lengths [N] -> [N, V]

    Row i's context is the prompt followed by `tokens[i, :lengths[i]]`; entries past a row's
    length are ignored. `lookup.draft(...)` reads the draft, `lookup.logits(name, ...)` any
    model of `models` (a "draft-bfloat16" entry: the draft run in bfloat16)."""

    MAX_LEVEL_SIZE = 400_000           # contexts of one length: V^m <= this
    MIN_DEPTH = 4                      # levels computed at once: enough for k = 2, L = 3

    def __init__(self, pair: Pair):
        self.pair, self.vocab = pair, pair.vocab
        self.models = {"target": pair.target, "draft": pair.draft,
                       "draft-bfloat16": functools.partial(_bfloat16, pair.draft)}
        self._levels: dict[str, list[np.ndarray]] = {name: [] for name in self.models}

    def target(self, tokens, lengths) -> np.ndarray:
        return self.logits("target", tokens, lengths)

    def draft(self, tokens, lengths) -> np.ndarray:
        return self.logits("draft", tokens, lengths)

    def logits(self, name: str, tokens, lengths) -> np.ndarray:
        """[N, W] tokens, [N] lengths -> [N, V] float32 logits of model `name`."""
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        deepest = int(lengths.max(initial=0))
        self._fill(name, deepest)
        out = np.empty((len(lengths), self.vocab), np.float32)
        for m in np.unique(lengths):
            rows = np.flatnonzero(lengths == m)
            out[rows] = self._levels[name][m][self._code(tokens[rows, :m])]
        return out

    def _code(self, tokens: np.ndarray) -> np.ndarray:
        """[N, m] -> [N]: the continuation's index in lexicographic order (base V)."""
        return (tokens.astype(np.int64) * self.vocab ** np.arange(tokens.shape[1] - 1, -1, -1)
                ).sum(axis=1)

    def _fill(self, name: str, deepest: int) -> None:
        """Compute every level up to `deepest` (at least `MIN_DEPTH`): one forward over all
        V^depth continuations gives the logits after each of their prefixes (the model is
        causal)."""
        if len(self._levels[name]) > deepest:
            return
        depth = max(deepest, self.MIN_DEPTH)
        if self.vocab ** depth > self.MAX_LEVEL_SIZE:
            raise ValueError(f"a context of {deepest} generated tokens was asked for; the lookup "
                             f"enumerates at most {self.MAX_LEVEL_SIZE:,} contexts of one "
                             f"length (V = {self.vocab})")
        model = self.models[name]
        if not isinstance(model, Model):           # made when first asked for
            model = self.models[name] = model()
        rest = np.array(list(itertools.product(range(self.vocab), repeat=depth)), np.int32)
        rest = rest.reshape(self.vocab ** depth, depth)
        seqs = np.concatenate([np.tile(np.array(self.pair.prompt, np.int32), (len(rest), 1)),
                               rest], axis=1)                          # [V^depth, P + depth]
        full = np.concatenate([_logits(model, chunk)[:, len(self.pair.prompt) - 1:]
                               for chunk in np.array_split(seqs, -(-len(seqs) // 4096))])
        # Level m: the prefixes of length m start every V^(depth - m)-th row.
        self._levels[name] = [full[::self.vocab ** (depth - m), m] for m in range(depth + 1)]


def _logits(model: Model, tokens: np.ndarray) -> np.ndarray:
    """[N, T] -> [N, T, V] float32 logits of a full-sequence forward pass."""
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    logits, _ = _forward(model.params, model.config, tokens, positions)
    return np.asarray(logits, np.float32)


_forward = jax.jit(forward, static_argnums=1)


@functools.lru_cache(maxsize=8)
def _lookup(pair: Pair) -> Lookup:
    return Lookup(pair)


def _bfloat16(model: Model) -> Model:
    return Model(model.config, cast_params(model.params, "bfloat16"))
