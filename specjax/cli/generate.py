"""`python -m specjax generate`: stream one method's text, or compare all of them, with the
summary line, the comparison table, --json and --trace. Here: the command's help, its flags (one
function per group: the prompt, decoding, trees, the controls, the output) and its run; what it
reads from the flags is `generate_inputs`, what it reports `generate_report`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from specjax.api import options
from specjax.api.checks import check_compatible
from specjax.api.explain import explain, format_steps
from specjax.api.generate import prepare, stream
from specjax.api.methods import TYPES
from specjax.cli.generate_inputs import (check_numbers, for_method, load_models, method_object,
                                         prompt_ids, read_prompt, read_tree, sampling_of)
from specjax.cli.generate_report import (comparison_table, json_report, prefill_line,
                                         prefill_seconds, summary_line, timed_generate,
                                         why_slower)
from specjax.cli.interrupt import Interrupt
from specjax.mesh import plan
from specjax.presets import (
    GENERATE_DEFAULT_HELP,
    TINY_NOTE,
    CLIError,
    add_model_arguments,
    enable_compile_cache,
    generate_preset,
    make_mesh,
    parse_mesh,
)

GENERATE_HELP = """\
Generates a continuation of the prompt with one decoding method (autoregressive, speculative,
ngram, medusa, eagle or dflash), or with all of them, then compares them. Text is streamed as it is produced by the Python step loop,
which gives the same tokens as the compiled loop; with --show-acceptance, drafted tokens that
the target accepted are green and tokens the target produced itself (the correction or bonus
token of each step, or every token of autoregressive decoding) are in the default colour.

The summary's tokens/s is measured after streaming, with `specjax.generate` (the whole loop
compiled as one program): one untimed run (it compiles), then the median of 3 timed runs, compile
time reported apart. The prompt's prefill is timed the same way (an autoregressive run that makes
one token), and "decode" is the tokens after the first over the time after the prefill. With
--method all, a method slower than autoregressive decoding on the prompt gets a line saying
why: its tokens per target call (and acceptance) against what its step costs, in
autoregressive steps.

With no --preset or --target, generate runs SmolLM2-135M-Instruct with its draft, heads and
drafter (the "smollm2" preset, fetched on first use; $SPECJAX_PRESET names another preset).
When it cannot be fetched, or with --preset tiny-llama or tiny-gpt2, it runs a tiny embedded
pair, with a note that the tiny pair shows correctness, not speed.
Temperature defaults to 0 (greedy), so a run is reproducible and every method gives the same
text; with --temperature > 0 each method still samples exactly from the target's distribution,
and with --coupled as well every method gives autoregressive decoding's text for the same seed
(the coupled rule: `specjax.sampling.coupled`).

--json prints one object instead of streaming:
  {"target", "target_path", "draft", "draft_path" (null without speculative), "prompt",
   "prompt_tokens", "prefill_s", "settings": {"method", "k", "max_new_tokens", "temperature",
   "top_k", "top_p", "min_p", "seed", "coupled", "max_ngram", "min_ngram", "repetition_penalty",
   "presence_penalty", "frequency_penalty", "logit_bias", "min_tokens", "logprobs", "stop",
   "regex", "json_schema", "tree" (a list of
   paths, {"dynamic": [depth, top_k, total_tokens]} or null),
   "candidates", "chat", "dtype"},
   "results": [{"method", "text", "tokens", "finish_reason" ("eos", "stop", "length" or
                "constraint": `specjax.api.results.FINISH_REASONS`),
                "speedup_vs_autoregressive", "logprobs" (with
                --logprobs N: one {"token", "logprob", "top": [[id, logprob], ...]} a new token,
                a logprob of -inf as null; else null),
                "stats": {"method", "rows", "new_tokens", "target_calls", "draft_calls",
                          "drafted", "accepted", "tree_size", "acceptance_rate",
                          "tokens_per_target_call", "accepted_histogram",
                          "tokens_per_second", "compile_s", "run_s", "timed_runs",
                          "decode_tokens_per_second"},
                "row_stats": [{"new_tokens", "target_calls", "draft_calls", "drafted",
                               "accepted", "accepted_histogram", "tokens_per_target_call",
                               "acceptance_by_position"}]}]}
