"""The `train` command's arguments: one parser a kind (`train data`, `features`, `eagle3`,
`eagle`, `dflash`, `medusa`, `draft`) and the groups they share (the target, the training data,
the features). The command wires each parser to its run in `specjax.cli.train`."""

from __future__ import annotations

import argparse

from specjax.io.published import HEADS_FORMATS
from specjax.presets import DEFAULT_PRESET, PRESETS
from specjax.train import dflash as dflash_train
from specjax.train import draft, eagle3, medusa
from specjax.train import prompts as prompt_sets

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
# target call at T = 1 against 1.41 with a chain of 4, tests/training/test_train.py's drafter): they get
# a chain of this length, `generate`'s default k.
DEFAULT_SAMPLED_CHAIN = 4


def _kind(kinds, name: str, text: str, description: str) -> argparse.ArgumentParser:
    """A kind's parser, with the command's description and the target's group."""
    p = kinds.add_parser(name, help=text, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_arguments(p)
    return p


def _target_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("the target")
    group.add_argument("--preset", choices=sorted(PRESETS),
                       help=f"a preset's target (default: {DEFAULT_PRESET})")
    group.add_argument("--target", metavar="DIR|FILE.gguf",
                       help="the target checkpoint: a Hugging Face directory or a GGUF file")


def _config_arguments(p: argparse.ArgumentParser, defaults, options, helps=()) -> None:
    """One flag per training-config field (`options`: (name, type) pairs), defaulting to
    `defaults`' value; its help from `helps`, then OPTION_HELP, then the default."""
    for option, type_ in options:
        default = getattr(defaults, option)
        p.add_argument("--" + option.replace("_", "-"), type=type_, default=default,
                       help=dict(helps).get(option, OPTION_HELP.get(option, f"default {default}")))


def data_parser(kinds, description: str) -> argparse.ArgumentParser:
    """`train data`: the target's continuations of a prompt set, in shards."""
    d = _kind(kinds, "data", "the target's continuations of a prompt set, in shards",
              description)
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
    return d


def features_parser(kinds, description: str) -> argparse.ArgumentParser:
    """`train features`: the target's states over `train data`'s continuations, on disk."""
    f = _kind(kinds, "features", "the target's states over `train data`'s continuations, on "
              "disk (what eagle3/eagle --features reads)", description)
    f.add_argument("--data", required=True, metavar="DIR", help="made by `train data`")
    f.add_argument("--out", required=True, metavar="DIR",
                   help="the features, memory-mapped; a pass started again resumes")
    _features_arguments(f, out=False)
    return f


def eagle_parser(kinds, name: str, kind: str, text: str,
                 description: str) -> argparse.ArgumentParser:
    """`train eagle3` (`kind` "eagle3") or `train eagle` ("eagle1"): a published drafter."""
    p = _kind(kinds, name, text, description)
    _data_arguments(p)
    p.add_argument("--format", default="eagle", choices=FORMATS,
                   help="the layout written (default: the EAGLE repo's)")
    _features_arguments(p, out=True, taps=kind == "eagle3")
    defaults = eagle3.TrainConfig()
    _config_arguments(p, defaults, (
        ("steps", int), ("batch", int), ("learning_rate", float), ("warmup", int),
        ("unroll", int), ("decay", float), ("clip", float), ("noise", float), ("seed", int),
        ("checkpoint_every", int), ("slots", int)) + (
        (("draft_vocab", int),) if kind == "eagle3" else ()))
    if kind == "eagle1":
        _eagle1_arguments(p)
    _eagle_tree_arguments(p)
    p.add_argument("--init", metavar="DIR",
                   help="start from this drafter's weights and draft vocabulary (ours or "
                        "published, trained on this target, of the shape this run "
                        "trains): fine-tuning it, e.g. with a larger --unroll")
    p.set_defaults(drafter_kind=kind, **(
        {} if kind == "eagle3" else {"draft_vocab": defaults.draft_vocab}))
    return p


def _eagle1_arguments(p: argparse.ArgumentParser) -> None:
    """EAGLE-1/2's variants that only specjax's layout holds."""
    p.add_argument("--style", choices=("published", "specjax"), default="published",
                   help="specjax: its own norm before the head, the fusion reading "
                        "[feature ; embedding] (the shipped SmolLM2 drafter's; needs "
                        "--format specjax)")
    p.add_argument("--subset", type=int, default=0, metavar="N",
                   help="propose from the N ids the target generated most often, "
                        "through its LM-head rows (default 0: the whole vocabulary; "
                        "needs --format specjax)")


def _eagle_tree_arguments(p: argparse.ArgumentParser) -> None:
    """The trees written into an EAGLE drafter: greedy rows' dynamic tree, sampled rows' chain."""
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


def dflash_parser(kinds, description: str) -> argparse.ArgumentParser:
    """`train dflash`: a DFlash block drafter."""
    x = _kind(kinds, "dflash", "a DFlash block drafter (its authors' published layout)",
              description)
    _data_arguments(x)
    _features_arguments(x, out=True, taps=False)
    x.add_argument("--taps", metavar="A,B",
                   help="the target's layer counts whose outputs it reads, >= 1 (default: the "
                        "published code's, one per draft layer: the middle layer for one)")
    _config_arguments(x, dflash_train.TrainConfig(), (
        ("steps", int), ("batch", int), ("learning_rate", float), ("warmup", int),
        ("clip", float), ("seed", int), ("checkpoint_every", int), ("slots", int),
        ("block_size", int), ("layers", int), ("anchors", int), ("decay", float)),
        helps=DFLASH_HELP.items())
    x.add_argument("--mask-token-id", type=int, metavar="ID",
                   help="the token the block's masked slots are embedded as (default: the "
                        "target's last id)")
    return x


def medusa_parser(kinds, description: str) -> argparse.ArgumentParser:
    """`train medusa`: Medusa-1 heads, and the tree searched for them."""
    m = _kind(kinds, "medusa", "published Medusa-1 heads (FasterDecoding's layout)",
              description)
    _data_arguments(m)
    m.add_argument("--format", default="medusa", choices=HEADS_FORMATS,
                   help="the layout written (default: FasterDecoding's; head subset needs "
                        "specjax's)")
    _features_arguments(m, out=True, taps=False)
    defaults = medusa.TrainConfig()
    _config_arguments(m, defaults, (
        ("steps", int), ("batch", int), ("learning_rate", float), ("warmup", int),
        ("heads", int), ("blocks", int), ("decay", float), ("clip", float), ("subset", int),
        ("seed", int), ("checkpoint_every", int), ("slots", int)))
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
    return m


def draft_parser(kinds, description: str) -> argparse.ArgumentParser:
    """`train draft`: a draft model, its shape defaulting to the target's proportions."""
    r = _kind(kinds, "draft", "a draft model: a small Llama LM (Hugging Face layout)",
              description)
    _data_arguments(r)
    _features_arguments(r, out=True, taps=False)
    _config_arguments(r, draft.TrainConfig(), (
        ("steps", int), ("batch", int), ("learning_rate", float), ("warmup", int),
        ("clip", float), ("seed", int), ("checkpoint_every", int), ("slots", int),
        ("layers", int)))
    for name, default in (("d_model", "half the target's"),
                          ("heads", "d_model / the target's head size"),
                          ("kv_heads", "heads"),
                          ("d_ff", "the target's d_ff / d_model ratio, a multiple of 32")):
        r.add_argument("--" + name.replace("_", "-"), type=int, help=f"default {default}")
    return r
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
