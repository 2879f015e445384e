"""The memory maps one process holds (issue 74, "Measures"): after the compiled forward's loop
of tests/engine/test_forward_compiled.py (4 dtypes x 3 widths x kernels on and off, twice), and after
one `specjax bench` run in the same process (SmolLM2, the quick prompts, every method of the
preset, K = 4, one timed run). An eager loop over `specjax.forward` once ran a process out of
maps (`vm.max_map_count`, 65,530 here): each op dispatched on its own left code mapped.

    python bench/compile-once-per-layer/maps.py --out bench/compile-once-per-layer/maps.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def maps() -> int:
    return len(Path("/proc/self/maps").read_text().splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    record = {"max_map_count": limit}
    import jax
    from specjax.cli.main import main as cli
    from tests.engine import test_forward_compiled as loop
    record["after import"] = maps()
    start = time.perf_counter()
    loop._run_all()
    loop._run_all()
    record["after the forward loop (24 programs, each called twice)"] = maps()
    record["forward loop seconds"] = round(time.perf_counter() - start, 1)
    start = time.perf_counter()
    code = cli(["bench", "--preset", "smollm2", "--quick", "--ks", "4", "--reps", "1",
                "--warmup", "0", "--no-peers", "--contexts", "none", "--max-new-tokens", "32",
                "--out", str(args.out.parent / "maps-bench")])
    record["bench exit code"] = code
    record["after one bench run"] = maps()
    record["bench seconds"] = round(time.perf_counter() - start, 1)
    record["jax"] = jax.__version__
    record["specjax"] = importlib.metadata.version("specjax")
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
