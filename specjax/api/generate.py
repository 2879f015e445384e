"""`specjax.generate`: the public entry point of the decoding methods.

    result = specjax.generate(target, ["def add(a, b):"], method="speculative", draft=draft,
                              k=4, max_new_tokens=64, temperature=0.0)
    result.tokens   # new token ids of each row
    result.texts    # decoded, when the target has a tokenizer
    result.stats    # target/draft calls, acceptance rate, tokens per target call, timings

`prepare` checks the parameters (`api.checks`, on the host, with errors that name the offending
value) and builds a `Request`; `generate` and `stream` run one through the compiled loop
(`decoding.loop`, which assumes valid input) and read the result back (`api.results`).
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import kernels as specjax_kernels
from specjax import mesh as meshes
from specjax.api.checks import (
    KERNELS_ENV,
    GenerationError,
    bucket,
    check_compatible,
    check_drafter,
    check_drafter_dtype,
    check_heads,
    check_controls,
    check_constraints,
    check_logprobs,
    check_stop,
    check_int,
    check_sampling,
    check_schedule,
    check_stop_ids,
    check_tree,
    check_tree_fits_heads,
    encode_prompts,
    kernels_switch,
    per_row_ints,
    prompt_matrix,
    rows_of,
)
from specjax.api.results import (GenerationResult, RowStats, Stats, acceptance_by_position, host,
                                 result, safe_prefix)
from specjax.decoding import loop
from specjax.decoding.loop import METHODS, DecodeSpec, Weights
from specjax.decoding.sharding import weight_shardings
from specjax.decoding.state import RowSettings
from specjax.heads import dflash, eagle
from specjax.heads.dflash import BlockDrafter
from specjax.heads.eagle import Drafter
from specjax.io.dflash import check_target as check_block_drafter
from specjax.heads.medusa import Heads, runtime_weights
from specjax.io.checkpoint import Model
from specjax.model.config import EIGHT_BIT
from specjax.model.transformer import in_dtype
from specjax.sampling.rules import Rules
from specjax.sampling.tree import DynamicTree, Tree

# The drafts a step verifies when k is not given (a DFlash drafter's block sets its own).
DEFAULT_K = 4

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


def prepare(target: Model, prompts, *, method: str = "autoregressive",
            draft: Model | None = None, k: int | None = None, max_new_tokens=64,
            temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed: int | Sequence[int] = 0,
            eos_ids=None, max_ngram: int = 3, min_ngram: int = 1, tree=None,
            candidates: str | None = None, heads: Heads | None = None,
            drafter: Drafter | BlockDrafter | None = None,
            k_schedule: str = "constant", k_start: int | None = None,
            confidence_threshold: float | None = None, mesh=None, shard_draft: bool = False,
            rules: Rules | None = None, kernels: bool | None = None,
            drafter_dtype: str | None = None, repetition_penalty=1.0, presence_penalty=0.0,
            frequency_penalty=0.0, logit_bias=None, min_tokens=0, logprobs=0, stop=None,
            regex=None, json_schema=None,
            **unknown) -> Request:
    """Validates everything and builds the static spec and the device inputs: `generate`'s
    arguments (its docstring says what each means) as a `Request`."""
    if unknown:
        raise GenerationError(f"unknown keyword argument {sorted(unknown)[0]!r}")
    if rules is not None and not isinstance(rules, Rules):
        raise GenerationError(f"rules must be a specjax.sampling.rules.Rules, got {rules!r}")
    if method not in METHODS:
        raise GenerationError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    drafter_dtype = check_drafter_dtype(drafter_dtype, method, target, mesh)
    if method == "dflash":       # k defaults to the drafter's block (`_check_dflash`)
        _check_block_drafter(drafter, target)
        k = drafter.config.drafts if k is None else k
    k = DEFAULT_K if k is None else k
    if method != "autoregressive":
        check_int("k", k, 1)
    sampling = check_sampling(temperature, top_k, top_p, min_p)
    if method == "medusa":
        tree = check_heads(heads, tree, target)
    elif heads is not None:
        raise GenerationError(f"heads applies to method 'medusa', not {method!r}")
    all_greedy = not np.any(sampling.temperature)
    if method == "eagle":
        tree = check_drafter(drafter, tree, target, k, all_greedy)
        drafter = eagle.with_dtype(eagle.resolve_taps(drafter, target.config), drafter_dtype)
    elif method == "dflash":
        tree, candidates = _check_dflash(drafter, tree, candidates, k, all_greedy, mesh)
        drafter = dflash.with_dtype(drafter, drafter_dtype)
    elif drafter is not None:
        raise GenerationError(f"drafter applies to methods 'eagle' and 'dflash', not "
                              f"{method!r}")
    if method != "dflash":
        tree, candidates = check_tree(method, tree, candidates, all_greedy, target)
    if method == "medusa":
        check_tree_fits_heads(tree, heads)
    if method == "eagle" and tree.max_width > drafter.config.subset_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"{drafter.config.subset_size} tokens {drafter.name} can propose")
    schedule = check_schedule(method, tree, k, k_schedule, k_start, confidence_threshold)
    if method == "ngram":
        check_int("min_ngram", min_ngram, 1)
        check_int("max_ngram", max_ngram, min_ngram)
    if method == "speculative":
        if draft is None:
            raise GenerationError("method 'speculative' needs a draft model (draft=...)")
        check_compatible(target, draft)
        draft = in_dtype(draft, drafter_dtype)
    else:
        draft = None
    prompt_array, lengths = prompt_matrix(target, prompts)
    rows = len(lengths)
    sampling = rows_of(sampling, rows)
    max_new = per_row_ints("max_new_tokens", max_new_tokens, rows, 1)
    longest = int(lengths.max())
    padded_length = bucket(longest)
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
    stops = check_stop_ids(target.config.eos_token_ids if eos_ids is None else eos_ids, rows)

    k_eff = k if method != "autoregressive" else 1
    if tree is not None:
        k_eff = tree.size
    if isinstance(tree, DynamicTree):      # the drafter reads its frontiers past the tree's end
        k_eff = max(tree.size, (tree.depth - 1) * tree.top_k)
    # A DFlash block is written to the drafter's cache whole, past the k drafts verified.
    room = drafter.config.drafts if method == "dflash" else k_eff
    # Room for the prompt, the new tokens and one step's K + 1 writes past the end (a tree's
    # nodes take one slot each). Attention reads only the filled prefix (`layers.attend_cache`:
    # a decoding step's kernel reads the slots in use, XLA's path the shortest window that
    # holds them), so capacity beyond that costs memory, not time.
    buffer_length = bucket(longest + int(max_new.max()) + max(k_eff, room) + 1)

    if mesh is not None:
        try:
            meshes.check_mesh(mesh)
        except meshes.MeshError as e:
            raise GenerationError(str(e)) from None
        # 8-bit matrices have no sharding table (their scales are a second array per matrix).
        for name, model in (("target", target), ("draft", draft)):
            dtype = getattr(getattr(model, "config", None), "dtype", None)
            if dtype in EIGHT_BIT:
                raise GenerationError(f"the {name} has {dtype} weights, which do not run on a "
                                      f"device mesh: load it as float32 or bfloat16")
    if not isinstance(shard_draft, bool):
        raise GenerationError(f"shard_draft must be True or False, got {shard_draft!r}")
    if shard_draft and (mesh is None or method != "speculative"):
        raise GenerationError("shard_draft applies to method 'speculative' on a mesh (mesh=...)")

    spec = DecodeSpec(method=method, target_config=target.config,
                      draft_config=draft.config if draft else None, k=k_eff,
                      max_ngram=max_ngram, min_ngram=min_ngram, buffer_length=buffer_length,
                      tree=tree, candidates=candidates,
                      heads_config=heads.config if method == "medusa" else None,
                      drafter_config=drafter.config if method == "eagle" else None,
                      dflash_config=drafter.config if method == "dflash" else None, **schedule,
                      mesh=mesh, shard_draft=shard_draft, rules=rules or Rules(),
                      logprobs=check_logprobs(logprobs, target.config.vocab_size),
                      kernels=kernels_switch(kernels) and mesh is None and specjax_kernels.ensure())
    weights = Weights(target.params, draft.params if draft else None,
                      runtime_weights(heads, target, drafter_dtype) if method == "medusa" else None,
                      eagle.runtime_weights(drafter, target) if method == "eagle"
                      else dflash.runtime_weights(drafter) if method == "dflash" else None)
    controls = check_controls(rows, vocab, max_new, repetition_penalty, presence_penalty,
                              frequency_penalty, logit_bias, min_tokens)
    constraint = check_constraints(regex, json_schema, rows, target, vocab, stops)
    settings = RowSettings(sampling, max_new, stops, controls, constraint)
    request = Request(spec, weights, prompt_array.astype(np.int32), lengths,
                      row_keys(seed, rows), settings, target.tokenizer, rows=rows,
                      stop=check_stop(stop, rows, target.tokenizer))
    return request if mesh is None else _on_mesh(request)


def _check_block_drafter(drafter, target: Model) -> None:
    """Method dflash's drafter must be a DFlash drafter that fits the target (a mismatch is a
    CheckpointError naming the drafter's file and field: `io.dflash.check_target`)."""
    if drafter is None:
        raise GenerationError("method 'dflash' needs a DFlash drafter "
                              "(drafter=specjax.load(DIR))")
    if not isinstance(drafter, BlockDrafter):
        raise GenerationError(f"drafter must be a DFlash drafter from specjax.load for method "
                              f"'dflash', got {type(drafter).__name__}")
    check_block_drafter(drafter, target)


