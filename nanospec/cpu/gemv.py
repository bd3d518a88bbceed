"""Few-row float32 linear layers on CPU through a small AVX2/AVX-512 kernel (gemv.c), compiled on first use.

A decode step multiplies one row by every weight, a target-verify a few rows: both are bound by reading
the weights once. On the AMD EPYC (two cores) of earlier sessions reading memory ran at about 35 GB/s,
oneDNN's one-row product on a prepacked weight at 17-27 GB/s and MKL's ``F.linear`` at about 12; gemv.c
read 25-36 GB/s on the same matrices (docs/cpu.md). It takes any number of rows (ops_linear.py sends it
up to ``MAX_ROWS``, and every row of a decode or verify pass) and sums each output in one order whatever
the row count, so a verify gives a decode step's bits (gemv.c).

The kernel is built and loaded with NanoSpec's other C kernels (nanospec/cpu/native.py: compiled on first
use, cached, used only on Linux x86-64 with AVX2 and FMA and one OpenMP runtime). Where ``available()`` is
false, callers keep oneDNN.
"""

from __future__ import annotations

import torch

from nanospec.cpu import native


def available() -> bool:
    return native.available()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] float32 @ weight [N, K].T (+ bias [N]) -> [M, N] float32, M small (the kernel re-reads x
    for every output); weight float32, or bfloat16 (widened to float32 as it is read; half the bytes
    to read); every tensor contiguous on the CPU (the caller checks; ``available()`` must be true)."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    lib = native.library()
    fn = lib.nanospec_linear_bf16 if weight.dtype == torch.bfloat16 else lib.nanospec_linear
    fn(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(), m, n, k)
    return out
