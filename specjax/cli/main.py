"""`python -m specjax`: the command line.

    python -m specjax generate --prompt "def fibonacci(n):"     # SmolLM2, speculative, greedy
    python -m specjax generate --method all -n 128 --prompt-file snippet.py
    python -m specjax generate --preset smollm2 --chat --method ngram --prompt "Tell me a joke"
    python -m specjax bench --quick
    python -m specjax fetch smollm2
    python -m specjax check                                      # the lossless check's catalogue
    python -m specjax train eagle3 --target DIR --prompts FILE --out DIR   # a drafter

`generate --method` picks autoregressive, speculative (a draft model), ngram (prompt lookup),
medusa, eagle or dflash (`specjax.api.methods.CLASSES`), or all of them, compared.

Errors a user can cause (paths, weights, tokenizers, numbers, prompts) print one line
`specjax: error: ...` on stderr and exit with status 2; Ctrl-C exits with status 130.

Compiled programs are kept in JAX's persistent compilation cache (<cache>/xla, where <cache> is
$SPECJAX_CACHE or ~/.cache/specjax), so a second run with the same settings starts quickly.
SPECJAX_COMPILE_CACHE=DIR moves it, SPECJAX_COMPILE_CACHE=off turns it off. The CPU kernels
(`specjax.kernels`) are on unless --no-kernels or SPECJAX_KERNELS=off.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from specjax import bench
from specjax.api.checks import KERNELS_ENV
from specjax.cli import check
from specjax.cli import train as train_cli
from specjax.cli.generate import GENERATE_HELP, add_generate_arguments
from specjax.cli.interrupt import Interrupt
from specjax.io.fetch import FetchError, fetch

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


# -- Entry point --------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # (the model cards give it)
    kernels_before = os.environ.get(KERNELS_ENV)
    if getattr(args, "no_kernels", False):
        # The run option's default (`specjax.generate(kernels=)`), for every call of the command.
        os.environ[KERNELS_ENV] = "off"
    Interrupt.seen = False
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, Interrupt.handler) if in_main_thread else None
    previous_hook, sys.unraisablehook = sys.unraisablehook, Interrupt.unraisable
    try:
        code = args.run(args)
        Interrupt.check()
        return code
    except KeyboardInterrupt:
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[0m")   # a colour may be open mid-stream
        _flush_quietly()
        print("\nspecjax: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `specjax generate | head`: stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, FetchError, OSError) as e:
        # GenerationError, CheckpointError, ConfigError, ChatTemplateError and CLIError are all
        # ValueErrors; OSError covers unreadable files.
        _flush_quietly()
        print(f"specjax: error: {one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if kernels_before is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = kernels_before
        sys.unraisablehook = previous_hook
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if isinstance(error, (ValueError, FetchError)) else f"{type(error).__name__}: {text}"


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except OSError:
        pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specjax", description="GPT-2 / Llama inference in JAX "
                                     "with exact speculative decoding: a draft model, n-gram "
                                     "lookup, Medusa, EAGLE and DFlash.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate_arguments(commands.add_parser(
        "generate", help="generate text with one method or compare all six",
        description=GENERATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter))
    bench.add_arguments(commands.add_parser(
        "bench", help="benchmark the methods on a fixed prompt suite",
        description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter))
    for name in ("generate", "bench"):
        commands.choices[name].add_argument(
            "--no-kernels", action="store_true",
            help="use XLA's products and attention instead of the CPU kernels (as "
                 f"{KERNELS_ENV}=off does)")
    check.add_arguments(commands.add_parser(
        "check", help="run the lossless check's catalogue of samplers, print the verdicts "
                      "(--identity: greedy identity with and without speculation on SmolLM2)",
        description=check.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter))
    train_cli.add_arguments(commands.add_parser(
        "train", help="train a drafter for a target (needs optax: pip install specjax[train])",
        description=train_cli.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter))
    fetch = commands.add_parser("fetch", help="download a real checkpoint, print its directory")
    fetch.add_argument("name", help="smollm2, or a Hugging Face repo id org/name")
    fetch.add_argument("--cache-dir", help="default: $SPECJAX_CACHE or ~/.cache/specjax")
    fetch.set_defaults(run=_run_fetch)
    return parser


def _run_fetch(args) -> int:

    print(fetch(args.name, args.cache_dir))
    return 0


