"""Pure-PyTorch ``copy_all_layer_kv_cache_cpu``: move KV rows inside every layer's cache buffer.

SGLang 0.5.23 (``sglang/kernels/ops/kvcache/cache_move.py``) passes raw buffer addresses
(``data_ptrs``, uint64, one per layer buffer) and row sizes in bytes (``strides``), the interface of its
Triton and C++ kernels. The buffers themselves are not reachable from here, so each one is viewed
zero-copy through ``ctypes`` as bytes, large enough for the highest row touched.
"""

from __future__ import annotations

import ctypes

import torch


def _byte_view(address: int, nbytes: int) -> torch.Tensor:
    buf = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer ``i``: ``rows(i)[tgt_loc] = rows(i)[src_loc]`` (sources read before writing)."""
    n = min(tgt_loc.numel(), src_loc.numel())
    if n == 0:
        return
    tgt = tgt_loc[:n].long()
    src = src_loc[:n].long()
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):  # one per layer buffer
        view = _byte_view(int(address) & 0xFFFFFFFFFFFFFFFF, rows * int(stride)).view(rows, int(stride))
        view[tgt] = view[src].clone()
