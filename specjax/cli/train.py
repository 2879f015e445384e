"""`python -m specjax train`: a drafter for a target, end to end, in the stages of
`specjax.train`:

    train data      the target's continuations of a prompt set, in resumable shards
    train features  the target's states over them, on disk (optional: the trainers make them)
    train eagle3    a published EAGLE-3 drafter (the EAGLE repo's, SpecForge's or speculators')
    train eagle     a published EAGLE-1/2 drafter (the EAGLE repo's layout)
    train medusa    published Medusa-1 heads (FasterDecoding's layout)
    train dflash    a DFlash block drafter (its authors' layout)
    train draft     a draft model: a small Llama LM (a Hugging Face checkpoint)

For example:

    python -m specjax train data --target DIR --prompts builtin:chat --out runs/data \\
        --max-new-tokens 256 --temperature 1 --top-p 0.9 --held-out 10
    python -m specjax train eagle3 --target DIR --data runs/data --out my-drafter --steps 2000

or in one command from --prompts: the continuations are kept in --work as sequences.npz and
reused when the run starts again. The features are one forward pass of the target (in memory,
or in --features DIR, resumable, or made first by `train features`). Training checkpoints in
--work every --checkpoint-every steps; a run started again on the same --work resumes and gives
the weights an uninterrupted run gives. A progress bar on stderr shows the loss and, every
--eval-every steps, the held-out tokens per target call. The result is written to --out in
--format, with its held-out evaluation (tokens per target call and acceptance by depth at
temperature 0 and 1 on the last --held-out prompts, never trained on) in --out/train_log.json
and its model card, rendered from that log, in --out/README.md. An EAGLE drafter is written
with the trees it is evaluated with (--dynamic-tree for greedy rows, a chain of --sampled-chain
for sampled ones), which `generate` then decodes with by default.
--mesh data=N trains data-parallel on N devices.

Prompts: a .jsonl file (each line a JSON string, {"prompt": text} or {"messages": [...]} in the
target's chat template) or a text file with one prompt per line; --chat wraps plain prompts in
the chat template. --prompts builtin:NAME is a built-in set (specjax/train/prompts.py):
chat (709 chat questions made from templates, then the 10 held-out questions the shipped
drafters' cards report, --held-out 10) and chat-wide (3,117 questions, then the same 10), in
the target's chat template; code (600 prompts cut from this Python's standard library) and
prose (523 plain-text openings), continued as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import shutil
import time
from pathlib import Path

import numpy as np

from specjax.api.methods import DFlash, Eagle, Medusa, Speculative
from specjax.sampling.params import SamplingParams
from specjax.api.generate import generate
from specjax.bench.common import machine
from specjax.io import chat as chat_template
from specjax.heads import dflash
from specjax.heads.eagle import Drafter
from specjax.io.checkpoint import load as load_checkpoint
from specjax.io.checkpoint import save as save_model
from specjax.io.dflash import save_block_drafter
from specjax.io.eagle import save_drafter
from specjax.presets import (DEFAULT_PRESET, PRESETS, CLIError, load_model, make_mesh,
                             model_paths, parse_mesh)
from specjax.sampling.tree import DynamicTree, Tree, TreeError
from specjax.io.medusa import save_heads
from specjax.io.sidecar import check_target, tree_to_json
from specjax.model.transformer import count_params
from specjax.io.published import HEADS_FORMATS
from specjax.train import card, data, draft, eagle3, medusa
from specjax.train import dflash as dflash_train
from specjax.train import prompts as prompt_sets
from specjax.train.state import StepProgress, on_mesh

DESCRIPTION = __doc__
BUILTIN_PREFIX = "builtin:"
FORMATS = ("eagle", "speculators", "specjax")
DFLASH_HELP = {"block_size": "the block: the last token and N - 1 drafts (default 8)",
               "layers": "draft layers, of the target's width and heads (default 1)",
               "anchors": "blocks a sequence a step, at random positions (default 8)",
               "decay": "block position j's loss weight exp(-(j - 1) / D) (default 4)"}
OPTION_HELP = {"noise": "half-width H of EAGLE-1's uniform noise U(-H, H) on the first pass's "
                        "feature inputs (default 0: none; the EAGLE paper's is 0.1)",
               "slots": "in place of --batch sequences a step: sequences of like length, about "
                        "N positions a step (less padding; default 0: --batch)"}
# EAGLE-2's dynamic tree written into a trained drafter unless --dynamic-tree says otherwise:
# the shipped SmolLM2 drafter's, chosen by timed runs on a 2-core CPU (its card). Not the best
# on every host: on the 2-core AVX2 one the search ranks 3,2,4 first (bench/eagle-tree-search).
DEFAULT_DYNAMIC_TREE = "4,4,8"
# Sampled rows keep a dynamic tree's top-k drafts by the deterministic rule (with the target's
# probability of each), less often than a sampled chain's (on the tiny Llama, 1.16 tokens per
# target call at T = 1 against 1.41 with a chain of 4, tests/test_train.py's drafter): they get
# a chain of this length, `generate`'s default k.
DEFAULT_SAMPLED_CHAIN = 4
NO_HELD_OUT_SEARCH = ("several --dynamic-tree are searched on held-out prompts, and there "
                      "are none: give --held-out N, or one tree")
NO_HELD_OUT_TREE = ("--tree-nodes searches a tree on held-out prompts, and there are none: give "
                    "--held-out N, or --tree-nodes 0")


def _target_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("the target")
    group.add_argument("--preset", choices=sorted(PRESETS),
                       help=f"a preset's target (default: {DEFAULT_PRESET})")
    group.add_argument("--target", metavar="DIR|FILE.gguf",
                       help="the target checkpoint: a Hugging Face directory or a GGUF file")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    d = kinds.add_parser("data", help="the target's continuations of a prompt set, in shards",
                         description=DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_arguments(d)
    source = d.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", metavar="FILE|builtin:NAME",
                        help=".jsonl (strings, {prompt}, or {messages}) or text, one prompt a "
                             "line; or a built-in set: builtin:" + "|".join(prompt_sets.BUILTIN))
    source.add_argument("--import", dest="import_shards", metavar="DIR|FILE.npz",
                        help="instead, the shards of `scripts/train.py eagle-data` (data/eagle2/"
                             "smollm2: the shipped SmolLM2 EAGLE drafter's data) or a sequence "
                             "set of its medusa-data (data/eagle/llama.npz: the tiny drafters'), "
                             "cut at --max-length")
    d.add_argument("--max-length", type=int, default=384,
                   help="with --import: documents are cut at this many tokens (default 384)")
    d.add_argument("--leave-out", metavar="KIND,...",
                   help="with --import of a sequence set: its documents of these kinds are "
                        "not imported (e.g. text-original: the original text, not the "
                        "target's); the held-out prompts stay the same")
    d.add_argument("--chat", action="store_true", help="wrap plain prompts in the chat template")
    d.add_argument("--out", required=True, metavar="DIR",
                   help="the shards and data.json; a run started again resumes")
    d.add_argument("--max-new-tokens", type=int, default=64, help="continuation length")
    d.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy")
    d.add_argument("--top-p", type=float, default=1.0, help="default 1: off")
    d.add_argument("--seed", type=int, default=0, help="row i samples with seed + i")
    d.add_argument("--shard-size", type=int, default=256, metavar="N", help="prompts a shard")
    d.add_argument("--batch", type=int, default=64, help="rows decoded together")
    d.add_argument("--held-out", type=int, default=8, metavar="N",
                   help="the last N prompts are kept for evaluation, not continued (default 8)")
    d.set_defaults(run=run_data, draft=None)

    f = kinds.add_parser("features", help="the target's states over `train data`'s "
                         "continuations, on disk (what eagle3/eagle --features reads)",
                         description=DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_arguments(f)
    f.add_argument("--data", required=True, metavar="DIR", help="made by `train data`")
    f.add_argument("--out", required=True, metavar="DIR",
                   help="the features, memory-mapped; a pass started again resumes")
    _features_arguments(f, out=False)
    f.set_defaults(run=run_features, draft=None)

    for name, kind, text in (("eagle3", "eagle3", "a published EAGLE-3 drafter"),
                             ("eagle", "eagle1", "a published EAGLE-1/2 drafter")):
        p = kinds.add_parser(name, help=text, description=DESCRIPTION,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        _target_arguments(p)
        _data_arguments(p)
        p.add_argument("--format", default="eagle", choices=FORMATS,
                       help="the layout written (default: the EAGLE repo's)")
        _features_arguments(p, out=True, taps=kind == "eagle3")
        defaults = eagle3.TrainConfig()
        for option, type_ in (("steps", int), ("batch", int), ("learning_rate", float),
                              ("warmup", int), ("unroll", int), ("decay", float),
                              ("clip", float), ("noise", float), ("seed", int),
                              ("checkpoint_every", int), ("slots", int)) + (
                (("draft_vocab", int),) if kind == "eagle3" else ()):
            p.add_argument("--" + option.replace("_", "-"), type=type_,
                           default=getattr(defaults, option),
                           help=OPTION_HELP.get(option, f"default {getattr(defaults, option)}"))
        if kind == "eagle1":
            p.add_argument("--style", choices=("published", "specjax"), default="published",
                           help="specjax: its own norm before the head, the fusion reading "
                                "[feature ; embedding] (the shipped SmolLM2 drafter's; needs "
                                "--format specjax)")
            p.add_argument("--subset", type=int, default=0, metavar="N",
                           help="propose from the N ids the target generated most often, "
                                "through its LM-head rows (default 0: the whole vocabulary; "
                                "needs --format specjax)")
        p.add_argument("--dynamic-tree", nargs="+", default=[DEFAULT_DYNAMIC_TREE],
                       metavar="DEPTH,TOP_K,TOTAL",
                       help="the EAGLE-2 dynamic tree written into the drafter, which `generate` "
                            "and the held-out evaluation decode with (default "
                            f"{DEFAULT_DYNAMIC_TREE}: the shipped SmolLM2 drafter's; "
                            "none: no tree, a chain of k); several: the one that decodes the "
                            "held-out prompts fastest here, by their tokens per target call "
                            "over timed decoding steps")
        p.add_argument("--sampled-chain", type=int, default=DEFAULT_SAMPLED_CHAIN, metavar="K",
                       help="sampled rows (temperature > 0) decode with a chain of K drafts "
                            "instead, written into the drafter beside the tree (default "
                            f"{DEFAULT_SAMPLED_CHAIN}; 0: the tree at every temperature)")
        p.add_argument("--init", metavar="DIR",
                       help="start from this drafter's weights and draft vocabulary (ours or "
                            "published, trained on this target, of the shape this run "
                            "trains): fine-tuning it, e.g. with a larger --unroll")
        p.set_defaults(run=run_train, draft=None, drafter_kind=kind, **(
            {} if kind == "eagle3" else {"draft_vocab": defaults.draft_vocab}))

    x = kinds.add_parser("dflash", help="a DFlash block drafter (its authors' published layout)",
                         description=DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_arguments(x)
    _data_arguments(x)
    _features_arguments(x, out=True, taps=False)
    x.add_argument("--taps", metavar="A,B",
                   help="the target's layer counts whose outputs it reads, >= 1 (default: the "
                        "published code's, one per draft layer: the middle layer for one)")
    defaults = dflash_train.TrainConfig()
    for option, type_ in (("steps", int), ("batch", int), ("learning_rate", float),
                          ("warmup", int), ("clip", float), ("seed", int),
                          ("checkpoint_every", int), ("slots", int), ("block_size", int),
                          ("layers", int), ("anchors", int), ("decay", float)):
        x.add_argument("--" + option.replace("_", "-"), type=type_,
                       default=getattr(defaults, option),
                       help=DFLASH_HELP.get(option, OPTION_HELP.get(
                           option, f"default {getattr(defaults, option)}")))
    x.add_argument("--mask-token-id", type=int, metavar="ID",
                   help="the token the block's masked slots are embedded as (default: the "
                        "target's last id)")
    x.set_defaults(run=run_dflash, draft=None)

    m = kinds.add_parser("medusa", help="published Medusa-1 heads (FasterDecoding's layout)",
                         description=DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_arguments(m)
    _data_arguments(m)
    m.add_argument("--format", default="medusa", choices=HEADS_FORMATS,
                   help="the layout written (default: FasterDecoding's; head subset needs "
                        "specjax's)")
    _features_arguments(m, out=True, taps=False)
    defaults = medusa.TrainConfig()
    for name, kind in (("steps", int), ("batch", int), ("learning_rate", float),
                       ("warmup", int), ("heads", int), ("blocks", int), ("decay", float),
                       ("clip", float), ("subset", int), ("seed", int),
                       ("checkpoint_every", int), ("slots", int)):
        m.add_argument("--" + name.replace("_", "-"), type=kind, default=getattr(defaults, name),
                       help=OPTION_HELP.get(name, f"default {getattr(defaults, name)}"))
    m.add_argument("--head", choices=("own", "subset"), default=defaults.head,
                   help="own: each head its own LM head (Medusa-1, default); subset: the "
                        "target's LM-head rows for the --subset most frequent ids")
    m.add_argument("--tree-nodes", type=int, default=16, metavar="N",
                   help="search a tree of at most N nodes for the heads, from their rank "
                        "accuracies on the held-out prompts' continuations (default 16; 0: "
                        "none, the heads then decode with one candidate per head)")
    m.add_argument("--verify-cost", default="measure", metavar="measure|calls|flat|N:C,...",
                   help="what a decoding step with a verify call over N tokens costs, in "
                        "autoregressive steps, for pricing the tree: measure (time whole steps "
                        "here with each candidate tree, the default), calls (time the verify "
                        "calls alone), flat (all the same, as on a GPU), or a table such as "
                        "1:1,5:1.6,17:2.4")
    m.set_defaults(run=run_medusa, draft=None)

    r = kinds.add_parser("draft", help="a draft model: a small Llama LM (Hugging Face layout)",
                         description=DESCRIPTION,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_arguments(r)
    _data_arguments(r)
    _features_arguments(r, out=True, taps=False)
    defaults = draft.TrainConfig()
    for name, kind in (("steps", int), ("batch", int), ("learning_rate", float),
                       ("warmup", int), ("clip", float), ("seed", int),
                       ("checkpoint_every", int), ("slots", int), ("layers", int)):
        r.add_argument("--" + name.replace("_", "-"), type=kind, default=getattr(defaults, name),
                       help=OPTION_HELP.get(name, f"default {getattr(defaults, name)}"))
    for name, default in (("d_model", "half the target's"),
                          ("heads", "d_model / the target's head size"),
                          ("kv_heads", "heads"),
                          ("d_ff", "the target's d_ff / d_model ratio, a multiple of 32")):
        r.add_argument("--" + name.replace("_", "-"), type=int, help=f"default {default}")
    r.set_defaults(run=run_draft, draft=None)


def _features_arguments(p: argparse.ArgumentParser, out: bool, taps: bool = True) -> None:
    """Which features, in what dtype, and (`out`) where a trainer keeps them."""
    if taps:
        p.add_argument("--taps", metavar="A,B,C",
                       help="the target's layer counts to read (default 2, L // 2, L - 3: "
                            "EAGLE-3's; `train features` for EAGLE-1/2 or a draft: 0)")
    if out:
        p.add_argument("--features", metavar="DIR",
                       help="keep the features on disk there, memory-mapped (sets larger than "
                            "memory), and resume an interrupted pass or reuse a finished one "
                            "(`train features`; eagle, medusa and draft read any taps' pass; "
                            "default: in memory)")
    p.add_argument("--features-dtype", choices=("float32", "float16"), default="float32",
                   help="the features' dtype (float16 halves them)")


def _data_arguments(p: argparse.ArgumentParser) -> None:
    """Where a trainer's data comes from, where it writes, and how it evaluates."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", metavar="FILE",
                        help=".jsonl (strings, {prompt}, or {messages}) or text, one prompt a "
                             "line")
    source.add_argument("--data", metavar="DIR",
                        help="continuations made by `train data` (its held-out prompts "
                             "evaluate the result)")
    p.add_argument("--chat", action="store_true", help="wrap plain prompts in the chat template")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="where the result is written, with train_log.json and README.md (its "
                        "model card)")
    p.add_argument("--work", metavar="DIR",
                   help="the run's data and checkpoints (default: OUT.work); resumes from it")
    p.add_argument("--held-out", type=int, default=8, metavar="N",
                   help="the last N prompts are not trained on; they evaluate it (default 8); "
                        "with --data, the first N of its held-out prompts")
    p.add_argument("--max-new-tokens", type=int, default=64, help="continuation length")
    p.add_argument("--data-temperature", type=float, default=0.0,
                   help="the continuations' temperature (default 0: greedy)")
    p.add_argument("--mesh", metavar="data=N",
                   help="train data-parallel on N devices: each batch split by row (a "
                        "multiple of N), the gradients summed across them")
    p.add_argument("--eval-every", type=int, metavar="N",
                   help="held-out tokens per target call (T = 0) on the progress bar every N "
                        "steps (default: 5 times a run; 0: only at the end)")