def _check_dflash(drafter: BlockDrafter, tree, candidates, k: int, all_greedy: bool, mesh):
    """DFlash verifies the first k of the block's drafts as a chain: k at most the block's
    drafts; no tree; candidates "top" (the argmax of each position, the default when every
    row is greedy) or "iid" (a draw from each position's own distribution, the default when
    a row samples). Returns (the chain, the scheme)."""
    if k > drafter.config.drafts:
        raise GenerationError(f"k={k} is more than the {drafter.config.drafts} tokens a block "
                              f"of {drafter.name} drafts (block_size "
                              f"{drafter.config.block_size})")
    if tree is not None:
        raise GenerationError("method 'dflash' verifies its block as a chain; tree does not "
                              "apply (k says how many of the block's drafts to verify)")
    if mesh is not None:
        raise GenerationError("method 'dflash' does not run on a device mesh yet")
    if candidates is None:
        candidates = "top" if all_greedy else "iid"
    if candidates not in ("top", "iid"):
        raise GenerationError(f"candidates for method 'dflash' must be 'top' or 'iid' (one "
                              f"draft per position), got {candidates!r}")
    if all_greedy and candidates != "top":
        raise GenerationError("every row is greedy (temperature 0): each position's "
                              "distribution is its argmax; use candidates='top'")
    return Tree.chain(k), candidates


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


