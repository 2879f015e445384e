"""Greedy identity, measured: an engine's greedy decoding with speculation against the same
engine's without, token by token, on a real model, and where they first part.

At temperature 0 a lossless speculative decoder returns the tokens of plain greedy decoding. In
exact arithmetic that holds for every correct one; in floating point it holds only where a verify
call's logits equal those of one-token steps, and an engine whose verify call sums in another
order (a batched product, another kernel) can flip an argmax between two near-tied tokens and
continue differently from there. The distribution check cannot see this (it is a bias of about
one rounding); this check reports it per prompt:

    rows = identity.specjax_rows(["float32"], ["speculative", "ngram"])
    print(identity.table(rows))

Each `Row` holds, per prompt of `PROMPTS` (21, in five kinds), the first position (0-based,
among the new tokens) where the speculative output differs from the plain one, or None where
the two agree on all `max_new_tokens` tokens (or end together). Engines: specjax in each dtype
and method (`specjax_rows`), and llama.cpp through xllamacpp in F16, Q8_0 and Q4_1, with a draft
model (DRAFT_SIMPLE, greedy drafting) and with n-gram lookup (`llamacpp_rows`), each on the same
token ids. SmolLM2-135M-Instruct is the model: `fetch smollm2`'s GGUF as llama.cpp reads it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from specjax.api.generate import generate
from specjax.api.methods import CLASSES, TYPES, build
from specjax.heads.dflash import BlockDrafter, init_block_drafter
from specjax.io import chat
from specjax.io.checkpoint import load
from specjax.io.fetch import cache_root, fetch, source_gguf
from specjax.io.gguf_write import reencode, write_llama
from specjax.presets import PRESETS, WEIGHTS
from specjax.sampling.params import SamplingParams
from specjax.testing import hf, law
from specjax.testing.llamacpp import engine_version

__all__ = ["KINDS", "METHODS", "PROMPTS", "Row", "first_divergence", "heading", "line",
           "llamacpp_rows", "transformers_rows",
           "row", "specjax_rows", "table"]

METHODS = tuple(m.name for m in CLASSES if m.drafts)     # each against autoregressive decoding
NEW_TOKENS = 128
K = 4                       # tokens drafted a step where a method drafts a chain
NGRAM_MATCH = 2             # llama.cpp's n-gram lookup: the last 2 tokens looked up

# The prompts, by kind: written for this check. Chat prompts are rendered with the model's chat
# template; the rest are plain text.
PROMPTS = {
    "code": ["import json\n\n\ndef load_settings(path):\n",
             "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n",
             "class LinkedList:\n    def __init__(self):\n        self.head = None\n\n"
             "    def append(self, value):\n",
             "def merge_sorted(a, b):\n    result = []\n    i = j = 0\n",
             "# Count the words in a text file.\nfrom collections import Counter\n\n\n"],
    "code-editing": ["# Rename `n` to `count`:\ndef repeat(s, n):\n    return s * n\n\n"
                     "def repeat(s, count):\n",
                     "# Add a default of 10 to `limit`:\ndef head(items, limit):\n"
                     "    return items[:limit]\n\ndef head(items, limit=10):\n",
                     "# The same function in JavaScript.\ndef square(x):\n    return x * x\n\n"
                     "function square(x) {\n",
                     "# Add type hints:\ndef area(width, height):\n    return width * height\n\n"
                     "def area(width: float, height: float) -> float:\n"],
    "prose": ["The history of the printing press begins",
              "A good night's sleep matters because",
              "The three states of water are",
              "In a small village by the sea, there lived"],
    "chat": ["What is the capital of France?", "Give me three tips for learning to code.",
             "Explain what a neural network is in one paragraph.",
             "Write a haiku about autumn.", "How do I reverse a list in Python?"],
    "lists-and-data": ["Here is a list of the planets in order from the Sun:\n1.",
                       '{"name": "Alice", "age": 30, "languages": [',
                       "| Country | Capital |\n|---|---|\n| France | Paris |\n"],
}
KINDS = tuple(PROMPTS)


@dataclasses.dataclass(frozen=True)
class Row:
    """One engine and method against the same engine's plain greedy decoding."""

    engine: str                         # "specjax float32", "llama.cpp Q8_0"
    method: str                         # "speculative k=4", "draft-simple k=4", ...
    first: tuple[int | None, ...]       # per prompt: the first differing new token, or None
    tokens: int                         # new tokens asked for per prompt
    seconds: float                      # the speculative runs' time
    version: str = ""                   # the engine's version

    @property
    def diverged(self) -> int:
        """How many prompts part from plain greedy decoding."""
        return sum(f is not None for f in self.first)

    @property
    def median_first(self) -> float | None:
        """The median first divergence over the prompts that part; None when none does."""
        parted = [f for f in self.first if f is not None]
        return statistics.median(parted) if parted else None


