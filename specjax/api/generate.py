"""`specjax.generate`: the public entry point of the three decoding methods.

    result = specjax.generate(target, ["def add(a, b):"], method="speculative", draft=draft,
                              k=4, max_new_tokens=64, temperature=0.0)
    result.tokens   # new token ids of each row
    result.texts    # decoded, when the target has a tokenizer
    result.stats    # target/draft calls, acceptance rate, tokens per target call, timings

Parameters are checked here, on the host, with errors that name the offending value; the
compiled loop itself (`decoding.loop`) assumes valid input.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from specjax import kernels as specjax_kernels
from specjax import mesh as meshes
from specjax.decoding import loop
from specjax.decoding.lookahead import DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_K_START, SCHEDULES
from specjax.decoding.loop import METHODS, DecodeSpec, Weights
from specjax.decoding.sharding import weight_shardings
from specjax.decoding.state import DecodeState, RowSettings
from specjax.decoding.trees import SCHEMES
from specjax.heads import eagle
from specjax.heads.eagle import Drafter
from specjax.heads.medusa import Heads, runtime_weights
from specjax.io.checkpoint import Model
from specjax.io.sidecar import check_target
from specjax.sampling.logits import Sampling, SamplingParams
from specjax.sampling.rules import Rules
from specjax.sampling.tree import DynamicTree, Tree, TreeError

# Keyword arguments that replace a step of the algorithm, for the negative-control tests only.


class GenerationError(ValueError):
    """Invalid input to `generate`: the message names the parameter and its value."""


def acceptance_by_position(histogram) -> list[float | None]:
    """From a histogram of accepted drafts per step (`Stats.accepted_histogram`), for i = 1..K:
    of the steps that accepted at least i - 1 drafts, the fraction that accepted at least i
    (None where no step got that far). With K drafts every step this is the probability that
    draft i is accepted given drafts 1..i-1 were, which the i.i.d. theory (Leviathan et al.
    2023) assumes to be one constant a; with fewer drafts (n-gram misses, dynamic lookahead) a
    step that drafted fewer than i counts as not accepting i."""
    if not histogram:
        return []
    reached = [sum(histogram[j:]) for j in range(len(histogram))]
    return [reached[i] / reached[i - 1] if reached[i - 1] else None
            for i in range(1, len(histogram))]


@dataclasses.dataclass(frozen=True)
class Stats:
    method: str
    rows: int
    new_tokens: int            # over all rows
    target_calls: int          # decoding-loop calls of the target, summed over rows (no prefill)
    draft_calls: int
    drafted: int
    accepted: int
    tree_size: int             # candidates verified per target call: k for a chain, 0 for AR
    compile_s: float
    run_s: float
    # Steps that accepted exactly j drafted tokens, j = 0..K (or a tree's depth); () for AR.
    accepted_histogram: tuple[int, ...] = ()
    # Iterations of the decoding loop: every row pays for each, finished or not.
    steps: int = 0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """`acceptance_by_position` of this run's histogram."""
        return acceptance_by_position(self.accepted_histogram)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_draft_length(self) -> float:
        """Tokens drafted per target call: K for a constant chain, less under a dynamic
        lookahead schedule or an n-gram lookup that finds fewer."""
        return self.drafted / self.target_calls if self.target_calls else 0.0

    @property
    def idle_fraction(self) -> float:
        """Of the rows x loop iterations the batch paid for, the share spent on rows that had
        already finished (EOS or max_new_tokens): the cost of ragged lengths in one batch."""
        paid = self.rows * self.steps
        return 1.0 - self.target_calls / paid if paid else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.run_s if self.run_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(acceptance_rate=self.acceptance_rate,
                 tokens_per_target_call=self.tokens_per_target_call,
                 mean_draft_length=self.mean_draft_length, idle_fraction=self.idle_fraction,
                 acceptance_by_position=self.acceptance_by_position,
                 tokens_per_second=self.tokens_per_second)
        return d