def read_prompts(path: Path, target, chat: bool) -> list:
    """The prompts of a file, each a text or (chat) token ids; "builtin:NAME" names a built-in
    set (`specjax.train.prompts`): its questions are rendered in the target's chat template,
    its plain texts only with `chat`."""
    if str(path).startswith(BUILTIN_PREFIX):
        name = str(path)[len(BUILTIN_PREFIX):]
        try:
            texts = prompt_sets.builtin(name)
        except ValueError as e:
            raise CLIError(f"--prompts {path}: {e}") from None
        if not prompt_sets.BUILTIN[name][0] and not chat:
            return texts                                    # plain text, continued as it is
        return [chat_template.encode(target, chat_template.render(target, q)) for q in texts]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"--prompts {path}: cannot read it ({type(e).__name__})") from None
    prompts = []
    if path.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                raise CLIError(f"--prompts {path}:{n}: not JSON") from None
            if isinstance(item, dict) and isinstance(item.get("messages"), list):
                prompts.append(chat_template.encode(target, chat_template.render_messages(
                    target, item["messages"])))
                continue
            if isinstance(item, dict):
                item = item.get("prompt")
            if not isinstance(item, str) or not item:
                raise CLIError(f"--prompts {path}:{n}: expected a string, {{\"prompt\": text}} "
                               f"or {{\"messages\": [...]}}")
            prompts.append(item)
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if chat:
        prompts = [chat_template.encode(target, chat_template.render(target, p))
                   if isinstance(p, str) else p for p in prompts]
    return prompts


