"""NanoSpec: speculative decoding with a dynamic per-request draft vocabulary.

Importing the package is cheap (no torch): the CPU start-up hook (``nanospec_sgl_cpu.pth`` ->
``nanospec.cpu._bootstrap``) imports it in every Python process of the environment, so the public names
load on first use (PEP 562).
"""

from __future__ import annotations

import importlib

__all__ = ["DynamicVocab", "NanoSpecConfig"]
__version__ = "0.1.0"

_LAZY = {"DynamicVocab": "nanospec.vocab", "NanoSpecConfig": "nanospec.config"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nanospec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
