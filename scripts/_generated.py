"""Generated data: the `distill-data` stage of scripts/train.py.

A target's own continuations of chat prompts, of standard-library code windows and of prompts
shaped from the stdlib's functions (scripts/_corpus.py), written as token streams that
`model --extra-corpus` mixes into the training batches (`load_extra_corpus` in
scripts/_training.py checks them against the tokenizer being trained).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import _corpus
import numpy as np
from _training import command_line, resolve_checkpoint, tokenizer_digest, windows_at


def distill_data(args) -> None:
    """Sequence-level distillation data: the target's own continuations of chat prompts, of
    stdlib code windows and of prompts shaped from the stdlib's functions and modules
    (`_corpus.code_prompts`), greedy and sampled at temperature 1, as token streams for
    `model --extra-corpus`.

    Each document is prompt + continuation (the chat prompts rendered in ChatML, half of them
    with the template's default system turn); documents are joined with `<|endoftext|>`, as in
    the stdlib corpus. Every `--validation-every`-th document is held out.
    """
    import random

    import specjax

    started = time.time()
    directory = resolve_checkpoint(args.target)
    target = specjax.load(directory)
    eot = _corpus.eot_id(target.tokenizer)
    questions = random.Random(args.seed).sample(_corpus.chat_questions(), args.chat_prompts)
    chat = [_corpus.chatml(q, _corpus.SMOLLM2_SYSTEM if i % 2 else None)
            for i, q in enumerate(questions)]
    code_stream = _corpus.corpus(directory / "tokenizer.json")["train"]
    starts = np.random.default_rng(args.seed).integers(
        0, code_stream.size - args.code_prompt_len, size=args.code_prompts)
    code = windows_at(code_stream, starts, args.code_prompt_len).tolist()
    shaped = _corpus.code_prompts(args.shaped_prompts, args.seed) if args.shaped_prompts else []

    # (group, kind, prompt ids, max_new_tokens, eos_ids); a group is generated in batches.
    jobs = [("chat", "chat", target.tokenizer.encode(p).ids, args.chat_new_tokens, None)
            for p in chat]
    jobs += [("code", "code", p, args.code_new_tokens, ()) for p in code]
    # Sorted by length, so that a batch's prompts are alike and little of it is padding.
    jobs += sorted((("shaped", kind, target.tokenizer.encode(p).ids, args.code_new_tokens, None)
                    for kind, p in shaped), key=lambda j: len(j[2]))
    documents, samples, generated, batches = [], [], 0, 0
    for group in ("chat", "code", "shaped"):
        rows = [j for j in jobs if j[0] == group]
        for b, first in enumerate(range(0, len(rows), args.batch)):
            batch = rows[first:first + args.batch]
            temperature = 0.0 if b % 2 == 0 else 1.0     # alternate greedy and sampled batches
            t0 = time.time()
            out = specjax.generate(target, [r[2] for r in batch], max_new_tokens=batch[0][3],
                                   temperature=temperature, seed=args.seed + batches,
                                   eos_ids=batch[0][4])
            batches += 1
            generated += out.stats.new_tokens
            for (_, kind, prompt, _, _), new in zip(batch, out.tokens):
                documents.append(list(prompt) + list(new))
                samples.append({"kind": kind, "temperature": temperature,
                                "prompt": target.tokenizer.decode(prompt, skip_special_tokens=False),
                                "completion": target.tokenizer.decode(new, skip_special_tokens=False)})
            print(f"{group} batch {b}: {len(batch)} prompts, T={temperature:g}, "
                  f"{out.stats.new_tokens} new tokens in {time.time() - t0:.0f} s", flush=True)

    splits = {"train": [eot], "validation": [eot]}
    for i, doc in enumerate(documents):
        split = "validation" if i % args.validation_every == args.validation_every - 1 else "train"
        splits[split] += doc + [eot]
    out_file = Path(args.out)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out_file, **{k: np.asarray(v, np.uint16) for k, v in splits.items()})
    with open(out_file.with_suffix(".jsonl"), "w") as f:
        for sample in samples:
            f.write(json.dumps(sample) + "\n")
    meta = {"target": args.target, "tokenizer_sha256": tokenizer_digest(directory / "tokenizer.json"),
            "chat_prompts": len(chat), "code_prompts": len(code), "shaped_prompts": len(shaped),
            "chat_new_tokens": args.chat_new_tokens, "code_new_tokens": args.code_new_tokens,
            "code_prompt_len": args.code_prompt_len, "batch": args.batch, "seed": args.seed,
            "documents": len(documents), "generated_tokens": generated,
            "train_tokens": len(splits["train"]), "validation_tokens": len(splits["validation"]),
            "validation_every": args.validation_every, "seconds": round(time.time() - started, 1),
            "command": command_line("distill-data", args, (
                "target", "chat_prompts", "code_prompts", "shaped_prompts", "chat_new_tokens",
                "code_new_tokens", "batch", "seed", "out"))}
    out_file.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))