def _leave_out_kinds(args) -> tuple[str, ...]:
    """--leave-out as kind names (only with --import)."""
    if not args.leave_out:
        return ()
    if not args.import_shards:
        raise CLIError("--leave-out applies to --import")
    kinds = tuple(k.strip() for k in args.leave_out.split(","))
    if not all(kinds):
        raise CLIError(f"--leave-out must be comma-separated kind names, got "
                       f"{args.leave_out!r}")
    return kinds


def run_data(args) -> int:
    leave_out = _leave_out_kinds(args)
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    if args.import_shards:
        try:
            out = data.import_shards(args.import_shards, target, args.out,
                                     max_length=args.max_length, leave_out=leave_out)
        except eagle3.TrainError as e:
            raise CLIError(str(e)) from None
        print(out)
        return 0
    prompts = read_prompts(Path(args.prompts), target, args.chat)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    sampling.validate()
    try:
        out = data.write(target, prompts, args.out, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                         shard_size=args.shard_size, batch=args.batch, held_out=args.held_out)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    print(out)
    return 0


def run_features(args) -> int:
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    taps = _taps(args, target)
    try:
        sequences, _ = data.read(args.data, target)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    args.features = args.out
    try:
        _features(target, sequences, taps, args)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    print(args.out)
    return 0


