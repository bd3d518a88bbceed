"""Start-up hook, run by ``nanospec_sgl_cpu.pth`` in every Python process of the environment.

It must stay cheap and never fail: it imports nothing heavy and only installs a ``sys.meta_path``
finder. The finder acts on two kinds of imports:

- ``import sgl_kernel``: the real package is tried first. Only if executing it raises (the PyPI
  ``sglang-kernel`` wheel is CUDA-only and cannot load its ``common_ops`` library without
  ``libcuda.so.1``) is the module replaced by ``nanospec.cpu.sgl_kernel`` (pure-PyTorch CPU ops). A working
  ``sgl_kernel`` is never shadowed.
- SGLang modules listed in ``nanospec.cpu.sglang_fixes.TARGETS``: after the module body runs, a fix-up
  function from that file patches it (only while the fallback is in use, i.e. on CPU-only hosts).

Besides, in a process launched as ``python -m sglang.launch_server ... --device cpu`` it sets
``SGLANG_USE_CPU_ENGINE=1`` (inherited by SGLang's spawned scheduler and detokenizer), which SGLang
0.5.23 needs to take its CPU path at all. ``NANOSPEC_SGL_FALLBACK=0`` switches everything off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _fallback_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgl_kernel")


def fallback_active() -> bool:
    """True once this process replaced ``sgl_kernel`` with the pure-PyTorch fallback."""
    mod = sys.modules.get("sgl_kernel")
    return bool(mod is not None and getattr(mod, "__nanospec_fallback__", False))


def fallback_needed() -> bool:
    """Import ``sgl_kernel`` (real or fallback) if not done yet and tell whether it is the fallback."""
    try:
        import sgl_kernel  # noqa: F401
    except Exception:
        return False
    return fallback_active()


class _SglKernelLoader(importlib.abc.Loader):
    def __init__(self, real_spec):
        self.real_spec = real_spec

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        error: BaseException | None = None
        if self.real_spec is not None and self.real_spec.loader is not None:
            module.__file__ = self.real_spec.origin
            module.__path__ = list(self.real_spec.submodule_search_locations or [])
            try:
                self.real_spec.loader.exec_module(module)
                return
            except Exception as e:  # the CUDA-only wheel raises ImportError/OSError here
                error = e
        for name in [n for n in sys.modules if n.startswith("sgl_kernel.")]:
            del sys.modules[name]
        keep = {"__name__", "__spec__", "__loader__"}
        for key in [k for k in module.__dict__ if k not in keep]:
            del module.__dict__[key]
        init = os.path.join(_fallback_dir(), "__init__.py")
        module.__file__ = init
        module.__path__ = [_fallback_dir()]
        module.__package__ = "sgl_kernel"
        module.__dict__["__nanospec_real_error__"] = repr(error) if error else "sgl_kernel not installed"
        with open(init, encoding="utf-8") as f:
            code = compile(f.read(), init, "exec")
        exec(code, module.__dict__)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, real_loader, fixup):
        self.real_loader = real_loader
        self.fixup = fixup

    def create_module(self, spec):
        return self.real_loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.real_loader.exec_module(module)
        if fallback_needed():
            self.fixup(module)


class NanoSpecFinder(importlib.abc.MetaPathFinder):
    def _real_spec(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sgl_kernel":
            real = self._real_spec(fullname, path, target)
            spec = importlib.machinery.ModuleSpec(
                "sgl_kernel", _SglKernelLoader(real), origin=real.origin if real else None, is_package=True
            )
            spec.submodule_search_locations = list(real.submodule_search_locations) if real else []
            return spec
        if fullname.startswith("sglang."):
            from nanospec.cpu.sglang_fixes import TARGETS

            fixup = TARGETS.get(fullname)
            if fixup is None:
                return None
            real = self._real_spec(fullname, path, target)
            if real is None or real.loader is None:
                return None
            real.loader = _PatchingLoader(real.loader, fixup)
            return real
        return None


def _maybe_enable_cpu_engine() -> None:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "SGLANG_USE_CPU_ENGINE" in os.environ:
        return
    is_sglang = any(a.startswith("sglang.") or a.endswith("/sglang") for a in argv[:4])
    device_cpu = any(
        a == "--device=cpu" or (a == "--device" and i + 1 < len(argv) and argv[i + 1] == "cpu")
        for i, a in enumerate(argv)
    )
    if is_sglang and device_cpu:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"


def install() -> None:
    """Install the finder once (``.pth`` files may run twice when lib64 links to lib)."""
    if os.environ.get("NANOSPEC_SGL_FALLBACK", "1") == "0":
        return
    if any(isinstance(f, NanoSpecFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, NanoSpecFinder())
    _maybe_enable_cpu_engine()
