"""Decoding on a device mesh (`specjax.mesh`): tests/mesh_checks.py, run on 8 forced host devices
in a subprocess so that the rest of the suite keeps its single device."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.cli.main import main

CHECKS = Path(__file__).with_name("mesh_checks.py")


@pytest.mark.slow
def test_mesh_checks_pass_on_eight_host_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(CHECKS)],
                          cwd=CHECKS.parent.parent, env=env, capture_output=True, text=True,
                          timeout=1200)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # Every check ran and passed: none skipped, none deselected.
    assert re.fullmatch(r"=* ?\d+ passed(, \d+ warnings?)? in [\d.]+s( \(.*\))? ?=*", summary), summary


@pytest.mark.parametrize("value, message", [
    ("data=2,model=x", "--mesh model must be an integer >= 1, got 'x'"),
    ("data=0", "--mesh data must be an integer >= 1, got '0'"),
    ("rows=2", "--mesh takes data=N,model=M (each axis once), got 'rows=2'"),
    ("model=2,model=2", "--mesh takes data=N,model=M (each axis once)"),
    ("data=2,model=4", "needs 8 devices; 1 available (on a CPU, set "
                       "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts)"),
])
def test_cli_mesh_errors(capsys, value, message):
    code = main(["generate", "--prompt", "x", "-n", "2", "--method", "autoregressive",
                 "--mesh", value])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_mesh_across_two_processes_gives_one_devices_tokens():
    """jax.distributed with two CPU processes of 4 devices each (gloo collectives): each
    process loads its own shards and gets every row's tokens, sampled, the same as one device."""
    import specjax
    from specjax.presets import WEIGHTS

    prompts = ["def add(a, b):", "class Stack:", "import os"]      # 3 rows: padded to 4
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    script = Path(__file__).with_name("mesh_process.py")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(script.parent.parent)
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), json.dumps(prompts)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    target, draft = specjax.load(WEIGHTS / "llama-target"), specjax.load(WEIGHTS / "llama-draft")
    expected = {method: specjax.generate(target, prompts, method=method, draft=draft, k=3,
                                         max_new_tokens=8, temperature=1.0, seed=5).tokens
                for method in ("autoregressive", "speculative")}
    for out, _ in outputs:
        assert json.loads(out.strip().splitlines()[-1]) == expected