def _taps(args, target) -> tuple[int, ...]:
    """--taps checked against the target (before hours of data and features)."""
    taps = None
    if args.taps:
        try:
            taps = tuple(int(t) for t in args.taps.split(","))
        except ValueError:
            raise CLIError(f"--taps must be comma-separated layer counts, got {args.taps!r}") \
                from None
    return eagle3.resolve_taps(target, taps)


def run_train(args) -> int:
    variant = ({"style": args.style, "subset": args.subset} if args.drafter_kind == "eagle1"
               else {})
    config = eagle3.TrainConfig(kind=args.drafter_kind, **variant, **{
        k: getattr(args, k) for k in ("steps", "batch", "learning_rate", "warmup", "unroll",
                                      "decay", "clip", "noise", "draft_vocab", "seed",
                                      "checkpoint_every", "slots")})
    if (config.style != "published" or config.subset) and args.format != "specjax":
        raise CLIError("--style specjax and --subset are specjax's variants, which no published "
                       "layout holds: add --format specjax")
    _check_data_arguments(args)
    mesh = _mesh(args, config)
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    if target.config.arch != "llama":
        raise CLIError(f"{target.name} is a {target.config.arch} model; EAGLE drafters are "
                       f"implemented for Llama-family targets")
    trees = _dynamic_trees(args.dynamic_tree, target)
    if len(trees) > 1 and args.held_out == 0:       # before hours of data and training
        raise CLIError(NO_HELD_OUT_SEARCH)
    tree = trees[0]
    if args.sampled_chain < 0:
        raise CLIError(f"--sampled-chain must be >= 0, got {args.sampled_chain}")
    if args.sampled_chain >= target.config.max_positions:
        raise CLIError(f"--sampled-chain {args.sampled_chain} does not fit a target call in "
                       f"{target.name}'s context of {target.config.max_positions}")
    sampled_tree = Tree.chain(args.sampled_chain) if args.sampled_chain else None
    init = _init_drafter(args.init, target) if args.init else None
    # EAGLE-1/2 reads only the final-normed states; the one tap (the embeddings) is the
    # cheapest `features` computes.
    taps = _taps(args, target) if config.kind == "eagle3" else (0,)
    out, work = _out_and_work(args)
    started = time.time()
    sequences, held_out = _training_data(args, target, work)
    if len(trees) > 1 and not held_out:             # --data without held-out prompts
        raise CLIError(NO_HELD_OUT_SEARCH)
    features = _features(target, sequences, taps, args, final_only=config.kind == "eagle1")
    progress = _progress(args, config, "loss/agreement by pass" if config.kind == "eagle3"
                         else "cross-entropy/agreement by pass", target, held_out, Eagle,
                         tree=tree)
    drafter = eagle3.train(target, features, config, checkpoint=work / "checkpoint",
                           progress=progress, mesh=mesh, init=init)
    search = {}
    if len(trees) > 1:
        tree = _search_tree(drafter, trees, target, held_out, args, search)
    drafter = dataclasses.replace(drafter, tree=tree, sampled_tree=sampled_tree)
    save_drafter(drafter, out, format=args.format)
    log = {"target": str(target_path), "format": args.format, "kind": config.kind,
           "taps": list(features.taps) if config.kind == "eagle3" else None,
           "draft_vocab": int(len(drafter.token_ids)), "config": vars(config),
           "init": args.init, "tree": tree_to_json(tree),
           "sampled_tree": tree_to_json(sampled_tree), **search,
           "train_sequences": int(len(sequences.length)), "held_out_prompts": len(held_out),
           "seconds": round(time.time() - started, 1)}
    _finish(out, log, target, held_out, args, Eagle(drafter))
    return 0


