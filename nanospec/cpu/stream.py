"""The streams' decode-step update on CPU through a small C kernel (stream.c), compiled on first use.

``torch_ops.extend`` is about 80 tensor operations on [B, C] and [B, C, C] tensors, a fixed-shape form
a GPU runs in one launch (the Triton kernel) but that on the CPU costs each operation's dispatch: at
batch 1 about 1.3 ms, 2.8 % of a SmolLM2 decode cycle on this project's 2-core EPYC, paid by every
cycle, plain (0-step) cycles included (py-spy of a server pinned at 0 steps). stream.c runs the same
algorithm as loops over a request's candidates, with the same writes in the same order, so the state
and the columns chosen are the twin's bit for bit (tests/test_cpu_stream.py). It is built and loaded
with NanoSpec's other C kernels (nanospec/cpu/native.py); where they are not usable, or for a state
whose columns are not int16 (W > 32767), callers keep the twin.

Two more loops serve the same moment: ``verify_candidates``, the candidates and emitted-token counts of
a verify that ``Proposer.after_verify`` otherwise builds from about 40 tensor operations, and
``gather_rows``, the packed head's row copies (``torch_ops.gather``'s four). Together they took a plain
cycle's NanoSpec update from 0.30 to 0.13 ms outside a server (one thread, SmolLM2 vocabulary), and
from 0.9 to 0.4 ms inside one (py-spy of a server pinned at 0 steps).
"""

from __future__ import annotations

import math

import torch

from nanospec.cpu import native, topk
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


def candidates_usable(st: VocabState, logits: torch.Tensor, k_ver: int) -> bool:
    """Whether ``verify_candidates`` takes a verify with these logits: a CPU state with int16 columns,
    float32 logits rows with unit column stride, k_ver within topk.c's range, and the kernels built."""
    return (st.col_of.device.type == "cpu" and st.col_of.dtype == torch.int16
            and st.nfree.dtype == torch.int32 and logits.device.type == "cpu"
            and logits.dtype == torch.float32 and logits.dim() == 2 and logits.stride(1) == 1
            and 0 < k_ver <= topk.MAX_K and native.available())


def verify_candidates(st: VocabState, *, reqs: torch.Tensor, draft_tokens: torch.Tensor,
                      accept_index: torch.Tensor, accept_lens: torch.Tensor, predict: torch.Tensor,
                      logits: torch.Tensor, vocab: int, k_ver: int, context: bool,
                      t2d: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One verify's candidates and emitted-token counts in one C call (stream.c): what
    ``Proposer.after_verify`` computes in tensor operations before the stream update, the same values
    wherever a candidate is valid. ``candidates_usable`` must be true.

    reqs [B] slots; draft_tokens [B * T]; accept_index [B, S1]; accept_lens [B]; predict [B * P] (P >=
    S1); logits [N, >= vocab] float32; t2d [V_target] target id -> draft row (-1: none) or None.
    Returns cand [B, C] int64 draft rows, valid [B, C] bool (C = S1 with ``context``, else T + S1 *
    k_ver) and stats [B, 3] int64: active vocabulary size, tokens emitted, emitted tokens active.
    """
    batch, width = accept_index.shape
    reqs, tree = reqs.long().contiguous(), draft_tokens.long().contiguous()
    accept, lens = accept_index.long().contiguous(), accept_lens.long().contiguous()
    predict = predict.long().contiguous()
    if tree.numel() % max(batch, 1) or predict.numel() % max(batch, 1) or predict.numel() < batch * width:
        raise ValueError(f"verify candidates: draft_tokens {tuple(draft_tokens.shape)} and predict "
                         f"{tuple(predict.shape)} must hold a block per request of accept_index "
                         f"{tuple(accept_index.shape)}")
    n_tree, n_pred = tree.numel() // max(batch, 1), predict.numel() // max(batch, 1)
    c = width if context else n_tree + width * k_ver
    cand = torch.empty(batch, c, dtype=torch.int64)
    valid = torch.empty(batch, c, dtype=torch.bool)
    stats = torch.empty(batch, 3, dtype=torch.int64)
    if batch == 0:
        return cand, valid, stats
    t2d_ptr, n_t2d = (None, 0) if t2d is None else (t2d.data_ptr(), t2d.shape[0])
    if t2d is not None:
        assert t2d.dtype == torch.int64 and t2d.is_contiguous()
    rc = native.library().nanospec_verify_candidates(
        reqs.data_ptr(), tree.data_ptr(), accept.data_ptr(), lens.data_ptr(), predict.data_ptr(),
        logits.data_ptr(), logits.shape[0], logits.stride(0), t2d_ptr, n_t2d, st.col_of.data_ptr(),
        st.nfree.data_ptr(), batch, n_tree, width, n_pred, vocab, k_ver, int(context), st.w_max, st.vocab,
        st.pos.shape[0], cand.data_ptr(), valid.data_ptr(), stats.data_ptr())
    if rc:
        raise IndexError(f"verify candidates: a slot outside [0, {st.pos.shape[0]}), an accepted row "
                         f"outside [0, {logits.shape[0]}) or k_ver {k_ver} outside "
                         f"[1, {min(vocab, topk.MAX_K)}]")
    return cand, valid, stats


def gather_usable(weight: torch.Tensor, packed: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether ``gather_rows`` takes this copy: contiguous CPU rows of one dtype, int64 indices of one
    size, and the kernels built."""
    return (weight.device.type == "cpu" and packed.device.type == "cpu" and weight.dtype == packed.dtype
            and weight.is_contiguous() and packed.is_contiguous() and weight.shape[1:] == packed.shape[1:]
            and dst.dtype == torch.int64 and src.dtype == torch.int64 and dst.numel() == src.numel()
            and native.available())


def gather_rows(weight: torch.Tensor, packed_flat: torch.Tensor, dst: torch.Tensor,
                src: torch.Tensor) -> None:
    """``torch_ops.gather``'s contract (packed_flat[dst[i]] = weight[src[i]] where dst[i] >= 0) in one C
    call; ``gather_usable`` must be true."""
    dst, src = dst.reshape(-1).contiguous(), src.reshape(-1).contiguous()
    row_bytes = math.prod(weight.shape[1:]) * weight.element_size()
    rc = native.library().nanospec_gather_rows(weight.data_ptr(), packed_flat.data_ptr(), dst.data_ptr(),
                                               src.data_ptr(), dst.numel(), row_bytes, weight.shape[0],
                                               packed_flat.shape[0])
    if rc:
        raise IndexError(f"gather: a packed row outside [0, {packed_flat.shape[0]}) or a weight row "
                         f"outside [0, {weight.shape[0]}); nothing was copied")