@dataclasses.dataclass(frozen=True)
class RowStats:
    """One row's share of the work (the counters of `Stats`, per row)."""
    new_tokens: int
    target_calls: int
    draft_calls: int
    drafted: int
    accepted: int
    # Steps of this row that accepted exactly j drafted tokens, j = 0..K; () for AR.
    accepted_histogram: tuple[int, ...] = ()

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        return acceptance_by_position(self.accepted_histogram)

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), tokens_per_target_call=self.tokens_per_target_call,
                    acceptance_by_position=self.acceptance_by_position)


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    tokens: list[list[int]]            # new tokens of each row (max_new_tokens unless EOS came)
    stats: Stats                       # the whole batch
    texts: list[str] | None = None
    row_stats: list[RowStats] = dataclasses.field(default_factory=list)   # one per row


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated generation request: the static spec, the weights and the padded prompts."""
    spec: DecodeSpec
    weights: Weights
    prompts: np.ndarray          # [B, P] int32, right-padded
    prompt_length: np.ndarray    # [B] int32
    row_keys: jax.Array          # [B]
    settings: RowSettings        # each row's sampling parameters, length and stop ids
    tokenizer: object | None
    rows: int                    # the caller's rows; on a mesh the batch may be padded past them

    @property
    def inputs(self) -> tuple:
        """The per-row arguments of the decoding programs after the weights (`loop.init`)."""
        return self.prompts, self.prompt_length, self.row_keys, self.settings


def prepare(target: Model, prompts, *, method: str = "autoregressive", draft: Model | None = None,
            k: int = 4, max_new_tokens=64, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
            seed: int | Sequence[int] = 0, eos_ids=None,
            max_ngram: int = 3, min_ngram: int = 1, tree=None, candidates: str | None = None,
            heads: Heads | None = None, drafter: Drafter | None = None, k_schedule: str = "constant", k_start: int | None = None,
            confidence_threshold: float | None = None, mesh=None, shard_draft: bool = False,
            rules: Rules | None = None, kernels: bool | None = None, **unknown) -> Request:
    """Validates everything and builds the static spec and the device inputs."""
    if unknown:
        raise GenerationError(f"unknown keyword argument {sorted(unknown)[0]!r}")
    if rules is not None and not isinstance(rules, Rules):
        raise GenerationError(f"rules must be a specjax.sampling.rules.Rules, got {rules!r}")
    if method not in METHODS:
        raise GenerationError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if method != "autoregressive":
        check_int("k", k, 1)
    sampling = _check_sampling(temperature, top_k, top_p, min_p)
    if method == "medusa":
        tree = _check_heads(heads, tree, target)
    elif heads is not None:
        raise GenerationError(f"heads applies to method 'medusa', not {method!r}")
    if method == "eagle":
        tree = _check_drafter(drafter, tree, target, k)
    elif drafter is not None:
        raise GenerationError(f"drafter applies to method 'eagle', not {method!r}")
    all_greedy = not np.any(sampling.temperature)
    tree, candidates = _check_tree(method, tree, candidates, all_greedy, target)
    if method == "medusa":
        _check_tree_fits_heads(tree, heads)
    if method == "eagle" and tree.max_width > drafter.config.subset_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"{drafter.config.subset_size} tokens {drafter.name} can propose")
    schedule = _check_schedule(method, tree, k, k_schedule, k_start, confidence_threshold)
    if method == "ngram":
        check_int("min_ngram", min_ngram, 1)
        check_int("max_ngram", max_ngram, min_ngram)
    if method == "speculative":
        if draft is None:
            raise GenerationError("method 'speculative' needs a draft model (draft=...)")
        check_compatible(target, draft)
    else:
        draft = None
    prompt_array, lengths = _prompt_matrix(target, prompts)
    rows = len(lengths)
    sampling = _rows_of(sampling, rows)
    max_new = _per_row_ints("max_new_tokens", max_new_tokens, rows, 1)
    longest = int(lengths.max())
    padded_length = _bucket(longest)
    vocab = max(target.config.vocab_size, draft.config.vocab_size if draft else 0)
    real = np.arange(padded_length) < lengths[:, None]
    outside = real & ((prompt_array < 0) | (prompt_array >= vocab))
    if outside.any():
        i, j = np.argwhere(outside)[0]
        raise GenerationError(f"prompt {i} has token id {prompt_array[i, j]} outside the "
                              f"vocabulary [0, {vocab})")
    for model in (target, draft):
        too_long = lengths + max_new > model.config.max_positions if model else [False]
        if np.any(too_long):
            i = int(np.argmax(too_long))
            raise GenerationError(
                f"prompt {i} has {lengths[i]} tokens; with max_new_tokens={max_new[i]} that "
                f"exceeds the context window of {model.name} ({model.config.max_positions})")
    stop_ids = _stop_ids(target.config.eos_token_ids if eos_ids is None else eos_ids, rows)

    k_eff = k if method != "autoregressive" else 1
    if tree is not None:
        k_eff = tree.size
    if isinstance(tree, DynamicTree):      # the drafter reads its frontiers past the tree's end
        k_eff = max(tree.size, (tree.depth - 1) * tree.top_k)
    # Room for the prompt, the new tokens and one step's K + 1 writes past the end (a tree's
    # nodes take one slot each). Attention reads only the filled prefix (`layers.attend_cache`:
    # a decoding step's kernel reads the slots in use, XLA's path the shortest window that
    # holds them), so capacity beyond that costs memory, not time.
    buffer_length = _bucket(longest + int(max_new.max()) + k_eff + 1)

    if mesh is not None:
        try:
            meshes.check_mesh(mesh)
        except meshes.MeshError as e:
            raise GenerationError(str(e)) from None
    if not isinstance(shard_draft, bool):
        raise GenerationError(f"shard_draft must be True or False, got {shard_draft!r}")
    if shard_draft and (mesh is None or method != "speculative"):
        raise GenerationError("shard_draft applies to method 'speculative' on a mesh (mesh=...)")

    spec = DecodeSpec(method=method, target_config=target.config,
                      draft_config=draft.config if draft else None, k=k_eff,
                      max_ngram=max_ngram, min_ngram=min_ngram, buffer_length=buffer_length,
                      tree=tree, candidates=candidates,
                      heads_config=heads.config if method == "medusa" else None,
                      drafter_config=drafter.config if method == "eagle" else None, **schedule,
                      mesh=mesh, shard_draft=shard_draft, rules=rules or Rules(),
                      kernels=_kernels_switch(kernels) and mesh is None and specjax_kernels.ensure())
    weights = Weights(target.params, draft.params if draft else None,
                      runtime_weights(heads, target) if method == "medusa" else None,
                      eagle.runtime_weights(drafter, target) if method == "eagle" else None)
    settings = RowSettings(sampling, max_new, stop_ids)
    request = Request(spec, weights, prompt_array.astype(np.int32), lengths,
                      row_keys(seed, rows), settings, target.tokenizer, rows=rows)
    return request if mesh is None else _on_mesh(request)


KERNELS_ENV = "SPECJAX_KERNELS"
_ENV_VALUES = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def _kernels_switch(kernels) -> bool:
    """The CPU kernels' switch: `kernels` when given, else $SPECJAX_KERNELS (on by default).
    Where it is on, the kernels are built and registered (`specjax.kernels.ensure`); without a
    compiler, or on a GPU, that is False and XLA's formulation runs."""
    if kernels is not None:
        if not isinstance(kernels, bool):
            raise GenerationError(f"kernels must be True, False or None, got {kernels!r}")
        return kernels
    value = os.environ.get(KERNELS_ENV, "on").strip().lower() or "on"
    if value not in _ENV_VALUES:
        raise GenerationError(f"{KERNELS_ENV} must be on or off, got {os.environ[KERNELS_ENV]!r}")
    return _ENV_VALUES[value]


