"""llama.cpp as a peer in `bench`: the same weights as a GGUF at the bench's precision, run
by llama.cpp's in-process server (the `xllamacpp` package from PyPI: prebuilt CPU wheels), in
the same run as specjax and transformers.

What runs and how it is measured:
- The weights: the GGUF the target came from (the `smollm2` preset's download, or a
  `--target FILE.gguf`), re-encoded with the `gguf` package at the bench's --dtype: F32 for
  float32, BF16 for bfloat16, Q8_0 for int8 and q8_0 (the norms, vectors, stay F32, as
  llama.cpp's converter writes them). Every tensor is dequantised and written again with the same metadata, so llama.cpp
  runs the numbers specjax runs (specjax dequantises the same file when it loads it, and its
  int8 quantiser gives the Q8_0 file's very values and scales, `specjax.model.quant`). The
  re-encoded file is kept in <cache>/gguf/.
- The methods: `autoregressive` (llama.cpp's plain decoding) and `ngram` (its n-gram
  speculation, `ngram-map-k`: a match of at most --max-ngram tokens in the context proposes up
  to K tokens), greedy or at the bench's temperature and top-p (top-k off).
- Its fastest: plain decoding also runs in each of `FASTEST_KINDS` (F16, Q8_0, Q4_1) that is
  not the bench's own, as engine "llama.cpp F16" and so on, so that every specjax row has a
  ratio to llama.cpp's fastest plain decode of the same model in the same run, in whatever
  precision that is (issue 62). A kind the source file is already stored in (the `smollm2`
  download's Q4_1) runs that file as downloaded, the file llama.cpp's users run.
- The threads: the cores JAX's CPU backend uses, for both prompt and decode.
- The process: each job (a prompt and a method) runs llama.cpp in a child process, away from
  torch's OpenMP runtime, which halved llama.cpp's speed when the two shared this one
  (`LlamaCpp`).
- The times: llama.cpp's own `timings` (prompt_ms, predicted_ms) give prompt and decode speed
  apart; run_s is the wall time of the completion call, as specjax's is of `generate`. Each
  run starts from an empty cache (`cache_prompt` off), so every run prefills the prompt.

xllamacpp and gguf are optional (the `llamacpp` extra); without them, or without a GGUF for the
target, the peer is skipped with a note.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from specjax.bench.common import ratio, usable_threads
from specjax.io.fetch import cache_root, source_gguf
from specjax.io.gguf_write import GGUF_TYPES, reencode

__all__ = ["FASTEST_KINDS", "LlamaCpp", "gguf_at", "target_gguf"]

# The precisions llama.cpp's plain decoding also runs in, for its fastest (any one of them may
# be, depending on the host: F16 on hosts whose products on it are fast, else a quantised one).
FASTEST_KINDS = ("F16", "Q8_0", "Q4_1")


def target_gguf(target) -> Path | None:
    """The GGUF file the target's weights came from, if any (a `--target FILE.gguf`, or the
    `smollm2` preset's download): the file its checkpoint directory was converted from."""
    return source_gguf(target.path)


def gguf_at(source: Path, precision: str, directory: Path | None = None) -> Path:
    """`source` re-encoded in `precision` (`specjax.io.gguf_write.reencode`), in `directory`
    (default <cache>/gguf)."""
    return reencode(source, precision, directory or cache_root() / "gguf")


