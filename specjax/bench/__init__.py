"""The benchmarks of `python -m specjax bench`: the timed prompt suite and context sweep (suite,
its tables and figures in report, the transformers peers in peers), the batch sweep (batch),
the oracle lookahead analysis (oracle), the versioned prompt suite (prompts) and what they share
(common), the cost of a settings change (settings) and of penalties and a bias (controls), and
the G-test harness of Theorem 1 (distribution). The package sits above the library: it may import the public API, checkpoint loading,
the command-line presets (specjax.presets) and, for the oracle and the timed forward calls, the
decoding loop and the forward pass; within specjax only the CLI imports it, and the core layers
(model, sampling, decoding) never do. The CLI needs add_arguments and run; importing the
package loads neither torch, transformers nor matplotlib (heavy optional dependencies, imported
where they are used).
"""

from __future__ import annotations

import argparse

from specjax.api import options
from specjax.api.methods import TYPES
from specjax.bench import batch, controls, oracle, settings, suite
from specjax.bench.common import CONSTANT, DYNAMIC_PREFIX
from specjax.decoding.lookahead import SCHEDULES
from specjax.presets import CLIError, add_model_arguments, enable_compile_cache, parse_mesh
from specjax.sampling.logits import SamplingParams
from specjax.sampling.tree import DynamicTree, parse_widths

ALL_METHODS = tuple(TYPES)
FULL = dict(ks="2,4,6", reps=5, warmup=1, max_new_tokens=128, contexts="50,500,1500")
QUICK = dict(ks="2", reps=1, warmup=0, max_new_tokens=16, contexts="none")
DESCRIPTION = suite.__doc__     # `bench --help`: what the suite measures and writes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bench` subcommand's arguments: the model arguments of specjax.presets and the bench's
    own; the parser's handler is `run`."""
    add_model_arguments(parser)
    parser.add_argument("--methods", default=",".join(ALL_METHODS),
                        help="comma-separated subset of " + ",".join(ALL_METHODS) +
                             " (autoregressive, the baseline, always runs)")
    parser.add_argument("--ks", help="comma-separated K values (default 2,4,6; --quick: 2)")
    parser.add_argument("--reps", type=int, help="timed runs per setting (default 5; --quick: 1)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 1; --quick: 0)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="tokens per run (default 128; --quick: 16); lowered for a prompt "
                             "that would not fit the context window")
    parser.add_argument("--contexts",
                        help="comma-separated prompt lengths in tokens for the context sweep, "
                             "or none (default 50,500,1500; --quick: none)")
    options.add(parser, "temperature", "top_p", "seed",
                seed=dict(help="timed run i uses seed + i"))
    parser.add_argument("--trees", nargs="+", metavar="WIDTHS",
                        help="also run token trees, each the full tree of these widths per depth "
                             "(e.g. --trees 2,2,1 3,2,1), for speculative, ngram, medusa and "
                             "eagle (which always run their heads' or drafter's own tree too); "
                             "default none")
    parser.add_argument("--dynamic-trees", nargs="+", metavar="DEPTH,TOP_K,TOTAL",
                        help="also run EAGLE-2 dynamic trees for eagle (e.g. --dynamic-trees "
                             "4,4,8 5,8,16); default none")
    parser.add_argument("--k-schedules", default="constant", metavar="SCHEDULES",
                        help="comma-separated lookahead schedules to run for each K (constant, "
                             "heuristic, confidence; default constant): K is the most a step "
                             "drafts; n-gram runs constant and heuristic only")
    options.add(parser, "confidence_threshold", confidence_threshold=dict(default=0.4))
    parser.add_argument("--oracle", action="store_true",
                        help="instead of the suite's timings, the oracle lookahead analysis "
                             "(specjax.bench.oracle): greedy, the draft's oracle, constant and "
                             "dynamic draft lengths per step, figures and call counts")
    parser.add_argument("--batch", metavar="SIZES",
                        help="comma-separated batch sizes, e.g. 1,8,32: instead of the suite's "
                             "timings, the batch sweep (specjax.bench.batch): B suite prompts in "
                             "one generate call per method and K, against transformers")
    parser.add_argument("--settings", action="store_true",
                        help="instead of the suite's timings, the time to the first token when "
                             "a call changes its sampling settings (specjax.bench.settings): "
                             "the same compiled program, or a recompile")
    parser.add_argument("--controls", action="store_true",
                        help="instead of the suite's timings, each method with and without "
                             "penalties and a logit bias, in turn (specjax.bench.controls)")
    options.add(parser, "max_ngram")
    parser.add_argument("--quick", action="store_true",
                        help="one short prompt per category, K=2, 1 run, 16 tokens, no context "
                             "sweep, no peers")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                        help="also run transformers (default: when installed; off with --quick)")
    parser.add_argument("--out", default="bench-out", help="output directory (default bench-out)")
    parser.set_defaults(run=run)


def run(args) -> int:
    """`python -m specjax bench`: the oracle analysis with --oracle, the batch sweep with
    --batch, the settings-change latency with --settings, the suite otherwise."""
    chosen = parse_settings(args)
    enable_compile_cache()
    if args.oracle:
        return oracle.run(args, chosen)
    if chosen["batch"]:
        return batch.run(args, chosen)
    if args.settings:
        return settings.run(args, chosen)
    if args.controls:
        return controls.run(args, chosen)
    return suite.run(args, chosen)