def _on_mesh(request: Request) -> Request:
    """The request's weights and inputs placed on its spec's mesh (`loop.weight_shardings`;
    weights already placed so are not copied), its rows padded with copies of the last row to a
    multiple of the "data" axis (`_result` drops them).

    Weights and inputs go from the host to their shards (`mesh.put`, `mesh.place`), which also
    works when the mesh spans several processes (`jax.distributed`): each process places its
    own devices' pieces."""
    mesh = request.spec.mesh
    b = len(request.prompt_length)
    extra = meshes.padded_rows(b, mesh) - b
    repeat = lambda a: np.concatenate([a, np.repeat(a[-1:], extra, axis=0)])  # noqa: E731
    rows = meshes.rows(mesh)
    key_data = repeat(np.asarray(jax.random.key_data(request.row_keys)))
    settings = jax.tree.map(lambda a: meshes.place(repeat(a), rows, a.dtype), request.settings)
    return dataclasses.replace(
        request, weights=meshes.put(request.weights, weight_shardings(request.spec)),
        prompts=meshes.place(repeat(request.prompts), rows, np.int32),
        prompt_length=meshes.place(repeat(request.prompt_length), rows, np.int32),
        row_keys=jax.random.wrap_key_data(meshes.place(key_data, rows, key_data.dtype)),
        settings=settings)