def first_divergence(plain: Sequence[int], fast: Sequence[int]) -> int | None:
    """The first index where two greedy outputs differ; None when they are equal. When one is a
    prefix of the other (one row ended early), the shorter one's length."""
    plain, fast = list(plain), list(fast)
    for i, (a, b) in enumerate(zip(plain, fast)):
        if a != b:
            return i
    return None if len(plain) == len(fast) else min(len(plain), len(fast))


def row(engine: str, method: str, plain: Sequence[Sequence[int]],
        fast: Sequence[Sequence[int]], tokens: int, seconds: float, version: str = "") -> Row:
    """A `Row` from the plain and speculative outputs of the same prompts."""
    if len(plain) != len(fast):
        raise ValueError(f"{len(plain)} plain outputs against {len(fast)} speculative ones")
    return Row(engine, method, tuple(first_divergence(a, b) for a, b in zip(plain, fast)),
               tokens, seconds, version)


def _version() -> str:
    return importlib.metadata.version("specjax")


def prompt_ids(model) -> list[list[int]]:
    """`PROMPTS` as the model's token ids (chat prompts through its chat template)."""
    ids = []
    for kind, texts in PROMPTS.items():
        for text in texts:
            ids.append(chat.encode(model, chat.render(model, text)) if kind == "chat"
                       else list(model.tokenizer.encode(text).ids))
    return ids


def _smollm2_method(name: str, target):
    """Method `name` as the bench runs it on SmolLM2: the preset's draft (a chain of K), heads
    and EAGLE drafter, in the target's dtype; no DFlash drafter is shipped, so a random one, as
    the suite's greedy tests use (its drafts are rejected, the verify calls still run)."""
    record, preset = TYPES[name], PRESETS["smollm2"]
    options = {"k": K} if record.chain else {}
    if record.kind() is BlockDrafter:
        base = target if target.config.dtype == "float32" else load(target.path)
        options[record.loads] = init_block_drafter(base, block_size=8, seed=1, std=0.3)
    elif record.loads:
        options[record.loads] = load(WEIGHTS / getattr(preset, record.loads))
        if name == "eagle":     # the drafter's own tree in every dtype (`Eagle` left to itself
            options["tree"] = options[record.loads].tree    # runs a chain in some)
    return build(name, **options)


# The paths a specjax row can take: the CPU kernels', and XLA's formulation (the kernels off,
# what GPU and TPU programs run), where every target call takes the one law's width.
PATHS = {"kernels": True, "xla": False}


# The sampled identity check's setting (`specjax_rows(..., sampled=True)`): prompt i is drawn
# with seed i, autoregressive sampling against each method under the coupled rule.
SAMPLED = SamplingParams(temperature=0.7, top_p=0.9)


def specjax_rows(dtypes: Sequence[str], methods: Sequence[str], *, tokens: int = NEW_TOKENS,
                 paths: Sequence[str] = ("kernels",), sampled: bool = False,
                 progress: Callable[[Row], None] | None = None) -> list[Row]:
    """specjax's greedy decoding of SmolLM2 in each dtype, each method against autoregressive
    decoding, one prompt a call (the way a user runs one request), on each of `paths` (PATHS).
    With `sampled`, the sampled identity instead: at `SAMPLED`, prompt i with seed i, each method
    under the coupled rule (`generate(..., coupled=True)`) against autoregressive sampling."""
    greedy = SAMPLED if sampled else SamplingParams(temperature=0.0)
    rows = []
    for dtype in dtypes:
        target = load(fetch("smollm2"), dtype=dtype)
        prompts = prompt_ids(target)
        for path in paths:

            def run(method) -> list[list[int]]:
                return [list(generate(target, [p], method, greedy, max_new_tokens=tokens,
                                      kernels=PATHS[path], seed=i,
                                      coupled=sampled and method != "autoregressive"
                                      ).tokens[0]) for i, p in enumerate(prompts)]

            plain = run("autoregressive")
            for name in methods:
                method = _smollm2_method(name, target)
                start = time.perf_counter()
                fast = run(method)
                label = name + (f" k={K}" if TYPES[name].chain else "")
                engine = (f"specjax {dtype}" + ("" if path == "kernels" else " xla")
                          + (" coupled" if sampled else ""))
                rows.append(row(engine, label, plain, fast, tokens,
                                time.perf_counter() - start, _version()))
                if progress:
                    progress(rows[-1])
    return rows