def run_dflash(args) -> int:
    """`train dflash`: data, the features at the drafter's taps, training, the published
    layout, the held-out evaluation and the card."""
    try:
        config = dflash_train.TrainConfig(**{
            k: getattr(args, k) for k in ("steps", "batch", "learning_rate", "warmup", "clip",
                                          "seed", "checkpoint_every", "slots", "block_size",
                                          "layers", "anchors", "decay")})
    except dflash_train.TrainError as e:
        raise CLIError(str(e)) from None
    _check_data_arguments(args)
    if args.mesh:
        raise CLIError("train dflash runs on one device (no --mesh)")
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    if target.config.arch != "llama":
        raise CLIError(f"{target.name} is a {target.config.arch} model; DFlash drafters serve "
                       f"Llama-family targets")
    n = target.config.n_layers
    taps = dflash.default_taps(n, config.layers)
    if args.taps:
        try:
            taps = tuple(int(t) for t in args.taps.split(","))
        except ValueError:
            raise CLIError(f"--taps must be comma-separated layer counts, got {args.taps!r}") \
                from None
    if not taps or list(taps) != sorted(set(taps)) or taps[0] < 1 or taps[-1] >= n:
        raise CLIError(f"--taps must be increasing layer counts in [1, {n}), got {list(taps)}")
    mask = args.mask_token_id
    if mask is not None and not 0 <= mask < target.config.vocab_size:
        raise CLIError(f"--mask-token-id must be a token id in [0, {target.config.vocab_size}), "
                       f"got {mask}")
    out, work = _out_and_work(args)
    started = time.time()
    sequences, held_out = _training_data(args, target, work)
    features = _features(target, sequences, taps, args)
    progress = _progress(args, config, "loss/accuracy/accepted prefix", target, held_out,
                         DFlash)
    drafter = dflash_train.train(target, features, config, checkpoint=work / "checkpoint",
                                 progress=progress, mask_token_id=mask)
    save_block_drafter(drafter, out)
    log = {"target": str(target_path), "format": "dflash", "kind": "dflash",
           "taps": list(taps), "config": vars(config),
           "train_sequences": int(len(sequences.length)), "held_out_prompts": len(held_out),
           "seconds": round(time.time() - started, 1)}
    _finish(out, log, target, held_out, args, DFlash(drafter))
    return 0