def generate(target: Model, prompts, **kwargs) -> GenerationResult:
    """Generates up to `max_new_tokens` tokens for each prompt with the chosen method.

    Args:
      target: the model whose distribution is sampled (from `specjax.load`).
      prompts: a list of texts (needs the target's tokenizer) or of token-id lists; ragged.
      method: "autoregressive", "speculative" (needs `draft`), "ngram", "medusa" (needs
        `heads`) or "eagle" (needs `drafter`).
      draft: the draft model for speculative sampling; same tokenizer as the target.
      k: tokens drafted per step (speculative and ngram), >= 1.
      max_new_tokens: tokens to generate per row, >= 1; fewer only if an EOS id comes first.
      temperature, top_k, top_p: see `specjax.sampling.logits`; temperature 0 is greedy.
      seed: an int (row b uses fold_in(key(seed), b)) or one int per row (row b uses key(seed[b]),
        so a row's output is the same alone or in any batch).
      eos_ids: ids that end a row (default: the target's), () to never stop early.
      max_ngram, min_ngram: n-gram sizes tried by the lookup, longest first.
      tree: a token tree of candidates instead of a chain of k (speculative and ngram): a
        `specjax.Tree`, or its paths in Medusa's "choices" format, e.g. ((0,), (1,), (0, 0)).
        For medusa and eagle, the default is the tree shipped with the heads or the drafter
        (a chain of k for a drafter that ships none; `specjax.Tree.chain(k)` asks for one).
      candidates: how a draft model or Medusa heads fill a tree: "top" (the most likely tokens;
        the default at temperature 0), "distinct" (sampled without replacement; the default
        otherwise) or "iid" (sampled independently). Each is verified by the rule exact for it.
      heads: Medusa heads for this target (`specjax.load` of a heads directory), method
        "medusa" only.
      drafter: an EAGLE drafter for this target (`specjax.load` of an EAGLE directory), method
        "eagle" only.
      k_schedule: how many of the k tokens each row drafts per step (`decoding.lookahead`):
        "constant" (k every step, the default), "heuristic" (a per-row length starting at
        k_start, + 2 after a fully accepted step, - 1 otherwise; speculative and ngram) or
        "confidence" (a row stops after a draft token whose probability under the draft falls
        below confidence_threshold; speculative). Every schedule is exact: the decision to stop
        never looks at the target.
      k_start: the heuristic schedule's first length, 1..k (default min(5, k)).
      confidence_threshold: the confidence schedule's threshold in [0, 1] (default 0.4).
      mesh: a "data" x "model" device mesh (`specjax.make_mesh`) to run on: the target split
        over "model", rows over "data" (`specjax.mesh`). Weights not yet placed so are copied
        there on every call; `specjax.load(..., mesh=mesh)` places them once.
      shard_draft: with a mesh, split the draft like the target (default: replicated).
      kernels: whether few-token calls use the CPU kernels (`specjax.kernels`): None (the
        default) follows $SPECJAX_KERNELS ("on" unless "off"), True or False decides. They are
        built on first use; without a compiler, on a GPU or on a mesh XLA's formulation runs.
        Outputs are the same up to float32 rounding; the switch is part of the compiled
        program's key.
    """
    request = prepare(target, prompts, **kwargs)
    compiled, compile_s = _compiled(request)
    start = time.perf_counter()
    state = compiled(request.weights, *request.inputs)
    jax.block_until_ready(state.tokens)
    return _result(request, state, compile_s, time.perf_counter() - start)


