"""The `generate` command's flags, one function per argument group: the prompt, decoding (the
method, its lengths and schedules, the sampling), token trees, the controls, and the output."""

from __future__ import annotations

import argparse

from specjax.api import options
from specjax.api.methods import TYPES

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
