"""What a `generate` run reads from its flags before the first token: the methods' options as
the API's objects (checked before any model is loaded), the sampling, the token tree, the
prompt, and the models each method runs with."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from specjax.api.checks import GenerationError, check_int, encode_prompts
from specjax.api.methods import CLASSES, TYPES, build_shared
from specjax.api.options import flag
from specjax.bench.methods import measured_default
from specjax.io import chat as chat_template
from specjax.io.checkpoint import load
from specjax.presets import (
    DRAFTER_KINDS,
    CLIError,
    drafter_path,
    heads_path,
    load_drafters,
    load_model,
    model_paths,
)
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, parse_widths

DEMO_PROMPT = "import os\nimport sys\n\n\ndef read_lines(path):\n    lines = []\n"   # bench --quick's


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


def for_method(method: str, options: dict, beside: dict, several: bool,
               dtype: str = "float32") -> dict:
    """The options for `method`'s object, with the weights it loads (`beside`, by method)
    under its keyword, and with none of `LENGTH_OPTIONS` given, its measured best in `dtype`
    (`bench.methods.measured_default`). With --method all (`several`), each method gets the
    shared options it takes (`SHARED`, less its `OWN`) and its own defaults for the rest;
    given for one method, an option that does not apply to it stays, for `method_object` to
    refuse."""
    cls = TYPES[method]
    options = dict(options)
    if cls.loads:
        options[cls.loads] = beside.get(method)
    if all(options.get(name) is None for name in LENGTH_OPTIONS):
        options.update(measured_default(method, dtype))
    if several:
        options.update({name: None for name in SHARED
                        if name not in cls.options() or name in OWN.get(method, ())})
        if options["k_schedule"] not in cls.schedules:
            options.update(k_schedule="constant", k_start=None, confidence_threshold=None)
    return options


def method_object(method: str, given: dict):
    """`method`'s object from its options (`methods.build_shared`; those at None or at the defaults
    the flags share take the object's own); an option given that the method does not take is
    an error naming its flag."""
    shared_defaults = {"k_schedule": "constant", "max_ngram": 3, "min_ngram": 1}
    fields = {f.name for f in dataclasses.fields(TYPES[method])}
    for name, value in given.items():
        if name not in fields and value is not None and shared_defaults.get(name) != value:
            raise GenerationError(f"{flag(name)} does not apply to --method {method}")
    return build_shared(method, **given)


# The options that say how much a step drafts: with none of them given, a method runs its
# measured best (`bench.methods.measured_default`).
LENGTH_OPTIONS = ("k", "k_schedule", "k_start", "confidence_threshold", "tree")

# The options --method all shares between the methods that take them (`for_method`), and those
# a method keeps to itself there: DFlash's k counts its own block's drafts.
SHARED = ("k", "tree", "candidates", "drafter_dtype")
OWN = {"dflash": ("k", "candidates")}


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


def prompt_ids(target, prompt: str, chat: bool) -> list[int]:

    if chat:
        return chat_template.encode(target, chat_template.render(target, prompt))
    return encode_prompts(target, [prompt])[0]


def load_beside(args, methods: list[str], method: str, kind: type, what: str, flag: str):
    """What `method` needs beside the target (Medusa heads, an EAGLE drafter): the directory
    of --FLAG (the flag is the keyword it loads under: --draft, --heads, --drafter) or the
    preset's, loaded and checked to be `kind`; None when the method does not
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
    method that runs loads beside the target (`Method.loads`: the draft, heads or a drafter;
    missing where not found); on `mesh`, the target split and the draft replicated."""
    beside = drafters(args, methods)
    for m in CLASSES:
        if m.loads == "heads":
            beside[m.name] = load_beside(args, methods, m.name, m.kind(), m.what, m.loads)
    drafting = [m.name for m in CLASSES if m.loads == "draft"]
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
