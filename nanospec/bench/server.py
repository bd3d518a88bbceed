"""Start, query and stop one SGLang server subprocess: the one launcher of the benchmarks, the demo and the
test suite (``tests/support/sglang_server.py`` adds only the tests' CPU defaults).

``Server(model, args=(), env=None, log_path=None, startup_timeout=900.0, *, port=None, append_log=False)``
runs ``python -m sglang.launch_server --model-path MODEL --host 127.0.0.1 --port PORT *args`` (a free port
unless given) with ``env`` over this process's environment, in its own process group so that stopping it
also ends the scheduler and detokenizer processes it spawns; its output goes to ``log_path`` (a temporary
file when None; truncated at start unless ``append_log``). ``start()`` (or ``with Server(...) as srv:``)
waits until ``/health`` answers 200 and ``/get_model_info`` answers; a server that dies or is not ready
within ``startup_timeout`` is a ``RuntimeError`` carrying its log tail, and its process group is stopped.
A server that could not bind a port ``free_port`` picked is launched again on a fresh one
(``start(attempts=3)``, the log appended); a port given by the caller is never changed.
``stop()`` (idempotent, also run at interpreter exit for servers still up) sends SIGTERM to the group, then
SIGKILL after ``grace`` seconds to whatever is left.

Requests: ``post(path, payload)``, ``get(path)``, ``generate(ids_or_text, max_new_tokens, ignore_eos)``
(greedy, ``/generate``), ``chat(messages)`` (``/v1/chat/completions``), ``server_info()``; an HTTP error
status is a ``RuntimeError`` with the body. ``base_url`` (also ``url``), ``port``, ``log_path``,
``process``; ``log_text()``, ``log_tail(n)``.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

_LIVE: set[Server] = set()


# Ports the server binds only seconds after we pick them. A port from the kernel's ephemeral range
# (bind(0), outgoing connections) can be handed to another socket in between -- in CI, to one of the
# server's own start-up sockets -- so pick below that range, and away from SGLang's own pick for its
# dist-init port (22000-29999, sglang.srt.utils.network.get_free_port_below_ephemeral).
_PORT_LOW, _PORT_HIGH = 10000, 21999
_PORT_RNG = random.Random()  # its own: a test that seeds ``random`` must not replay the same ports


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range where one is known, so that
    nothing else is handed it before the server binds it."""
    high = min(_PORT_HIGH, _ephemeral_low() - 1)
    for port in _PORT_RNG.sample(range(_PORT_LOW, high + 1), min(64, max(high - _PORT_LOW + 1, 0))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, payload=None, timeout: float = 30.0) -> tuple[int, bytes]:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if payload is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


class Server:
    """``python -m sglang.launch_server --model-path MODEL *args`` on a localhost port (module docstring)."""

    def __init__(self, model: str | Path, args=(), env: dict[str, str] | None = None, log_path=None,
                 startup_timeout: float = 900.0, *, port: int | None = None, append_log: bool = False):
        self.model_path = str(model)
        self.args = [str(a) for a in args]
        self.env = dict(env or {})
        self._own_port = port is None  # ours to change when another socket takes it first
        self._use_port(port or free_port())
        self.startup_timeout = startup_timeout
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="sglang_server_", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.append_log = append_log
        self.process: subprocess.Popen | None = None
        self._log_file = None

    def _use_port(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"

    @property
    def url(self) -> str:
        return self.base_url

    # ---- lifecycle -------------------------------------------------------------------------------
    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path,
                "--host", "127.0.0.1", "--port", str(self.port), *self.launch_args()]

    def launch_args(self) -> list[str]:
        """The ``sglang.launch_server`` arguments after model, host and port: ``args``."""
        return list(self.args)

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def start(self, attempts: int = 3) -> Server:
        """Launch and wait until ready. A server that could not bind a port we picked is launched again
        on a fresh port, up to ``attempts`` launches in all; a port given to ``__init__`` is never changed."""
        if self.process is not None:
            return self
        for attempt in range(attempts):
            self._launch(append=self.append_log or attempt > 0)
            try:
                self._wait_ready()
                return self
            except BaseException as e:
                self.stop()
                if not (self._own_port and attempt + 1 < attempts and isinstance(e, RuntimeError)
                        and self._port_was_taken()):
                    raise
            self._use_port(free_port())
        raise AssertionError("unreachable")

    def _launch(self, append: bool) -> None:
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab" if append else "wb", buffering=0)
        self._log_file.write(("$ " + " ".join(cmd) + "\n").encode())
        self.process = subprocess.Popen(
            cmd, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.environment(),
            start_new_session=True,  # own process group: stop() ends the scheduler and detokenizer too
        )
        _LIVE.add(self)

    def _port_was_taken(self) -> bool:
        """Whether the last launch failed because its HTTP port was taken (uvicorn's EADDRINUSE line)."""
        text = self.log_text()
        last_launch = text[text.rfind("$ " + self.command()[0]):]
        return f"{self.port}): address already in use" in last_launch

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

    def stop(self, grace: float = 20.0) -> None:
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

    def __enter__(self) -> Server:
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

    def generate(self, prompt, max_new_tokens: int = 32, ignore_eos: bool = False, timeout: float = 3600.0,
                 **sampling) -> dict:
        """Greedy ``/generate`` of ``prompt`` (token ids, or text); ``sampling`` adds sampling params."""
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos, **sampling}
        payload = {"sampling_params": params}
        if isinstance(prompt, str):
            payload["text"] = prompt
        else:
            payload["input_ids"] = list(prompt)
        return self.post("/generate", payload, timeout=timeout)

    def chat(self, messages, max_tokens: int = 32, **kw) -> dict:
        payload = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                   "ignore_eos": True, **kw}
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
