"""An engine run in its own Python, in a subprocess: one JSON request a line in, one JSON answer
a line out, the engine's own output in a log file whose tail an error quotes. The worker script
writes a first line, {"version": ...}, when it is ready, and {"error": ...} for a request it
could not serve."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

__all__ = ["EngineWorker", "engine_python", "installed_versions"]


def engine_python(env: str, missing: type[ImportError], why: str, install: str) -> str:
    """The engine environment's Python that the variable `env` names, checked to exist; `why`
    says why it has an environment of its own and `install` how to make one (`missing`'s
    message)."""
    python = os.environ.get(env)
    if not python:
        raise missing(f"{why}, and {env} is not set: {install}")
    if not os.access(python, os.X_OK):
        raise missing(f"{env}={python!r} is not an executable Python: {install}")
    return python


def installed_versions(python: str, *dists: str) -> list[str] | None:
    """The versions of `dists` in `python`'s environment, read from their metadata without
    importing them; None where one is not installed."""
    found = subprocess.run(
        [python, "-c", "import importlib.metadata as m, sys; "
                       "print(*(m.version(d) for d in sys.argv[1:]))", *dists],
        capture_output=True, text=True)
    return None if found.returncode else found.stdout.split()


class EngineWorker:
    """`command` (the engine's Python running its worker script) as a running process."""

    def __init__(self, engine: str, command: list[str], env: dict):
        self.engine = engine
        self.log = tempfile.NamedTemporaryFile(prefix="specjax-worker-", suffix=".log",
                                               delete=False)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=env)
        self.version = self._answer()["version"]

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"{self.engine} refused the request: {answer['error']}")
        return answer

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.close()
            tail = Path(self.log.name).read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"{self.engine}'s worker ended (log {self.log.name}):\n"
                               + "\n".join(tail))
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
