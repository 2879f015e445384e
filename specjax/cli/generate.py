"""`python -m specjax generate`: stream one method's text, or compare all of them, with the
summary line, the comparison table, --json and --trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

from specjax.api.explain import explain, format_steps

from specjax.api import options
from specjax.api.checks import GenerationError, check_compatible, check_int, encode_prompts
from specjax.api.options import flag
from specjax.api.generate import generate, prepare, stream
from specjax.api.methods import TYPES, build
from specjax.decoding.methods import METHODS
from specjax.cli.interrupt import Interrupt
from specjax.decoding.methods import REGISTRY
from specjax.io import chat as chat_template
from specjax.io.checkpoint import load
from specjax.io.sidecar import tree_to_json
from specjax.mesh import plan
from specjax.presets import (
    DRAFTER_KINDS,
    GENERATE_DEFAULT_HELP,
    TINY_NOTE,
    CLIError,
    add_model_arguments,
    drafter_path,
    enable_compile_cache,
    generate_preset,
    heads_path,
    load_drafters,
    load_model,
    make_mesh,
    model_paths,
    parse_mesh,
)
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, parse_widths

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
text; with --temperature > 0 each method still samples exactly from the target's distribution.

--json prints one object instead of streaming:
  {"target", "target_path", "draft", "draft_path" (null without speculative), "prompt",
   "prompt_tokens", "prefill_s", "settings": {"method", "k", "max_new_tokens", "temperature",
   "top_k", "top_p", "min_p", "seed", "max_ngram", "min_ngram", "repetition_penalty",
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

METHOD_CHOICES = (*METHODS, "all")
DEMO_PROMPT = "import os\nimport sys\n\n\ndef read_lines(path):\n    lines = []\n"   # bench --quick's
GREEN, RESET, DIM = "\x1b[32m", "\x1b[0m", "\x1b[2m"


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, GENERATE_DEFAULT_HELP)
    p = parser.add_argument_group("prompt")
    p.add_argument("--prompt", help="the prompt text (with no prompt and stdin a terminal, a "
                                    "demo prompt; otherwise stdin is read)")
    p.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a file")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user turn in the target's chat template")
    d = parser.add_argument_group("decoding")
    d.add_argument("--method", choices=METHOD_CHOICES, default="speculative",
                   help="default: speculative; all runs every method and compares them")
    d.add_argument("-n", "--max-new-tokens", type=int, default=64, help="default: 64")
    d.add_argument("-k", type=int, default=None,
                   help="tokens drafted per step (speculative, ngram); default: 4; for dflash, "
                        "how many of the block's drafts a step verifies (default: all)")
    d.add_argument("--k-schedule", default="constant", metavar="SCHEDULE",
                   help="how many of the k tokens each step drafts: constant (k, the default), "
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
    d.add_argument("--min-ngram", type=int, default=1, help="shortest n-gram looked up (default 1)")
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
    parser.set_defaults(run=run_generate)


def run_generate(args) -> int:

    methods = list(METHODS) if args.method == "all" else [args.method]
    # The method's options, given to each method's object below (`for_method`); the sampling
    # and the run's options are the same for every method.
    options = dict(k=args.k, max_ngram=args.max_ngram, min_ngram=args.min_ngram,
                   tree=read_tree(args, methods), candidates=args.candidates,
                   k_schedule=args.k_schedule, k_start=args.k_start,
                   confidence_threshold=args.confidence_threshold,
                   drafter_dtype=args.drafter_dtype)
    run = dict(max_new_tokens=args.max_new_tokens, seed=args.seed)
    check_numbers(methods, options, run)
    sampling = sampling_of(args)
    mesh_shape = parse_mesh(args.mesh)
    if args.trace is not None and args.trace < 1:
        raise CLIError(f"--trace must be an integer >= 1, got {args.trace}")
    if args.trace is not None and len(methods) != 1:
        raise CLIError("--trace explains one method; pick --method speculative, ngram, "
                       "medusa or eagle")
    prompt = read_prompt(args)
    enable_compile_cache()
    mesh = make_mesh(mesh_shape)
    args.preset, note = generate_preset(args)
    if note is None and args.preset and args.preset.startswith("tiny-"):
        note = TINY_NOTE
    target, draft, beside = load_models(args, methods, mesh)
    if mesh is not None:

        print(f"specjax: mesh data={mesh_shape[0]} x model={mesh_shape[1]}: "
              f"{plan(target.config, mesh)}", file=sys.stderr)
    if draft is not None:
        check_compatible(target, draft)
    if len(methods) > 1:           # a method whose weights were not found is skipped (a note)
        methods = [m for m in methods if not REGISTRY[m].loads or beside.get(m) is not None]
    ids = prompt_ids(target, prompt, args.chat)
    objects = {m: method_object(m, for_method(m, options, beside, len(methods) > 1))
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
    return 0


def check_numbers(methods: list[str], options: dict, run: dict) -> None:
    """Rejects the method's bad numbers before any model is loaded (the objects check them
    again when made; the sampling's are checked as its `SamplingParams` is made)."""
    check_int("max_new_tokens (-n)", run["max_new_tokens"], 1)
    if set(methods) - {"autoregressive"} and options["k"] is not None:
        check_int("k (-k)", options["k"], 1)
    if "ngram" in methods:
        check_int("--min-ngram", options["min_ngram"], 1)
        check_int("--max-ngram", options["max_ngram"], options["min_ngram"])
    if not 0 <= run["seed"] < 2**32:
        raise GenerationError(f"seed must be an integer in [0, 2^32), got {run['seed']}")
    threshold = options["confidence_threshold"]
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise GenerationError(f"--confidence-threshold must be in [0, 1], got {threshold}")


