"""The bench suite's measurements, as jobs: one per (prompt, engine, method, K or tree), each a
closure that runs the timed runs and returns their records, and one per (context length,
engine) for the context sweep. `specjax.bench.suite` runs them; `specjax.bench.suite_rows`
turns their results into rows."""

from __future__ import annotations

from specjax.api.generate import generate, prepare
from specjax.api.methods import TYPES, build_shared
from specjax.bench.common import (
    CONSTANT,
    DYNAMIC_PREFIX,
    HEADS_TREE,
    sweep_times,
    timed_runs,
)
from specjax.bench.methods import PEERS
from specjax.presets import make_mesh
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, parse_widths


def jobs(prompts, settings, target, draft, peers, beside=None, llamacpp=None,
         llamacpp_others=()) -> list[dict]:
    """One job per (prompt, engine, method, K or tree); `run` returns the timed runs' records.
    `beside`: the Medusa heads and the EAGLE drafter, {"heads": ..., "drafter": ...}. Per prompt
    and engine also a "prefill" job (specjax, transformers): autoregressive runs that make one
    token, whose time is the prompt's prefill (llama.cpp reports its own). `llamacpp_others`:
    llama.cpp in other precisions, plain decoding only (its fastest, `summarize`)."""
    beside = beside or {}
    found = []
    for p in prompts:
        ks = {m: settings["ks"] if TYPES[m].chain else [None]
              for m in settings["methods"]}
        for method in settings["methods"]:
            found += _method_jobs(p, method, ks[method], settings, target, draft, beside)
        if "speculative" in settings["methods"]:
            # The draft decoding on its own, for the cost ratio c.
            found.append(_job(p, "specjax", "draft-autoregressive", None,
                              _specjax_job(p, settings, draft, "autoregressive", None, None)))
        one_token = dict(p, max_new_tokens=1)
        found.append(_job(p, "specjax", "prefill", None,
                          _specjax_job(one_token, settings, target, "autoregressive", None,
                                       None)))
        found += _peer_jobs(p, one_token, ks, settings, peers, llamacpp, llamacpp_others)
    return found


def _job(prompt, engine, method, k, run_job, tree=None, schedule=CONSTANT) -> dict:
    """One job, labelled for the progress bar."""
    label = (f"{prompt['id']} {engine} {method}" + (f" K={k}" if k else "")
             + (f" tree {tree}" if tree else "")
             + (f" {schedule}" if schedule != CONSTANT else ""))
    return dict(prompt=prompt, engine=engine, method=method, k=k, tree=tree,
                schedule=schedule, label=label, run=run_job)


def _method_jobs(p, method: str, ks, settings, target, draft, beside) -> list[dict]:
    """specjax's jobs for one prompt and method: its own tree, its chains of each K (and
    schedule), then the --trees and --dynamic-trees it takes."""
    found = []
    if TYPES[method].own_tree:           # their own tree first
        found.append(_job(p, "specjax", method, None,
                          _specjax_job(p, settings, target, method, None, None, HEADS_TREE,
                                       beside), HEADS_TREE))
    if method == "eagle":                   # then chains of each K
        for k in settings["ks"]:
            found.append(_job(p, "specjax", method, k,
                              _specjax_job(p, settings, target, method, k, None, None, beside)))
    elif method == "dflash":                # its whole block, verified as a chain
        k = beside["block_drafter"].config.drafts
        found.append(_job(p, "specjax", method, k,
                          _specjax_job(p, settings, target, method, k, None, None, beside)))
        return found
    elif method != "medusa":
        for k in ks:
            for schedule in _method_schedules(method, settings):
                found.append(_job(p, "specjax", method, k,
                                  _specjax_job(p, settings, target, method, k, draft,
                                               schedule=schedule), schedule=schedule))
    for tree in settings["trees"] if method != "autoregressive" else []:
        found.append(_job(p, "specjax", method, None,
                          _specjax_job(p, settings, target, method, None, draft, tree, beside),
                          tree))
    for tree in settings["dynamic_trees"] if method == "eagle" else []:
        found.append(_job(p, "specjax", method, None,
                          _specjax_job(p, settings, target, method, None, draft, tree, beside),
                          tree))
    return found


