"""An engine run in its own Python, in a subprocess: one JSON request a line in, one JSON answer
a line out, the engine's own output in a log file whose tail an error quotes. The worker script
writes a first line, {"version": ...}, when it is ready, and {"error": ...} for a request it
could not serve."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

__all__ = ["EngineWorker"]


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
