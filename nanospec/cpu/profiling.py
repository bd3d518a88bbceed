"""Opt-in timing of the fallback ops and of SGLang's forward passes, for ``python -m nanospec.cpu.bench``.

Enabled in a process when ``NANOSPEC_PROFILE_OPS`` names a directory: every fallback op, every
``ModelRunner.forward`` (target and draft) and every ``EAGLEWorkerV2.forward_batch_generation`` (one
speculative cycle) add their wall time to per-name totals, written to ``<dir>/<pid>.json`` by a
background thread twice a second (SGLang's processes are killed, not exited) and at exit. Calls made
inside a ``scope(label)`` (a forward pass: "target:TARGET_VERIFY", ...) also add to ``label/name``, so an
op's cost in a verify is told apart from the same op in the draft's passes. Off (the default), nothing is
wrapped and nothing costs anything.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import threading
import time

_DIR = os.environ.get("NANOSPEC_PROFILE_OPS")
_STATS: dict[str, list[float]] = {}
_LOCK = threading.Lock()
_LAST = [0.0]
_DEPTH = threading.local()
_SCOPE = threading.local()
_DIRTY = threading.Event()
_FLUSHER: list[threading.Thread] = []


def _flush_loop() -> None:
    while True:
        time.sleep(0.5)
        if _DIRTY.is_set():
            _flush(True)


def enabled() -> bool:
    return bool(_DIR)


def _flush(force: bool = False) -> None:
    now = time.monotonic()
    if not force and now - _LAST[0] < 0.5:
        return
    _LAST[0] = now
    _DIRTY.clear()
    os.makedirs(_DIR, exist_ok=True)
    path = os.path.join(_DIR, f"{os.getpid()}.json")
    with _LOCK:
        data = {k: {"seconds": v[0], "calls": int(v[1])} for k, v in _STATS.items()}
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def timed(name: str, fn):
    """Wrap ``fn`` so that its wall time adds to ``name``; only outermost calls of a name count."""
    if not enabled():
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        depth = getattr(_DEPTH, name, 0)
        setattr(_DEPTH, name, depth + 1)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(_DEPTH, name, depth)
            if depth == 0:
                record(name, time.perf_counter() - t0)

    return wrapper


@contextlib.contextmanager
def scope(label: str):
    """Inside, every recorded call also adds to ``label/<name>`` (the innermost scope only)."""
    outer = getattr(_SCOPE, "label", None)
    _SCOPE.label = label
    try:
        yield
    finally:
        _SCOPE.label = outer


def record(name: str, seconds: float) -> None:
    """Add one call of ``seconds`` to the totals of ``name`` (and of ``<scope>/name`` inside a scope)."""
    label = getattr(_SCOPE, "label", None)
    names = (name,) if label is None else (name, f"{label}/{name}")
    with _LOCK:
        for n in names:
            s = _STATS.setdefault(n, [0.0, 0])
            s[0] += seconds
            s[1] += 1
        if not _FLUSHER:
            _FLUSHER.append(threading.Thread(target=_flush_loop, daemon=True))
            _FLUSHER[0].start()
    _DIRTY.set()


if enabled():
    atexit.register(_flush, True)
