"""Hugging Face transformers on the same weights: the peers that `bench` runs beside specjax, as
transformers' users run them (the settings and what they are compared on are described in
specjax.bench.suite's docstring).

torch and transformers are heavy optional dependencies (the `bench` extra): they are imported
only in `Peers.create`, which notes their absence and returns None. They run where JAX runs: on
the GPU when JAX's backend is one and torch sees CUDA, else on the CPU with JAX's thread count.
"""

from __future__ import annotations

import importlib.util
import time

import jax

from specjax.bench.common import ratio, sweep_times, usable_threads


class Peers:
    """transformers' `generate` on the same weights, run as its users run it (the settings: in
    specjax.bench.suite's docstring)."""

    def __init__(self, torch, transformers, target, draft, settings, threads, device="cpu"):
        self.torch, self.settings, self.threads = torch, settings, threads
        self.device = device   # where the models and every prompt's tensors live
        self.target, self.draft = target, draft
        # What a GenerationConfig holds when nobody sets the schedule ("constant" is applied
        # when it holds None, in transformers 5.23).
        self.default_schedule = transformers.GenerationConfig().num_assistant_tokens_schedule
        self.calls = 0
        target.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1

    @classmethod
    def create(cls, target, draft, settings, dtype: str, notes: list[str]) -> "Peers | None":
        try:
            # Heavy optional dependencies (the `bench` extra): only when peers run.
            import torch
            import transformers
        except ImportError:
            notes.append("transformers peers skipped: transformers and torch are not installed "
                         "(pip install specjax[bench])")
            return None
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        threads = usable_threads()
        torch.set_num_threads(threads)
        device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
        # transformers has no 8-bit CPU path without further packages: in int8 or q8_0 it runs
        # float32.
        torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

        def hf_load(model):
            return transformers.AutoModelForCausalLM.from_pretrained(
                model.path, **{dtype_arg: torch_dtype}).to(device).eval()
        where = (f"on the GPU ({torch.cuda.get_device_name()}), as JAX" if device == "cuda" else
                 f"torch.set_num_threads({threads}), the {threads} cores JAX's CPU backend uses")
        notes.append(f"transformers {transformers.__version__} / torch {torch.__version__}: "
                     f"{where}; peer speedups are over transformers' own generate"
                     + (f"; {dtype}: transformers runs float32" if dtype in ("int8", "q8_0")
                        else ""))
        if draft is not None and importlib.util.find_spec("sklearn") is None:
            notes.append("transformers speculative-dynamic: scikit-learn is not installed, so "
                         "assistant_confidence_threshold stays at 0.4 instead of being re-fitted")
        return cls(torch, transformers, hf_load(target),
                   hf_load(draft) if draft is not None else None, settings, threads, device)

    def job(self, prompt, method, k):
        """A suite job: --warmup (at least 1) untimed and --reps timed runs of one method."""
        s = self.settings
        ids = self.torch.tensor([prompt["ids"]], device=self.device)
        kwargs = self.generate_kwargs(ids, prompt["max_new_tokens"], s["temperature"], s["top_p"])
        assistant = None
        if method == "speculative":           # K tokens every step, as specjax drafts them
            assistant = dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                             assistant_confidence_threshold=0.0)
        elif method == "speculative-dynamic":   # transformers' defaults
            assistant = dict(num_assistant_tokens=20, assistant_confidence_threshold=0.4,
                             num_assistant_tokens_schedule=self.default_schedule)
        elif method == "ngram":
            kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=s["max_ngram"])
        if assistant is not None:
            kwargs["assistant_model"] = self.draft

        def run_job() -> dict:
            records = []
            warmup = max(1, s["warmup"])   # the first call pays one-time costs, even in --quick
            for i in range(warmup + s["reps"]):
                if assistant is not None:
                    # Shared with the other assisted setting, and the draft's checkpoint may
                    # carry its own values: set all three before every run.
                    for name, value in assistant.items():
                        setattr(self.draft.generation_config, name, value)
                self.torch.manual_seed(s["seed"] + max(0, i - warmup))
                run_s, new = self._timed_generate(ids, kwargs)
                if i >= warmup:
                    records.append(dict(new_tokens=len(new), run_s=run_s, acceptance_rate=None,
                                        tokens_per_target_call=ratio(len(new), self.calls),
                                        tokens=new))
            return dict(records=records, compile_s=None)
        return run_job

    def sweep_job(self, ids: list[int], settings):
        """A context-sweep job: greedy, EOS ignored (min_new_tokens), as specjax's."""
        ids = self.torch.tensor([ids], device=self.device)

        def seconds(new_tokens: int) -> float:
            kwargs = self.generate_kwargs(ids, new_tokens, temperature=0.0)
            return self._timed_generate(ids, dict(kwargs, min_new_tokens=new_tokens))[0]
        return lambda: sweep_times(seconds, settings)

    def generate_kwargs(self, ids, max_new_tokens: int, temperature: float,
                        top_p: float = 1.0) -> dict:
        """The keyword arguments of one `generate` call on `ids` (a [B, T] tensor without
        padding): greedy at temperature 0, else sampling with `top_p` (no top-k); padded with
        the target's EOS."""
        eos = self.target.generation_config.eos_token_id
        kwargs = dict(attention_mask=self.torch.ones_like(ids), max_new_tokens=max_new_tokens,
                      pad_token_id=eos[0] if isinstance(eos, list) else eos)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        return kwargs

    def _timed_generate(self, ids, kwargs: dict) -> tuple[float, list[int]]:
        """Seconds and new tokens of one `generate` call, up to its tokens on the host (as specjax
        is timed); self.calls counts its target calls."""
        self.calls = 0
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self.target.generate(ids, **kwargs)
        new = out[0, ids.shape[1]:].tolist()
        return time.perf_counter() - start, new

