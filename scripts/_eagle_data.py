"""Stage: the EAGLE drafters' larger data set, the target's own continuations, greedy and sampled.

    python scripts/train.py eagle-data --target smollm2 --out data/eagle2/smollm2
    python scripts/train.py eagle-features --sequences data/eagle2/smollm2 --target smollm2 \
        --out runs/eagle2/smollm2-features

`eagle-data` continues every prompt of a fixed prompt set (`specjax.train.prompts`:
chat questions in the chat template, code, prose) once in each sampling setting of SETTINGS: greedy,
temperature 0.7 with top-p 0.9, and temperature 1. A drafter that is to be accepted when the
target samples must see what the target samples, not only its argmax.

The run is cut into shards: shard s holds the documents of prompts s * P .. (s + 1) * P - 1 of
the shuffled set (P = --prompts-per-shard) in every setting, so that any prefix of the shards
is a balanced sample of the whole. Each shard is written once it is complete (to a temporary
name, then renamed), with the digest of its plan; a restarted command skips the shards that
exist with the same plan, so a run cut short loses at most the shard it was on. After every
shard the provenance file (OUT.json, beside the OUT directory) is rewritten with the counts.

Each shard-NNN.npz (`np.savez_compressed`) has the layout of data/eagle/*.npz (tokens uint16,
starts, prompt_length, kind with kind_names) plus, per document: setting (an index into
setting_names), temperature, top_p, seed (the row's sampling key is `jax.random.key(seed)`),
prompt_index (its prompt's place in the shuffled set, the same in every setting) and held_out
(HELD_OUT_RULE). `load_sequences` reads a shard directory as one such file, which is what
`eagle-features --sequences` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import shlex
import time
from pathlib import Path

import _corpus
import numpy as np
from _training import command_line
from _training import resolve_checkpoint as resolve

from specjax.train import prompts as prompt_sets

# name -> (temperature, top_p); greedy rows draw nothing, so their seed does not matter.
SETTINGS = {"greedy": (0.0, 1.0), "t0.7-p0.9": (0.7, 0.9), "t1": (1.0, 1.0)}
KINDS = ("chat", "edit", "function", "module", "prose", "text")  # kind_names of every shard
HOLDOUT_MODULUS = 16
HELD_OUT_RULE = (f"a prompt is held out when int(md5(its token ids as little-endian uint16 "
                 f"bytes)) % {HOLDOUT_MODULUS} == 0, in every setting")


def is_held_out(prompt_ids) -> bool:
    """HELD_OUT_RULE: a function of the prompt alone, so all its documents go together."""
    digest = hashlib.md5(np.asarray(prompt_ids, "<u2").tobytes()).hexdigest()
    return int(digest, 16) % HOLDOUT_MODULUS == 0


# -- The plan -------------------------------------------------------------------------------------

def prompt_set(args, target, directory: Path) -> list[dict]:
    """The prompts, shuffled with --seed: {kind, ids, text} each (text None for text windows)."""
    rng = random.Random(args.seed)
    encode = lambda text: target.tokenizer.encode(text).ids  # noqa: E731
    made_here = prompt_sets.more_chat_questions()
    questions = list(dict.fromkeys(_corpus.chat_questions() + made_here))
    questions = rng.sample(questions, args.chat_prompts)
    prompts = [{"kind": "chat", "text": _corpus.chatml(q, _corpus.SMOLLM2_SYSTEM if i % 2 else None)}
               for i, q in enumerate(questions)]
    prompts += [{"kind": kind, "text": text}
                for kind, text in _corpus.code_prompts(args.code_prompts, args.seed)]
    prose = rng.sample(prompt_sets.prose_prompts(random.Random(args.seed)), args.prose_prompts)
    made_here += prose
    prompts += [{"kind": "prose", "text": text} for text in prose]
    from specjax.bench.prompts import PROMPTS
    try:
        prompt_sets.check_excluded([p["text"] for p in prompts], questions, made_here,
                                   [p["prompt"] for p in PROMPTS])
    except ValueError as e:
        raise SystemExit(str(e)) from None
    for p in prompts:
        p["ids"] = encode(p["text"])
    if args.text_windows:
        stream = _corpus.corpus(directory / "tokenizer.json")["train"]
        starts = np.random.default_rng(args.seed).integers(
            0, stream.size - args.text_prompt_len, size=args.text_windows)
        prompts += [{"kind": "text", "text": None,
                     "ids": stream[s:s + args.text_prompt_len].tolist()} for s in starts]
    rng.shuffle(prompts)
    return prompts


def shard_jobs(args, prompts: list[dict], shard: int) -> list[dict]:
    """The documents of one shard, in generation order: for each setting, its prompts sorted by
    length (so that a batch pads little), each with its row seed."""
    first = shard * args.prompts_per_shard
    jobs = []
    for s, name in enumerate(args.settings):
        temperature, top_p = SETTINGS[name]
        picks = range(first, min(first + args.prompts_per_shard, len(prompts)))
        for i in sorted(picks, key=lambda i: (len(prompts[i]["ids"]), i)):
            jobs.append({"prompt_index": i, "kind": prompts[i]["kind"], "ids": prompts[i]["ids"],
                         "setting": name, "temperature": temperature, "top_p": top_p,
                         "seed": args.seed * 10 ** 6 + i * len(SETTINGS) + list(SETTINGS).index(name)})
    return jobs


def plan_digest(args, jobs: list[dict]) -> str:
    """What a shard's contents are a function of: its jobs and the generation's parameters."""
    plan = [[j["prompt_index"], j["ids"], j["setting"], j["seed"]] for j in jobs]
    return hashlib.sha256(json.dumps([plan, args.new_tokens, args.batch]).encode()).hexdigest()


# -- Generation ------------------------------------------------------------------------------------

def eagle_data(args) -> None:
    """`eagle-data`: generates the missing shards, then rewrites the provenance file."""
    import specjax
    from specjax.heads.shared import tokenizer_digest

    unknown = set(args.settings) - set(SETTINGS)
    if unknown:
        raise SystemExit(f"unknown settings {sorted(unknown)}; known: {list(SETTINGS)}")
    directory = resolve(args.target)
    target = specjax.load(directory)
    if target.config.vocab_size > 2 ** 16:
        raise SystemExit("the token ids are stored as uint16: the vocabulary is too large")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = prompt_set(args, target, directory)
    shards = -(-len(prompts) // args.prompts_per_shard)
    last = min(shards, args.max_shards) if args.max_shards else shards
    print(f"{len(prompts)} prompts x {len(args.settings)} settings in {shards} shards; "
          f"generating shards 0-{last - 1}", flush=True)
    started, generated = time.time(), 0
    for shard in range(last):
        path = out / f"shard-{shard:03d}.npz"
        jobs = shard_jobs(args, prompts, shard)
        digest = plan_digest(args, jobs)
        if path.exists():
            if str(np.load(path)["plan"]) != digest:
                raise SystemExit(f"{path} was made by another plan (other prompts or options); "
                                 "move it away or use another --out")
            continue
        news = []
        for first in range(0, len(jobs), args.batch):
            batch = jobs[first:first + args.batch]
            t0 = time.time()
            result = specjax.generate(target, [j["ids"] for j in batch],
                                      temperature=[j["temperature"] for j in batch],
                                      top_p=[j["top_p"] for j in batch],
                                      seed=[j["seed"] for j in batch],
                                      max_new_tokens=args.new_tokens)
            news += result.tokens
            generated += result.stats.new_tokens
            print(f"shard {shard} documents {first}-{first + len(batch)} ({batch[0]['setting']}): "
                  f"{result.stats.new_tokens} tokens in {time.time() - t0:.0f} s; this run "
                  f"{generated:,} tokens, {generated / (time.time() - started) * 60:,.0f} a minute",
                  flush=True)
        write_shard(path, jobs, news, digest)
        write_provenance(args, out, target, tokenizer_digest(target.tokenizer), len(prompts), shards)
        print(f"wrote {path}", flush=True)
    write_provenance(args, out, target, tokenizer_digest(target.tokenizer), len(prompts), shards)


def write_shard(path: Path, jobs: list[dict], news: list[list[int]], digest: str) -> None:
    """One shard, written under a temporary name and renamed, so it exists whole or not at all."""
    docs = [j["ids"] + new for j, new in zip(jobs, news)]
    names = list(SETTINGS)
    temporary = path.with_name(path.stem + ".partial.npz")
    np.savez_compressed(
        temporary, tokens=np.concatenate(docs).astype(np.uint16),
        starts=np.cumsum([0] + [len(d) for d in docs]).astype(np.int32),
        prompt_length=np.array([len(j["ids"]) for j in jobs], np.int32),
        kind=np.array([KINDS.index(j["kind"]) for j in jobs], np.uint8),
        kind_names=np.array(KINDS),
        setting=np.array([names.index(j["setting"]) for j in jobs], np.uint8),
        setting_names=np.array(names),
        temperature=np.array([j["temperature"] for j in jobs], np.float32),
        top_p=np.array([j["top_p"] for j in jobs], np.float32),
        seed=np.array([j["seed"] for j in jobs], np.int64),
        prompt_index=np.array([j["prompt_index"] for j in jobs], np.int32),
        held_out=np.array([is_held_out(j["ids"]) for j in jobs], bool),
        plan=np.array(digest))
    os.replace(temporary, path)


# -- Reading -------------------------------------------------------------------------------------

def load_sequences(path: Path, shards: list[int] | None = None) -> dict:
    """A sequences file (data/eagle/*.npz) or a shard directory of `eagle-data` (all its
    shards, or those numbered in `shards`), as one set of arrays: the shards' documents
    concatenated in shard order, `starts` running on."""
    path = Path(path)
    if not path.is_dir():
        if shards:
            raise SystemExit(f"{path} is a sequences file, not a shard directory")
        return dict(np.load(path))
    files = sorted(path.glob("shard-[0-9][0-9][0-9].npz"))
    if shards:
        missing = sorted(set(shards) - {int(f.stem[-3:]) for f in files})
        if missing:
            raise SystemExit(f"{path} has no shard {missing[0]}")
        files = [f for f in files if int(f.stem[-3:]) in shards]
    if not files:
        raise SystemExit(f"no shards in {path}")
    parts = [dict(np.load(f)) for f in files]
    out = {}
    for key in parts[0]:
        if key == "starts":
            offsets = np.cumsum([0] + [int(p["starts"][-1]) for p in parts[:-1]])
            out[key] = np.concatenate([parts[0]["starts"][:1]] +
                                      [p["starts"][1:] + o for p, o in zip(parts, offsets)])
        elif key in ("kind_names", "setting_names", "plan"):
            out[key] = parts[0][key]
        else:
            out[key] = np.concatenate([p[key] for p in parts])
    del out["plan"]
    return out


def write_provenance(args, out: Path, target, tokenizer_sha256: str, prompts: int,
                     shards: int) -> None:
    """OUT.json: the command, the target, the shards written and what they hold."""
    from specjax.bench.prompts import VERSION

    files = sorted(out.glob("shard-[0-9][0-9][0-9].npz"))
    counts: dict = {}
    shard_records, total, generated, longest = [], 0, 0, 0
    for f in files:
        d = np.load(f)
        lengths = np.diff(d["starts"])
        new = lengths - d["prompt_length"]
        kinds, settings = d["kind_names"][d["kind"]], d["setting_names"][d["setting"]]
        for k, s, n in zip(kinds, settings, new):
            c = counts.setdefault(str(s), {}).setdefault(str(k), {"documents": 0,
                                                                  "generated_tokens": 0})
            c["documents"] += 1
            c["generated_tokens"] += int(n)
        total += int(lengths.sum())
        generated += int(new.sum())
        longest = max(longest, int(lengths.max()))
        shard_records.append({"file": f.name, "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                              "documents": int(lengths.size), "tokens": int(lengths.sum()),
                              "generated_tokens": int(new.sum())})
    kinds = {k: sum(c.get(k, {"documents": 0})["documents"] for c in counts.values())
             for k in KINDS}
    provenance = {
        "directory": out.name, "target": args.target, "target_name": target.name,
        "tokenizer_sha256": tokenizer_sha256, "vocab_size": target.config.vocab_size,
        "python": platform.python_version(), "bench_suite_version": VERSION,
        "generated_by": command_line("eagle-data", args, (
            "target", "chat_prompts", "code_prompts", "text_windows", "text_prompt_len",
            "prose_prompts", "new_tokens", "prompts_per_shard", "batch", "seed", "out"))
        + " --settings " + shlex.join(args.settings),
        "resume": "run the same command again: finished shards are skipped",
        "settings": {name: {"temperature": SETTINGS[name][0], "top_p": SETTINGS[name][1]}
                     for name in args.settings},
        "held_out_rule": HELD_OUT_RULE,
        "prompts": prompts, "shards_planned": shards, "shards_written": len(files),
        "documents": sum(kinds.values()), "kinds": {k: n for k, n in kinds.items() if n},
        "tokens": total, "generated_tokens": generated, "longest": longest,
        "by_setting": counts, "shards": shard_records,
        "layout": {"tokens": "uint16 [N], the documents concatenated",
                   "starts": "int32 [M + 1], document i is tokens[starts[i]:starts[i + 1]]",
                   "prompt_length": "int32 [M], tokens of document i that are its prompt",
                   "kind": "uint8 [M], an index into kind_names",
                   "setting": "uint8 [M], an index into setting_names",
                   "temperature, top_p": "float32 [M], the setting's sampling parameters",
                   "seed": "int64 [M], the row's sampling key is jax.random.key(seed)",
                   "prompt_index": "int32 [M], the prompt's place in the shuffled set",
                   "held_out": "bool [M], " + HELD_OUT_RULE,
                   "plan": "the sha256 of the shard's plan, for resuming"}}
    path = out.with_suffix(".json")
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(json.dumps(provenance, indent=1) + "\n")
    os.replace(temporary, path)


def add_commands(sub) -> None:
    p = sub.add_parser("eagle-data", help="the target's greedy and sampled continuations of a "
                                          "broad prompt set, in resumable shards")
    p.add_argument("--target", required=True, help="a checkpoint directory or fetch name")
    p.add_argument("--chat-prompts", type=int, default=1408)
    p.add_argument("--code-prompts", type=int, default=384,
                   help="function, module and edit prompts from the stdlib, a third each")
    p.add_argument("--text-windows", type=int, default=192,
                   help="stdlib windows of --text-prompt-len tokens to continue")
    p.add_argument("--text-prompt-len", type=int, default=32)
    p.add_argument("--prose-prompts", type=int, default=448)
    p.add_argument("--new-tokens", type=int, default=192,
                   help="tokens to generate per document, fewer where the target ends its turn")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS),
                   help=f"sampling settings, each prompt continued once in each: {list(SETTINGS)}")
    p.add_argument("--prompts-per-shard", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-shards", type=int, default=0,
                   help="stop after the first N shards (0: all); a later run goes on")
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--out", type=Path, required=True,
                   help="the shard directory; the provenance goes to OUT.json")
    p.set_defaults(func=eagle_data)