def sampling_of(args) -> SamplingParams:
    """The sampling and the controls of the flags, as one `SamplingParams` (checked as it is
    made: a bad value exits 2 naming it)."""
    if args.logprobs and not args.json:
        raise GenerationError("--logprobs shows in --json output: add --json")
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty,
                          logit_bias=parse_logit_bias(args.logit_bias),
                          min_tokens=args.min_tokens, logprobs=args.logprobs, stop=args.stop,
                          regex=args.regex, json_schema=read_schema(args.json_schema))


def read_schema(path: str | None) -> dict | None:
    """--json-schema FILE: the schema, read and parsed (None without the option)."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise CLIError(f"--json-schema: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise CLIError(f"--json-schema: {path} is not JSON ({e})") from None


def parse_logit_bias(entries: list[str]) -> dict | None:
    """--logit-bias ID:BIAS, given any number of times -> {id: bias} (None when not given)."""
    bias = {}
    for entry in entries:
        token, _, value = entry.partition(":")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise CLIError(f"--logit-bias takes ID:BIAS, such as 42:-5, got {entry!r}") from None
    return bias or None


def read_tree(args, methods: list[str]):
    """The `Tree` of --tree or --tree-file, or None."""

    if sum(x is not None for x in (args.tree, args.tree_file, args.dynamic_tree)) > 1:
        raise CLIError("give one of --tree, --tree-file and --dynamic-tree")
    if args.dynamic_tree is not None:
        if methods != ["eagle"]:
            raise CLIError("--dynamic-tree needs --method eagle")
        return DynamicTree.parse(args.dynamic_tree)
    if args.tree is None and not args.tree_file:
        if args.candidates is not None:
            raise CLIError("--candidates applies to token trees; give --tree or --tree-file")
        return None
    if methods == ["autoregressive"]:
        raise CLIError("--tree needs --method speculative, ngram, medusa, eagle or all")
    return parse_widths(args.tree) if args.tree is not None else Tree.from_json(args.tree_file)


def for_method(method: str, options: dict, beside: dict, several: bool) -> dict:
    """The options for `method`'s object, with the weights it loads (`beside`, by method)
    under its keyword. With --method all (`several`), each method gets the shared options it
    takes (`Record.under_all`) and its own defaults for the rest; given for one method, an
    option that does not apply to it stays, for `method_object` to refuse."""
    entry = REGISTRY[method]
    options = dict(options)
    if entry.loads:
        options[entry.loads] = beside.get(method)
    if several:
        options.update({name: None for name in SHARED if name not in entry.under_all})
        if options["k_schedule"] not in entry.schedules:
            options.update(k_schedule="constant", k_start=None, confidence_threshold=None)
    return options


# The keywords under which the methods take what they load (the draft, heads, a drafter).
WEIGHTS = {m.loads for m in REGISTRY.values() if m.loads}


def method_object(method: str, given: dict):
    """`method`'s object from its options (`methods.build`; those at None or at the defaults
    the flags share take the object's own); an option given that the method does not take is
    an error naming its flag."""
    shared_defaults = {"k_schedule": "constant", "max_ngram": 3, "min_ngram": 1}
    fields = {f.name for f in dataclasses.fields(TYPES[method])}
    for name, value in given.items():
        if name not in fields and value is not None and shared_defaults.get(name) != value:
            raise GenerationError(f"{flag(name)} does not apply to --method {method}")
    return build(method, others="ignore", **given)


# The options --method all shares between the methods that take them (`for_method`).
SHARED = ("k", "tree", "candidates", "drafter_dtype")


def read_prompt(args) -> str:
    if args.prompt is not None and args.prompt_file:
        raise CLIError("give either --prompt or --prompt-file, not both")
    if args.prompt is not None:
        text = args.prompt
    elif args.prompt_file:
        try:
            text = Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"cannot read --prompt-file {args.prompt_file}: "
                           f"{getattr(e, 'strerror', None) or e}") from None
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        text = DEMO_PROMPT
    if not text:
        raise CLIError("the prompt is empty (give --prompt, --prompt-file or text on stdin)")
    return text


def load_beside(args, methods: list[str], method: str, kind: type, what: str, flag: str):
    """What `method` needs beside the target (Medusa heads, an EAGLE drafter): the directory
    of --FLAG or the preset's, loaded and checked to be `kind`; None when the method does not
    run, or when it has none and other methods run (with a note: it is skipped)."""
    given = getattr(args, flag)
    if method not in methods:
        if given:
            raise CLIError(f"--{flag} applies to --method {method} or all")
        return None
    path, missing = (heads_path if flag == "heads" else drafter_path)(args)
    if path is None:
        if methods == [method]:
            raise CLIError(f"method {method} needs {what}: {missing}; pass --{flag} DIR")
        print(f"specjax: note: skipping {method}: {missing}", file=sys.stderr)
        return None
    loaded = load(path)
    if not isinstance(loaded, kind):
        raise CLIError(f"--{flag} {path} is not {what}")
    return loaded


def drafters(args, methods: list[str]) -> dict:
    """The drafters the methods need (`presets.load_drafters`), by method: a method without its
    kind is skipped with a note when other methods run, an error when it runs alone."""
    found, missing = load_drafters(args, methods)
    for method, why in missing.items():
        what = DRAFTER_KINDS[method][1]
        if methods == [method]:
            raise CLIError(f"method {method} needs {what}: {why}; pass --drafter DIR")
        print(f"specjax: note: skipping {method}: {why}", file=sys.stderr)
    return found


def load_models(args, methods: list[str], mesh=None):
    """The target, the draft (None when not needed or not found) and, by method, what each
    method that runs loads beside the target (`Record.loads`: the draft, heads or a drafter;
    missing where not found); on `mesh`, the target split and the draft replicated."""
    beside = drafters(args, methods)
    for m in REGISTRY.values():
        if m.loads == "heads":
            beside[m.name] = load_beside(args, methods, m.name, m.kind, m.what, m.flag)
    drafting = [m.name for m in REGISTRY.values() if m.loads == "draft"]
    want_draft = any(m in methods for m in drafting)
    target_path, draft_path, no_draft = model_paths(args, want_draft)
    if want_draft and draft_path is None:
        if methods == ["speculative"]:
            raise CLIError(f"speculative sampling needs a draft model: {no_draft}; pass --draft "
                           "DIR or use --method autoregressive|ngram")
        print(f"specjax: note: skipping speculative: {no_draft}", file=sys.stderr)
    target = load_model(target_path, args.dtype, mesh)
    draft = load_model(draft_path, args.dtype, mesh, shard=False) if draft_path else None
    beside.update({name: draft for name in drafting if draft is not None})
    return target, draft, beside


def prompt_ids(target, prompt: str, chat: bool) -> list[int]:

    if chat:
        return chat_template.encode(target, chat_template.render(target, prompt))
    return encode_prompts(target, [prompt])[0]


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
    method = request.spec.method
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


def timed_generate(request, runs: int = 3):
    """`generate` once untimed (it compiles, and pays every one-time cost), then `runs` timed
    runs; the stats carry the median run time and the first call's compile time. Returns
    (result, number of timed runs)."""

    first = generate(request)
    results = [generate(request) for _ in range(runs)]
    stats = dataclasses.replace(results[-1].stats, compile_s=first.stats.compile_s,
                                run_s=statistics.median(r.stats.run_s for r in results))
    return dataclasses.replace(results[-1], stats=stats), runs


def prefill_seconds(target, ids: list[int], sampling: SamplingParams, run: dict,
                    runs: int = 3) -> float:
    """The median time of an autoregressive run that makes one token: the prompt's prefill (the
    first token comes from its logits), timed as `timed_generate` times a method."""
    request = prepare(target, [ids], "autoregressive",
                      SamplingParams(temperature=sampling.temperature),
                      **dict(run, max_new_tokens=1))
    return timed_generate(request, runs)[0].stats.run_s


def decode_rate(stats, prefill_s: float) -> float | None:
    """Tokens per second after the prefill: the tokens past the first over the run time past
    the prefill's (None when there is no such time)."""
    rest = stats.run_s - prefill_s
    return (stats.new_tokens - 1) / rest if stats.new_tokens > 1 and rest > 0 else None


