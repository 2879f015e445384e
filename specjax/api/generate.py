"""`specjax.generate`: the public entry point of the decoding methods.

    result = specjax.generate(target, ["def add(a, b):"], specjax.Speculative(draft, k=4),
                              specjax.SamplingParams(temperature=0.0), max_new_tokens=64)
    result.tokens          # new token ids of each row
    result.texts           # decoded, when the target has a tokenizer
    result.finish_reasons  # why each row ended
    result.stats           # target/draft calls, acceptance rate, tokens per target call, timings

A request is four things: the target and the prompts, the method (an object of
`specjax.api.methods` that carries its options and weights), the sampling (`SamplingParams`)
and the run's options (max_new_tokens, seed, eos_ids, mesh, kernels, coupled, rules). `prepare` binds
them to the target (each object checked its own values when it was made) and builds a
`Request`; `generate` and `stream` run one through the compiled loop (`decoding.loop`, which
assumes valid input) and read the result back (`api.results`).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import numbers
import time
from typing import Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import mesh as meshes
from specjax.api.checks import (KERNELS_ENV, GenerationError, bind_sampling, bucket,
                                check_compatible, check_logprobs, check_stop_ids, encode_prompts,
                                kernels_switch, one_sampling, per_row_ints, prompt_matrix)
from specjax.api.forward import _compiled as compiled_forward, kernels_of
from specjax.api.methods import CLASSES, Method, method_of
from specjax.api.results import (GenerationResult, RowStats, Stats, acceptance_by_position, host,
                                 result, safe_prefix)
from specjax.decoding import loop
from specjax.decoding.loop import DecodeSpec, Weights
from specjax.decoding.sharding import weight_shardings
from specjax.decoding.state import RowSettings
from specjax.model.config import EIGHT_BIT
from specjax.model.transformer import Model
from specjax.sampling.params import SamplingParams
from specjax.sampling.rules import COUPLED, Rules

__all__ = ["KERNELS_ENV", "GenerationError", "GenerationResult", "Request", "RowStats", "Stats",
           "acceptance_by_position", "check_compatible", "encode_prompts", "generate", "prepare",
           "row_keys", "stream"]


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
    stop: tuple = ()             # each row's stop strings (`results.cut_at_stop`)

    @property
    def inputs(self) -> tuple:
        """The per-row arguments of the decoding programs after the weights (`loop.init`)."""
        return self.prompts, self.prompt_length, self.row_keys, self.settings

    def reseeded(self, seed: int | Sequence[int]) -> Request:
        """This request drawing with another seed, as `prepare(..., seed=seed)` would make it
        (the bench's timed runs: checked and placed once, drawn anew each run)."""
        keys = row_keys(seed, self.rows)
        if self.spec.mesh is not None:
            keys = _placed_keys(keys, self.spec.mesh, len(self.prompt_length) - self.rows)
        return dataclasses.replace(self, row_keys=keys)


def prepare(target: Model, prompts, method: Method | str = "autoregressive",
            sampling: SamplingParams | Sequence[SamplingParams] | None = None, *,
            max_new_tokens=64, seed: int | Sequence[int] = 0, eos_ids=None, mesh=None,
            kernels: bool | None = None, coupled: bool = False,
            rules: Rules | None = None) -> Request:
    """Checks the request against the target and builds the static spec and the device
    inputs: `generate`'s arguments (its docstring says what each means) as a `Request`."""
    if rules is not None and not isinstance(rules, Rules):
        raise GenerationError(f"rules must be a specjax.sampling.rules.Rules, got {rules!r}")
    if not isinstance(coupled, bool):
        raise GenerationError(f"coupled must be True or False, got {coupled!r}")
    if coupled and rules is not None:
        raise GenerationError("coupled=True chooses the rules (sampling.rules.COUPLED); give "
                              "coupled or rules, not both")
    method = method_of(method)
    sampling = one_sampling(sampling)
    if mesh is not None:
        try:
            meshes.check_mesh(mesh)
        except meshes.MeshError as e:
            raise GenerationError(str(e)) from None
    bound = method.bind(target, sampling.greedy, mesh)
    draft = bound.draft
    prompt_array, lengths = prompt_matrix(target, prompts)
    rows = len(lengths)
    max_new = per_row_ints("max_new_tokens", max_new_tokens, rows, 1)
    vocab = max(target.config.vocab_size, draft.config.vocab_size if draft else 0)
    check_prompts(prompt_array, lengths, max_new, vocab, (target, draft))
    if coupled and vocab > target.config.vocab_size:
        raise GenerationError(f"coupled=True draws over the target's vocabulary, and the draft's "
                              f"({vocab}) is larger than the target's "
                              f"({target.config.vocab_size})")
    stops = check_stop_ids(target.config.eos_token_ids if eos_ids is None else eos_ids, rows)
    settings, stop = bind_sampling(sampling, rows, vocab, max_new, stops, target)
    # Room for the prompt, the new tokens and one step's writes past the end (a tree's nodes
    # take one slot each). Attention reads only the filled prefix (`layers.attend_cache`: a
    # decoding step's kernel reads the slots in use, XLA's path the shortest window that holds
    # them), so capacity beyond that costs memory, not time.
    buffer_length = bucket(int(lengths.max()) + int(max_new.max()) + bound.room + 1)
    if mesh is not None:
        check_on_mesh(target, draft)
    # The run option as the programs' configs name it (`loop.lawful`): never on a mesh.
    kernels = kernels_of(kernels_switch(kernels) and mesh is None)
    spec = DecodeSpec(method=bound.spec, target_config=target.config,
                      buffer_length=buffer_length, mesh=mesh,
                      rules=rules or (COUPLED if coupled else Rules()),
                      logprobs=check_logprobs(sampling.logprobs, target.config.vocab_size),
                      kernels=kernels)
    weights = Weights(target.params, draft.params if draft else None,
                      bound.weights if method.loads == "heads" else None,
                      bound.weights if method.loads == "drafter" else None)
    request = Request(spec, weights, prompt_array.astype(np.int32), lengths,
                      row_keys(seed, rows), settings, target.tokenizer, rows=rows, stop=stop)
    return request if mesh is None else _on_mesh(request)


def check_prompts(prompts: np.ndarray, lengths: np.ndarray, max_new: np.ndarray, vocab: int,
                  models) -> None:
    """Every prompt's ids lie in the vocabulary, and with its new tokens it fits each model's
    context window."""
    real = np.arange(prompts.shape[1]) < lengths[:, None]
    outside = real & ((prompts < 0) | (prompts >= vocab))
    if outside.any():
        i, j = np.argwhere(outside)[0]
        raise GenerationError(f"prompt {i} has token id {prompts[i, j]} outside the "
                              f"vocabulary [0, {vocab})")
    for model in models:
        too_long = lengths + max_new > model.config.max_positions if model else [False]
        if np.any(too_long):
            i = int(np.argmax(too_long))
            raise GenerationError(
                f"prompt {i} has {lengths[i]} tokens; with max_new_tokens={max_new[i]} that "
                f"exceeds the context window of {model.name} ({model.config.max_positions})")


def check_on_mesh(target: Model, draft: Model | None) -> None:
    """8-bit matrices have no sharding table (their scales are a second array per matrix)."""
    for name, model in (("target", target), ("draft", draft)):
        dtype = getattr(getattr(model, "config", None), "dtype", None)
        if dtype in EIGHT_BIT:
            raise GenerationError(f"the {name} has {dtype} weights, which do not run on a "
                                  f"device mesh: load it as float32 or bfloat16")


def _on_mesh(request: Request) -> Request:
    """The request's weights and inputs placed on its spec's mesh (`loop.weight_shardings`;
    weights already placed so are not copied), its rows padded with copies of the last row to a
    multiple of the "data" axis (`result` drops them).

    Weights and inputs go from the host to their shards (`mesh.put`, `mesh.place`), which also
    works when the mesh spans several processes (`jax.distributed`): each process places its
    own devices' pieces."""
    mesh = request.spec.mesh
    b = len(request.prompt_length)
    extra = meshes.padded_rows(b, mesh) - b
    repeat = lambda a: np.concatenate([a, np.repeat(a[-1:], extra, axis=0)])  # noqa: E731
    rows = meshes.rows(mesh)
    table = request.settings.constraint.table           # one for the batch: not a row's
    settings = jax.tree.map(lambda a: meshes.place(repeat(a), rows, a.dtype),
                            dataclasses.replace(request.settings, constraint=None))
    settings = dataclasses.replace(settings, constraint=dataclasses.replace(
        request.settings.constraint, table=meshes.place(table, meshes.replicated(mesh), np.int32),
        start=meshes.place(repeat(request.settings.constraint.start), rows, np.int32),
        active=meshes.place(repeat(request.settings.constraint.active), rows, bool)))
    return dataclasses.replace(
        request, weights=meshes.put(request.weights, weight_shardings(request.spec)),
        prompts=meshes.place(repeat(request.prompts), rows, np.int32),
        prompt_length=meshes.place(repeat(request.prompt_length), rows, np.int32),
        row_keys=_placed_keys(request.row_keys, mesh, extra), settings=settings)


def _placed_keys(keys: jax.Array, mesh, extra: int) -> jax.Array:
    """Row keys padded with `extra` copies of the last and split over the mesh's rows."""
    data = np.asarray(jax.random.key_data(keys))
    data = np.concatenate([data, np.repeat(data[-1:], extra, axis=0)])
    return jax.random.wrap_key_data(meshes.place(data, meshes.rows(mesh), data.dtype))


class Run(NamedTuple):
    """The run's options (`generate`'s docstring says what each means), declared here once
    with their defaults; `prepare`, `generate`, `stream` and `specjax.explain` take each as a
    keyword-only parameter with the same default (tests/docs/test_walkthrough.py holds them
    equal)."""
    max_new_tokens: int | Sequence[int] = 64
    seed: int | Sequence[int] = 0
    eos_ids: Sequence | None = None
    mesh: object | None = None
    kernels: bool | None = None
    coupled: bool = False
    rules: Rules | None = None

    def given(self) -> list[str]:
        """The options set to other than their defaults (one passed at its default reads as
        left out: a prepared `Request` beside it then runs with its own)."""
        return [name for name, value, default in zip(self._fields, self, Run())
                if not (type(value) is type(default) and value == default)]


RUN_OPTIONS = Run._fields


def moved(name: str) -> str:
    """Where an option of the flat API of specjax 0.5 lives now, as a hint (CHANGELOG.md), or
    "" for a name that never was one."""
    if name in SAMPLING_FIELDS:
        return f": it is a field of SamplingParams (sampling=specjax.SamplingParams({name}=...))"
    owners = [cls.__name__ for cls in CLASSES if name in {f.name for f in dataclasses.fields(cls)}]
    if owners:
        return f": it belongs to the method object ({', '.join(owners)})"
    return ""


SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


def says_where_options_went(function):
    """`function` (`generate`, `stream`, `specjax.explain`), which refuses a keyword of the
    flat API of specjax 0.5 with a `GenerationError` saying where it went (`moved`). Any other
    unknown keyword is Python's TypeError, which names it."""
    @functools.wraps(function)
    def checked(*args, **kwargs):
        for name in kwargs:
            where = moved(name)
            if where:
                raise GenerationError(f"unknown keyword argument {name!r}{where}")
        return function(*args, **kwargs)
    return checked


@says_where_options_went
def generate(target: Model | Request, prompts=None, method: Method | str = "autoregressive",
             sampling: SamplingParams | Sequence[SamplingParams] | None = None, *,
             max_new_tokens: int | Sequence[int] = 64, seed: int | Sequence[int] = 0,
             eos_ids=None, mesh=None, kernels: bool | None = None, coupled: bool = False,
             rules: Rules | None = None) -> GenerationResult:
    """Generates up to `max_new_tokens` tokens for each prompt with the chosen method.

    Args:
      target: the model whose distribution is sampled (from `specjax.load`), or a `Request`
        made by `prepare(target, prompts, ...)` alone: a caller that runs one request several
        times (the CLI's timed runs, the bench) checks and places it once.
      prompts: a list of texts (needs the target's tokenizer) or of token-id lists; ragged.
      method: the decoding method, an object that carries its options and weights
        (`Autoregressive`, `Speculative(draft)`, `NGram`, `Medusa(heads)`, `Eagle(drafter)`,
        `DFlash(drafter)`: `specjax.api.methods`), or the name of one that needs no weights
        ("autoregressive", "ngram") for its defaults.
      sampling: a `SamplingParams` (temperature, top-k/p, min-p, penalties, bias, min_tokens,
        logprobs, stop strings, a regex or JSON schema; each field a value or one per row), or
        a list of one per row. Default: `SamplingParams()`, temperature 1.

    The run's options (`RUN_OPTIONS`; `stream`, `specjax.explain` and `prepare` take them too):
      max_new_tokens: tokens to generate per row, >= 1 (an int, or one per row); fewer if
        the row ends first (`GenerationResult.finish_reasons` says why each ended).
      seed: an int (row b uses fold_in(key(seed), b)) or one int per row (row b uses
        key(seed[b]), so a row's output is the same alone or in any batch).
      eos_ids: ids that end a row (default: the target's), () to never stop early.
      mesh: a "data" x "model" device mesh (`specjax.mesh.make_mesh`) to run on: the target
        split over "model", rows over "data" (`specjax.mesh`).
      kernels: whether few-token calls use the CPU kernels (`specjax.kernels`): None (the
        default) follows $SPECJAX_KERNELS, True or False decides; the programs' static configs
        name the choice (`ModelConfig.kernels`), so it is part of their key.
      coupled: verify by the coupled rule instead of Algorithm 2 (`specjax.sampling.coupled`):
        every token is the target's own draw at its position under the row's seed, so every
        method returns autoregressive sampling's tokens for the same seed and settings, at any
        temperature; drafts are kept a little less often (docs/methods.md, "The same seed, the
        same text"). Greedy rows are the same either way.
      rules: the draw and verification rules (`specjax.sampling.rules.Rules`); the default is
        Theorem 1's. Others are for studying a rule under the distribution tests.

    Every option is checked where it enters: a method object or a `SamplingParams` when it is
    made, the request against the target here; a bad value is a `GenerationError` that names
    it, and so is a keyword of the flat API of specjax 0.5, saying where it went (`moved`).
    """
    request = _request(target, prompts, method, sampling, Run(max_new_tokens, seed, eos_ids,
                                                              mesh, kernels, coupled, rules))
    compiled, compile_s = _compiled(request)
    start = time.perf_counter()
    state = compiled(request.weights, *request.inputs)
    jax.block_until_ready(state.tokens)
    return result(request, state, compile_s, time.perf_counter() - start)


@says_where_options_went
def stream(target: Model | Request, prompts=None, method: Method | str = "autoregressive",
           sampling: SamplingParams | Sequence[SamplingParams] | None = None, *,
           max_new_tokens: int | Sequence[int] = 64, seed: int | Sequence[int] = 0,
           eos_ids=None, mesh=None, kernels: bool | None = None, coupled: bool = False,
           rules: Rules | None = None) -> Iterator[tuple[list[list[int]], GenerationResult | None]]:
    """Generates step by step from Python, yielding each step's new tokens per row.

    Yields (new_tokens_per_row, None) after every step and finally ([], result). Takes
    `generate`'s arguments and runs the same step function, so the tokens are the same; it
    stops once every row has ended (a stop string included).
    """
    request = _request(target, prompts, method, sampling, Run(max_new_tokens, seed, eos_ids,
                                                              mesh, kernels, coupled, rules))
    return _steps(request)


def _steps(request: Request) -> Iterator[tuple[list[list[int]], GenerationResult | None]]:
    """`stream`'s steps of a checked request (a generator: the checks above run at the call)."""
    start = time.perf_counter()
    programs = loop.programs(request.spec)
    state = programs.init(request.weights, *request.inputs)
    shown = host(state.length).copy()       # each row's tokens yielded so far end here
    first = request.prompt_length
    stopped = np.zeros(len(shown), bool)    # rows cut by a stop string
    while not bool(np.all(host(state.done) | stopped)):
        state = programs.step(request.weights, state)
        tokens, lengths, done = host(state.tokens), host(state.length), host(state.done)
        ends = lengths.copy()
        for b in range(request.rows):
            if request.stop[b]:             # yield only what no stop string can still cut
                new = tokens[b, first[b]:lengths[b]].tolist()
                kept, cut = safe_prefix(request.tokenizer, new, request.stop[b], done[b])
                ends[b], stopped[b] = first[b] + kept, stopped[b] or cut
        ends = np.maximum(ends, shown)
        yield [tokens[b, shown[b]:ends[b]].tolist() for b in range(request.rows)], None
        shown = ends
    yield [], result(request, state, 0.0, time.perf_counter() - start)


def _request(target, prompts, method, sampling, run: Run) -> Request:
    """`generate`'s and `stream`'s arguments as a request: prepared now, or by the caller."""
    if not isinstance(target, Request):
        if prompts is None:
            raise GenerationError("prompts are required (or pass a prepared Request alone)")
        return prepare(target, prompts, method, sampling, **run._asdict())
    if prompts is not None or run.given() or sampling is not None or method != "autoregressive":
        extra = ("prompts" if prompts is not None else "sampling" if sampling is not None
                 else "method" if method != "autoregressive" else f"{run.given()[0]!r}")
        raise GenerationError(f"a prepared Request carries its prompts and options; got {extra} "
                              "beside it")
    return target


def row_keys(seed, rows: int) -> jax.Array:
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(int(seed)),
                                                               jnp.arange(rows))
    seeds = list(seed) if isinstance(seed, Sequence) else None
    if seeds is None or len(seeds) != rows or not all(isinstance(s, numbers.Integral) for s in seeds):
        raise GenerationError(f"seed must be an int or a list of {rows} ints, got {seed!r}")
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


