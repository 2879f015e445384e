"""`python -m specjax bench --quick` on the embedded tiny-llama pair: the results schema, and
the pieces of the harness that need no model (suite, theory)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specjax
from specjax.bench import theoretical_speedup
from specjax.bench_prompts import SUITE

WEIGHTS = Path(specjax.__file__).resolve().parent.parent / "weights"
ROW_KEYS = {"prompt_id": str, "category": str, "engine": str, "method": str, "new_tokens": int,
            "tokens_per_second": float, "run_s": float, "speedup": float,
            "speedup_vs_specjax_autoregressive": float, "theoretical_speedup": float,
            "measured_over_theoretical": float}
OPTIONAL_NUMBERS = ("acceptance_rate", "tokens_per_target_call", "cost_ratio")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    for name in ("llama-target", "llama-draft"):
        if not (WEIGHTS / name / "model.safetensors").exists():
            pytest.fail(f"{WEIGHTS / name} is missing: bench runs on the embedded tiny-llama "
                        "checkpoints (see weights/README.md)")
    # The same compilation cache as test_cli (same session base directory): the --quick
    # settings match its generate runs, so most programs are already compiled.
    cache = tmp_path_factory.getbasetemp() / "xla"
    cache.mkdir(exist_ok=True)
    out = tmp_path_factory.mktemp("bench-out")
    proc = subprocess.run([sys.executable, "-m", "specjax", "bench", "--quick", "--out", str(out)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
                          env=dict(os.environ, SPECJAX_COMPILE_CACHE=str(cache)))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_quick_bench_writes_results_with_the_documented_schema(quick):
    out, proc = quick
    results = json.loads((out / "results.json").read_text())
    assert results["schema"] == "specjax.bench/1" and results["suite_version"] == SUITE["version"]
    machine = results["machine"]
    assert isinstance(machine["cpu_count"], int) and machine["cpu_count"] >= 1
    assert all(isinstance(machine[k], str) for k in ("platform", "jax_version", "device", "backend"))
    settings = results["settings"]
    assert settings["quick"] is True and settings["ks"] == [2] and settings["reps"] == 1
    assert settings["target"] == "llama-target" and settings["draft"] == "llama-draft"
    assert settings["peers"] is False                      # --quick runs no peers by default
    quick_ids = {p["id"] for p in SUITE["prompts"] if p["quick"]}
    assert {p["id"] for p in results["prompts"]} == quick_ids
    assert isinstance(results["notes"], list) and all(isinstance(n, str) for n in results["notes"])

    expected = {("autoregressive", None), ("speculative", 2), ("ngram", 2)}
    assert len(results["rows"]) == len(expected) * len(quick_ids)
    for row in results["rows"] + results["summary"] + results["by_category"]:
        for key, kind in ROW_KEYS.items():
            if key in row:
                value = row[key]
                assert isinstance(value, kind) or (kind is float and isinstance(value, int)), key
        for key in ("tokens_per_second", "speedup", "theoretical_speedup"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        for key in OPTIONAL_NUMBERS:
            assert row[key] is None or (isinstance(row[key], (int, float)) and row[key] >= 0)
        assert row["k"] is None or isinstance(row["k"], int)
        if row["method"] == "autoregressive":
            assert row["speedup"] == 1.0 and row["acceptance_rate"] is None
        else:
            assert 0 <= row["acceptance_rate"] <= 1 and row["tokens_per_target_call"] >= 1
            assert row["cost_ratio"] >= 0 and row["measured_over_theoretical"] > 0
        # Greedy: every method reproduces the target's own greedy tokens.
        assert row["same_tokens_as_specjax_autoregressive"] is True
    assert results["summary"] and all(r["category"] == "all" for r in results["summary"])
    assert {(r["method"], r["k"]) for r in results["summary"]} == expected
    assert len(results["summary"]) == len(expected)          # one row per method / K
    assert len(results["by_category"]) == len(expected) * 3

    markdown = (out / "results.md").read_text()
    assert "| engine | method | K | tokens/s | speedup |" in markdown
    assert markdown.count("| specjax |") >= len(expected)
    assert "| engine | method | K |" in proc.stdout
    plots = [p for p in ("speedup_vs_k.png", "acceptance_vs_k.png") if (out / p).exists()]
    assert len(plots) == 2 or any("matplotlib" in n for n in results["notes"])


def test_theoretical_speedup():
    assert theoretical_speedup(0.0, 4, 0.0) == 1.0               # nothing accepted, free draft
    assert theoretical_speedup(1.0, 4, 0.0) == 5.0               # everything accepted: K + 1
    assert theoretical_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert theoretical_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)
    assert theoretical_speedup(None, 2, 0.1) is None and theoretical_speedup(0.5, 2, None) is None


def test_prompt_suite_is_versioned_and_has_one_quick_prompt_per_category():
    assert isinstance(SUITE["version"], int)
    prompts = SUITE["prompts"]
    assert len({p["id"] for p in prompts}) == len(prompts)
    categories = {p["category"] for p in prompts}
    assert categories == {"code-completion", "code-editing", "prose-chat"}
    for category in categories:
        assert sum(p["quick"] for p in prompts if p["category"] == category) == 1
