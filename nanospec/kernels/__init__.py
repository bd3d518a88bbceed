"""Kernel back ends: ``triton`` (CUDA, or CPU under TRITON_INTERPRET=1) and ``torch`` (CPU, oracle)."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

BACKENDS = ("auto", "torch", "triton")
# Draft rows of one request that one logits program multiplies with each weight tile it loads: a
# request with more rows than this has its active rows read once per started block of this many.
ROWS_PER_PROGRAM = 64


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def load(backend: str, device: torch.device) -> ModuleType:
    """The kernel module for ``backend`` on ``device``; ``auto`` picks Triton on CUDA."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and triton_available() else "torch"
    module = importlib.import_module(f"nanospec.kernels.{backend}_ops")
    if backend == "triton" and device.type != "cuda" and not _interpreted(module):
        raise ValueError("backend='triton' on a non-CUDA device needs TRITON_INTERPRET=1 set before triton "
                         "is first imported")
    return module


def _interpreted(module: ModuleType) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(module._extend_kernel, InterpretedFunction)
