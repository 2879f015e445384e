"""What every `train` kind shares: its prompts (`read_prompts`), the training data and held-out
prompts, the target's features, the checks on them made before hours of work, the progress bar,
and the finish (the held-out evaluation, train_log.json and the model card)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np

from specjax.api.generate import generate
from specjax.api.methods import DFlash
from specjax.bench.common import machine
from specjax.io import chat as chat_template
from specjax.presets import CLIError, make_mesh, parse_mesh
from specjax.sampling.params import SamplingParams
from specjax.train import card, data, eagle3
from specjax.train import prompts as prompt_sets
from specjax.train.state import StepProgress, on_mesh

BUILTIN_PREFIX = "builtin:"


def read_prompts(path: Path, target, chat: bool) -> list:
    """The prompts of a file, each a text or (chat) token ids; "builtin:NAME" names a built-in
    set (`specjax.train.prompts`): its questions are rendered in the target's chat template,
    its plain texts only with `chat`."""
    if str(path).startswith(BUILTIN_PREFIX):
        name = str(path)[len(BUILTIN_PREFIX):]
        try:
            texts = prompt_sets.builtin(name)
        except ValueError as e:
            raise CLIError(f"--prompts {path}: {e}") from None
        if not prompt_sets.BUILTIN[name][0] and not chat:
            return texts                                    # plain text, continued as it is
        return [chat_template.encode(target, chat_template.render(target, q)) for q in texts]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"--prompts {path}: cannot read it ({type(e).__name__})") from None
    prompts = []
    if path.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                raise CLIError(f"--prompts {path}:{n}: not JSON") from None
            if isinstance(item, dict) and isinstance(item.get("messages"), list):
                prompts.append(chat_template.encode(target, chat_template.render_messages(
                    target, item["messages"])))
                continue
            if isinstance(item, dict):
                item = item.get("prompt")
            if not isinstance(item, str) or not item:
                raise CLIError(f"--prompts {path}:{n}: expected a string, {{\"prompt\": text}} "
                               f"or {{\"messages\": [...]}}")
            prompts.append(item)
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if chat:
        prompts = [chat_template.encode(target, chat_template.render(target, p))
                   if isinstance(p, str) else p for p in prompts]
    return prompts


def check_data_arguments(args) -> None:
    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.held_out < 0:
        raise CLIError(f"--held-out must be >= 0, got {args.held_out}")
    if args.eval_every is not None and args.eval_every < 0:
        raise CLIError(f"--eval-every must be >= 0, got {args.eval_every}")


def out_and_work(args) -> tuple[Path, Path]:
    out = Path(args.out)
    return out, Path(args.work) if args.work else out.with_name(out.name + ".work")


def parse_taps(args) -> tuple[int, ...] | None:
    """--taps as layer counts (None when not given); the target checks them."""
    if not args.taps:
        return None
    try:
        return tuple(int(t) for t in args.taps.split(","))
    except ValueError:
        raise CLIError(f"--taps must be comma-separated layer counts, got {args.taps!r}") \
            from None


def read_taps(args, target) -> tuple[int, ...]:
    """--taps checked against the target (before hours of data and features)."""
    return eagle3.resolve_taps(target, parse_taps(args))


def train_mesh(args, config):
    """--mesh data=N as a mesh, checked against the run's batch before any data is made."""
    mesh = make_mesh(parse_mesh(args.mesh))
    on_mesh({}, mesh, config)
    return mesh


def training_data(args, target, work: Path):
    """(the sequences to train on, the held-out prompts): `train data`'s shards (--data), or
    the continuations of --prompts made here, kept in `work`."""
    if args.data:
        try:
            sequences, held_out = data.read(args.data, target)
        except eagle3.TrainError as e:
            raise CLIError(str(e)) from None
        held_out = held_out[:args.held_out]         # the first N of the data's held-out
    else:
        prompts = read_prompts(Path(args.prompts), target, args.chat)
        if len(prompts) <= args.held_out:
            raise CLIError(f"--prompts {args.prompts} has {len(prompts)} prompt(s); --held-out "
                           f"{args.held_out} leaves none to train on")
        train_prompts = prompts[:len(prompts) - args.held_out]
        held_out = prompts[len(prompts) - args.held_out:]
        sequences = _sequences(work, target, train_prompts, args)
    print(f"data: {len(sequences.length)} sequences, "
          f"{int(np.sum(sequences.length - sequences.prompt_length))} generated tokens",
          flush=True)
    return sequences, held_out


