"""Evaluation: the `evaluate` and `evaluate-draft` stages of scripts/train.py.

`evaluate` measures the greedy acceptance rate of a shipped draft/target pair with
`specjax.generate`, cross-checked by `greedy_speculative`, a cache-free reference written here;
`evaluate-draft` measures the acceptance table and wall-clock speed of a draft for a fetched
target. Both add their results to train_log.json and rewrite the cards (scripts/_cards.py).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import time
from pathlib import Path

import _corpus
import numpy as np
from _cards import flops_per_token, write_card
from _training import resolve_checkpoint, windows_at


def evaluate_pair(args) -> None:
    """Greedy acceptance rate of the draft against its target at K, on held-out prompts."""
    import specjax

    draft, target = specjax.load(args.draft), specjax.load(args.target)
    data = _corpus.corpus(args.tokenizer)
    prompts = eval_prompts(data["validation"], args.prompts, args.prompt_len)
    t0 = time.time()
    drafted, accepted, _ = greedy_speculative(draft, target, prompts, args.k, args.new_tokens)
    reference = {"drafted": drafted, "accepted": accepted,
                 "acceptance_rate": round(accepted / drafted, 4),
                 "seconds": round(time.time() - t0, 1)}
    how = "greedy_speculative in scripts/train.py (forward without a cache)"
    seconds = reference["seconds"]
    generate = library_generate()
    if generate is not None:
        # The library's jitted loop, cached; the no-cache reference above is the cross-check.
        t0 = time.time()
        out = generate(target, prompts.tolist(), method="speculative", draft=draft, k=args.k,
                       max_new_tokens=args.new_tokens, temperature=0.0, eos_ids=())
        drafted, accepted = int(out.stats.drafted), int(out.stats.accepted)
        how = "specjax.generate(method='speculative', temperature=0.0)"
        seconds = round(time.time() - t0, 1)
    rate = accepted / drafted
    # Every step drafts K tokens and emits the accepted ones plus one of the target's, so the
    # rate (accepted / drafted, not the per-token alpha of Leviathan et al.) gives 1 + K x rate.
    expected = 1 + args.k * rate
    result = {"draft": Path(args.draft).name, "target": Path(args.target).name, "k": args.k,
              "prompts": len(prompts), "prompt_tokens": args.prompt_len,
              "new_tokens": args.new_tokens, "drafted": drafted, "accepted": accepted,
              "acceptance_rate": round(rate, 4),
              "expected_tokens_per_target_call": round(expected, 3),
              "cost_ratio_flops": round(flops_per_token(draft.config) /
                                        flops_per_token(target.config), 4),
              "measured_with": how, "seconds": seconds,
              "reference_no_cache": reference,
              "command": shlex.join(["python", "scripts/train.py", "evaluate", "--draft",
                                     f"weights/{Path(args.draft).name}", "--target",
                                     f"weights/{Path(args.target).name}", "--k", str(args.k)])}
    print(json.dumps(result, indent=1))
    for directory in (args.draft, args.target):
        log_file = Path(directory) / "train_log.json"
        record = json.loads(log_file.read_text())
        record["speculative"] = result
        log_file.write_text(json.dumps(record, indent=1) + "\n")
        write_card(Path(directory))


def evaluate_draft(args) -> None:
    """Acceptance of a draft for a fetched target, on held-out code and chat prompts, for each K
    and temperature; and the wall-clock speed of speculative against autoregressive decoding."""
    import statistics

    import specjax

    draft = specjax.load(args.draft)
    directory = resolve_checkpoint(args.target)
    target = specjax.load(directory)
    data = _corpus.corpus(directory / "tokenizer.json")
    code = eval_prompts(data["validation"], args.prompts, args.prompt_len).tolist()
    chat = [target.tokenizer.encode(_corpus.chatml(q)).ids for q in _corpus.EVAL_QUESTIONS]
    # Code runs to max_new_tokens (eos_ids=()); a chat answer ends at the target's <|im_end|>.
    sets = {"code": (code, ()), "chat": (chat[:args.prompts], None)}
    ratio = flops_per_token(draft.config) / flops_per_token(target.config)
    n = args.new_tokens
    table, exact = [], {}
    load = [os.getloadavg()[0]]
    for name, (prompts, eos) in sets.items():
        greedy = specjax.generate(target, prompts, max_new_tokens=n, temperature=0.0, eos_ids=eos)
        for temperature in args.temperatures:
            for k in args.ks:
                t0 = time.time()
                out = specjax.generate(target, prompts, method="speculative", draft=draft, k=k,
                                       max_new_tokens=n, temperature=temperature, seed=args.seed,
                                       eos_ids=eos)
                st = out.stats
                if temperature == 0:
                    exact[f"{name} K={k}"] = out.tokens == greedy.tokens
                table.append({"prompts": name, "rows": len(prompts), "temperature": temperature,
                              "k": k, "drafted": st.drafted, "accepted": st.accepted,
                              "acceptance_rate": round(st.acceptance_rate, 4),
                              "new_tokens": st.new_tokens, "target_calls": st.target_calls,
                              "tokens_per_target_call": round(st.tokens_per_target_call, 3),
                              # target calls saved, less the drafts' cost by FLOPs
                              "flops_speedup": round(st.tokens_per_target_call / (1 + k * ratio), 3)})
                print(f"{name:4s} T={temperature:g} K={k}: acceptance {st.acceptance_rate:.3f}, "
                      f"{st.tokens_per_target_call:.2f} tokens/target call "
                      f"({time.time() - t0:.0f} s)", flush=True)
    if not all(exact.values()):
        print(f"WARNING: greedy speculative differs from greedy autoregressive: {exact}", flush=True)

    # Wall clock, batch of one prompt, compile excluded (stats.run_s), median of --runs.
    def median_run_s(model, prompt, **kwargs):
        specjax.generate(model, [prompt], max_new_tokens=n, temperature=0.0, eos_ids=(), **kwargs)
        runs = [specjax.generate(model, [prompt], max_new_tokens=n, temperature=0.0, eos_ids=(),
                                 **kwargs) for _ in range(args.runs)]
        return statistics.median(r.stats.run_s for r in runs), runs[0].stats

    speed = []
    picks = np.linspace(0, len(code) - 1, args.speed_prompts).round().astype(int)
    for i in picks:          # spread over the code prompts, as the prompts over the files
        ar_s, _ = median_run_s(target, code[i])
        # The draft alone, autoregressive: its measured cost per token against the target's.
        draft_s, _ = median_run_s(draft, code[i])
        entry = {"prompt": int(i), "autoregressive_tok_s": round(n / ar_s, 2),
                 "draft_alone_tok_s": round(n / draft_s, 1),
                 "measured_cost_ratio": round(draft_s / ar_s, 4), "speculative": {}}
        for k in args.speed_ks:
            spec_s, st = median_run_s(target, code[i], method="speculative", draft=draft, k=k)
            entry["speculative"][str(k)] = {
                "tok_s": round(n / spec_s, 2), "speedup": round(ar_s / spec_s, 3),
                "acceptance_rate": round(st.acceptance_rate, 4),
                "tokens_per_target_call": round(st.tokens_per_target_call, 3)}
        speed.append(entry)
        print(f"speed: {entry}", flush=True)
    load.append(os.getloadavg()[0])
    result = {
        "target": args.target, "draft": Path(args.draft).name, "new_tokens": n,
        "prompt_tokens_code": args.prompt_len, "seed": args.seed,
        "chat_questions": _corpus.EVAL_QUESTIONS[:args.prompts],
        "cost_ratio_flops": round(ratio, 4), "table": table,
        "greedy_equals_autoregressive": exact,
        "speed": {"ks": args.speed_ks, "prompts": len(speed), "runs": args.runs, "per_prompt": speed,
                  "speedup_median": {str(k): round(statistics.median(
                      e["speculative"][str(k)]["speedup"] for e in speed), 3) for k in args.speed_ks},
                  "load_average": [round(x, 2) for x in load]},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "command": shlex.join(["python", "scripts/train.py", "evaluate-draft", "--draft",
                               f"weights/{Path(args.draft).name}", "--target", args.target]),
    }
    print(json.dumps(result, indent=1))
    log_file = Path(args.draft) / "train_log.json"
    record = json.loads(log_file.read_text())
    record["evaluation"] = result
    log_file.write_text(json.dumps(record, indent=1) + "\n")
    write_card(Path(args.draft))


def library_generate():
    """specjax.generate if the library has it (the package attribute or the module's function)."""
    import specjax

    generate = getattr(specjax, "generate", None)
    if callable(generate):
        return generate
    try:
        from specjax.api.generate import generate
    except ImportError:
        return None
    return generate


def eval_prompts(tokens: np.ndarray, n: int, length: int) -> np.ndarray:
    """n prompts of `length` tokens, evenly spaced over the held-out stream."""
    starts = np.linspace(0, tokens.size - 2 * length - 1, n).round().astype(int)
    return windows_at(tokens, starts, length)


def greedy_speculative(draft, target, prompts: np.ndarray, k: int, new_tokens: int):
    """Speculative decoding with argmax draft and argmax target (Chen et al. Algorithm 2 at
    temperature 0), batched over prompts with right padding and no cache.

    Every row drafts k tokens greedily, the target scores them in one call, the longest prefix
    that equals the target's own argmax is kept, and the target's token at the first mismatch
    (or the bonus token after k matches) is appended. A row stops once it has `new_tokens` new
    tokens; its last round is still counted in full. Returns (drafted, accepted) over all rows
    and the token buffer [B, prompt + new_tokens + k + 1] (row r is valid up to its length).
    """
    import jax
    import jax.numpy as jnp

    from specjax import forward

    b, prompt_len = prompts.shape
    width = prompt_len + new_tokens + k + 1
    buffer = np.zeros((b, width), np.int32)
    buffer[:, :prompt_len] = prompts
    lengths = np.full(b, prompt_len)
    positions = jnp.broadcast_to(jnp.arange(width), (b, width))

    def argmax_fn(model):
        # Right padding is harmless: position t only attends to positions <= t.
        return jax.jit(lambda tokens: jnp.argmax(
            forward(model.params, model.config, tokens, positions)[0], axis=-1))

    draft_argmax, target_argmax = argmax_fn(draft), argmax_fn(target)
    rows = np.arange(b)
    drafted = accepted = 0
    while (active := lengths - prompt_len < new_tokens).any():
        proposal = buffer.copy()
        at = np.where(active, lengths, prompt_len)             # finished rows idle in bounds
        for i in range(k):                                     # Step 1: draft k tokens
            guess = np.asarray(draft_argmax(proposal))         # [B, width]
            proposal[rows, at + i] = guess[rows, at + i - 1]
        truth = np.asarray(target_argmax(proposal))            # Step 2: one target call
        for r in rows[active]:
            n = lengths[r]
            drafts = proposal[r, n:n + k]
            wanted = truth[r, n - 1:n + k]                     # the target's k + 1 argmaxes
            a = int(np.argmin(np.append(drafts == wanted[:k], False)))   # Step 3: accept
            buffer[r, n:n + a] = drafts[:a]
            buffer[r, n + a] = wanted[a]                       # correction or bonus token
            lengths[r] = n + a + 1
            drafted, accepted = drafted + k, accepted + a
    return drafted, accepted, buffer