"""

GREEN, RESET, DIM = "\x1b[32m", "\x1b[0m", "\x1b[2m"


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's flags, then the command's own, group by group."""
    add_model_arguments(parser, GENERATE_DEFAULT_HELP)
    prompt_arguments(parser)
    decoding_arguments(parser)
    control_arguments(parser)
    output_arguments(parser)
    parser.set_defaults(run=run_generate)


METHOD_CHOICES = (*TYPES, "all")


def prompt_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the prompt comes from, and the chat template."""
    p = parser.add_argument_group("prompt")
    p.add_argument("--prompt", help="the prompt text (with no prompt and stdin a terminal, a "
                                    "demo prompt; otherwise stdin is read)")
    p.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a file")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user turn in the target's chat template")


def decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The method, how many tokens it drafts and makes, and the sampling."""
    d = parser.add_argument_group("decoding")
    d.add_argument("--method", choices=METHOD_CHOICES, default="speculative",
                   help="default: speculative; all runs every method and compares them")
    d.add_argument("-n", "--max-new-tokens", type=int, default=64, help="default: 64")
    d.add_argument("-k", type=int, default=None,
                   help="tokens drafted per step (speculative, ngram; default: 4, and with "
                        "no -k, --k-schedule or tree each method's measured best: speculative "
                        "at most 4 on the confidence schedule, ngram 2, eagle a chain of 2 "
                        "below float32 and its drafter's tree in float32); for "
                        "dflash, how many of the block's drafts a step verifies (default: all)")
    d.add_argument("--k-schedule", default=None, metavar="SCHEDULE",
                   help="how many of the k tokens each step drafts: constant (k; the default "
                        "once -k or a tree is given), "
                        "heuristic (per row: + 2 after a fully accepted step, - 1 otherwise; "
                        "speculative, ngram) or confidence (stop after a draft token whose "
                        "probability is below --confidence-threshold; speculative)")
    d.add_argument("--k-start", type=int, metavar="N",
                   help="the heuristic schedule's first length (default: min(5, k))")
    options.add(d, "confidence_threshold", "temperature")
    d.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    options.add(d, "top_p", top_p=dict(help="in (0, 1]; 1 = off (default)"))
    d.add_argument("--min-p", type=float, default=0.0,
                   help="in [0, 1]: keep tokens at least this times as likely as the most "
                        "likely one; 0 = off (default)")
    options.add(d, "seed", "max_ngram")
    d.add_argument("--coupled", action="store_true",
                   help="verify by the coupled rule: each token is the target's own draw at its "
                        "position, so every method gives autoregressive decoding's text for the "
                        "same --seed at any temperature (default: Algorithm 2, which keeps "
                        "drafts a little more often)")
    d.add_argument("--min-ngram", type=int, default=1, help="shortest n-gram looked up (default 1)")
    tree_arguments(d)


def tree_arguments(d) -> None:
    """Token trees, and how a tree's candidates are filled (in the decoding group `d`)."""
    d.add_argument("--tree", metavar="WIDTHS",
                   help="verify a token tree instead of a chain of k (speculative, ngram; for "
                        "medusa and eagle, instead of the heads' or the drafter's own tree): the "
                        "full tree of these widths per depth, e.g. 3,2,1")
    d.add_argument("--tree-file", metavar="PATH",
                   help="a token tree as a JSON list of paths of child ranks (Medusa's "
                        "'choices'), e.g. [[0], [1], [0, 0]]")
    d.add_argument("--dynamic-tree", metavar="DEPTH,TOP_K,TOTAL",
                   help="eagle: EAGLE-2's dynamic tree instead of a static one: expand the "
                        "TOP_K likeliest children of the TOP_K best nodes per depth, DEPTH deep, "
                        "and verify the TOTAL best nodes, e.g. 4,4,8")
    d.add_argument("--candidates", choices=("top", "distinct", "iid"),
                   help="how the draft, the heads or the drafter fill a tree: the top tokens (default at "
                        "temperature 0), sampled without replacement (default otherwise) or "
                        "i.i.d.")


