"""The server launcher's ports: picked where nothing else is handed them, and picked again when the
server could not bind its port (CI once lost 17 tests to an SGLang server whose port was taken)."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from nanospec.bench import server as server_mod
from nanospec.bench.server import Server, free_port

# Stands in for sglang.launch_server: binds --port the way uvicorn does, or exits with uvicorn's
# EADDRINUSE line (its text as SGLang's server printed it in CI), then answers the two ready probes.
FAKE_SERVER = textwrap.dedent('''
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    try:
        httpd = http.server.HTTPServer(("127.0.0.1", port), Handler)
    except OSError as e:
        print(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address "
              f"('127.0.0.1', {port}): address already in use", flush=True)
        sys.exit(3)
    print("ready", flush=True)
    httpd.serve_forever()
''')


class FakeServer(Server):
    def command(self) -> list[str]:
        return [sys.executable, str(self.model_path), "--port", str(self.port)]


@pytest.fixture
def fake(tmp_path) -> Path:
    path = tmp_path / "fake_server.py"
    path.write_text(FAKE_SERVER)
    return path


@pytest.fixture
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        yield s.getsockname()[1]


RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    return int(RANGE.read_text().split()[0]) if RANGE.exists() else 0


@pytest.mark.skipif(_ephemeral_low() <= server_mod._PORT_LOW, reason="no port range below the ephemeral one")
def test_free_port_is_below_the_kernels_ephemeral_range():
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= p < low for p in ports), ports
    assert len(set(ports)) > 1  # picked at random, so two launches at once rarely pick the same


def test_a_server_whose_picked_port_was_taken_is_launched_again_on_another(fake, taken_port, tmp_path,
                                                                           monkeypatch):
    picks = iter([taken_port])
    real_free_port = server_mod.free_port
    monkeypatch.setattr(server_mod, "free_port", lambda: next(picks, None) or real_free_port())
    srv = FakeServer(fake, log_path=tmp_path / "server.log", startup_timeout=30)
    assert srv.port == taken_port
    with srv:
        assert srv.port != taken_port
        assert srv.get("/health") == {}
        assert srv.base_url.endswith(f":{srv.port}")
    log = (tmp_path / "server.log").read_text()
    assert f"('127.0.0.1', {taken_port}): address already in use" in log  # the first launch's log kept
    assert log.count("$ ") == 2


def test_a_server_given_a_taken_port_fails_with_the_bind_error(fake, taken_port, tmp_path):
    srv = FakeServer(fake, log_path=tmp_path / "server.log", startup_timeout=30, port=taken_port)
    with pytest.raises(RuntimeError, match="address already in use"):
        srv.start()
    assert srv.port == taken_port
    assert (tmp_path / "server.log").read_text().count("$ ") == 1