def prefill_line(prompt_tokens: int, prefill_s: float, runs: int) -> str:
    return (f"prompt: {prompt_tokens} tokens, prefill {prefill_s * 1e3:.1f} ms "
            f"({prompt_tokens / prefill_s:,.0f} tokens/s), median of {runs} runs")


def summary_line(stats, runs: int, prefill_s: float | None = None) -> str:
    acceptance = (f"acceptance {stats.acceptance_rate:.1%} ({stats.accepted}/{stats.drafted})"
                  if stats.method != "autoregressive" else "acceptance n/a")
    decode = decode_rate(stats, prefill_s) if prefill_s is not None else None
    return (f"[{stats.method}] {stats.new_tokens} tokens, {stats.tokens_per_second:,.1f} tokens/s"
            + (f", decode {decode:,.1f} tokens/s" if decode
               else ", decode n/a" if prefill_s is not None else "")
            + f" (median of {runs} runs, {stats.run_s:.3f} s; compile {stats.compile_s:.1f} s), "
            f"{acceptance}, {stats.tokens_per_target_call:.2f} tokens/target call"
            + (f", {stats.mean_draft_length:.2f} drafted/call"
               if REGISTRY[stats.method].chain else "")
            + (f" ({stats.tree_size} candidates per call)" if stats.tree_size else "")
            + (", steps accepting 0..{}: {}".format(len(stats.accepted_histogram) - 1, " ".join(
                map(str, stats.accepted_histogram))) if stats.accepted_histogram else ""))


