"""`python -m specjax bench --quick` on the embedded tiny-llama pair: the results schema, and
the pieces of the harness that need no model run (suite, settings, theory, spread)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specjax
from specjax.bench import batch as bench_batch
from specjax.bench import parse_settings, report
from specjax.bench import settings as settings_bench
from specjax.bench.common import encode_suite, theoretical_speedup
from specjax.bench.peers import Peers
from specjax.bench.prompts import SUITE
from specjax.bench.report import METRICS, summarize
from specjax.cli.main import build_parser, main

# One test worker runs test_bench and test_cli (see test_cli's pytestmark).
pytestmark = pytest.mark.xdist_group("cli")

WEIGHTS = Path(specjax.__file__).resolve().parent.parent / "weights"
ROW_KEYS = {"prompt_id": str, "category": str, "engine": str, "method": str, "new_tokens": int,
            "tokens_per_second": float, "run_s": float, "speedup": float,
            "speedup_vs_specjax_autoregressive": float, "theoretical_speedup": float,
            "measured_over_theoretical": float}
OPTIONAL_NUMBERS = ("acceptance_rate", "tokens_per_target_call", "cost_ratio")


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


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
    # Two timed runs, so that the spreads are numbers; one short context for the sweep.
    args = ["bench", "--quick", "--reps", "2", "--contexts", "20", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "specjax", *args],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
                          env=dict(os.environ, SPECJAX_COMPILE_CACHE=str(cache)))
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.mark.slow
def test_quick_bench_writes_results_with_the_documented_schema(quick):
    out, proc = quick
    results = json.loads((out / "results.json").read_text())
    assert results["schema"] == "specjax.bench/1" and results["suite_version"] == SUITE["version"]
    machine = results["machine"]
    assert isinstance(machine["cpu_count"], int) and machine["cpu_count"] >= 1
    assert all(isinstance(machine[k], str) and machine[k]
               for k in ("platform", "cpu_model", "python", "jax_version", "jaxlib_version",
                         "numpy_version", "device", "backend"))
    for package in ("torch", "transformers"):                # recorded even without peers
        assert machine[f"{package}_version"] == installed_version(package)
    settings = results["settings"]
    assert settings["quick"] is True and settings["ks"] == [2] and settings["reps"] == 2
    assert settings["contexts"] == [20]
    assert settings["target"] == "llama-target" and settings["draft"] == "llama-draft"
    assert settings["peers"] is False                      # --quick runs no peers by default
    quick_ids = {p["id"] for p in SUITE["prompts"] if p["quick"]}
    assert {p["id"] for p in results["prompts"]} == quick_ids
    assert isinstance(results["notes"], list) and all(isinstance(n, str) for n in results["notes"])

    # tiny-llama ships Medusa heads and an EAGLE drafter, so the default methods include medusa
    # and eagle (each with its own tree).
    assert settings["heads"] == "llama-medusa" and settings["heads_tree"]
    assert settings["drafter"] == "llama-eagle" and settings["drafter_tree"]
    expected = {("autoregressive", None), ("speculative", 2), ("ngram", 2), ("medusa", None),
                ("eagle", None), ("eagle", 2)}
    assert len(results["rows"]) == len(expected) * len(quick_ids)
    for row in results["rows"] + results["summary"] + results["by_category"]:
        for key, kind in ROW_KEYS.items():
            if key in row and row[key] is not None:       # None: checked by method below
                value = row[key]
                assert isinstance(value, kind) or (kind is float and isinstance(value, int)), key
        # No theory for medusa and eagle rows: their drafting cost is not measured by the bench.
        theory = () if row["method"] in ("medusa", "eagle") else ("theoretical_speedup",)
        for key in ("tokens_per_second", "speedup", *theory):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        for key in OPTIONAL_NUMBERS:
            assert row[key] is None or (isinstance(row[key], (int, float)) and row[key] >= 0)
        assert row["k"] is None or isinstance(row["k"], int)
        if row["method"] == "autoregressive":
            assert row["speedup"] == 1.0 and row["acceptance_rate"] is None
        elif row["method"] in ("medusa", "eagle"):
            assert row["tree"] == ("heads" if row["k"] is None else None)
            assert row["tokens_per_target_call"] > 1
            assert row["cost_ratio"] is None and row["theoretical_speedup"] is None
        else:
            assert 0 <= row["acceptance_rate"] <= 1 and row["tokens_per_target_call"] >= 1
            assert row["cost_ratio"] >= 0 and row["measured_over_theoretical"] > 0
        # Greedy: every method reproduces the target's own greedy tokens.
        assert row["same_tokens_as_specjax_autoregressive"] is True
    for row in results["rows"]:
        assert len(row["per_run_tokens_per_second"]) == len(row["per_run_speedup"]) == 2
    for row in results["summary"] + results["by_category"]:
        for key in ("speedup_spread", "speedup_vs_specjax_autoregressive_spread"):
            assert isinstance(row[key], float) and 0 <= row[key] < 10, (key, row)
        if row["method"] == "autoregressive":
            assert row["speedup_spread"] == 0.0               # 1.0 in every run
    # One definition of speedup: the ratio of the tokens/s column to the autoregressive row's.
    for table in ("summary", "by_category"):
        ar = {r["category"]: r["tokens_per_second"] for r in results[table]
              if r["method"] == "autoregressive"}
        for row in results[table]:
            assert row["speedup"] == pytest.approx(row["tokens_per_second"] / ar[row["category"]])
    assert results["summary"] and all(r["category"] == "all" for r in results["summary"])
    assert {(r["method"], r["k"]) for r in results["summary"]} == expected
    assert len(results["summary"]) == len(expected)          # one row per method / K
    assert len(results["by_category"]) == len(expected) * 3

    sweep = results["context_sweep"]
    assert [(r["engine"], r["context_tokens"]) for r in sweep] == [("specjax", 20)]
    assert sweep[0]["runs"] == 2 and sweep[0]["per_token_over_shortest"] == 1.0
    for key in ("prefill_s", "per_token_ms", "prefill_spread", "per_token_spread"):
        assert isinstance(sweep[0][key], float) and math.isfinite(sweep[0][key]), key
    assert sweep[0]["prefill_s"] > 0 and sweep[0]["per_token_ms"] > 0

    markdown = (out / "results.md").read_text()
    assert ("| engine | method | K | tokens/s | speedup (ratio of medians) | spread | "
            "vs specjax AR | spread |" in markdown)
    assert f"Machine: {machine['cpu_model']}, {machine['cpu_count']} cores" in markdown
    assert "| context tokens | engine | prefill + first token |" in markdown
    assert "| 20 | specjax |" in markdown
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


def _suite_row(prompt, method, per_run, **metrics):
    return dict(engine="specjax", method=method, k=None if method == "autoregressive" else 2,
                prompt_id=prompt, same_tokens_as_specjax_autoregressive=True,
                per_run_tokens_per_second=per_run,
                **{m: metrics.get(m, 1.0) for m in METRICS})


def test_speedup_is_the_ratio_of_the_medians_not_the_median_of_the_ratios():
    # Three prompts. Per-prompt ratios 12/10, 13/20, 50/30 have the median 1.2; the medians of
    # tokens/s are 13 and 20, whose ratio, 0.65, is the one definition the tables use.
    ar = [_suite_row(p, "autoregressive", [t, t], tokens_per_second=t)
          for p, t in (("a", 10.0), ("b", 20.0), ("c", 30.0))]
    ngram = [_suite_row(p, "ngram", [t, t], tokens_per_second=t, tokens_per_target_call=1.3)
             for p, t in (("a", 12.0), ("b", 13.0), ("c", 50.0))]
    rows = {r["method"]: r for r in summarize(ar + ngram, "all")}
    assert rows["autoregressive"]["speedup"] == 1.0
    assert rows["ngram"]["tokens_per_second"] == 13.0
    assert rows["ngram"]["speedup"] == pytest.approx(13.0 / 20.0)
    assert rows["ngram"]["speedup_vs_specjax_autoregressive"] == pytest.approx(13.0 / 20.0)
    assert rows["ngram"]["step_cost"] == pytest.approx(1.3 / (13.0 / 20.0))


def test_spread_is_the_range_of_the_suite_runs_over_their_median():
    # Suite run i: the median over the prompts of their run-i tokens/s, over the autoregressive
    # rows' median of theirs: [10.5 / 10, 12.5 / 10] = [1.05, 1.25].
    rows = [_suite_row("a", "autoregressive", [10.0, 10.0]),
            _suite_row("b", "autoregressive", [10.0, 10.0]),
            _suite_row("a", "ngram", [10.0, 12.0]), _suite_row("b", "ngram", [11.0, 13.0])]
    summary = {r["method"]: r for r in summarize(rows, "all")}["ngram"]
    assert summary["speedup_spread"] == pytest.approx(0.2 / 1.15)
    assert summary["speedup_vs_specjax_autoregressive_spread"] == pytest.approx(0.2 / 1.15)
    one_run = {r["method"]: r for r in summarize(
        [_suite_row("a", "autoregressive", [10.0]), _suite_row("a", "ngram", [11.0])],
        "all")}["ngram"]
    assert one_run["speedup_spread"] is None


def test_contexts_default_to_the_sweep_of_the_issue_and_to_none_with_quick():
    def settings(*argv):
        return parse_settings(build_parser().parse_args(["bench", *argv]))
    assert settings()["contexts"] == [50, 500, 1500]
    assert settings("--quick")["contexts"] == []
    assert settings("--quick", "--contexts", "1500,50,50")["contexts"] == [50, 1500]
    assert settings("--contexts", "none")["contexts"] == []


@pytest.mark.parametrize("argv, option, value", [
    (["--contexts", "0"], "--contexts", "0"), (["--contexts", "50,abc"], "--contexts", "50,abc"),
    (["--contexts", ""], "--contexts", ""), (["--contexts=-5"], "--contexts", "-5"),
    (["--contexts", "50,,500"], "--contexts", "50,,500"), (["--ks", "0"], "--ks", "0")])
def test_bad_bench_options_exit_2_with_one_line_naming_the_value(argv, option, value, capsys,
                                                                 tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("specjax: error: "), err
    assert f"{option} must be comma-separated positive integers, got {value!r}" in err[0]
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("argv, shown", [
    (["--temperature", "1", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["--temperature", "1", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--top-p", "0.9"], "--top-p applies when --temperature > 0"),
    (["--temperature", "1", "--top-p", "0.9", "--oracle"], "--top-p does not apply to --oracle")])
def test_bad_top_p_exits_2_with_one_line(argv, shown, capsys, tmp_path):
    assert main(["bench", "--quick", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and shown in err[0], err
    assert not (tmp_path / "results.json").exists()


def test_top_p_reaches_the_settings_and_the_peers_sampling():
    settings = parse_settings(build_parser().parse_args(
        ["bench", "--temperature", "0.7", "--top-p", "0.9"]))
    assert (settings["temperature"], settings["top_p"]) == (0.7, 0.9)
    assert parse_settings(build_parser().parse_args(["bench"]))["top_p"] == 1.0
    peers = Peers.__new__(Peers)
    peers.torch = type("torch", (), {"ones_like": staticmethod(lambda ids: ids)})
    peers.target = type("target", (), {"generation_config": type("g", (), {"eos_token_id": 2})})
    kwargs = peers.generate_kwargs([[1]], 8, 0.7, 0.9)
    assert (kwargs["do_sample"], kwargs["temperature"], kwargs["top_p"], kwargs["top_k"]) == \
        (True, 0.7, 0.9, 0)


def test_peers_run_where_jax_runs_and_their_greedy_tokens_are_the_targets():
    """On the CPU backend the transformers peer stays on the CPU with JAX's thread count (on a
    GPU backend it would go to the card: bench/gpu-h200-first/), and its greedy run of a suite
    job gives specjax's greedy tokens on the same weights."""
    target = specjax.load(WEIGHTS / "llama-target")
    settings = dict(temperature=0.0, top_p=1.0, warmup=0, reps=1, seed=0, max_ngram=3)
    notes = []
    peers = Peers.create(target, None, settings, "float32", notes)
    assert peers.device == "cpu" and next(peers.target.parameters()).device.type == "cpu"
    assert any("torch.set_num_threads" in note for note in notes)
    prompt = [5, 17, 99, 4, 250, 31]
    job = peers.job(dict(ids=prompt, max_new_tokens=12), "autoregressive", None)()
    ours = specjax.generate(target, [prompt], sampling=specjax.SamplingParams(temperature=0.0),
                            max_new_tokens=12, eos_ids=())
    assert job["records"][0]["tokens"] == ours.tokens[0][:len(job["records"][0]["tokens"])]
    assert len(job["records"][0]["tokens"]) >= 1


