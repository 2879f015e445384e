"""What the suite, the batch sweep and the oracle analysis share: loading the models and the
prompts, timed runs, the statistics and formulas of the reports, writing the reports and their
figures, the machine's description and the progress line.

None of it imports another module of specjax.bench; matplotlib is imported only when a figure is
drawn.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jaxlib
import numpy

from specjax import kernels
from specjax.api.checks import encode_prompts
from specjax.io import chat
from specjax.mesh import plan
from specjax.presets import load_model, make_mesh

CONSTANT = "constant"      # the lookahead schedule of rows that draft K every step
HEADS_TREE = "heads"       # the tree key of medusa and eagle rows that use their own shipped tree
DYNAMIC_PREFIX = "dynamic "  # the tree key of eagle rows with an EAGLE-2 tree: "dynamic 4,4,8"
SWEEP_DECODE_TOKENS = 32   # M: tokens decoded after the first one, for the per-token time


# -- Models, prompts and timed runs -------------------------------------------------------------

def load_pair(target_path, draft_path, dtype: str, settings: dict, notes: list[str]):
    """The target and the draft (None without a path), on the --mesh if one was given: the
    target split, the draft replicated, the layout noted."""
    mesh = make_mesh(settings["mesh"])
    target = load_model(target_path, dtype, mesh)
    draft = load_model(draft_path, dtype, mesh, shard=False) if draft_path is not None else None
    if mesh is not None:
        notes.append(f"mesh data={settings['mesh'][0]} x model={settings['mesh'][1]} on "
                     f"{mesh.devices.flat[0].platform}: {plan(target.config, mesh)}; the draft "
                     "replicated")
    return target, draft


def encode_suite(target, draft, suite, settings, notes) -> list[dict]:
    """The suite's prompts (only the quick ones with settings["quick"]) as token ids, each with
    its max_new_tokens lowered to fit the smaller context window of the two models; a prompt
    that fills the window is skipped with a note. Chat prompts use the target's chat template
    when it has one."""
    prompts, shortened = [], []
    context = min(m.config.max_positions for m in (target, draft) if m is not None)
    for entry in suite:
        if settings["quick"] and not entry["quick"]:
            continue
        use_chat = bool(entry.get("chat")) and bool(target.chat_template)
        ids = (chat.encode(target, chat.render(target, entry["prompt"])) if use_chat
               else encode_prompts(target, [entry["prompt"]])[0])
        n = min(settings["max_new_tokens"], context - len(ids))
        if n < 1:
            notes.append(f"{entry['id']} skipped: its {len(ids)} tokens fill the context window")
            continue
        if n < settings["max_new_tokens"]:
            shortened.append(f"{entry['id']} ({n})")
        prompts.append(dict(entry, chat=use_chat, ids=ids, prompt_tokens=len(ids),
                            max_new_tokens=n))
    if shortened:
        notes.append("max_new_tokens lowered to fit the context window: " + ", ".join(shortened))
    return prompts


def timed_runs(settings, generate_with_seed) -> tuple[list, float]:
    """--warmup untimed calls, then --reps timed ones, timed run i with seed --seed + i: the
    timed runs' results and the first call's compile seconds."""
    results, compile_s = [], 0.0
    for i in range(settings["warmup"] + settings["reps"]):
        result = generate_with_seed(settings["seed"] + max(0, i - settings["warmup"]))
        compile_s = result.stats.compile_s if i == 0 else compile_s
        if i >= settings["warmup"]:
            results.append(result)
    return results, compile_s


def sweep_times(seconds, settings) -> dict:
    """Times of runs of 1 and 1 + M new tokens, paired; `seconds(n)` times one greedy run of n
    new tokens on the job's prompt. Warm-up pairs first: the first run of each length compiles
    (specjax) or pays one-time costs (transformers)."""
    m = SWEEP_DECODE_TOKENS
    for _ in range(max(1, settings["warmup"])):
        seconds(1), seconds(1 + m)
    prefill_s, per_token_s = [], []
    for _ in range(settings["reps"]):
        one, more = seconds(1), seconds(1 + m)
        prefill_s.append(one)
        per_token_s.append((more - one) / m)
    return dict(prefill_s=prefill_s, per_token_s=per_token_s)


# -- Statistics and theory ----------------------------------------------------------------------

def median(values):
    """The median of the values that are not None; None when none is."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    """a / b; None when a is None or b is None or 0."""
    return a / b if a is not None and b else None


def spread(values) -> float | None:
    """(max - min) / median of repeated measurements; None with fewer than two."""
    values = [v for v in values if v is not None]
    if len(values) < 2 or statistics.median(values) <= 0:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def expected_tokens_per_call(a: float | None, k: int | None) -> float | None:
    """(1 - a^(K+1)) / (1 - a): tokens per target call when each of K drafts is accepted with
    probability a independently (Leviathan et al. 2023, Eq. 1)."""
    if a is None or k is None:
        return None
    return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def theoretical_speedup(a: float | None, k: int | None, c: float | None) -> float | None:
    """E / (c K + 1) with E = (1 - a^(K+1)) / (1 - a), the expected tokens per target call
    (Leviathan et al. 2023, Eq. 1 and Theorem 3.8); None when a or c is unknown."""
    if a is None or k is None or c is None:
        return None
    return expected_tokens_per_call(a, k) / (c * k + 1.0)


# -- Reports ------------------------------------------------------------------------------------

def write_report(out, stem: str, results: dict, plots, markdown, printed=None) -> None:
    """Draws the figures (`plots(results, out)`, which may add notes), then writes
    <stem>.json and <stem>.md into `out` and prints the report (`printed(results)`, by default
    the markdown) and the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = plots(results, out)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(results))
    print((printed or markdown)(results), end="")
    print("\nwrote " + ", ".join(str(out / f) for f in [f"{stem}.json", f"{stem}.md", *written]))