def stream(target: Model, prompts, **kwargs) -> Iterator[tuple[list[list[int]], GenerationResult | None]]:
    """Generates step by step from Python, yielding each step's new tokens per row.

    Yields (new_tokens_per_row, None) after every step and finally ([], result). Runs the same
    step function as `generate`, so the tokens are the same.
    """
    request = prepare(target, prompts, **kwargs)
    start = time.perf_counter()
    init, step, _ = loop.programs(request.spec)
    state = init(request.weights, *request.inputs)
    lengths = _host(state.length)
    while not bool(np.all(_host(state.done))):
        state = step(request.weights, state)
        tokens, new_lengths = _host(state.tokens), _host(state.length)
        yield [tokens[b, lengths[b]:new_lengths[b]].tolist() for b in range(request.rows)], None
        lengths = new_lengths
    yield [], _result(request, state, 0.0, time.perf_counter() - start)


# -- Validation and inputs ----------------------------------------------------------------------

def check_compatible(target: Model, draft: Model) -> None:
    """A draft must share the target's token ids: same tokenizer, vocab sizes equal or differing
    only by padding rows beyond the tokenizer."""
    tt, dt = target.tokenizer, draft.tokenizer
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tt is not None and dt is not None:
        if tt.get_vocab(with_added_tokens=True) != dt.get_vocab(with_added_tokens=True):
            raise GenerationError(f"draft {draft.name} and target {target.name} have different "
                                  "tokenizers; speculative sampling needs the same token ids")
        return  # the same tokenizer fits in both vocabularies (checked by load): padding only
    if tv != dv:
        raise GenerationError(f"draft vocab_size {dv} != target vocab_size {tv} ({draft.name} vs "
                              f"{target.name})")


def _prompt_matrix(model: Model, prompts) -> tuple[np.ndarray, np.ndarray]:
    """The prompts right-padded with zeros to their bucketed length (`_bucket`), [B, P] int64,
    and each row's length [B]. A 2-D integer array is taken as it is (every row full length:
    the fast way in for 10^5 equal rows); anything else goes through `encode_prompts`."""
    if (isinstance(prompts, np.ndarray) and prompts.ndim == 2 and prompts.dtype.kind in "iu"
            and prompts.size):
        rows, lengths = prompts, np.full(len(prompts), prompts.shape[1], np.int32)
    else:
        rows = encode_prompts(model, prompts)
        lengths = np.array([len(r) for r in rows], np.int32)
    matrix = np.zeros((len(rows), _bucket(int(lengths.max()))), np.int64)
    if isinstance(rows, np.ndarray):
        matrix[:, :rows.shape[1]] = rows
    else:
        for i, row in enumerate(rows):
            matrix[i, :len(row)] = row
    return matrix, lengths


def encode_prompts(model: Model, prompts) -> list[list[int]]:
    if isinstance(prompts, np.ndarray):
        prompts = list(prompts)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise GenerationError("prompts must be a non-empty list of texts or of token-id lists")
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if model.tokenizer is None:
                raise GenerationError(f"{model.name} has no tokenizer.json; pass token ids")
            row = model.tokenizer.encode(prompt).ids
        else:
            try:
                array = np.asarray(prompt)
            except ValueError:         # ragged nesting
                array = np.asarray(prompt, dtype=object)
            if array.size and array.dtype.kind not in "iub":
                big = [t for t in array.reshape(-1) if isinstance(t, numbers.Integral)]
                if array.dtype == object and len(big) == array.size:   # beyond int64
                    raise GenerationError(f"prompt {i} has token id {max(big, key=abs)} outside "
                                          f"the vocabulary [0, {model.config.vocab_size})")
                raise GenerationError(f"prompt {i} must hold integer token ids")
            row = array.reshape(-1).tolist()
        if not row:
            raise GenerationError(f"prompt {i} is empty")
        rows.append(row)
    return rows


def row_keys(seed, rows: int) -> jax.Array:
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(int(seed)),
                                                               jnp.arange(rows))
    seeds = list(seed) if isinstance(seed, Sequence) else None
    if seeds is None or len(seeds) != rows or not all(isinstance(s, numbers.Integral) for s in seeds):
        raise GenerationError(f"seed must be an int or a list of {rows} ints, got {seed!r}")
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


