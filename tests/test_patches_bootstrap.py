"""The start-up hook: fallback only when the real sgl_kernel cannot load, installed for every process."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nanospec.cpu import _bootstrap


def _run(code: str, extra_path: Path | None = None, env: dict | None = None) -> str:
    full_env = dict(os.environ)
    full_env.pop("SGLANG_USE_CPU_ENGINE", None)
    if extra_path is not None:
        full_env["PYTHONPATH"] = str(extra_path) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def _pth_installed() -> bool:
    try:
        files = importlib.metadata.files("nanospec") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(str(f).endswith("nanospec_sgl_cpu.pth") for f in files)


needs_install = pytest.mark.skipif(not _pth_installed(), reason="nanospec is not pip-installed")


@needs_install
def test_pth_is_installed_into_site_packages():
    files = importlib.metadata.files("nanospec")
    pth = [f for f in files if str(f).endswith("nanospec_sgl_cpu.pth")]
    assert len(pth) == 1 and pth[0].parent == Path(".")  # top level of site-packages
    text = Path(pth[0].locate()).read_text()
    assert "nanospec.cpu._bootstrap" in text


@needs_install
def test_a_working_sgl_kernel_is_never_shadowed(tmp_path):
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    out = _run(
        """
        import sgl_kernel
        print(getattr(sgl_kernel, "REAL", False), getattr(sgl_kernel, "__nanospec_fallback__", False))
        """,
        tmp_path,
    )
    assert out == "True False"


@needs_install
def test_a_broken_sgl_kernel_is_replaced_by_the_fallback(tmp_path):
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('Could not load any common_ops library')\n")
    (pkg / "helper.py").write_text("X = 1\n")
    out = _run(
        """
        import sys, torch, sgl_kernel
        from sgl_kernel.speculative import verify_tree_greedy_cpu
        from sgl_kernel.kvcacheio import copy_all_layer_kv_cache_cpu
        from sgl_kernel import build_draft_decode_metadata_cpu
        print(sgl_kernel.__nanospec_fallback__, "common_ops" in sgl_kernel.__nanospec_real_error__)
        print(callable(torch.ops.sgl_kernel.decode_attention_cpu), "sgl_kernel.helper" in sys.modules)
        try:
            from sgl_kernel import some_cuda_only_op
        except ImportError as e:
            print("some_cuda_only_op" in str(e))
        """,
        tmp_path,
    )
    assert out.split() == ["True", "True", "True", "False", "True"]


@needs_install
def test_switch_off_with_environment_variable(tmp_path):
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('broken')\n")
    out = _run(
        """
        try:
            import sgl_kernel
            print("imported")
        except ImportError:
            print("ImportError")
        """,
        tmp_path,
        env={"NANOSPEC_SGL_FALLBACK": "0"},
    )
    assert out == "ImportError"


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["python", "-m", "sglang.launch_server", "--model-path", "m", "--device", "cpu"], "1"),
        (["python", "-m", "sglang.launch_server", "--device=cpu"], "1"),
        (["/venv/bin/sglang", "serve", "--device", "cpu"], "1"),
        (["python", "-m", "sglang.launch_server", "--device", "cuda"], None),
        (["python", "train.py", "--device", "cpu"], None),
    ],
)
def test_cpu_engine_is_enabled_only_for_sglang_on_cpu(monkeypatch, argv, expected):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    monkeypatch.setattr(sys, "orig_argv", argv)
    _bootstrap._maybe_enable_cpu_engine()
    assert os.environ.get("SGLANG_USE_CPU_ENGINE") == expected
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)


@needs_install
def test_every_sglang_fix_is_installed_once_and_keeps_sglangs_function():
    # The bootstrap fixes each module on import; applying a fix again (a module executed twice) must not
    # wrap the fix in itself, and every fix keeps SGLang's function as __nanospec_original__.
    out = _run("""
        import importlib
        import sgl_kernel
        from nanospec.cpu import sglang_fixes
        if not getattr(sgl_kernel, "__nanospec_fallback__", False):
            raise SystemExit(print("real sgl_kernel"))
        installed = set()
        install = sglang_fixes._install
        def spy(owner, name, replacement):
            install(owner, name, replacement)
            installed.add((owner, name))
        sglang_fixes._install = spy
        for name, fix in sglang_fixes.TARGETS.items():
            fix(importlib.import_module(name))
        for owner, name in sorted(installed, key=str):
            fn = getattr(owner, name)
            original = fn.__nanospec_original__
            assert fn.__nanospec__ and not getattr(original, "__nanospec__", False), (owner, name)
            assert original.__qualname__ == fn.__qualname__, (owner, name)
        print(len(installed))
    """)
    if out.endswith("real sgl_kernel"):
        pytest.skip("the real sgl_kernel loads here: no fix is applied")
    assert int(out.splitlines()[-1]) == 11