def pyplot(results: dict):
    """matplotlib.pyplot on the Agg backend, or None with a note in results when matplotlib is
    not installed."""
    try:
        # matplotlib: a heavy optional dependency (the `bench` extra), imported only to draw.
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        results["notes"].append("figures skipped: matplotlib is not installed "
                                "(pip install specjax[bench])")
        return None
    return plt


def save_figure(fig, path: Path, results: dict) -> None:
    """Writes a figure and records its legend's series under results["figures"]."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    results.setdefault("figures", {})[path.name] = [
        text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().texts]
    # matplotlib: a heavy optional dependency, already imported by `pyplot` to draw `fig`.
    import matplotlib.pyplot as plt

    plt.close(fig)


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    """A table cell: `value` in format `spec` followed by `suffix`; "-" for None."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


# -- Machine and progress -----------------------------------------------------------------------

def machine(peers) -> dict:
    """What results.json records of the machine: platform, CPU, cores and usable threads, the
    versions of Python, jax, jaxlib, numpy, torch, transformers and xllamacpp, the JAX device, the
    kernels' instruction paths by dtype (`specjax.kernels.paths`), and the threads and the device
    torch was given (`peers`, a specjax.bench.peers.Peers or None)."""
    device = jax.devices()[0]
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_model": _cpu_model(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "threads": usable_threads(),
            "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
            "numpy_version": numpy.__version__, "torch_version": _version("torch"),
            "transformers_version": _version("transformers"),
            "xllamacpp_version": _version("xllamacpp"),
            "backend": jax.default_backend(), "device": f"{device.platform} ({device.device_kind})",
            "kernel_paths": kernels.paths(),
            "torch_threads": peers.threads if peers else None,
            "torch_device": peers.device if peers else None}


def _cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo on Linux, with its family, model and widest vector
    extension (hosts that print the same name, "AMD EPYC", differ in these); what `platform`
    knows elsewhere."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if key.strip() == "flags":
                    break
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    flags = fields.get("flags", "").split()
    vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"))
                   if flag in flags), "no AVX2")
    if "avx512_bf16" in flags:
        vector += " with BF16"
    return (f"{fields['model name']} (family {fields.get('cpu family', '?')}, model "
            f"{fields.get('model', '?')}, {vector})")


def _version(package: str) -> str | None:
    """An installed package's version, without importing it; None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def usable_threads() -> int:
    """The cores this process may run on (its CPU affinity), the thread count of JAX's CPU
    backend; os.cpu_count() where affinity is unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Progress:
    """A progress bar on stderr when it is a terminal; one line per job otherwise, each with the
    seconds since the first job began (a log then says what each job cost)."""

    def __init__(self, total: int, stream=None, width: int = 24):
        # sys.stderr as it is now, not as it was at import (a test may have replaced it since)
        stream = sys.stderr if stream is None else stream
        self.total, self.stream, self.width, self.done = total, stream, width, 0
        self.tty = stream.isatty()
        self.start = time.perf_counter()

    def update(self, label: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        if self.tty:
            filled = self.width * (self.done - 1) // max(self.total, 1)
            self.stream.write(f"\r\x1b[Kbench [{'#' * filled}{'.' * (self.width - filled)}] "
                              f"{self.done}/{self.total} {elapsed:4.0f}s {label}")
        else:
            self.stream.write(f"bench {self.done}/{self.total} at {elapsed:.0f}s: {label}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
