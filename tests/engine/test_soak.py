"""A long-running process stays healthy: 1,000 `generate` calls with random settings in one
process (scripts/soak.py, tiny models) compile a bounded number of programs, none after the first
200 calls, and the process's memory does not grow after them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_thousand_calls_with_random_settings():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--calls", "1000",
                             "--settle", "200", "--seed", "0"], capture_output=True, text=True,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # Three methods x one prompt bucket x two buffer sizes, and the few programs that place
    # inputs (keys, per-row arrays): settings are data, so nothing else compiles.
    assert report["programs"] <= 8, report
    assert report["xla_compiles_after_settle"] == 0, report
    assert report["rss_mib_end"] - report["rss_mib_after_settle"] < 20, report
