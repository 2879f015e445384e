"""Evaluation: the `evaluate` stage of scripts/train.py.

`evaluate` measures the greedy acceptance rate of a shipped draft/target pair with
`specjax.generate`, cross-checked by `greedy_speculative`, a cache-free reference written here,
adds it to both train_log.json files and rewrites the cards (scripts/_cards.py).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import _corpus
import numpy as np
from _cards import flops_per_token, write_card
from _training import windows_at


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
        out = generate(target, prompts.tolist(), method=specjax.Speculative(draft=draft, k=args.k),
                       sampling=specjax.SamplingParams(temperature=0.0),
                       max_new_tokens=args.new_tokens, eos_ids=())
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