def _check_sampling(temperature, top_k, top_p, min_p) -> Sampling:
    """The sampling parameters, each a number for every row or a sequence of one per row,
    validated (`SamplingParams`), as numpy arrays ([] or [B] each)."""
    values = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    dtypes = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32,
              "min_p": np.float32}
    arrays = {}
    for name, value in values.items():
        per_row = _is_sequence(value)
        array = np.asarray(value, dtype=object) if per_row else None
        if per_row and (array.ndim != 1 or not len(array)):
            raise GenerationError(f"{name} must be a number or a flat list of one per row, "
                                  f"got {value!r}")
        for v in _distinct(array.tolist() if per_row else [value]):
            try:
                SamplingParams(**{name: v})
            except ValueError as e:
                raise GenerationError(str(e)) from None
        arrays[name] = np.asarray(array.tolist() if per_row else value, dtypes[name])
    return Sampling(**arrays)


def _is_sequence(value) -> bool:
    """A list, tuple or array of values (not a string, not a 0-d array)."""
    return (isinstance(value, (Sequence, np.ndarray, jax.Array)) and not isinstance(value, str)
            and getattr(value, "ndim", 1) != 0)


def _distinct(values: list) -> list:
    """Each value once (1 and True apart), so that a per-row list is validated per value."""
    return [v for _, v in dict.fromkeys((type(v), v) for v in values)]


def _rows_of(sampling: Sampling, rows: int) -> Sampling:
    """Every field [rows]: a number repeated, a per-row sequence checked for its length."""
    fields = {}
    for name in ("temperature", "top_k", "top_p", "min_p"):
        value = getattr(sampling, name)
        if value.ndim and len(value) != rows:
            raise GenerationError(f"{name} has {len(value)} values for {rows} prompts")
        fields[name] = np.broadcast_to(value, (rows,)).copy()
    return Sampling(**fields)


def _per_row_ints(name: str, value, rows: int, minimum: int) -> np.ndarray:
    """An integer for every row, or one per row: [rows] int32."""
    values = list(value) if _is_sequence(value) else [value] * rows
    if len(values) != rows:
        raise GenerationError(f"{name} has {len(values)} values for {rows} prompts")
    for v in _distinct(values):
        check_int(name, v, minimum)
    return np.asarray(values, np.int32)


STOP_SLOTS = 8


def _stop_ids(eos_ids, rows: int) -> np.ndarray:
    """The ids that end each row, [rows, S] int32 padded with -1; S, the slots, is a power of
    two of at least `STOP_SLOTS`, so that other stop ids, or a few more, do not recompile.
    `eos_ids` is one sequence of ids for every row, or a sequence of one per row."""
    if not _is_sequence(eos_ids):
        raise GenerationError(f"eos_ids must be a list of token ids (or one list per prompt), "
                              f"got {eos_ids!r}")
    per_row = len(eos_ids) > 0 and all(_is_sequence(e) for e in eos_ids)
    lists = [list(e) for e in eos_ids] if per_row else [list(eos_ids)]
    if per_row and len(lists) != rows:
        raise GenerationError(f"eos_ids has {len(lists)} lists for {rows} prompts")
    for e in _distinct([e for ids in lists for e in ids]):
        if isinstance(e, bool) or not isinstance(e, numbers.Integral) or not 0 <= e < 2 ** 31:
            raise GenerationError(f"eos_ids must hold token ids >= 0, got {e!r}")
    longest = max(len(ids) for ids in lists)
    slots = max(STOP_SLOTS, 1 << (longest - 1).bit_length()) if longest else STOP_SLOTS
    table = np.full((len(lists), slots), -1, np.int32)
    for b, ids in enumerate(lists):
        table[b, :len(ids)] = ids
    return table if per_row else np.repeat(table, rows, axis=0)


def _check_beside(value, kind: type, what: str, keyword: str, method: str, target) -> None:
    """What a method reads beside the target (Medusa heads, an EAGLE drafter) must be there,
    of its kind, and trained on this target."""
    if value is None:
        raise GenerationError(f"method {method!r} needs {what} ({keyword}=specjax.load(DIR))")
    if not isinstance(value, kind):
        raise GenerationError(f"{keyword} must be {what} from specjax.load, got "
                              f"{type(value).__name__}")
    try:
        check_target(value, target)
    except ValueError as e:
        raise GenerationError(str(e)) from None


