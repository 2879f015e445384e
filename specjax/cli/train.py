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
import shutil
import time
from pathlib import Path

import numpy as np

from specjax.api.methods import DFlash, Eagle, Medusa, Speculative
from specjax.cli import train_args
from specjax.cli import train_stages as stages
from specjax.heads import dflash
from specjax.heads.eagle import Drafter
from specjax.io.checkpoint import load as load_checkpoint
from specjax.io.checkpoint import save as save_model
from specjax.io.dflash import save_block_drafter
from specjax.io.eagle import save_drafter
from specjax.io.medusa import save_heads
from specjax.io.sidecar import check_target, tree_to_json
from specjax.model.transformer import count_params
from specjax.presets import CLIError, load_model, model_paths
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, TreeError
from specjax.train import data, draft, eagle3, medusa
from specjax.train import dflash as dflash_train

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One subcommand a kind (`specjax.cli.train_args`), each wired to its run."""
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    train_args.data_parser(kinds, DESCRIPTION).set_defaults(run=run_data, draft=None)
    train_args.features_parser(kinds, DESCRIPTION).set_defaults(run=run_features, draft=None)
    for name, kind, text in (("eagle3", "eagle3", "a published EAGLE-3 drafter"),
                             ("eagle", "eagle1", "a published EAGLE-1/2 drafter")):
        train_args.eagle_parser(kinds, name, kind, text, DESCRIPTION).set_defaults(
            run=run_train, draft=None)
    train_args.dflash_parser(kinds, DESCRIPTION).set_defaults(run=run_dflash, draft=None)
    train_args.medusa_parser(kinds, DESCRIPTION).set_defaults(run=run_medusa, draft=None)
    train_args.draft_parser(kinds, DESCRIPTION).set_defaults(run=run_draft, draft=None)


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
    prompts = stages.read_prompts(Path(args.prompts), target, args.chat)
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
    taps = stages.read_taps(args, target)
    try:
        sequences, _ = data.read(args.data, target)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    args.features = args.out
    try:
        stages.target_features(target, sequences, taps, args)
    except eagle3.TrainError as e:
        raise CLIError(str(e)) from None
    print(args.out)
    return 0


# -- The trainers' runs: from the flags, checked against the target before hours of data and
# training, to the written drafter, heads or draft model (the stages they share are
# `specjax.cli.train_stages`): the data, the features, training, the trees searched on
# held-out prompts, the layout written and the card.

NO_HELD_OUT_SEARCH = ("several --dynamic-tree are searched on held-out prompts, and there "
                      "are none: give --held-out N, or one tree")
NO_HELD_OUT_TREE = ("--tree-nodes searches a tree on held-out prompts, and there are none: give "
                    "--held-out N, or --tree-nodes 0")


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
    stages.check_data_arguments(args)
    mesh = stages.train_mesh(args, config)
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
    taps = stages.read_taps(args, target) if config.kind == "eagle3" else (0,)
    out, work = stages.out_and_work(args)
    started = time.time()
    sequences, held_out = stages.training_data(args, target, work)
    if len(trees) > 1 and not held_out:             # --data without held-out prompts
        raise CLIError(NO_HELD_OUT_SEARCH)
    features = stages.target_features(target, sequences, taps, args, final_only=config.kind == "eagle1")
    progress = stages.progress_bar(args, config, "loss/agreement by pass" if config.kind == "eagle3"
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
    stages.finish(out, log, target, held_out, args, Eagle(drafter))
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
    stages.check_data_arguments(args)
    if args.mesh:
        raise CLIError("train dflash runs on one device (no --mesh)")
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    if target.config.arch != "llama":
        raise CLIError(f"{target.name} is a {target.config.arch} model; DFlash drafters serve "
                       f"Llama-family targets")
    n = target.config.n_layers
    taps = stages.parse_taps(args) or dflash.default_taps(n, config.layers)
    if not taps or list(taps) != sorted(set(taps)) or taps[0] < 1 or taps[-1] >= n:
        raise CLIError(f"--taps must be increasing layer counts in [1, {n}), got {list(taps)}")
    mask = args.mask_token_id
    if mask is not None and not 0 <= mask < target.config.vocab_size:
        raise CLIError(f"--mask-token-id must be a token id in [0, {target.config.vocab_size}), "
                       f"got {mask}")
    out, work = stages.out_and_work(args)
    started = time.time()
    sequences, held_out = stages.training_data(args, target, work)
    features = stages.target_features(target, sequences, taps, args)
    progress = stages.progress_bar(args, config, "loss/accuracy/accepted prefix", target, held_out,
                         DFlash)
    drafter = dflash_train.train(target, features, config, checkpoint=work / "checkpoint",
                                 progress=progress, mask_token_id=mask)
    save_block_drafter(drafter, out)
    log = {"target": str(target_path), "format": "dflash", "kind": "dflash",
           "taps": list(taps), "config": vars(config),
           "train_sequences": int(len(sequences.length)), "held_out_prompts": len(held_out),
           "seconds": round(time.time() - started, 1)}
    stages.finish(out, log, target, held_out, args, DFlash(drafter))
    return 0


def run_medusa(args) -> int:
    config = medusa.TrainConfig(**{k: getattr(args, k) for k in (
        "steps", "batch", "learning_rate", "warmup", "heads", "blocks", "head", "subset",
        "decay", "clip", "seed", "checkpoint_every", "slots")})
    if config.head == "subset" and args.format == "medusa":
        raise CLIError("--format medusa (FasterDecoding's) holds heads with their own LM heads; "
                       "--head subset needs --format specjax")
    stages.check_data_arguments(args)
    costs = _verify_costs(args)
    mesh = stages.train_mesh(args, config)
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    out, work = stages.out_and_work(args)
    started = time.time()
    sequences, held_out, states = stages.final_states(args, target, work)
    if args.tree_nodes and not held_out:            # --data without held-out prompts
        raise CLIError(NO_HELD_OUT_TREE)
    progress = stages.progress_bar(args, config, "loss/accuracy by head", target, held_out, Medusa)
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
    stages.finish(out, log, target, held_out, args, Medusa(heads))
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
    stages.check_data_arguments(args)
    mesh = stages.train_mesh(args, config)
    target_path, _, _ = model_paths(args, want_draft=False)
    target = load_model(target_path, "float32")
    shape = draft.draft_config(target, config)      # a shape that does not fit, before the data
    out, work = stages.out_and_work(args)
    started = time.time()
    sequences, held_out, states = stages.final_states(args, target, work)
    progress = stages.progress_bar(args, config, "loss/agreement", target, held_out, Speculative)
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
    stages.finish(out, log, target, held_out, args, Speculative(model))
    return 0


def _tokenizer_files(target_path: Path, out: Path) -> None:
    """The target's tokenizer and generation settings beside the draft's weights (`save` wrote
    tokenizer.json), so that Hugging Face's loaders find the special tokens and the chat
    template the target has."""
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if target_path.is_dir() and (target_path / name).is_file():
            shutil.copyfile(target_path / name, out / name)