def final_states(args, target, work: Path):
    """(sequences, held-out prompts, features) for the trainers that read only the target's
    final-normed states (Medusa heads, draft models): any finished pass in --features, or a
    pass through the one tap that is cheapest to compute (the embeddings)."""
    sequences, held_out = training_data(args, target, work)
    return sequences, held_out, target_features(target, sequences, (0,), args, final_only=True)


def target_features(target, sequences, taps, args,
                    final_only: bool = False) -> eagle3.Features:
    """The features, in memory or in --features; their size said before the pass starts (a disk
    without room for them is refused then, by `eagle3.features`). `final_only`: any finished
    pass in --features serves (`eagle3.features`)."""
    dtype = np.dtype(args.features_dtype)
    n, t = sequences.tokens.shape
    size = n * t * (len(taps) + 1) * target.config.d_model * dtype.itemsize
    where = f"in {args.features}" if args.features else "in memory"
    print(f"features: {n} sequences of up to {t} tokens, taps {list(taps)}, "
          f"{size / 2**30:.2f} GiB in {dtype.name} {where}", flush=True)
    every = max(1, -(-n // 16) // 10)

    def progress(done, total):
        if done == total or (done // 16) % every == 0:
            print(f"features: {done}/{total} sequences", flush=True)

    features = eagle3.features(target, sequences, taps, dtype=dtype, progress=progress,
                               directory=args.features, final_only=final_only)
    if features.taps != taps:
        print(f"features: the final states of the finished pass in {args.features} "
              f"(taps {list(features.taps)})", flush=True)
    return features


def _sequences(work: Path, target, prompts, args) -> eagle3.Sequences:
    """The continuations, generated once per run and kept in `work`."""
    key = json.dumps([target.name, [p if isinstance(p, str) else list(map(int, p))
                                    for p in prompts], args.max_new_tokens,
                      args.data_temperature, args.seed])
    file = work / "sequences.npz"
    if file.exists():
        with np.load(file) as saved:
            if str(saved["key"]) == key:
                return eagle3.Sequences(saved["tokens"], saved["length"], saved["prompt_length"])
    seqs = eagle3.continuations(target, prompts, max_new_tokens=args.max_new_tokens,
                                temperature=args.data_temperature, seed=args.seed,
                                progress=lambda done, total: print(f"data: {done}/{total} "
                                                                   f"prompts", flush=True))
    work.mkdir(parents=True, exist_ok=True)
    np.savez(file, key=np.array(key), tokens=seqs.tokens, length=seqs.length,
             prompt_length=seqs.prompt_length)
    return seqs


def progress_bar(args, config, label: str, target, held_out, method: type,
              tree=None) -> StepProgress:
    """The training's progress bar (on stderr), with the held-out tokens per target call at
    temperature 0 every --eval-every steps: the model as it stands, given to `method` (the
    object's class: Eagle, DFlash, Medusa or Speculative, with `tree`, the one it will be
    written with, where the method takes one)."""
    every = args.eval_every if args.eval_every is not None else max(1, config.steps // 5)

    def evaluate(model) -> float:
        chosen = method(model) if method is DFlash else method(model, tree=tree)
        result = generate(target, held_out, chosen, SamplingParams(temperature=0.0),
                          max_new_tokens=args.max_new_tokens)
        return result.stats.tokens_per_target_call

    return StepProgress(config.steps, label, evaluate if held_out and every else None, every)


def finish(out: Path, log: dict, target, held_out, args, method) -> None:
    """The held-out evaluation (tokens per target call and acceptance by depth at temperature
    0 and 1, on prompts never trained on) into the log, with the machine and the version that
    made it; the log into out/train_log.json, and the model card rendered from it into
    out/README.md."""
    host = machine(None)
    log.update(specjax=_specjax_version(), host={
        "cpu": host["cpu_model"], "cores": host["threads"], "device": host["device"],
        "jax": host["jax_version"]})
    if held_out:
        for temperature in (0.0, 1.0):
            result = generate(target, held_out, method, SamplingParams(temperature=temperature),
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
            log[f"tokens_per_target_call_t{temperature:g}"] = round(
                result.stats.tokens_per_target_call, 3)
            log[f"acceptance_by_position_t{temperature:g}"] = [
                None if a is None else round(float(a), 3)     # a depth never reached
                for a in result.stats.acceptance_by_position]
        print(f"held out: {log['tokens_per_target_call_t0']} tokens per target call at "
              f"temperature 0, {log['tokens_per_target_call_t1']} at 1", flush=True)
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "README.md").write_text(card.render(out, log, getattr(args, "argv", [])))
    print(out)


def _specjax_version() -> str:
    try:
        return importlib.metadata.version("specjax")
    except importlib.metadata.PackageNotFoundError:       # run from a checkout, not installed
        return "(not installed)"
