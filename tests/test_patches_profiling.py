"""The opt-in op profiler used by ``python -m nanospec.cpu.bench``."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_profiler_records_outermost_calls_only_when_enabled(tmp_path):
    code = """
from nanospec.cpu import profiling
def inner(x):
    return x + 1
inner_t = profiling.timed("op:inner", inner)
outer = profiling.timed("op:inner", lambda x: inner_t(x) * 2)  # nested call of the same name
assert outer(1) == 4 and inner_t(1) == 2
profiling._flush(True)
print(profiling.enabled())
"""
    env = dict(os.environ, NANOSPEC_PROFILE_OPS=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    (stats_file,) = tmp_path.glob("*.json")
    stats = json.loads(stats_file.read_text())
    assert stats["op:inner"]["calls"] == 2  # outer (with its nested inner) + one direct inner
    assert stats["op:inner"]["seconds"] >= 0.0

    env.pop("NANOSPEC_PROFILE_OPS")
    code_off = "from nanospec.cpu import profiling; f = lambda: 1; print(profiling.timed('x', f) is f)"
    off = subprocess.run([sys.executable, "-c", code_off], env=env, capture_output=True, text=True)
    assert off.stdout.strip() == "True"


def test_profiler_scope_adds_calls_to_the_innermost_scope_label(tmp_path):
    code = """
from nanospec.cpu import profiling
op = profiling.timed("op:x", lambda: None)
op()
with profiling.scope("target:TARGET_VERIFY"):
    op()
    with profiling.scope("draft:DRAFT_EXTEND"):
        op()
    op()
profiling._flush(True)
"""
    env = dict(os.environ, NANOSPEC_PROFILE_OPS=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (stats_file,) = tmp_path.glob("*.json")
    stats = json.loads(stats_file.read_text())
    assert stats["op:x"]["calls"] == 4
    assert stats["target:TARGET_VERIFY/op:x"]["calls"] == 2
    assert stats["draft:DRAFT_EXTEND/op:x"]["calls"] == 1