def generate(target: Model | Request, prompts=None, *, method: str = "autoregressive",
             draft: Model | None = None, k: int | None = None, max_new_tokens=64, temperature=1.0,
             top_k=0, top_p=1.0, min_p=0.0, seed: int | Sequence[int] = 0, eos_ids=None,
             max_ngram: int = 3, min_ngram: int = 1, tree=None, candidates: str | None = None,
             heads: Heads | None = None, drafter: Drafter | None = None,
             k_schedule: str = "constant", k_start: int | None = None,
             confidence_threshold: float | None = None, mesh=None, shard_draft: bool = False,
             rules: Rules | None = None, kernels: bool | None = None,
             drafter_dtype: str | None = None, repetition_penalty=1.0, presence_penalty=0.0,
             frequency_penalty=0.0, logit_bias=None, min_tokens=0, logprobs=0, stop=None,
             regex=None, json_schema=None,
             **unknown) -> GenerationResult:
    """Generates up to `max_new_tokens` tokens for each prompt with the chosen method.

    `generate(request)` runs a `Request` made by `prepare(target, prompts, ...)`, which takes
    the same arguments as `generate`: a caller that runs one request several times (the CLI's
    timed runs, the bench) checks and places it once. Beside a request, every option must be
    left at its default (the request carries its own). A keyword not listed here is an error
    (`GenerationError`) that names it.

    Args:
      target: the model whose distribution is sampled (from `specjax.load`).
      prompts: a list of texts (needs the target's tokenizer) or of token-id lists; ragged.
      method: "autoregressive", "speculative" (needs `draft`), "ngram", "medusa" (needs
        `heads`), "eagle" (needs an EAGLE `drafter`) or "dflash" (needs a DFlash `drafter`).
      draft: the draft model for speculative sampling; same tokenizer as the target.
      k: tokens drafted per step (speculative and ngram), >= 1; default 4. For dflash, how
        many of the block's drafts a step verifies, at most block_size - 1 (the default).
      max_new_tokens: tokens to generate per row, >= 1 (an int, or one per row); fewer only if
        an EOS id comes first.
      temperature, top_k, top_p, min_p: the sampling parameters (`specjax.sampling.logits`),
        each a number or one per row: temperature 0 is greedy; top_k 0, top_p 1 and min_p 0
        are off.
      seed: an int (row b uses fold_in(key(seed), b)) or one int per row (row b uses key(seed[b]),
        so a row's output is the same alone or in any batch).
      eos_ids: ids that end a row (default: the target's), () to never stop early.
      max_ngram, min_ngram: n-gram sizes tried by the lookup, longest first.
      tree: a token tree of candidates instead of a chain of k (speculative and ngram): a
        `specjax.Tree`, or its paths in Medusa's "choices" format, e.g. ((0,), (1,), (0, 0)).
        For medusa and eagle, the default is the tree shipped with the heads or the drafter
        (a chain of k for a drafter that ships none; `specjax.Tree.chain(k)` asks for one); a
        drafter may ship a second default for calls that sample (any row at temperature > 0).
      candidates: how a draft model or Medusa heads fill a tree: "top" (the most likely tokens;
        the default at temperature 0), "distinct" (sampled without replacement; the default
        otherwise) or "iid" (sampled independently). Each is verified by the rule exact for it.
      heads: Medusa heads for this target (`specjax.load` of a heads directory), method
        "medusa" only.
      drafter: an EAGLE drafter for this target (`specjax.load` of an EAGLE directory), method
        "eagle"; or a DFlash drafter (`specjax.load` of a DFlash directory), method "dflash".
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
      rules: the draw and verification rules (`specjax.sampling.rules.Rules`); the default is
        Theorem 1's. Others are for studying a rule under the distribution tests (a broken rule
        is how the negative controls are built); `specjax.explain` shows their numbers.
      kernels: whether few-token calls use the CPU kernels (`specjax.kernels`): None (the
        default) follows $SPECJAX_KERNELS ("on" unless "off"), True or False decides. They are
        built on first use; without a compiler, on a GPU or on a mesh XLA's formulation runs.
        Outputs are the same up to float32 rounding; the switch is part of the compiled
        program's key.
      repetition_penalty, presence_penalty, frequency_penalty, logit_bias, min_tokens: each
        row's controls (`specjax.sampling.logits`, applied before the temperature), each a
        value or one per row. repetition_penalty > 0 (1 is off) divides the positive logits
        and multiplies the negative ones of every token seen in the prompt or the output;
        presence_penalty and frequency_penalty, in [-2, 2] (0 is off), subtract from a token's
        logit once if it was generated, and once per time; logit_bias, {token id: bias in
        [-100, 100]}, adds to the logits; min_tokens >= 0 masks the stop ids (eos_ids) until
        that many tokens are generated. Every method stays exact under them: a verify call's
        position counts the drafts before it as generated.
      logprobs: N >= 0 (at most 20): the result's `logprobs` give every new token's
        log-probability under the target's distribution at its position, after every control
        (`GenerationResult.logprobs`), with the N most likely tokens'; the same numbers for every
        method. A greedy row's distribution is one-hot, so its numbers are those of temperature 1
        after the controls.
      stop: strings that end a row at their first occurrence in its new text, across token
        boundaries (a list for every row, or one list per row; needs the target's tokenizer).
        The row's text ends just before it, and its tokens (and log-probabilities) are those
        whose text lies wholly before it, as OpenAI's API returns. `generate` runs its loop to
        the end and cuts; `stream` stops once every row has stopped.
      regex, json_schema: constrained output: each row's text must match the regex, or be a
        JSON document valid under the schema (a dict or its JSON text); one for every row, or
        one per row (None: free). Compiled by outlines-core into a token-level automaton
        (`specjax.sampling.constraints`) that runs in the compiled loop; the target's
        distribution is masked to the tokens it allows and renormalised (that is the law every
        method is exact for), and a row whose match can go no further can only stop (an EOS
        id, which a constrained row needs).
      drafter_dtype: the dtype the draft model, Medusa heads or EAGLE drafter runs in:
        "float32", "bfloat16", "int8" or "q8_0" (default: the target's, so their products take
        the same kernels as the target's).
    """
    request = _request(target, prompts, collect_options(locals()))
    compiled, compile_s = _compiled(request)
    start = time.perf_counter()
    state = compiled(request.weights, *request.inputs)
    jax.block_until_ready(state.tokens)
    return result(request, state, compile_s, time.perf_counter() - start)