def why_slower(stats, base) -> str | None:
    """One line for a method slower than autoregressive decoding in this run, saying why: its
    speedup is its tokens per target call over the cost of a step (the time per target call in
    autoregressive steps: the drafting and a wider verify call), and which of the two fell
    short. None for a method that is not slower, or without the baseline."""
    if base is None or stats.method == base.method or not stats.target_calls:
        return None
    speedup = stats.tokens_per_second / base.tokens_per_second if base.tokens_per_second else 0
    if speedup >= 1:
        return None
    step = (stats.run_s / stats.target_calls) / (base.run_s / base.target_calls)
    drafting = (f"{stats.draft_calls / stats.target_calls:.1f} draft calls and " if
                stats.draft_calls else "")
    return (f"{stats.method} is slower here ({speedup:.2f}x): {stats.tokens_per_target_call:.2f} "
            f"tokens per target call (acceptance {stats.acceptance_rate:.0%}) against a step "
            f"that costs {step:.2f} autoregressive steps ({drafting}a verify of "
            f"{stats.tree_size + 1} tokens)")


def comparison_table(rows, prefill_s: float) -> str:
    base = {m: s.tokens_per_second for m, s, _ in rows}.get("autoregressive")
    lines = [f"{'method':<16}{'tokens/s':>11}{'decode/s':>11}{'speedup':>9}{'acceptance':>12}"
             f"{'tokens/call':>13}"]
    for method, stats, _ in rows:
        speedup = f"{stats.tokens_per_second / base:.2f}x" if base else "-"
        acceptance = f"{stats.acceptance_rate:.1%}" if method != "autoregressive" else "-"
        decode = decode_rate(stats, prefill_s)
        lines.append(f"{method:<16}{stats.tokens_per_second:>11,.1f}"
                     f"{f'{decode:,.1f}' if decode else '-':>11}{speedup:>9}{acceptance:>12}"
                     f"{stats.tokens_per_target_call:>13.2f}")
    return "\n".join(lines)