class LlamaCpp:
    """llama.cpp on the target's GGUF at the bench's dtype, each job in a process of its own.

    Why not in this process: xllamacpp's llama.cpp and torch each bring an OpenMP runtime, and
    once transformers had run here, llama.cpp's decode ran at half its speed for the rest of
    the process (SmolLM2 BF16, 16 tokens, 2-core Zen 4 host: 76.8 tokens/s before a
    transformers generate, 38.7 after, 43.2 a second later; in a child process of the same
    parent, 83.2 before and 87.2 after). A job's process loads the GGUF and runs its
    completions; the timings are llama.cpp's own, as before."""

    def __init__(self, path: Path, settings: dict, threads: int, engine: str = "llama.cpp"):
        self.path, self.settings, self.threads, self.engine = path, settings, threads, engine

    @classmethod
    def create(cls, target, settings: dict, dtype: str, notes: list[str],
               kind: str | None = None) -> "LlamaCpp | None":
        """llama.cpp on the target's GGUF at the bench's dtype (engine "llama.cpp"), or in
        another GGUF type `kind` (engine "llama.cpp KIND"); None, with a note, when it cannot
        run."""
        source = target_gguf(target)
        if source is None:
            notes.append(f"llama.cpp peer skipped: {target.name} was not loaded from a GGUF "
                         "(use --preset smollm2 or --target FILE.gguf)")
            return None
        try:
            # Optional dependencies (the llamacpp extra): only when the peer runs.
            import gguf  # noqa: F401
            import xllamacpp
        except ImportError:
            notes.append("llama.cpp peer skipped: xllamacpp and gguf are not installed "
                         "(pip install specjax[llamacpp])")
            return None
        own = kind is None or kind == GGUF_TYPES[dtype]
        kind = GGUF_TYPES[dtype] if own else kind
        path = gguf_at(source, kind)
        threads = usable_threads()
        engine = "llama.cpp" if own else f"llama.cpp {kind}"
        made = "as downloaded" if path == source else f"re-encoded from {source.name}"
        notes.append(f"{engine} (xllamacpp {_version(xllamacpp)}): {path.name} ({kind}, {made}), "
                     f"{threads} threads, each job in a process of its own"
                     + ("; ngram is its ngram-map-k speculation; prompt and decode speeds are its "
                        "own timings" if own else "; plain decoding, for llama.cpp's fastest"))
        return cls(path, settings, threads, engine)

    def job(self, prompt, method: str, k: int | None):
        """A suite job: max(1, --warmup) untimed and --reps timed completions of one method,
        in a child process (`_serve`)."""
        s = self.settings
        order = {"path": str(self.path), "threads": self.threads,
                 "ngram": [s["max_ngram"], k] if method == "ngram" else None,
                 "warmup": max(1, s["warmup"]), "reps": s["reps"], "seed": s["seed"],
                 "request": {"prompt": list(map(int, prompt["ids"])),
                             "n_predict": prompt["max_new_tokens"], "cache_prompt": False,
                             "top_k": 0, "top_p": s["top_p"], "min_p": 0.0,
                             "temperature": s["temperature"]}}

        def run_job() -> dict:
            done = subprocess.run([sys.executable, "-m", "specjax.bench.llamacpp"],
                                  input=json.dumps(order), capture_output=True, text=True)
            lines = done.stdout.strip().splitlines()
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"llama.cpp: its process failed: {done.stderr[-1000:]}")
            reply = json.loads(lines[-1])
            if "error" in reply:
                raise RuntimeError(f"llama.cpp: {reply['error']}")
            return dict(records=reply["records"], compile_s=None)
        return run_job


def _serve(order: dict) -> dict:
    """In the child process: llama.cpp's server on the GGUF, and the job's completions."""
    import xllamacpp as x     # optional: the llamacpp extra (checked by `LlamaCpp.create`)

    params = x.CommonParams()
    params.model.path = order["path"]
    params.n_ctx = 4096
    params.n_parallel = 1
    params.verbosity = -1
    params.cpuparams.n_threads = order["threads"]
    params.cpuparams_batch.n_threads = order["threads"]
    if order["ngram"] is not None:
        params.speculative.types = [x.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K]
        params.speculative.ngram_map_k.size_n, params.speculative.ngram_map_k.size_m = \
            order["ngram"]
    server = x.Server(params)
    records, warmup = [], order["warmup"]
    for i in range(warmup + order["reps"]):
        seed = order["seed"] + max(0, i - warmup)
        start = time.perf_counter()
        reply = server.handle_completions(dict(order["request"], seed=seed))
        run_s = time.perf_counter() - start
        if isinstance(reply, str):
            reply = json.loads(reply)
        if "error" in reply:
            return {"error": reply["error"]}
        timings = reply["timings"]
        if i >= warmup:
            drafted = timings.get("draft_n") or 0
            records.append(dict(
                new_tokens=timings["predicted_n"], run_s=run_s,
                prompt_s=timings["prompt_ms"] / 1e3, decode_s=timings["predicted_ms"] / 1e3,
                acceptance_rate=ratio(timings.get("draft_n_accepted"), drafted)
                if drafted else None,
                tokens_per_target_call=None, tokens=None, text=reply["choices"][0]["text"]))
    return {"records": records}


def _version(module) -> str:
    return getattr(module, "__version__", "?")


if __name__ == "__main__":      # a job's process (LlamaCpp.job)
    print(json.dumps(_serve(json.loads(sys.stdin.read()))))
