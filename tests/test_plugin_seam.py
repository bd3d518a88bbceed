"""The seam table (``nanospec/sglang/seam.py``) against SGLang and against the plugin's own code.

Every touchpoint the plugin has must be a row: its HookRegistry registrations, the methods its
subclasses override, the attributes it writes on SGLang objects and the private SGLang names it
reads. A new touchpoint without a row, or a row whose touchpoint is gone, fails here; a changed
SGLang signature fails ``seam.check`` with the version and the symbol.
"""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import pytest

from nanospec.sglang import seam

PLUGIN = Path(__file__).resolve().parents[1] / "nanospec" / "sglang"
WRITERS = ("patch", "hide", "swapped", "set_server_arg", "graphs_unless_stale")  # (obj, "attr", ...) helpers


def test_every_row_matches_the_installed_sglang():
    seam.check(force=True)
    assert {t.kind for t in seam.SEAM} <= set(seam.KINDS)
    for t in seam.SEAM:
        assert t.reason and t.test.startswith("tests/test_") and t.where, t.symbol
        assert (Path(__file__).resolve().parents[1] / t.test.split("::")[0]).is_file(), t.test
        if "::" in t.test:
            path, name = t.test.split("::")
            assert f"def {name}(" in (Path(__file__).resolve().parents[1] / path).read_text(), t.test


@pytest.mark.parametrize("change, words", [
    ({"params": ("self", "hidden", "lm_head")}, "parameters are"),
    ({"symbol": "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head_v2"}, "no longer sets"),
    ({"symbol": "sglang.srt.no_such_module.Thing.method"}, "cannot be imported"),
])
def test_a_changed_sglang_symbol_stops_the_start_naming_version_and_symbol(change, words):
    import dataclasses

    row = next(t for t in seam.SEAM if t.symbol.endswith("LogitsProcessor._compute_lm_head"))
    bad = dataclasses.replace(row, **change)
    with pytest.raises(seam.SeamError, match=words) as e:
        seam.check_row(bad)
    assert "SGLang 0.5.23" in str(e.value) and bad.symbol in str(e.value)


def test_hook_registrations_are_the_table_hooks(monkeypatch):
    import sglang.srt.speculative.spec_registry as spec_registry
    from sglang.srt.plugins.hook_registry import HookRegistry

    import nanospec.sglang as plugin

    def registered(timing: bool) -> set[tuple[str, str]]:
        monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
        fresh = {k: v for k, v in spec_registry._REGISTRY.items() if k != "NANOSPEC"}
        monkeypatch.setattr(spec_registry, "_REGISTRY", fresh)
        monkeypatch.setattr(plugin, "_registered", False)
        if timing:
            monkeypatch.setenv("NANOSPEC_TIME_DRAFT", "1")
        else:
            monkeypatch.delenv("NANOSPEC_TIME_DRAFT", raising=False)
        plugin.register()
        return {(target, kind.name) for target, hooks in HookRegistry._hooks.items() for kind, _, _ in hooks}

    rows = seam.rows("hook")
    assert registered(False) == {(t.symbol, t.hook_type) for t in rows if not t.optional}
    assert registered(True) == {(t.symbol, t.hook_type) for t in rows}