def test_prompt_suite_is_versioned_and_has_one_quick_prompt_per_short_category():
    assert isinstance(SUITE["version"], int)
    prompts = SUITE["prompts"]
    assert len({p["id"] for p in prompts}) == len(prompts)
    categories = {p["category"] for p in prompts}
    assert categories == {"code-completion", "code-editing", "long-code-editing", "prose-chat"}
    for category in categories - {"long-code-editing"}:
        assert sum(p["quick"] for p in prompts if p["category"] == category) == 1


def test_long_code_editing_prompts_hold_a_whole_module_and_are_skipped_where_they_do_not_fit():
    """About 1,400 tokens with SmolLM2's tokenizer; more with the embedded models' smaller
    vocabulary, whose 256-position window cannot hold them: skipped with a note."""
    target = specjax.load(WEIGHTS / "llama-target")
    long = [p for p in SUITE["prompts"] if p["category"] == "long-code-editing"]
    assert long and not any(p["quick"] for p in long)
    for p in long:
        assert len(target.tokenizer.encode(p["prompt"]).ids) >= 1000
        assert "\nclass Ledger:" in p["prompt"] and "\ndef merge(" in p["prompt"]
    notes = []
    settings = dict(quick=False, max_new_tokens=16)
    kept = encode_suite(target, None, SUITE["prompts"], settings, notes)
    assert {p["id"] for p in kept} == {p["id"] for p in SUITE["prompts"]} - {p["id"] for p in long}
    assert all(any(p["id"] in n and "context window" in n for n in notes) for p in long)


