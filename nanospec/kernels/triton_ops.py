"""Triton kernels: one program per request row for the bookkeeping, row-parallel gather, and logits
as one small GEMM per request block and column tile.

The extend kernel mirrors ``torch_ops.extend`` lane for lane; see there for the algorithm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from nanospec.kernels import ROWS_PER_PROGRAM
from nanospec.state import VocabState


@triton.jit
def _extend_kernel(
    reqs_ptr, cand_ptr, valid_ptr, dst_ptr, C,
    col_of_ptr, col_tok_ptr, count_ptr, ring_ptr, stack_ptr, nfree_ptr, pos_ptr, gathered_ptr,
    V, W, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    req = tl.load(reqs_ptr + b).to(tl.int64)
    lane = tl.arange(0, BLOCK_C)
    in_row = lane < C
    tok = tl.load(cand_ptr + b * C + lane, mask=in_row, other=0).to(tl.int64)
    valid = (tl.load(valid_ptr + b * C + lane, mask=in_row, other=0) != 0) & in_row
    earlier = lane[None, :] < lane[:, None]

    dup = tl.sum(((tok[:, None] == tok[None, :]) & valid[None, :] & earlier).to(tl.int32), axis=1)
    uniq = valid & (dup == 0)
    k = tl.cumsum(uniq.to(tl.int32), axis=0) - 1
    n = tl.sum(uniq.to(tl.int32), axis=0)
    kept = uniq & (k >= n - W)
    pos0 = tl.load(pos_ptr + req)
    t = pos0 + k
    slot = t % W
    # The ring slot holds an entry (to evict) once written: all slots after W entries, else the first
    # pos0. Not "t >= W": a row longer than the free slots drops its first entries in this step.
    had_old = kept & ((pos0 >= W) | (slot < pos0))
    row_w = req * W
    old_col = tl.load(ring_ptr + row_w + slot, mask=had_old, other=-1).to(tl.int32)
    old_col = tl.where(had_old, old_col, -1)
    cur_col = tl.load(col_of_ptr + req * V + tok, mask=kept, other=-1).to(tl.int32)
    cur_col = tl.where(kept, cur_col, -1)
    active = kept & (cur_col >= 0)
    new = kept & (cur_col < 0)

    same_e = (old_col[:, None] == old_col[None, :]) & had_old[None, :]
    n_dec = tl.sum(same_e.to(tl.int32), axis=1)
    first_e = had_old & (tl.sum((same_e & earlier).to(tl.int32), axis=1) == 0)
    inc_e = tl.sum(((old_col[:, None] == cur_col[None, :]) & active[None, :]).to(tl.int32), axis=1)
    cnt_e = tl.load(count_ptr + row_w + old_col, mask=had_old, other=0).to(tl.int32) + inc_e - n_dec
    freed = first_e & (cnt_e == 0)
    dec_i = tl.sum(((cur_col[:, None] == old_col[None, :]) & had_old[None, :]).to(tl.int32), axis=1)
    cnt_i = tl.load(count_ptr + row_w + cur_col, mask=active, other=0).to(tl.int32) + 1 - dec_i
    old_tok = tl.load(col_tok_ptr + row_w + old_col, mask=freed, other=0).to(tl.int64)

    fr = tl.cumsum(freed.to(tl.int32), axis=0) - 1
    nf = tl.sum(freed.to(tl.int32), axis=0)
    nr = tl.cumsum(new.to(tl.int32), axis=0) - 1
    nn = tl.sum(new.to(tl.int32), axis=0)
    match = (fr[None, :] == nr[:, None]) & freed[None, :]
    col_ff = tl.sum(tl.where(match, old_col[None, :], 0), axis=1)
    nfree = tl.load(nfree_ptr + req)
    from_stack = new & (nr >= nf)
    col_st = tl.load(stack_ptr + row_w + (nfree - 1 - (nr - nf)), mask=from_stack, other=0).to(tl.int32)
    new_col = tl.where(new & (nr < nf), col_ff, col_st)
    reused = freed & (fr < nn)
    leftover = freed & (fr >= nn)
    final_col = tl.where(active, cur_col, new_col)

    # Lanes read columns that other lanes are about to write.
    tl.debug_barrier()
    cd = count_ptr.dtype.element_ty
    tl.store(count_ptr + row_w + old_col, cnt_e.to(cd), mask=first_e & (inc_e == 0) & (reused == 0))
    tl.store(count_ptr + row_w + cur_col, cnt_i.to(cd), mask=active)
    tl.store(count_ptr + row_w + new_col, tl.full([BLOCK_C], 1, cd), mask=new)
    tl.store(col_of_ptr + req * V + old_tok, tl.full([BLOCK_C], -1, cd), mask=freed)
    tl.store(col_of_ptr + req * V + tok, new_col.to(cd), mask=new)
    tl.store(col_tok_ptr + row_w + old_col, tl.full([BLOCK_C], -1, tl.int32), mask=leftover)
    tl.store(col_tok_ptr + row_w + new_col, tok.to(tl.int32), mask=new)
    tl.store(ring_ptr + row_w + slot, final_col.to(cd), mask=kept)
    tl.store(stack_ptr + row_w + nfree + fr - nn, old_col.to(cd), mask=leftover)
    tl.store(nfree_ptr + req, nfree + nf - nn)
    tl.store(pos_ptr + req, tl.load(pos_ptr + req) + n)
    tl.store(gathered_ptr + req, tl.load(gathered_ptr + req) + nn)
    tl.store(dst_ptr + b * C + lane, tl.where(new, row_w + new_col, -1), mask=in_row)


def extend(st: VocabState, reqs: torch.Tensor, cand: torch.Tensor, valid: torch.Tensor):
    """Same contract as ``torch_ops.extend``."""
    B, C = cand.shape
    dst = torch.empty(B, C, dtype=torch.int64, device=cand.device)
    if B == 0 or C == 0:
        return dst, cand
    block = max(16, triton.next_power_of_2(C))
    _extend_kernel[(B,)](
        reqs, cand, valid.view(torch.uint8), dst, C,
        st.col_of, st.col_tok, st.count, st.ring, st.stack, st.nfree, st.pos, st.gathered,
        st.vocab, st.w_max, BLOCK_C=block, num_warps=4 if block <= 64 else 8,
    )  # fmt: skip
    return dst, cand


@triton.jit
def _gather_kernel(
    dst_ptr, src_ptr, n_items, weight_ptr, stride_w, packed_ptr, D,
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # Several rows per program: a step gathers only a handful of short rows.
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    in_n = i < n_items
    dst = tl.load(dst_ptr + i, mask=in_n, other=-1)
    src = tl.load(src_ptr + i, mask=in_n, other=0)
    live = (dst >= 0)[:, None]
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + tl.arange(0, BLOCK_D)
        m = live & (dd < D)[None, :]
        v = tl.load(weight_ptr + src[:, None] * stride_w + dd[None, :], mask=m)
        tl.store(packed_ptr + dst[:, None] * D + dd[None, :], v, mask=m)


def gather(weight: torch.Tensor, packed_flat: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
    """Same contract as ``torch_ops.gather``."""
    dst, src = dst.reshape(-1), src.reshape(-1)
    n, D = dst.numel(), weight.shape[1]
    if n:
        rows, block = 16, min(256, triton.next_power_of_2(D))
        _gather_kernel[(triton.cdiv(n, rows),)](
            dst, src, n, weight, weight.stride(0), packed_flat, D, ROWS=rows, BLOCK_D=block
        )


@triton.jit
def _logits_kernel(
    hidden_ptr, stride_h, rows_ptr, stride_r, col_tok_ptr, reqs_ptr, out_ptr, D, W, G,
    INDEXED: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program: a tile of BLOCK_W columns of one request times up to BLOCK_G of its G draft rows.
    # Each weight tile is loaded once for all those rows (a small GEMM on tensor cores), not per row.
    blocks = tl.cdiv(G, BLOCK_G)
    b = tl.program_id(0) // blocks
    g = (tl.program_id(0) % blocks) * BLOCK_G + tl.arange(0, BLOCK_G)
    in_g = g < G
    n = b.to(tl.int64) * G + g
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    in_w = cols < W
    req = tl.load(reqs_ptr + b).to(tl.int64)
    tok = tl.load(col_tok_ptr + req * W + cols, mask=in_w, other=-1).to(tl.int64)
    live = tok >= 0
    row = tok if INDEXED else req * W + cols
    acc = tl.zeros([BLOCK_G, BLOCK_W], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + tl.arange(0, BLOCK_D)
        in_d = dd < D
        h = tl.load(hidden_ptr + n[:, None] * stride_h + dd[None, :], mask=in_g[:, None] & in_d[None, :],
                    other=0.0)
        # Free columns are never read: eviction costs no bandwidth.
        w = tl.load(rows_ptr + row[:, None] * stride_r + dd[None, :], mask=live[:, None] & in_d[None, :],
                    other=0.0)
        if UPCAST:  # the interpreter's dot cannot take bfloat16; float32 products of bf16 are exact
            h, w = h.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=PRECISION)
    out = tl.where(live[None, :], acc, float("-inf"))
    tl.store(out_ptr + n[:, None] * W + cols[None, :], out, mask=in_g[:, None] & in_w[None, :])


def logits(
    hidden: torch.Tensor, rows: torch.Tensor, col_tok: torch.Tensor, reqs: torch.Tensor, indexed: bool
) -> torch.Tensor:
    """Same contract as ``torch_ops.logits``; ``rows`` is [R, W, d] packed or [V, d] indexed."""
    N, D = hidden.shape
    W = col_tok.shape[1]
    out = torch.empty(N, W, dtype=torch.float32, device=hidden.device)
    B = reqs.shape[0]
    if N == 0 or B == 0:
        return out
    G = N // B
    block_g = min(ROWS_PER_PROGRAM, max(16, triton.next_power_of_2(G)))  # tl.dot needs >= 16
    # Narrower column tiles at small batches: enough programs that every SM reads its share. (A
    # column's sum does not depend on the tile width; the interpreter takes the fewest programs.)
    blocks = B * triton.cdiv(G, block_g)
    block_w = 128 if _INTERPRETED else 64
    while block_w > 16 and blocks * triton.cdiv(W, block_w) < 512 and not _INTERPRETED:
        block_w //= 2
    block_d = max(16, min(128, triton.next_power_of_2(D)))
    stride_r = rows.stride(0) if indexed else rows.stride(1)
    fp32 = hidden.dtype == torch.float32
    _logits_kernel[(B * triton.cdiv(G, block_g), triton.cdiv(W, block_w))](
        hidden, hidden.stride(0), rows, stride_r, col_tok, reqs, out, D, W, G,
        INDEXED=indexed, UPCAST=_INTERPRETED and not fp32,
        PRECISION="ieee" if fp32 or _INTERPRETED else "tf32",  # float32 stays float32, not TF32
        BLOCK_G=block_g, BLOCK_W=block_w, BLOCK_D=block_d,
    )  # fmt: skip
    return out


_INTERPRETED = isinstance(_logits_kernel, InterpretedFunction)
