"""The k largest logits of chosen rows on the CPU through a small C kernel (topk.c), for the streams'
top-K_ver after each verify and top-K_pre at each prompt position.

``torch.topk`` over a vocabulary row costs 86 us for SmolLM2 (49,152 logits) and 0.77 ms for a Qwen
verify's four rows (151,936 each) on this project's CPU, single-threaded, in every decode cycle, plain
(0-step) cycles included; inside a server, after a forward pass has evicted the caches, more. topk.c
reads each row once, a vector at a time. It is built and loaded with NanoSpec's other C kernels
(nanospec/cpu/native.py); where they are not usable, callers keep the twin (``streams.top_ids_twin``).
"""

from __future__ import annotations

import torch

from nanospec.cpu import native

MAX_K = 64  # topk.c's KMAX


def usable(logits: torch.Tensor, k: int) -> bool:
    """Whether the kernel takes these logits: float32 rows on the CPU with unit column stride, k at
    most MAX_K, and the kernels built."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.stride(1) == 1 and 0 < k <= MAX_K and native.available())


def top_ids(logits: torch.Tensor, rows: torch.Tensor | None, vocab: int, k: int) -> torch.Tensor:
    """``streams.top_ids``'s contract (logits [N, >= vocab] float32; rows [n] int64 or None for all N;
    returns [n, k] int64, largest first, equal values by lower id); ``usable`` must be true."""
    n_rows = logits.shape[0]
    if not 0 < vocab <= logits.shape[1]:
        raise ValueError(f"top-k: vocab {vocab} outside [1, {logits.shape[1]}] for logits "
                         f"{tuple(logits.shape)}")
    if rows is not None:
        rows = rows.reshape(-1).long().contiguous()
    n = n_rows if rows is None else rows.shape[0]
    out = torch.empty(n, k, dtype=torch.int64)
    if n == 0:
        return out
    picked = None if rows is None else rows.data_ptr()
    rc = native.library().nanospec_topk(logits.data_ptr(), n_rows, logits.stride(0), picked, n, vocab, k,
                                        out.data_ptr())
    if rc:
        raise IndexError(f"top-k: a row outside [0, {n_rows}) or k {k} outside [1, {min(vocab, MAX_K)}]")
    return out