def _check_heads(heads, tree, target):
    """Medusa's heads must be heads, trained on this target; returns the tree to use."""
    _check_beside(heads, Heads, "Medusa heads", "heads", "medusa", target)
    if tree is None:
        if heads.tree is None:
            raise GenerationError(f"{heads.name} ships no tree; pass tree=...")
        return heads.tree
    return tree


def _check_drafter(drafter, tree, target, k: int):
    """EAGLE's drafter must be a drafter, trained on this target; returns the tree to use."""
    _check_beside(drafter, Drafter, "an EAGLE drafter", "drafter", "eagle", target)
    fused = drafter.config.fused_layers
    if fused and max(fused) > target.config.n_layers:
        raise GenerationError(f"{drafter.name} fuses the states after {list(fused)} layers, but "
                              f"{target.name} has {target.config.n_layers}")
    if tree is not None:
        return tree
    return drafter.tree if drafter.tree is not None else Tree.chain(k)


def _check_tree_fits_heads(tree: Tree, heads: Heads) -> None:
    if tree.max_depth > heads.config.num_heads:
        raise GenerationError(f"the tree is {tree.max_depth} deep but {heads.name} has "
                              f"{heads.config.num_heads} heads (one per depth)")
    if tree.max_width > heads.config.subset_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"{heads.config.subset_size} tokens the heads can propose")


def _check_tree(method, tree, candidates, all_greedy: bool, target):
    """The tree as a `Tree` and the candidate scheme, or (None, "top") without a tree."""
    if tree is None:
        if candidates is not None:
            raise GenerationError("candidates applies to token trees; pass tree=... too")
        return None, "top"
    if method == "autoregressive":
        raise GenerationError("a token tree needs method 'speculative', 'ngram', 'medusa' or "
                              "'eagle', not 'autoregressive'")
    if isinstance(tree, DynamicTree):
        if method != "eagle":
            raise GenerationError(f"a dynamic tree is EAGLE-2's: it needs method 'eagle', not "
                                  f"{method!r}")
        if candidates not in (None, "top"):
            raise GenerationError(f"a dynamic tree's candidates are the drafter's top tokens; "
                                  f"candidates={candidates!r} does not apply")
        if tree.size >= target.config.max_positions:
            raise GenerationError(f"the tree has {tree.size} nodes; a target call on it needs "
                                  f"more than the context window of {target.name} "
                                  f"({target.config.max_positions})")
        return tree, "top"
    if not isinstance(tree, Tree):
        try:
            tree = Tree.from_paths(tree)
        except TreeError as e:
            raise GenerationError(str(e)) from None
    if tree.size >= target.config.max_positions:
        raise GenerationError(f"the tree has {tree.size} nodes; a target call on it needs more "
                              f"than the context window of {target.name} "
                              f"({target.config.max_positions})")
    if method == "ngram":
        if candidates not in (None, "top"):
            raise GenerationError(f"n-gram lookup fills a tree with deterministic candidates; "
                                  f"candidates={candidates!r} applies to a draft model")
        return tree, "top"
    if candidates is None:
        candidates = "top" if all_greedy else "distinct"
    if candidates not in SCHEMES:
        raise GenerationError(f"candidates must be one of {', '.join(SCHEMES)}; "
                              f"got {candidates!r}")
    if all_greedy and candidates != "top":
        # Sampled from a one-hot p, every candidate would be the draft's argmax.
        raise GenerationError(f"at temperature 0 the draft's distribution is one-hot, so "
                              f"candidates={candidates!r} would draw its argmax only; use 'top'")
    if tree.max_width > target.config.vocab_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"vocabulary ({target.config.vocab_size})")
    return tree, candidates