LLAMACPP_KINDS = ("F16", "Q8_0", "Q4_1")
LLAMACPP_MODES = ("draft-simple", "ngram-simple")
LLAMACPP_SAMPLED_MODES = ("draft-simple", "draft-probabilistic", "ngram-simple")


def _llamacpp_server(path: Path, mode: str, draft: Path | None, threads: int):
    import xllamacpp as xl    # optional: only the llama.cpp rows need it (engine_version says so)

    params = xl.CommonParams()
    params.model.path = str(path)
    params.n_ctx = 1024
    params.n_parallel = 1
    params.verbosity = -1
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = threads
    kinds = xl.common_speculative_type
    if mode in ("draft-simple", "draft-probabilistic"):
        params.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        drafting = params.speculative.draft
        # False: greedy drafts kept while they equal the target's own sample; True: rejection
        # sampling (llama.cpp PR #27694).
        drafting.probabilistic = mode == "draft-probabilistic"
        drafting.mparams.path = str(draft)
        drafting.n_max, drafting.n_min, drafting.p_min = K, 0, 0.0      # always draft K
        for cpu in (drafting.cpuparams, drafting.cpuparams_batch):
            cpu.n_threads = threads
    elif mode == "ngram-simple":
        params.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        lookup = params.speculative.ngram_simple       # its default match of 12 rarely hits
        lookup.size_n, lookup.size_m, lookup.min_hits = NGRAM_MATCH, K, 1
    elif mode != "plain":
        raise ValueError(f"mode must be plain, {' or '.join(LLAMACPP_MODES)}, got {mode!r}")
    return xl.Server(params)


def _llamacpp_greedy(server, prompts, tokens: int,
                     sampled: bool = False) -> tuple[list[list[int]], int]:
    """Each prompt's greedy completion as llama.cpp's token ids (read from the reply's
    per-token log-probabilities, `n_probs` 1: its completion reply carries no ids otherwise),
    and the tokens it drafted over all of them. With `sampled`, at `SAMPLED` instead (top-p,
    then the temperature; every other stage neutral), prompt i with seed i."""
    outputs, drafted = [], 0
    for i, p in enumerate(prompts):
        law = (dict(temperature=SAMPLED.temperature, top_p=SAMPLED.top_p, top_k=0, min_p=0.0,
                    samplers=["top_p", "temperature"], seed=i) if sampled else
               dict(temperature=0.0, top_k=1, samplers=["top_k"], seed=0))
        reply = server.handle_completions({
            "prompt": list(map(int, p)), "n_predict": tokens, "repeat_penalty": 1.0,
            "dry_multiplier": 0.0, "n_probs": 1, "cache_prompt": False, "stream": False, **law})
        if isinstance(reply, str):
            reply = json.loads(reply)
        if "choices" not in reply:
            raise RuntimeError(f"llama.cpp refused the request: {reply}")
        outputs.append([int(t["id"]) for t in reply["choices"][0]["logprobs"]["content"]])
        drafted += reply.get("timings", {}).get("draft_n", 0) or 0
    return outputs, drafted


def llamacpp_rows(kinds: Sequence[str] = LLAMACPP_KINDS,
                  modes: Sequence[str] = LLAMACPP_MODES, *, tokens: int = NEW_TOKENS,
                  threads: int | None = None, sampled: bool = False,
                  progress: Callable[[Row], None] | None = None) -> list[Row]:
    """llama.cpp's greedy decoding of SmolLM2 (`fetch smollm2`'s Q4_1 GGUF, and F16 and Q8_0
    re-encodings of it), each of `modes` against its plain decoding: DRAFT_SIMPLE with the
    SmolLM2 draft (`weights/smollm2-draft` written as a float32 GGUF with SmolLM2's tokenizer,
    K drafts a step) and NGRAM_SIMPLE (the K tokens after an earlier match of the last
    NGRAM_MATCH tokens). `threads`: llama.cpp's threads (default: the cores this process may
    use; its threads wait for each other by spinning, so give it one where others run). With
    `sampled`, sampled at `SAMPLED` with prompt i's seed i (`_llamacpp_greedy`), where
    "draft-probabilistic" (rejection sampling) is a mode too."""
    version = engine_version()
    threads = threads or len(os.sched_getaffinity(0))
    directory = fetch("smollm2")
    source = source_gguf(directory)
    target = load(directory)
    prompts = prompt_ids(target)
    files = cache_root() / "gguf"
    files.mkdir(parents=True, exist_ok=True)
    draft = write_llama(load(WEIGHTS / PRESETS["smollm2"].draft),
                        files / "smollm2-draft.F32.gguf", like=source)
    rows = []
    for kind in kinds:
        path = reencode(source, kind, files)
        server = _llamacpp_server(path, "plain", None, threads)
        plain, _ = _llamacpp_greedy(server, prompts, tokens, sampled)
        for mode in modes:
            start = time.perf_counter()
            server = _llamacpp_server(path, mode, draft, threads)
            fast, drafted = _llamacpp_greedy(server, prompts, tokens, sampled)
            if not drafted:
                raise RuntimeError(f"llama.cpp {kind} {mode} drafted nothing")
            rows.append(row(f"llama.cpp {kind}" + (" T=0.7" if sampled else ""),
                            f"{mode} k={K}", plain, fast, tokens,
                            time.perf_counter() - start, version))
            if progress:
                progress(rows[-1])
    return rows