def test_figures_render_from_results_with_the_theory_series(tmp_path):
    # The figures come from results.json alone: a small fixture of two methods over three K.
    rows = []
    for method, c in (("speculative", 0.4), ("ngram", 0.0)):
        for k in (1, 2, 4):
            a = 0.7
            rows.append(dict(engine="specjax", method=method, k=k, tree=None,
                             schedule="constant", speedup=1.0 + 0.1 * k, acceptance_rate=a,
                             tokens_per_target_call=1.0 + k * a,
                             theoretical_speedup=theoretical_speedup(a, k, c),
                             accepted_histogram=[10] + [5] * k))
    rows.append(dict(engine="specjax", method="autoregressive", k=None, tree=None,
                     schedule="constant", speedup=1.0, acceptance_rate=None,
                     tokens_per_target_call=1.0, theoretical_speedup=1.0,
                     accepted_histogram=None))
    results = dict(summary=rows, settings=dict(ks=[1, 2, 4], target="tiny"), notes=[],
                   machine=dict(cpu_model="cpu"), created="2026-11-23T00:00:00")
    written = report.plots(results, tmp_path)
    assert written == ["speedup_vs_k.png", "acceptance_vs_k.png", "tokens_per_call_vs_k.png",
                       "acceptance_by_position.png"]
    assert all((tmp_path / name).stat().st_size > 1000 for name in written)
    series = results["figures"]
    assert "specjax speculative (theory)" in series["speedup_vs_k.png"]
    assert any("(1 - a^(K+1)) / (1 - a)" in s for s in series["tokens_per_call_vs_k.png"])
    assert any(s.startswith("speculative K=4") for s in series["acceptance_by_position.png"])