# -- Compilation and results --------------------------------------------------------------------

_COMPILED: dict = {}


def release_programs() -> None:
    """Drops every program this process has compiled: `generate`'s, `stream`'s, `forward`'s
    and JAX's own caches. The next call of a program compiles it again, or reads it from the
    persistent compilation cache.

    Every compiled program stays alive until then, and on a CPU it holds memory maps all that
    time: XLA's JIT maps each object of code it links as three regions (code, read-only data,
    data). A small model's program holds about 190; one `bench` run of SmolLM2 left a process
    at 20,000 (bench/compile-once-per-layer/). Linux allows a process 65,530 by default
    (`vm.max_map_count`). A process that compiles many programs, such as a sweep over methods,
    k and trees, can call this between groups of runs; the test suite calls it after every
    module."""
    _COMPILED.clear()
    loop.programs.cache_clear()
    compiled_forward.clear_cache()
    jax.clear_caches()
    gc.collect()      # a program held in a reference cycle is unmapped only when it is freed


def _compiled(request: Request):
    """The compiled whole-generation program for this spec and these shapes, and the seconds
    spent compiling it now (0 when it was compiled before)."""
    args = (request.weights, *request.inputs)
    shapes = jax.tree.map(lambda a: (a.shape, str(a.dtype)), args)
    key = (request.spec, str(shapes))
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    start = time.perf_counter()
    compiled = loop.programs(request.spec).run.lower(*args).compile()
    _COMPILED[key] = compiled
    return compiled, time.perf_counter() - start