def stream(target: Model | Request, prompts=None, *, method: str = "autoregressive",
           draft: Model | None = None, k: int | None = None, max_new_tokens=64,
           temperature=1.0, top_k=0,
           top_p=1.0, min_p=0.0, seed: int | Sequence[int] = 0, eos_ids=None,
           max_ngram: int = 3, min_ngram: int = 1, tree=None, candidates: str | None = None,
           heads: Heads | None = None, drafter: Drafter | None = None,
           k_schedule: str = "constant", k_start: int | None = None,
           confidence_threshold: float | None = None, mesh=None, shard_draft: bool = False,
           rules: Rules | None = None, kernels: bool | None = None,
           drafter_dtype: str | None = None, repetition_penalty=1.0, presence_penalty=0.0,
           frequency_penalty=0.0, logit_bias=None, min_tokens=0, logprobs=0, stop=None,
           regex=None, json_schema=None,
           **unknown) -> Iterator[tuple[list[list[int]], GenerationResult | None]]:
    """Generates step by step from Python, yielding each step's new tokens per row.

    Yields (new_tokens_per_row, None) after every step and finally ([], result). Takes
    `generate`'s arguments (its docstring says what each means) and runs the same step function,
    so the tokens are the same; like it, takes a prepared `Request` in place of the target, the
    prompts and the options.
    """
    request = _request(target, prompts, collect_options(locals()))
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