def _peer_jobs(p, one_token, ks, settings, peers, llamacpp, llamacpp_others) -> list[dict]:
    """The other engines' jobs for one prompt: transformers (with its prefill), llama.cpp at
    the bench's precision, and llama.cpp's plain decoding in the others."""
    found = []
    if peers is not None:
        for method in (m for m in settings["methods"] if "transformers" in PEERS.get(m, ())):
            for k in ks[method]:
                found.append(_job(p, "transformers", method, k, peers.job(p, method, k)))
        if "speculative" in settings["methods"]:
            found.append(_job(p, "transformers", "speculative-dynamic", None,
                              peers.job(p, "speculative-dynamic", None)))
        found.append(_job(p, "transformers", "prefill", None,
                          peers.job(one_token, "autoregressive", None)))
    if llamacpp is not None:
        for method in (m for m in settings["methods"] if "llama.cpp" in PEERS.get(m, ())):
            for k in ks[method]:
                found.append(_job(p, llamacpp.engine, method, k, llamacpp.job(p, method, k)))
    for other in llamacpp_others:
        found.append(_job(p, other.engine, "autoregressive", None,
                          other.job(p, "autoregressive", None)))
    return found


def _method_schedules(method: str, settings) -> list[str]:
    """The lookahead schedules that apply to `method` among --k-schedules."""
    if method == "speculative":
        return settings["k_schedules"]
    if method == "ngram":
        return [s for s in settings["k_schedules"] if s != "confidence"]
    return [CONSTANT]


def _specjax_job(prompt, settings, model, method, k, draft, tree=None, beside=None,
                 schedule=CONSTANT):
    def run_job() -> dict:
        if method == "medusa":
            extra = dict(heads=beside["heads"])
        elif method == "eagle":          # K: a chain of K; otherwise the row's tree
            extra = dict(drafter=beside["drafter"], tree=Tree.chain(k) if k else _tree(tree))
        elif method == "dflash":         # the first K of the block's drafts
            extra = dict(drafter=beside["block_drafter"], k=k)
        else:
            extra = dict(draft=draft, k=k or 1)
        if schedule != CONSTANT:
            extra["k_schedule"] = schedule
        if "drafter_dtype" in TYPES[method].options() and settings.get("drafter_dtype"):
            extra["drafter_dtype"] = settings["drafter_dtype"]
        if schedule == "confidence":
            extra["confidence_threshold"] = settings["confidence_threshold"]
        if TYPES[method].loads != "drafter":
            extra["tree"] = _tree(tree)
        request = prepare(model, [prompt["ids"]],
                          build_shared(method, max_ngram=settings["max_ngram"], **extra),
                          SamplingParams(temperature=settings["temperature"],
                                         top_p=settings["top_p"]),
                          max_new_tokens=prompt["max_new_tokens"], mesh=make_mesh(settings["mesh"]))
        results, compile_s = timed_runs(settings, lambda seed: generate(request.reseeded(seed)))
        records = [dict(new_tokens=s.new_tokens, run_s=s.run_s,
                        acceptance_rate=s.acceptance_rate if s.drafted else None,
                        tokens_per_target_call=s.tokens_per_target_call,
                        mean_draft_length=(s.mean_draft_length
                                           if method != "autoregressive" else None),
                        accepted_histogram=list(s.accepted_histogram), tokens=r.tokens[0])
                   for r, s in ((r, r.stats) for r in results)]
        return dict(records=records, compile_s=compile_s)
    return run_job


def _tree(label: str | None):
    """A row's tree from its label: None (a chain, or the heads' or drafter's own tree), the
    full tree of "3,2,1", or the dynamic tree of "dynamic 4,4,8"."""
    if not label or label == HEADS_TREE:
        return None
    if label.startswith(DYNAMIC_PREFIX):
        return DynamicTree.parse(label[len(DYNAMIC_PREFIX):])
    return parse_widths(label)


def sweep_jobs(contexts, settings, target, peers) -> list[dict]:
    """One job per (context length, engine); `run` returns the timed runs' seconds."""
    jobs = []
    for c in contexts:
        n = c["context_tokens"]
        jobs.append(dict(engine="specjax", context_tokens=n, label=f"context {n} specjax",
                         run=_specjax_sweep_job(c["ids"], settings, target)))
        if peers is not None:
            jobs.append(dict(engine="transformers", context_tokens=n,
                             label=f"context {n} transformers",
                             run=peers.sweep_job(c["ids"], settings)))
    return jobs


def _specjax_sweep_job(ids, settings, target):
    def seconds(new_tokens: int) -> float:
        return generate(target, [ids], "autoregressive", SamplingParams(temperature=0.0),
                        max_new_tokens=new_tokens, eos_ids=(),
                        mesh=make_mesh(settings["mesh"])).stats.run_s
    return lambda: sweep_times(seconds, settings)