def _check_schedule(method, tree, k, k_schedule, k_start, threshold) -> dict:
    """The lookahead schedule's spec fields (`decoding.lookahead`), checked."""
    if k_schedule not in SCHEDULES:
        raise GenerationError(f"k_schedule must be one of {', '.join(SCHEDULES)}; "
                              f"got {k_schedule!r}")
    if k_schedule != "constant":
        if method not in ("speculative", "ngram"):
            raise GenerationError(f"k_schedule={k_schedule!r} applies to methods 'speculative' "
                                  f"and 'ngram', not {method!r}")
        if tree is not None:
            raise GenerationError(f"k_schedule={k_schedule!r} drafts a chain; a token tree's "
                                  "shape is fixed (use k_schedule='constant')")
    if k_schedule == "confidence" and method != "speculative":
        raise GenerationError("k_schedule='confidence' needs a draft model's probabilities "
                              "(method 'speculative'); n-gram lookup has none")
    if k_start is not None and k_schedule != "heuristic":
        raise GenerationError("k_start applies to k_schedule='heuristic'")
    if threshold is not None and k_schedule != "confidence":
        raise GenerationError("confidence_threshold applies to k_schedule='confidence'")
    fields = dict(k_schedule=k_schedule)
    if k_schedule == "heuristic":
        if k_start is None:
            k_start = min(DEFAULT_K_START, k)
        check_int("k_start", k_start, 1)
        if k_start > k:
            raise GenerationError(f"k_start={k_start} is more than k={k}, the most a step drafts "
                                  "under the heuristic schedule")
        fields["k_start"] = k_start
    if k_schedule == "confidence":
        if threshold is None:
            threshold = DEFAULT_CONFIDENCE_THRESHOLD
        if (isinstance(threshold, bool) or not isinstance(threshold, numbers.Real)
                or not 0.0 <= threshold <= 1.0):
            raise GenerationError(f"confidence_threshold must be a number in [0, 1], "
                                  f"got {threshold!r}")
        fields["confidence_threshold"] = float(threshold)
    return fields


def check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise GenerationError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _bucket(n: int) -> int:
    """Rounds lengths up so that new prompt lengths rarely recompile: powers of two up to 256,
    then four sizes per octave (320, 384, 448, 512, 640, ...), so that a buffer is at most
    1.25x what the request needs."""
    if n <= 256:
        return max(8, 1 << (n - 1).bit_length())
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step


# -- Compilation and results --------------------------------------------------------------------

_COMPILED: dict = {}


def _compiled(request: Request):
    """The compiled whole-generation program for this spec and these shapes, and the seconds
    spent compiling it now (0 when it was compiled before)."""
    args = (request.weights, *request.inputs)
    shapes = jax.tree.map(lambda a: (a.shape, str(a.dtype)), args)
    key = (request.spec, str(shapes))
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    start = time.perf_counter()
    compiled = loop.programs(request.spec)[2].lower(*args).compile()
    _COMPILED[key] = compiled
    return compiled, time.perf_counter() - start


def _result(request: Request, state: DecodeState, compile_s: float, run_s: float) -> GenerationResult:
    if bool(_host(state.nan_seen)):
        raise GenerationError("the model produced NaN logits; its weights or inputs are broken")
    real = request.rows            # rows past these pad the batch on a mesh
    tokens, length, start = (_host(a) for a in (state.tokens, state.length,
                                                request.prompt_length))
    rows = [tokens[b, start[b]:length[b]].tolist() for b in range(real)]
    counters = {name: _host(getattr(state, name))[:real].astype(int) for name in
                ("target_calls", "draft_calls", "drafted", "accepted")}
    histograms = (np.zeros((real, 0), int) if state.accepted_histogram is None else
                  _host(state.accepted_histogram)[:real].astype(int))
    row_stats = [RowStats(len(rows[b]), *(int(counters[name][b]) for name in counters),
                          accepted_histogram=tuple(histograms[b].tolist()))
                 for b in range(real)]
    stats = Stats(method=request.spec.method, rows=len(rows),
                  new_tokens=int(sum(len(r) for r in rows)),
                  **{name: int(np.sum(values)) for name, values in counters.items()},
                  tree_size=_tree_size(request.spec), compile_s=compile_s, run_s=run_s,
                  steps=int(_host(state.step)),
                  accepted_histogram=tuple(np.sum(histograms, axis=0).tolist()))
    texts = None
    if request.tokenizer is not None:
        texts = [request.tokenizer.decode(r) for r in rows]
    return GenerationResult(rows, stats, texts, row_stats)


def _host(array) -> np.ndarray:
    """All of `array` as a numpy array; on a mesh across processes, gathered from all."""
    if getattr(array, "is_fully_addressable", True):
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def _tree_size(spec) -> int:
    if spec.method == "autoregressive":
        return 0
    return spec.tree.size if spec.tree is not None else spec.k
