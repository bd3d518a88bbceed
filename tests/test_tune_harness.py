"""The step-controller sweep's harness without servers: which runner serves its configurations."""

from __future__ import annotations

from pathlib import Path

from nanospec.bench import specbench, tune


def fake_runs(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []

    def run(m):
        return {"method": m.name, "config": "c", "records": [{"completion_tokens": 4, "wall_s": 1.0}]}

    def run_method(m, *args, **kwargs):
        calls.append(("one", m.name))
        return run(m)

    def run_interleaved(ms, *args, **kwargs):
        calls.append(("all", [m.name for m in ms]))
        return [run(m) for m in ms]

    monkeypatch.setattr(specbench, "run_method", run_method)
    monkeypatch.setattr(specbench, "run_interleaved", run_interleaved)
    return calls


def test_interleave_serves_every_configuration_side_by_side_in_one_call(monkeypatch):
    calls = fake_runs(monkeypatch)
    ms = tune.methods(Path("draft"), [(1, 1, 2), (3, 1, 4)], False)
    runs = tune.run_all(ms, True, "t", [], {}, None, [], 8, 1, Path("logs"))
    assert calls == [("all", [m.name for m in ms])]
    assert [r["method"] for r in runs] == [m.name for m in ms]


def test_without_interleave_each_configuration_gets_its_own_server_in_turn(monkeypatch):
    calls = fake_runs(monkeypatch)
    ms = tune.methods(Path("draft"), [(1, 1, 2)], False)
    tune.run_all(ms, False, "t", [], {}, None, [], 8, 1, Path("logs"))
    assert calls == [("one", m.name) for m in ms]


def test_interleave_flag_is_parsed():
    argv = ["--target", "t", "--draft", "d"]
    assert tune.parse_args(argv + ["--interleave"]).interleave and not tune.parse_args(argv).interleave