def _loaded(objects: dict, keyword: str) -> str | None:
    """The name of the first running method's weights under `keyword` (heads, drafter)."""
    return next((getattr(o, keyword).name for m, o in objects.items()
                 if REGISTRY[m].loads == keyword), None)


def json_report(target, draft, prompt: str, ids: list[int], requests, objects, settings,
                args) -> dict:
    """`requests`, `objects`: each method's prepared request and its object; `settings`: the
    flags' options, sampling and run options, as the report shows them."""
    results = []
    methods = list(requests)
    prefill_s = prefill_seconds(target, ids, SamplingParams(temperature=settings["temperature"]),
                                {k: settings[k] for k in ("seed", "mesh")})
    for method, request in requests.items():
        result, runs = timed_generate(request)
        stats = result.stats.as_dict()
        stats["timed_runs"] = runs
        stats["decode_tokens_per_second"] = decode_rate(result.stats, prefill_s)
        results.append({"method": method, "text": (result.texts or [None])[0],
                        "tokens": result.tokens[0], "finish_reason": result.finish_reasons[0],
                        "stats": stats,
                        "logprobs": (None if result.logprobs is None else
                                     [t.as_dict() for t in result.logprobs[0]]),
                        "row_stats": [row.as_dict() for row in result.row_stats]})
    base = {r["method"]: r["stats"]["tokens_per_second"] for r in results}.get("autoregressive")
    for r in results:
        r["speedup_vs_autoregressive"] = r["stats"]["tokens_per_second"] / base if base else None
    return {"target": target.name, "target_path": str(target.path),
            "draft": draft.name if draft is not None and "speculative" in methods else None,
            "draft_path": str(draft.path) if draft is not None and "speculative" in methods else None,
            "prompt": prompt, "prompt_tokens": len(ids), "prefill_s": prefill_s,
            "heads": _loaded(objects, "heads"), "drafter": _loaded(objects, "drafter"),
            "settings": dict({k: v for k, v in settings.items() if k not in WEIGHTS and k != "mesh"},
                             chat=args.chat, dtype=args.dtype, method=args.method, mesh=args.mesh,
                             candidates=args.candidates,
                             tree=tree_to_json(settings["tree"])),
            "results": results}