def _batch_job(batch, engine, method, k, seconds, tokens, calls=None, drafted=0, accepted=0):
    record = dict(new_tokens=sum(map(len, tokens)), run_s=seconds, target_calls=calls,
                  drafted=drafted, accepted=accepted, idle_fraction=0.1 if k else 0.0,
                  tokens=tokens)
    return dict(batch=batch, engine=engine, method=method, k=k,
                result=dict(records=[record], compile_s=1.0))


def test_batch_sweep_rows_speedups_cost_model_and_report(tmp_path):
    greedy = [[1, 2, 3, 4], [5, 6, 7, 8]]
    jobs = [_batch_job(2, "specjax", "autoregressive", None, 2.0, greedy, calls=8),
            _batch_job(2, "specjax", "speculative", 2, 1.0, greedy, calls=4, drafted=8,
                       accepted=4),
            _batch_job(2, "specjax", "ngram", 2, 4.0, [[1, 2, 3, 4], [5, 6, 7, 9]], calls=8),
            _batch_job(2, "transformers", "autoregressive", None, 4.0, greedy),
            dict(batch=2, engine="specjax", method="call-times", k=None,
                 result=dict(target_1=0.010, target_3=0.015, draft_1=0.002))]
    rows = {(r["engine"], r["method"]): r for r in bench_batch.batch_rows(jobs)}
    spec = rows[("specjax", "speculative")]
    assert spec["tokens_per_second"] == 8.0 and spec["speedup"] == 2.0
    assert spec["tokens_per_target_call"] == 2.0 and spec["acceptance_rate"] == 0.5
    assert spec["v"] == pytest.approx(1.5) and spec["c"] == pytest.approx(0.2)
    assert spec["cost_model"] == pytest.approx(2.0 / (0.2 * 2 + 1.5))
    assert rows[("specjax", "ngram")]["c"] == 0.0
    assert rows[("transformers", "autoregressive")]["speedup"] == 0.5
    # Greedy rows must repeat autoregressive's tokens; the n-gram fixture does not.
    assert spec["same_tokens_as_specjax_autoregressive"] is True
    assert rows[("specjax", "ngram")]["same_tokens_as_specjax_autoregressive"] is False
    assert all(r["same_tokens_as_specjax_autoregressive"] is None
               for r in bench_batch.batch_rows(jobs, sampled=True))
    results = dict(rows=list(rows.values()), notes=[], created="2026-11-23T00:00:00",
                   machine=dict(cpu_model="cpu", threads=2, jax_version="0"),
                   settings=dict(batch=[2], target="tiny", draft="d", temperature=0.0,
                                 max_new_tokens=4, reps=1))
    table = bench_batch.markdown(results)
    assert "| 2 | specjax | speculative | 2 | 8.0 | 2.00x | 2.00 |" in table
    assert "| NO |" in table
    assert bench_batch.plots(results, tmp_path) == ["tokens_per_second_vs_batch.png",
                                                    "speedup_vs_batch.png"]
    assert "specjax speculative K=2 cost model" in results["figures"]["speedup_vs_batch.png"]


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch must be comma-separated positive integers, got '0'"),
    (["--batch", "2", "--oracle"], "--batch and --oracle are two different runs"),
    (["--batch", "2", "--trees", "2,1"], "--trees does not apply to --batch"),
    (["--batch", "2", "--k-schedules", "heuristic"], "--k-schedules does not apply to --batch"),
    (["--batch", "2", "--contexts", "50"], "--contexts does not apply to --batch"),
    (["--oracle", "--settings"], "--oracle and --settings are two different runs")])
def test_bad_batch_options_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0], err


def test_settings_latency_reuses_the_program_and_reports_it(tmp_path, capsys):
    # bench --settings on the tiny pair: one row per method with a time for each new setting
    # (that these reuse the compiled program is tests/exactness/test_rows.py's, counting compilations).
    assert main(["bench", "--preset", "tiny-llama", "--settings", "--reps", "1", "--methods",
                 "autoregressive,speculative", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "settings.json").read_text())
    assert [r["method"] for r in results["rows"]] == ["autoregressive", "speculative"]
    for row in results["rows"]:
        assert set(row["new_s"]) == set(settings_bench.NEW) == set(row["ratio"])
        assert all(t > 0 for t in row["new_s"].values()) and row["same_s"] > 0
    assert "| speculative |" in (tmp_path / "settings.md").read_text()
