"""Decoding on a device mesh (`specjax.mesh`): tests/support/mesh_checks.py, run on 8 forced host devices
in a subprocess so that the rest of the suite keeps its single device, beside a mesh across two
processes (tests/support/mesh_process.py)."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.cli.main import main

CHECKS = Path(__file__).resolve().parents[1] / "support" / "mesh_checks.py"
PROCESS = Path(__file__).resolve().parents[1] / "support" / "mesh_process.py"


@pytest.mark.slow
def test_mesh_checks_pass_on_eight_devices_and_across_two_processes():
    """The mesh checks, one run of processes started together: tests/support/mesh_checks.py under pytest
    on 8 forced host devices, and two `jax.distributed` CPU processes of 4 devices each (gloo
    collectives, tests/support/mesh_process.py) that each load their own shards and must get every
    row's tokens, sampled, the same as one device gives here."""
    import specjax
    from specjax.presets import WEIGHTS

    flags = os.environ.get("XLA_FLAGS", "")                   # the suite's compile level too
    env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=8")
    checks = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                               str(CHECKS)], cwd=CHECKS.parents[2], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prompts = ["def add(a, b):", "class Stack:", "import os"]      # 3 rows: padded to 4
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(PROCESS.parents[2]))
    pair = [subprocess.Popen([sys.executable, str(PROCESS), str(i), str(port), json.dumps(prompts)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]

    target, draft = specjax.load(WEIGHTS / "llama-target"), specjax.load(WEIGHTS / "llama-draft")
    expected = {method: specjax.generate(target, prompts,
                                         method=specjax.api.methods.build_shared(method, draft=draft, k=3),
                                         sampling=specjax.SamplingParams(temperature=1.0),
                                         max_new_tokens=8, seed=5).tokens
                for method in ("autoregressive", "speculative")}
    outputs = [p.communicate(timeout=600) for p in pair]
    out, err = checks.communicate(timeout=1200)

    summary = out.strip().splitlines()[-1] if out.strip() else ""
    assert checks.returncode == 0, out[-6000:] + err[-3000:]
    # Every check ran and passed: none skipped, none deselected.
    passed = r"=* ?\d+ passed(, \d+ warnings?)? in [\d.]+s( \(.*\))? ?=*"
    assert re.fullmatch(passed, summary), summary
    for p, (out, err) in zip(pair, outputs):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == expected


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
