"""Start, query and stop one SGLang server subprocess (used by the Spec-Bench harness and the demo).

The server runs in its own process group so that stopping it also ends the scheduler and detokenizer
processes it spawns; a server that dies or never answers ``/health`` is an error carrying its log tail.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, payload: dict | None = None, timeout: float = 30.0) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


class Server:
    """``python -m sglang.launch_server --model-path MODEL *args`` on a free localhost port."""

    def __init__(self, model: str | Path, args: list[str], env: dict[str, str], log_path: Path,
                 startup_timeout: float = 900.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
                    "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.env = {**os.environ, **env}
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(self.cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with code {self.proc.returncode} during start-up"
                                   f" ({self.log_path}):\n{self.log_tail()}")
            try:
                _http(self.url + "/health", timeout=5)
                return
            except (OSError, urllib.error.URLError, json.JSONDecodeError):
                time.sleep(0.5)
        raise RuntimeError(f"SGLang server not ready after {self.startup_timeout:.0f} s ({self.log_path}):\n"
                           + self.log_tail())

    def generate(self, input_ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> dict:
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}
        return _http(self.url + "/generate", {"input_ids": input_ids, "sampling_params": params},
                     timeout=3600)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self.proc = None
