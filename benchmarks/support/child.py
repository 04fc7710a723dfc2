"""A benchmark's baseline in a process of its own, driven line by line: it prints READY once built, then
answers each line sent to its stdin with one JSON line (other output, vLLM's messages, is skipped).
Its own process, so that neither side inherits the other's engine, threads or environment."""
from __future__ import annotations

import json
import subprocess


class LineChild:
    def __init__(self, cmd: list[str], what: str):
        self.what = what  # names it in errors
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read(ready=True)

    def _read(self, ready: bool = False):
        for line in self.proc.stdout:
            line = line.strip()
            if ready and line == "READY":
                return None
            if not ready and line.startswith("["):
                return json.loads(line)
        raise RuntimeError(f"{self.what} exited (code {self.proc.wait()})")

    def ask(self, line: str):
        """Send `line`; the JSON value of the answer."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