# The options `prepare` takes after the target and the prompts, with their defaults: `generate`,
# `stream` and `specjax.explain` declare the same ones (tests/test_walkthrough.py holds them
# equal).
OPTIONS = {name: parameter.default
           for name, parameter in inspect.signature(prepare).parameters.items()
           if parameter.kind is inspect.Parameter.KEYWORD_ONLY}


def collect_options(arguments: dict) -> dict:
    """The options among a public function's arguments (its `locals()`, read first thing), for
    `prepare`: the declared ones (`OPTIONS`) and any unknown keyword, which `prepare` names."""
    return {**{name: arguments[name] for name in OPTIONS}, **arguments["unknown"]}


def _request(target, prompts, options: dict) -> Request:
    """`generate`'s and `stream`'s arguments as a request: prepared now, or by the caller."""
    if not isinstance(target, Request):
        if prompts is None:
            raise GenerationError("prompts are required (or pass a prepared Request alone)")
        return prepare(target, prompts, **options)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise GenerationError(f"unknown keyword argument {unknown[0]!r}")
    given = [name for name, value in options.items() if not _is_default(value, OPTIONS[name])]
    if prompts is not None or given:
        extra = "prompts" if prompts is not None else f"{given[0]!r}"
        raise GenerationError(f"a prepared Request carries its prompts and options; got {extra} "
                              "beside it")
    return target


def _is_default(value, default) -> bool:
    """Whether an option was left at its default (or given exactly that value)."""
    if value is default:
        return True
    try:
        return type(value) is type(default) and bool(value == default)
    except (TypeError, ValueError):      # an array: not a default
        return False


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