def _overrides() -> dict[str, tuple[type, type]]:
    """symbol -> (our class, SGLang class) for every method our subclasses define over SGLang's."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from nanospec.sglang.algo import NanoSpecAlgo
    from nanospec.sglang.worker import NanoSpecDraftWorker, NanoSpecWorker

    out = {}
    for cls in (NanoSpecAlgo, NanoSpecWorker, NanoSpecDraftWorker):
        for name, fn in vars(cls).items():
            if not callable(fn):
                continue
            base = next((b for b in cls.__mro__[1:] if name in vars(b) and b.__module__.startswith("sglang")),
                        None)
            if base is None and cls is NanoSpecAlgo and hasattr(SpeculativeAlgorithm, name):
                base = SpeculativeAlgorithm  # the interface the scheduler calls on every algorithm
            if base is not None:
                out[f"{base.__module__}.{base.__qualname__}.{name}"] = (cls, base)
    return out


def test_method_overrides_are_the_table_overrides_and_keep_sglangs_parameters():
    found = _overrides()
    assert set(found) == {t.symbol for t in seam.rows("override")}
    for symbol, (cls, base) in found.items():
        name = symbol.rsplit(".", 1)[1]
        ours = list(inspect.signature(getattr(cls, name)).parameters)
        theirs = list(inspect.signature(getattr(base, name)).parameters)
        named = [p for p in ours if p not in ("args", "kwargs")]
        assert named == theirs[: len(named)], symbol


def _sglang_subclasses(tree: ast.Module, module) -> dict[str, type]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cls = getattr(module, node.name, None)
            if isinstance(cls, type) and any(b.__module__.startswith("sglang") for b in cls.__mro__[1:]):
                out[node.name] = cls
    return out


def scan(path: Path) -> tuple[set[str], set[str], list[str]]:
    """(attributes written on SGLang objects, private names read off other objects, problems)."""
    import importlib

    tree = ast.parse(path.read_text())
    module = importlib.import_module(f"nanospec.sglang.{path.stem}")
    subclasses = _sglang_subclasses(tree, module)
    writes, private, problems = set(), set(), []

    def visit(node, cls: type | None, func: str | None):
        for child in ast.iter_child_nodes(node):
            c, f = cls, func
            if isinstance(child, ast.ClassDef):
                c = subclasses.get(child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = child.name
            check(child, c, f)
            visit(child, c, f)

    def on_self(attr: ast.Attribute) -> bool:
        return isinstance(attr.value, ast.Name) and attr.value.id == "self"

    def check(node, cls, func):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if not on_self(node):
                writes.add(node.attr)
            elif cls is not None and seam._class_has(cls.__mro__[1], node.attr):
                writes.add(node.attr)  # an attribute SGLang's base class owns
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = node.attr
            private_name = name.startswith("_") and not name.startswith("__")
            own_module = isinstance(node.value, ast.Name) and node.value.id in ("seam", "plugin")
            if private_name and not own_module and (not on_self(node) or cls is not None):
                private.add(name)
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name in ("setattr", "delattr"):
                problems.append(f"{where}: {name}() hides the attribute from this test; use seam.patch")
            if name in WRITERS and len(node.args) >= 2:
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    writes.add(arg.value)
                elif func != "graphs_unless_stale":  # its callers name the attribute
                    problems.append(f"{where}: {name}() with an attribute that is not a literal")

    visit(tree, None, None)
    return writes, private, problems


def test_every_attribute_written_and_private_name_read_is_in_the_table():
    files = sorted(p for p in PLUGIN.glob("*.py") if p.name != "seam.py")
    writes, private, problems = set(), set(), []
    for f in files:
        w, p, bad = scan(f)
        writes |= w
        private |= p
        problems += bad
    assert not problems
    written_rows = {a for t in seam.SEAM if t.kind != "api" for a in t.attrs}
    assert writes - written_rows == set(), "attributes written on SGLang objects without a seam row"
    assert written_rows - writes - {"penalizer_orchestrator"} == set(), "seam rows no code writes"
    named = {t.symbol.rsplit(".", 1)[1] for t in seam.SEAM} | {a for t in seam.SEAM for a in t.attrs}
    assert private - named == set(), "private SGLang names read without a seam row"


def test_the_scan_sees_a_new_touchpoint(tmp_path, monkeypatch):
    # The test above must be able to fail: a write, a setattr and a private call it has no row for.
    import sys
    import types

    src = ("def f(pool, proc):\n    pool.alloc = None\n    setattr(proc, 'x', 1)\n"
           "    return proc._forward_raw(1)\n")
    f = tmp_path / "extra.py"
    f.write_text(src)
    monkeypatch.setitem(sys.modules, "nanospec.sglang.extra", types.ModuleType("nanospec.sglang.extra"))
    writes, private, problems = scan(f)
    assert writes == {"alloc"} and private == {"_forward_raw"} and len(problems) == 1


def test_docs_show_the_table():
    doc = (PLUGIN.parents[1] / "docs" / "plugin.md").read_text()
    assert seam.table_markdown() in doc
