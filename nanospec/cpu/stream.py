"""The streams' decode-step update on CPU through a small C kernel (stream.c), compiled on first use.

``torch_ops.extend`` is about 80 tensor operations on [B, C] and [B, C, C] tensors, a fixed-shape form
a GPU runs in one launch (the Triton kernel) but that on the CPU costs each operation's dispatch: at
batch 1 about 1.3 ms, 2.8 % of a SmolLM2 decode cycle on this project's 2-core EPYC, paid by every
cycle, plain (0-step) cycles included (py-spy of a server pinned at 0 steps). stream.c runs the same
algorithm as loops over a request's candidates, with the same writes in the same order, so the state
and the columns chosen are the twin's bit for bit (tests/test_cpu_stream.py). It is built and loaded
with NanoSpec's other C kernels (nanospec/cpu/native.py); where they are not usable, or for a state
whose columns are not int16 (W > 32767), callers keep the twin.
"""

from __future__ import annotations

import torch

from nanospec.cpu import native
from nanospec.state import VocabState

MAX_CANDIDATES = 1024  # stream.c's CMAX


def usable(st: VocabState, cand: torch.Tensor) -> bool:
    """Whether the kernel takes this update: a CPU state with int16 columns, at most MAX_CANDIDATES
    candidates per request, and the kernels built."""
    return (cand.device.type == "cpu" and st.count.dtype == torch.int16 and cand.shape[1] <= MAX_CANDIDATES
            and native.available())


def extend(st: VocabState, reqs: torch.Tensor, cand: torch.Tensor,
           valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_ops.extend``'s contract (reqs [B] int64, cand [B, C] int64, valid [B, C] bool; returns
    dst [B, C] int64, src = cand); ``usable`` must be true."""
    reqs, cand, valid = reqs.long().contiguous(), cand.long().contiguous(), valid.contiguous()
    dst = torch.empty(cand.shape, dtype=torch.int64)
    for t in (st.col_of, st.col_tok, st.count, st.ring, st.stack, st.nfree, st.pos, st.gathered):
        assert t.is_contiguous()  # _rows views of whole rows: data_ptr and row strides as the kernel assumes
    if valid.dtype != torch.bool or cand.shape != valid.shape or reqs.shape[0] != cand.shape[0]:
        raise ValueError(f"stream update: reqs {tuple(reqs.shape)}, candidates {tuple(cand.shape)} and bool "
                         f"valid {tuple(valid.shape)} {valid.dtype} must be [B], [B, C], [B, C]")
    rc = native.library().nanospec_stream_extend(
        st.col_of.data_ptr(), st.col_tok.data_ptr(), st.count.data_ptr(), st.ring.data_ptr(),
        st.stack.data_ptr(), st.nfree.data_ptr(), st.pos.data_ptr(), st.gathered.data_ptr(),
        reqs.data_ptr(), cand.data_ptr(), valid.data_ptr(), dst.data_ptr(),
        cand.shape[0], cand.shape[1], st.w_max, st.vocab, st.pos.shape[0])
    if rc:
        raise IndexError(f"stream update: a slot outside [0, {st.pos.shape[0]}) or a valid candidate outside "
                         f"[0, {st.vocab}); the state is unchanged")
    return dst, cand