def control_arguments(parser: argparse.ArgumentParser) -> None:
    """Penalties, bias, a minimum length, constraints and stop strings."""
    c = parser.add_argument_group(
        "controls", "penalties, bias and a minimum length, applied to the target's logits "
        "before the temperature; every method stays exact under them")
    c.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="> 0: divide the positive logits, multiply the negative ones, of the "
                        "tokens in the prompt or the output; 1 = off (default)")
    c.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                   help="in [-2, 2]: subtract from the logit of a token generated at least "
                        "once; 0 = off (default)")
    c.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                   help="in [-2, 2]: subtract per time a token was generated; 0 = off "
                        "(default)")
    c.add_argument("--logit-bias", action="append", default=[], metavar="ID:BIAS",
                   help="add BIAS, in [-100, 100], to token ID's logit (repeatable)")
    c.add_argument("--min-tokens", type=int, default=0, metavar="N",
                   help="no EOS before N new tokens (default 0)")
    c.add_argument("--regex", metavar="PATTERN",
                   help="constrain the output to match this regex in full (outlines-core)")
    c.add_argument("--json-schema", metavar="FILE",
                   help="constrain the output to a JSON document valid under this schema")
    c.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="end the output just before the first TEXT in it, across token "
                        "boundaries (repeatable)")


def output_arguments(parser: argparse.ArgumentParser) -> None:
    """What is printed: colours, JSON, log-probabilities or the trace."""
    o = parser.add_argument_group("output")
    o.add_argument("--show-acceptance", action=argparse.BooleanOptionalAction, default=None,
                   help="colour drafted vs target tokens (default: on when stdout is a terminal "
                        "and NO_COLOR is unset)")
    o.add_argument("--json", action="store_true", help="print one JSON object, no streaming")
    o.add_argument("--logprobs", type=int, default=0, metavar="N",
                   help="with --json: each new token's log-probability under the target's "
                        "distribution and the N likeliest tokens' (at most 20)")
    o.add_argument("--trace", type=int, metavar="STEPS",
                   help="instead of the text, print the first STEPS verify steps: each drafted "
                        "token with p, q, the uniform draw and the verdict, the residual's top "
                        "entries and the emitted token; with a tree (any tree, medusa, "
                        "eagle) each sibling test of the walk")


def run_generate(args) -> int:
    """Every check and load before the first token, then the trace, the --json report or each
    method's text streamed, timed and compared."""
    methods = list(TYPES) if args.method == "all" else [args.method]
    # The method's options, given to each method's object below (`for_method`); the sampling
    # and the run's options are the same for every method.
    options = dict(k=args.k, max_ngram=args.max_ngram, min_ngram=args.min_ngram,
                   tree=read_tree(args, methods), candidates=args.candidates,
                   k_schedule=args.k_schedule, k_start=args.k_start,
                   confidence_threshold=args.confidence_threshold,
                   drafter_dtype=args.drafter_dtype)
    run = dict(max_new_tokens=args.max_new_tokens, seed=args.seed, coupled=args.coupled)
    check_numbers(methods, options, run)
    sampling = sampling_of(args)
    mesh_shape = parse_mesh(args.mesh)
    _check_trace(args, methods)
    prompt = read_prompt(args)
    enable_compile_cache()
    mesh = make_mesh(mesh_shape)
    note = _preset_note(args)
    target, draft, beside = load_models(args, methods, mesh)
    if mesh is not None:
        print(f"specjax: mesh data={mesh_shape[0]} x model={mesh_shape[1]}: "
              f"{plan(target.config, mesh)}", file=sys.stderr)
    if draft is not None:
        check_compatible(target, draft)
    if len(methods) > 1:           # a method whose weights were not found is skipped (a note)
        methods = [m for m in methods if not TYPES[m].loads or beside.get(m) is not None]
    ids = prompt_ids(target, prompt, args.chat)
    objects = {m: method_object(m, for_method(m, options, beside, len(methods) > 1, args.dtype))
               for m in methods}
    run["mesh"] = mesh
    # Every error before the first token is printed; each method's request is checked and
    # placed once, then streamed and timed.
    requests = {m: prepare(target, [ids], objects[m], sampling, **run) for m in methods}
    if note:
        print(f"specjax: note: {note}", file=sys.stderr)

    if args.trace is not None:
        steps = explain(target, ids, objects[methods[0]], sampling, steps=args.trace, **run)
        print(format_steps(steps, target.tokenizer))
        return 0
    if args.json:
        report = json_report(target, draft, prompt, ids, requests, objects,
                             dict(options, **run, **dataclasses.asdict(sampling)), args)
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 0
    _stream_and_compare(args, target, ids, methods, requests, sampling, run)
    return 0