def parse_settings(args) -> dict:
    """The bench's settings from the parsed arguments: --quick's or the full run's defaults
    where an option is not given, each value checked (a CLIError naming a bad one)."""
    base = QUICK if args.quick else FULL
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or any(m not in ALL_METHODS for m in methods):
        raise CLIError(f"--methods must be a comma-separated subset of {','.join(ALL_METHODS)}, "
                       f"got {args.methods!r}")
    contexts_text = base["contexts"] if args.contexts is None else args.contexts
    contexts = ([] if contexts_text.strip().lower() == "none"
                else positive_ints("--contexts", contexts_text))
    pick = lambda name: base[name] if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    settings = dict(methods=[m for m in ALL_METHODS if m in methods or m == "autoregressive"],
                    ks=positive_ints("--ks", pick("ks")), reps=pick("reps"),
                    warmup=pick("warmup"), max_new_tokens=pick("max_new_tokens"),
                    contexts=contexts, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed,
                    max_ngram=args.max_ngram, quick=args.quick, trees=_trees(args.trees),
                    dynamic_trees=_dynamic_trees(args.dynamic_trees),
                    k_schedules=_schedules(args.k_schedules),
                    confidence_threshold=args.confidence_threshold,
                    batch=positive_ints("--batch", args.batch) if args.batch else [],
                    mesh=parse_mesh(args.mesh), drafter_dtype=args.drafter_dtype,
                    peers=args.peers if args.peers is not None else not args.quick)
    for name, minimum in (("reps", 1), ("warmup", 0), ("max_new_tokens", 1), ("max_ngram", 1),
                          ("seed", 0)):
        if settings[name] < minimum:
            raise CLIError(f"--{name.replace('_', '-')} must be >= {minimum}, got {settings[name]}")
    if not 0.0 <= settings["confidence_threshold"] <= 1.0:
        raise CLIError(f"--confidence-threshold must be in [0, 1], got "
                       f"{settings['confidence_threshold']}")
    runs = [name for name, given in (("--batch", settings["batch"]), ("--oracle", args.oracle),
                                     ("--settings", args.settings)) if given]
    if len(runs) > 1:
        raise CLIError(f"{runs[0]} and {runs[1]} are two different runs; pick one")
    if settings["mesh"] and args.settings:
        raise CLIError("--mesh does not apply to --settings (one device)")
    if settings["mesh"] and args.oracle:
        raise CLIError("--mesh does not apply to --oracle (it counts calls, on one device)")
    if args.drafter_dtype and (args.oracle or args.settings):
        raise CLIError(f"--drafter-dtype does not apply to {runs[0]} (its draft runs in --dtype)")
    if settings["dynamic_trees"] and "eagle" not in settings["methods"]:
        raise CLIError("--dynamic-trees applies when --methods includes eagle")
    ignored = [name for name, given in (("--trees", settings["trees"]),
                                        ("--dynamic-trees", settings["dynamic_trees"]),
                                        ("--k-schedules", settings["k_schedules"] != [CONSTANT]),
                                        ("--contexts", args.contexts is not None)) if given]
    if settings["batch"] and ignored:
        raise CLIError(f"{ignored[0]} does not apply to --batch (the batch sweep runs chains of "
                       "constant K, without the context sweep)")
    if settings["seed"] >= 2**31:
        raise CLIError(f"--seed must be below 2^31, got {settings['seed']}")
    # A ValueError naming a bad temperature or top-p.
    SamplingParams(temperature=args.temperature, top_p=args.top_p)
    if args.top_p < 1.0 and args.temperature == 0:
        raise CLIError("--top-p applies when --temperature > 0 (greedy decoding ignores it)")
    if args.top_p < 1.0 and (args.oracle or args.settings):
        raise CLIError("--top-p does not apply to --oracle or --settings")
    return settings


def _schedules(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in SCHEDULES for n in names):
        raise CLIError(f"--k-schedules must be a comma-separated subset of "
                       f"{','.join(SCHEDULES)}, got {text!r}")
    return [n for n in SCHEDULES if n in names]


def _trees(texts: list[str] | None) -> list[str]:
    """--trees: each validated as a full tree's widths, kept as the canonical text "3,2,1"."""
    return [",".join(map(str, parse_widths(t).full_widths())) for t in texts or []]


def _dynamic_trees(texts: list[str] | None) -> list[str]:
    """--dynamic-trees: each validated, kept as the row's tree label "dynamic 4,4,8"."""
    trees = [DynamicTree.parse(t) for t in texts or []]
    return [f"{DYNAMIC_PREFIX}{t.depth},{t.top_k},{t.total_tokens}" for t in trees]


def positive_ints(option: str, text: str) -> list[int]:
    """"2,4,6" -> [2, 4, 6]: sorted, without repeats; a CLIError naming the option and the text
    for anything else."""
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise CLIError(f"{option} must be comma-separated positive integers, got {text!r}")
    return values