def _dynamic_trees(texts: list[str], target) -> list[DynamicTree | None]:
    """--dynamic-tree as trees that fit `target`'s context ([None] for "none")."""
    if "none" in texts:
        if len(texts) > 1:
            raise CLIError("--dynamic-tree none is no tree: give it alone")
        return [None]
    trees = []
    for text in texts:
        try:
            tree = DynamicTree.parse(text)
        except TreeError as e:
            raise CLIError(f"--dynamic-tree: {e}") from None
        if tree.size >= target.config.max_positions:
            raise CLIError(f"--dynamic-tree: {tree.size} nodes do not fit a target call in "
                           f"{target.name}'s context of {target.config.max_positions}")
        trees.append(tree)
    return trees


def _search_tree(drafter, trees, target, held_out, args, log: dict):
    """Of several --dynamic-tree, the fastest here (`eagle3.best_dynamic_tree`), with the
    search in the log."""
    print(f"tree: timing decoding steps with {len(trees)} dynamic trees", flush=True)
    tree, rows = eagle3.best_dynamic_tree(target, drafter, trees, held_out,
                                          max_new_tokens=args.max_new_tokens,
                                          new_tokens=max(args.max_new_tokens, 2))
    log["tree_search"] = rows
    for row in rows:
        print(f"tree {','.join(map(str, row['tree']))}: {row['tokens_per_call']} tokens per "
              f"call, a step {row['step_cost']} autoregressive steps, {row['speedup']}x",
              flush=True)
    return tree


def _init_drafter(path: str, target) -> Drafter:
    """--init as a drafter trained on `target`, before any data is made (whether it has the
    shape the run trains, `eagle3.train` checks)."""
    init = load_checkpoint(path)
    if not isinstance(init, Drafter):
        raise CLIError(f"--init {path} is not an EAGLE drafter (it holds "
                       f"{type(init).__name__.lower()})")
    check_target(init, target)
    return init


def run_medusa(args) -> int:
    config = medusa.TrainConfig(**{k: getattr(args, k) for k in (
        "steps", "batch", "learning_rate", "warmup", "heads", "blocks", "head", "subset",
        "decay", "clip", "seed", "checkpoint_every", "slots")})
    if config.head == "subset" and args.format == "medusa":
        raise CLIError("--format medusa (FasterDecoding's) holds heads with their own LM heads; "
                       "--head subset needs --format specjax")
    _check_data_arguments(args)
    costs = _verify_costs(args)
    mesh = _mesh(args, config)
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    out, work = _out_and_work(args)
    started = time.time()
    sequences, held_out, states = _final_states(args, target, work)
    if args.tree_nodes and not held_out:            # --data without held-out prompts
        raise CLIError(NO_HELD_OUT_TREE)
    progress = _progress(args, config, "loss/accuracy by head", target, held_out, Medusa)
    try:
        heads = medusa.train(target, states, config, checkpoint=work / "checkpoint",
                             progress=progress, mesh=mesh)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    log = {"target": str(target_path), "format": args.format, "config": vars(config),
           "train_sequences": int(len(sequences.length)), "held_out_prompts": len(held_out)}
    if args.tree_nodes:
        heads = _heads_tree(heads, target, held_out, costs, args, log)
    save_heads(heads, out, format=args.format)
    log["seconds"] = round(time.time() - started, 1)
    _finish(out, log, target, held_out, args, Medusa(heads))
    return 0


def _verify_costs(args) -> dict[int, float] | str | None:
    """--verify-cost: "measure", None (flat) or a table {call size: cost}, checked."""
    text = args.verify_cost.strip()
    if args.tree_nodes < 0:
        raise CLIError(f"--tree-nodes must be >= 0, got {args.tree_nodes}")
    if args.tree_nodes and args.held_out == 0:      # before hours of data and training
        raise CLIError(NO_HELD_OUT_TREE)
    if text in ("measure", "calls", "flat"):
        return None if text == "flat" else text
    try:
        table = {int(n): float(c) for n, c in (item.split(":") for item in text.split(","))}
    except ValueError:
        raise CLIError(f"--verify-cost must be measure, calls, flat or sizes and costs such as "
                       f"1:1,5:1.6, got {args.verify_cost!r}") from None
    if min(table) < 1 or not all(np.isfinite(c) and c > 0 for c in table.values()):
        raise CLIError(f"--verify-cost: sizes must be >= 1 and costs positive, got "
                       f"{args.verify_cost!r}")
    return table