def transformers_rows(tokens: int = 16) -> list[Row]:
    """transformers' greedy decoding of the kit's pair (`testing.pair("close")`), assisted by
    its draft and by a draft of its own tokenizer (UAD, on `hf.retokenized`), against its plain
    greedy decoding, from the retokenized pair's prompt followed by each of the 36 two-token
    contexts (a tiny model: its rows say whether the mechanics keep greedy identity, not how a
    real model's rounding behaves). transformers samples across tokenizers only by TLI, which
    `check --transformers` judges; UAD runs only greedy, so this is its check."""
    import transformers    # optional: only these rows need it (and torch)

    retokenized = hf.retokenized(law.pair("close"))
    prompts = [list(retokenized.prompt) + [a, b] for a in range(6) for b in range(6)]
    plain = hf.greedy(retokenized, prompts, tokens)
    rows = []
    for method, label in (("assisted", "assisted k=2"), ("assisted-tokenizers", "uad k=2")):
        pair = law.pair("close") if method == "assisted" else retokenized
        start = time.perf_counter()
        fast = hf.greedy(pair, prompts, tokens, method)
        rows.append(row("transformers pair", label, plain, fast, tokens,
                        time.perf_counter() - start, transformers.__version__))
    return rows


HEADER = (f"{'engine':<18} {'method':<18} {'prompts':>7} {'diverge':>7} "
          f"{'median first':>12} {'time s':>7}  first divergence per prompt")


def line(r: Row) -> str:
    """One row of `table`."""
    median = "-" if r.median_first is None else f"{r.median_first:g}"
    firsts = " ".join("." if f is None else str(f) for f in r.first)
    return (f"{r.engine:<18} {r.method:<18} {len(r.first):>7} {r.diverged:>7} {median:>12} "
            f"{r.seconds:>7.1f}  {firsts}")


def heading(tokens: int = NEW_TOKENS, sampled: bool = False) -> str:
    """What `table` shows, and its column names."""
    kinds = ", ".join(f"{k} {len(v)}" for k, v in PROMPTS.items())
    if sampled:
        return "\n".join([
            f"Sampled identity on SmolLM2-135M-Instruct: {sum(map(len, PROMPTS.values()))} prompts "
            f"({kinds}), {tokens} new tokens each at temperature {SAMPLED.temperature} with top-p "
            f"{SAMPLED.top_p}, prompt i with seed i, one prompt a request; per prompt, the first "
            f"new token (0-based) where speculation under the coupled rule parts from "
            f"autoregressive sampling under the same seed, '.' where it never does.", "", HEADER])
    return "\n".join([f"Greedy identity on SmolLM2-135M-Instruct: {sum(map(len, PROMPTS.values()))}"
                      f" prompts ({kinds}), {tokens} new tokens each, one prompt a request; per "
                      f"prompt, the first new token (0-based) where speculation parts from the "
                      f"same engine's plain greedy decoding, '.' where it never does. (Rows of "
                      f"'transformers pair': the kit's tiny pair, its 36 two-token contexts.)", "",
                      HEADER])


def table(rows: Sequence[Row]) -> str:
    """The greedy-identity table: per engine and method, the prompts whose output parts from
    plain greedy decoding, the median first divergence among them, and each prompt's, in
    `PROMPTS`'s order."""
    return "\n".join([heading(rows[0].tokens if rows else NEW_TOKENS), *map(line, rows)])
