"""Start and stop a real SGLang server subprocess for tests.

API (kept stable):

``SGLangServer(model_path, *, args=(), env=None, log_path=None, port=None, device="cpu",
startup_timeout=600.0)``
    Describes a server; nothing runs until ``start()``. ``args`` are extra ``sglang.launch_server``
    arguments (e.g. ``["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", d]``).
    With ``device="cpu"`` the helper adds ``--device cpu`` and ``--skip-server-warmup`` (unless given in
    ``args``) and ``OMP_NUM_THREADS=1`` (unless set in the environment or ``env``). Nothing else: the
    installed ``patches/`` start-up hook sets ``SGLANG_USE_CPU_ENGINE=1`` and a CPU default for
    ``--max-total-tokens`` (docs/cpu.md), so the server runs exactly as a user's would.
    ``start()`` launches ``python -m sglang.launch_server`` on a free localhost port in its own process
    group, output to ``log_path`` (a temp file by default), and waits until ``/health`` answers 200 and
    ``/get_model_info`` answers; if the process dies or the timeout passes it raises ``RuntimeError``
    with the log's tail and stops the process group. ``stop()`` (idempotent, also run at interpreter
    exit) sends SIGTERM to the whole process group, then SIGKILL after a grace period.
    Context manager: ``with SGLangServer(...) as srv:``.

    Attributes: ``base_url`` ("http://127.0.0.1:PORT"), ``port``, ``log_path``, ``process``.
    Methods: ``post(path, payload, timeout=300) -> dict`` (JSON POST), ``get(path, timeout=30) -> dict``,
    ``generate(text_or_ids, max_new_tokens=32, **sampling) -> dict`` (greedy by default; ``ignore_eos``
    is on), ``chat(messages, max_tokens=32, **kw) -> dict`` (``/v1/chat/completions``),
    ``server_info() -> dict`` (``/get_server_info``), ``log_text() -> str``.

``free_port() -> int``
    A free TCP port on 127.0.0.1.

Typical module-scoped fixture::

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        model = make_tiny_llama(tmp_path_factory.mktemp("m"), vocab_size=512)
        with SGLangServer(model, log_path=tmp_path_factory.mktemp("log") / "server.log") as srv:
            yield srv
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CPU_DEFAULTS: dict[str, str] = {}
CPU_FLAGS = ("--skip-server-warmup",)

_LIVE: set[SGLangServer] = set()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, payload=None, timeout: float = 30.0):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if payload is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
        return resp.status, body


class SGLangServer:
    def __init__(
        self,
        model_path,
        *,
        args=(),
        env: dict | None = None,
        log_path=None,
        port: int | None = None,
        device: str = "cpu",
        startup_timeout: float = 600.0,
    ) -> None:
        self.model_path = str(model_path)
        self.args = [str(a) for a in args]
        self.env = dict(env or {})
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.device = device
        self.startup_timeout = startup_timeout
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="sglang_server_", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self._log_file = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path,
            "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        args = list(self.args)
        if self.device == "cpu":
            if "--device" not in args:
                cmd += ["--device", "cpu"]
            for flag, value in CPU_DEFAULTS.items():
                if flag not in args:
                    cmd += [flag, value]
            for flag in CPU_FLAGS:
                if flag not in args:
                    cmd.append(flag)
        return cmd + args

    def start(self) -> SGLangServer:
        if self.process is not None:
            return self
        env = dict(os.environ)
        if self.device == "cpu":
            # Tiny test models: one OpenMP thread avoids spin-wait collapse on a busy 2-core host.
            env.setdefault("OMP_NUM_THREADS", "1")
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab", buffering=0)
        self._log_file.write(("$ " + " ".join(self.command()) + "\n").encode())
        self.process = subprocess.Popen(
            self.command(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # own process group: stop() kills scheduler/detokenizer too
        )
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"SGLang server exited with code {self.process.returncode} during start-up; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                status, _ = _request(self.base_url + "/health", timeout=5)
                if status == 200:
                    _request(self.base_url + "/get_model_info", timeout=10)
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"SGLang server not ready after {self.startup_timeout:.0f} s; log {self.log_path}:\n"
            + self.log_tail()
        )

    def stop(self, grace: float = 15.0) -> None:
        proc = self.process
        if proc is None:
            return
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            # Children (scheduler, detokenizer) may outlive the launcher: kill whatever is left.
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.process = None
        _LIVE.discard(self)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- requests --------------------------------------------------------------------------------
    def post(self, path: str, payload: dict, timeout: float = 300.0) -> dict:
        try:
            _, body = _request(self.base_url + path, payload, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"POST {path} -> {e.code}: {e.read()[:2000]!r}") from e
        return json.loads(body)

    def get(self, path: str, timeout: float = 30.0) -> dict:
        _, body = _request(self.base_url + path, timeout=timeout)
        return json.loads(body)

    def generate(self, prompt, max_new_tokens: int = 32, **sampling) -> dict:
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        params.update(sampling)
        payload = {"sampling_params": params}
        if isinstance(prompt, str):
            payload["text"] = prompt
        else:
            payload["input_ids"] = list(prompt)
        return self.post("/generate", payload)

    def chat(self, messages, max_tokens: int = 32, **kw) -> dict:
        payload = {
            "model": "default",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        payload.update(kw)
        return self.post("/v1/chat/completions", payload)

    def server_info(self) -> dict:
        return self.get("/get_server_info")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE):
        srv.stop(grace=5.0)