def _check_trace(args, methods: list[str]) -> None:
    """--trace: a number of steps, of one method."""
    if args.trace is not None and args.trace < 1:
        raise CLIError(f"--trace must be an integer >= 1, got {args.trace}")
    if args.trace is not None and len(methods) != 1:
        raise CLIError("--trace explains one method; pick --method speculative, ngram, "
                       "medusa or eagle")


def _preset_note(args) -> str | None:
    """The preset that runs (set on `args`), and the note said about it, if any."""
    args.preset, note = generate_preset(args)
    if note is None and args.preset and args.preset.startswith("tiny-"):
        note = TINY_NOTE
    return note


def _stream_and_compare(args, target, ids: list[int], methods: list[str], requests, sampling,
                        run: dict) -> None:
    """Each method's text streamed, then timed with the compiled loop: its summary line, and
    with several methods the comparison table and why any is slower."""
    show = args.show_acceptance
    if show is None:
        show = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    rows = []
    runs = 3
    prefill_s = prefill_seconds(target, ids, sampling, run, runs)
    for method in methods:
        if len(methods) > 1:
            print(f"{DIM if show else ''}--- {method} ---{RESET if show else ''}", flush=True)
        streamed = stream_text(target.tokenizer, requests[method], show)
        result, runs = timed_generate(requests[method])
        if result.tokens[0] != streamed:
            print(f"specjax: warning: {method}: the streamed tokens differ from the compiled "
                  "loop's", file=sys.stderr)
        rows.append((method, result.stats, runs))
        print(summary_line(result.stats, runs, prefill_s), flush=True)
    print(prefill_line(len(ids), prefill_s, runs))
    if len(methods) > 1:
        print()
        print(comparison_table(rows, prefill_s))
        base = next((s for m, s, _ in rows if m == "autoregressive"), None)
        for line in filter(None, (why_slower(s, base) for _, s, _ in rows)):
            print(line)
    if show and any(m != "autoregressive" for m in methods):
        print(f"{GREEN}green{RESET}: drafted tokens the target accepted; default colour: tokens "
              "the target produced")


class TextPrinter:
    """Prints tokens as text as they arrive. Decoding the whole output so far and printing the
    new suffix handles tokens that hold only part of a UTF-8 character (byte-level BPE): text
    that ends in an incomplete character is held back until the next token completes it."""

    def __init__(self, tokenizer, out, colour: bool):
        self.tokenizer, self.out, self.colour = tokenizer, out, colour
        self.ids: list[int] = []
        self.printed = ""
        self.green = False           # inside a green (drafted) run of text

    def add(self, tokens: list[int], from_draft: list[bool]) -> None:
        for token, drafted in zip(tokens, from_draft):
            self.ids.append(token)
            text = self.tokenizer.decode(self.ids)
            if not text.endswith("\ufffd"):
                self._write(text, drafted)
        self.out.flush()

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids) if self.ids else ""
        self._write(text, False)
        if self.green:
            self.out.write(RESET)
        if not (text or "\n").endswith("\n"):
            self.out.write("\n")
        self.out.flush()

    def _write(self, text: str, drafted: bool) -> None:
        new = text[len(os.path.commonprefix([text, self.printed])):]
        if new and self.colour and drafted != self.green:
            self.out.write(GREEN if drafted else RESET)
            self.green = drafted
        self.out.write(new)
        self.printed = text


def stream_text(tokenizer, request, colour: bool) -> list[int]:
    """Streams one prepared request's output (one row) to stdout; returns the new tokens."""
    method = request.spec.method.name
    status = sys.stderr.isatty()
    if status:
        sys.stderr.write(f"(compiling {method}...)")
        sys.stderr.flush()
    printer = TextPrinter(tokenizer, sys.stdout, colour)
    for step_tokens, result in stream(request):
        Interrupt.check()
        if status:
            sys.stderr.write("\r\x1b[K")
            status = False
        if result is not None:
            break
        new = step_tokens[0]
        # Each speculative / n-gram step appends the accepted drafts and then one token of the
        # target's own (the residual sample or the bonus). A step cut short by EOS or
        # max_new_tokens may end on a draft token; it is shown as the target's.
        printer.add(new, [method != "autoregressive" and i < len(new) - 1 for i in range(len(new))])
    printer.finish()
    return printer.ids
