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
from pathlib import Path

from specjax.cli import train_args
from specjax.cli import train_stages as stages
from specjax.cli.train_runs import run_dflash, run_draft, run_medusa, run_train
from specjax.presets import CLIError, load_model, model_paths
from specjax.sampling.params import SamplingParams
from specjax.train import data, eagle3

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
