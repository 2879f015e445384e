"""Greedy identity on XLA's path before issue 85's law: every target call at its own width
(`law_width=1`, which also turns off the branch layout of tree calls and the rounded products,
as the code was), the identity check's prompts and methods otherwise as `check --identity`.

    python bench/xla-one-law/before.py [--dtypes float32 bfloat16 int8 q8_0] [--tokens 32]

Prints the check's table, a row as each method finishes (the engine column says "w=1"). Run a
dtype or two a process: one process that compiled every method's programs in three dtypes ran
out of memory in XLA's LLVM compiler on the 24 GiB host.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from specjax.io.fetch import fetch
from specjax.testing import identity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8", "q8_0"])
    parser.add_argument("--methods", nargs="+",
                        default=["speculative", "ngram", "medusa", "eagle", "dflash"])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    smollm2, load = Path(fetch("smollm2")).resolve(), identity.load

    def at_own_width(path, **options):          # the target only: its drafters are as shipped
        model = load(path, **options)
        if Path(path).resolve() != smollm2:
            return model
        return dataclasses.replace(model, config=model.config.replace(law_width=1))

    identity.load = at_own_width
    print(identity.heading(args.tokens), flush=True)
    identity.specjax_rows(args.dtypes, args.methods, tokens=args.tokens, paths=["xla"],
                          progress=lambda r: print(identity.line(dataclasses.replace(
                              r, engine=r.engine.replace(" xla", " w=1"))), flush=True))


if __name__ == "__main__":
    main()