def _heads_tree(heads, target, held_out, costs, args, log: dict):
    """The heads with the tree searched for them (`medusa.best_tree`), from their rank
    accuracies on the target's greedy continuations of the held-out prompts; what was
    measured goes into the log."""
    held = eagle3.continuations(target, held_out, max_new_tokens=args.max_new_tokens)
    states = eagle3.features(target, held, taps=(0,))
    try:
        accuracy = medusa.rank_accuracy(heads, target, states)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    if costs == "measure":          # whole steps, each prefix of the growth as the tree
        paths, _ = medusa.growth(accuracy, args.tree_nodes)
        print(f"tree: timing decoding steps with trees of 1 to {len(paths)} nodes", flush=True)
        costs = medusa.step_costs(target, heads, paths, held_out[0])
    elif costs == "calls":          # verify calls alone, every size
        costs = medusa.call_costs(target, sizes=range(1, args.tree_nodes + 2))
    tree, expected = medusa.best_tree(accuracy, args.tree_nodes, costs)
    log["tree"] = {"paths": [list(p) for p in tree.paths], "max_nodes": args.tree_nodes,
                   "expected_tokens_per_call": expected,
                   "verify_cost": None if costs is None else {str(n): c for n, c in
                                                              sorted(costs.items())},
                   "rank_accuracy": [[round(float(a), 4) for a in row] for row in accuracy]}
    print(f"tree: {tree.size} nodes, {expected:.2f} tokens per call expected", flush=True)
    return dataclasses.replace(heads, tree=tree)


def run_draft(args) -> int:
    config = draft.TrainConfig(**{k: getattr(args, k) for k in (
        "steps", "batch", "learning_rate", "warmup", "clip", "seed", "checkpoint_every", "slots",
        "layers", "d_model", "heads", "kv_heads", "d_ff")})
    _check_data_arguments(args)
    mesh = _mesh(args, config)
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    shape = draft.draft_config(target, config)      # a shape that does not fit, before the data
    out, work = _out_and_work(args)
    started = time.time()
    sequences, held_out, states = _final_states(args, target, work)
    progress = _progress(args, config, "loss/agreement", target, held_out, Speculative)
    model = draft.train(target, states, config, checkpoint=work / "checkpoint",
                        progress=progress, mesh=mesh)
    save_model(model, out)
    _tokenizer_files(target_path, out)
    log = {"target": str(target_path), "format": "hf", "config": vars(config),
           "draft": {"layers": shape.n_layers, "d_model": shape.d_model,
                     "heads": shape.n_heads, "kv_heads": shape.n_kv_heads, "d_ff": shape.d_ff,
                     "parameters": count_params(model.params)},
           "train_sequences": int(len(sequences.length)), "held_out_prompts": len(held_out),
           "seconds": round(time.time() - started, 1)}
    _finish(out, log, target, held_out, args, Speculative(model))
    return 0


def _tokenizer_files(target_path: Path, out: Path) -> None:
    """The target's tokenizer and generation settings beside the draft's weights (`save` wrote
    tokenizer.json), so that Hugging Face's loaders find the special tokens and the chat
    template the target has."""
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if target_path.is_dir() and (target_path / name).is_file():
            shutil.copyfile(target_path / name, out / name)


def _progress(args, config, label: str, target, held_out, method: type,
              tree=None) -> StepProgress:
    """The training's progress bar (on stderr), with the held-out tokens per target call at
    temperature 0 every --eval-every steps: the model as it stands, given to `method` (the
    object's class: Eagle, DFlash, Medusa or Speculative, with `tree`, the one it will be
    written with, where the method takes one)."""
    every = args.eval_every if args.eval_every is not None else max(1, config.steps // 5)

    def evaluate(model) -> float:
        chosen = method(model) if method is DFlash else method(model, tree=tree)
        result = generate(target, held_out, chosen, SamplingParams(temperature=0.0),
                          max_new_tokens=args.max_new_tokens)
        return result.stats.tokens_per_target_call

    return StepProgress(config.steps, label, evaluate if held_out and every else None, every)


def _finish(out: Path, log: dict, target, held_out, args, method) -> None:
    """The held-out evaluation (tokens per target call and acceptance by depth at temperature
    0 and 1, on prompts never trained on) into the log, with the machine and the version that
    made it; the log into out/train_log.json, and the model card rendered from it into
    out/README.md."""
    host = machine(None)
    log.update(specjax=_specjax_version(), host={
        "cpu": host["cpu_model"], "cores": host["threads"], "device": host["device"],
        "jax": host["jax_version"]})
    if held_out:
        for temperature in (0.0, 1.0):
            result = generate(target, held_out, method, SamplingParams(temperature=temperature),
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
            log[f"tokens_per_target_call_t{temperature:g}"] = round(
                result.stats.tokens_per_target_call, 3)
            log[f"acceptance_by_position_t{temperature:g}"] = [
                None if a is None else round(float(a), 3)     # a depth never reached
                for a in result.stats.acceptance_by_position]
        print(f"held out: {log['tokens_per_target_call_t0']} tokens per target call at "
              f"temperature 0, {log['tokens_per_target_call_t1']} at 1", flush=True)
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "README.md").write_text(card.render(out, log, getattr(args, "argv", [])))
    print(out)


def _specjax_version() -> str:
    try:
        return importlib.metadata.version("specjax")
    except importlib.metadata.PackageNotFoundError:       # run from a checkout, not installed
        return "(not installed)"


def _mesh(args, config):
    """--mesh data=N as a mesh, checked against the run's batch before any data is made."""
    mesh = make_mesh(parse_mesh(args.mesh))
    on_mesh({}, mesh, config)
    return mesh


def _check_data_arguments(args) -> None:
    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.held_out < 0:
        raise CLIError(f"--held-out must be >= 0, got {args.held_out}")
    if args.eval_every is not None and args.eval_every < 0:
        raise CLIError(f"--eval-every must be >= 0, got {args.eval_every}")


def _out_and_work(args) -> tuple[Path, Path]:
    out = Path(args.out)
    return out, Path(args.work) if args.work else out.with_name(out.name + ".work")


def _training_data(args, target, work: Path):
    """(the sequences to train on, the held-out prompts): `train data`'s shards (--data), or
    the continuations of --prompts made here, kept in `work`."""
    if args.data:
        try:
            sequences, held_out = data.read(args.data, target)
        except eagle3.TrainError as e:
            raise CLIError(str(e)) from None
        held_out = held_out[:args.held_out]         # the first N of the data's held-out
    else:
        prompts = read_prompts(Path(args.prompts), target, args.chat)
        if len(prompts) <= args.held_out:
            raise CLIError(f"--prompts {args.prompts} has {len(prompts)} prompt(s); --held-out "
                           f"{args.held_out} leaves none to train on")
        train_prompts = prompts[:len(prompts) - args.held_out]
        held_out = prompts[len(prompts) - args.held_out:]
        sequences = _sequences(work, target, train_prompts, args)
    print(f"data: {len(sequences.length)} sequences, "
          f"{int(np.sum(sequences.length - sequences.prompt_length))} generated tokens",
          flush=True)
    return sequences, held_out


def _final_states(args, target, work: Path):
    """(sequences, held-out prompts, features) for the trainers that read only the target's
    final-normed states (Medusa heads, draft models): any finished pass in --features, or a
    pass through the one tap that is cheapest to compute (the embeddings)."""
    sequences, held_out = _training_data(args, target, work)
    return sequences, held_out, _features(target, sequences, (0,), args, final_only=True)


def _features(target, sequences, taps, args, final_only: bool = False) -> eagle3.Features:
    """The features, in memory or in --features; their size said before the pass starts (a disk
    without room for them is refused then, by `eagle3.features`). `final_only`: any finished
    pass in --features serves (`eagle3.features`)."""
    dtype = np.dtype(args.features_dtype)
    n, t = sequences.tokens.shape
    size = n * t * (len(taps) + 1) * target.config.d_model * dtype.itemsize
    where = f"in {args.features}" if args.features else "in memory"
    print(f"features: {n} sequences of up to {t} tokens, taps {list(taps)}, "
          f"{size / 2**30:.2f} GiB in {dtype.name} {where}", flush=True)
    every = max(1, -(-n // 16) // 10)

    def progress(done, total):
        if done == total or (done // 16) % every == 0:
            print(f"features: {done}/{total} sequences", flush=True)

    features = eagle3.features(target, sequences, taps, dtype=dtype, progress=progress,
                               directory=args.features, final_only=final_only)
    if features.taps != taps:
        print(f"features: the final states of the finished pass in {args.features} "
              f"(taps {list(features.taps)})", flush=True)
    return features


def _sequences(work: Path, target, prompts, args) -> eagle3.Sequences:
    """The continuations, generated once per run and kept in `work`."""
    key = json.dumps([target.name, [p if isinstance(p, str) else list(map(int, p))
                                    for p in prompts], args.max_new_tokens,
                      args.data_temperature, args.seed])
    file = work / "sequences.npz"
    if file.exists():
        with np.load(file) as saved:
            if str(saved["key"]) == key:
                return eagle3.Sequences(saved["tokens"], saved["length"], saved["prompt_length"])
    seqs = eagle3.continuations(target, prompts, max_new_tokens=args.max_new_tokens,
                                temperature=args.data_temperature, seed=args.seed,
                                progress=lambda done, total: print(f"data: {done}/{total} "
                                                                   f"prompts", flush=True))
    work.mkdir(parents=True, exist_ok=True)
    np.savez(file, key=np.array(key), tokens=seqs.tokens, length=seqs.length,
             prompt_length=seqs.prompt_length)
    return seqs
