"""Plain-PyTorch twins of the Triton kernels: the CPU path and the test oracle.

They follow the Triton kernels lane by lane (same column choices), so both give bit-identical states.
Two exceptions on the CPU, where NanoSpec's C kernels are built: the head's products of a few float32
rows go to nanospec/cpu/gemv.py (``rows_product`` says why), and ``extend`` to nanospec/cpu/stream.py,
the same steps as loops (``extend_twin`` stays the tensor form, and the oracle of both kernels).
"""

from __future__ import annotations

import functools

import torch

from nanospec.state import VocabState, flat, sink


def _put(t: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, mask: torch.Tensor) -> None:
    """t.flat[idx] = val where mask; masked lanes write the spare element behind ``t``."""
    # index_copy_ rather than index_put_: the latter is ~100x slower on the CPU when indices repeat.
    flat(t).index_copy_(0, torch.where(mask, idx, sink(t)).reshape(-1), val.to(t.dtype).reshape(-1))


def extend(st: VocabState, reqs: torch.Tensor, cand: torch.Tensor, valid: torch.Tensor):
    """One decode step: append each row's unique valid candidates to its request's stream.

    reqs: [B] int64 distinct live slots; cand: [B, C] int64 token ids; valid: [B, C] bool.
    Returns the rows to gather: dst [B, C] int64 flat packed row (-1 for none), src [B, C] int64 tokens.
    On the CPU, NanoSpec's C kernel runs the same steps where it is built (``_native_extend``).
    """
    native = _native_extend(st, cand)
    if native is not None:
        return native.extend(st, reqs, cand, valid)
    return extend_twin(st, reqs, cand, valid)


def cpu_stream(t: torch.Tensor):
    """nanospec.cpu.stream (NanoSpec's C loops for the streams) when ``t`` is on the CPU and the module
    imports, else None; each caller still asks the module whether its kernel takes the call."""
    if t.device.type != "cpu":
        return None
    try:
        from nanospec.cpu import stream
    except ImportError:
        return None
    return stream


def _native_extend(st: VocabState, cand: torch.Tensor):
    """nanospec.cpu.stream where it takes this update, else None (the twin runs)."""
    stream = cpu_stream(cand)
    return stream if stream is not None and stream.usable(st, cand) else None


def extend_twin(st: VocabState, reqs: torch.Tensor, cand: torch.Tensor, valid: torch.Tensor):
    """``extend`` in tensor operations: the Triton kernel's lane-for-lane twin and the C kernel's oracle."""
    B, C = cand.shape
    W, V = st.w_max, st.vocab
    dev = cand.device
    lane = torch.arange(C, device=dev)
    earlier = lane[None, :] < lane[:, None]  # [i, j]: j comes before i
    req = reqs[:, None]

    dup = ((cand[:, :, None] == cand[:, None, :]) & valid[:, None, :] & earlier).any(-1)
    uniq = valid & ~dup
    k = uniq.long().cumsum(-1) - 1  # position among the row's appended entries
    n = uniq.sum(-1, keepdim=True)
    kept = uniq & (k >= n - W)  # earlier entries of an over-long row are evicted within the step
    pos0 = st.pos[req]
    t = pos0 + k
    slot = t.remainder(W)
    # The ring slot holds an entry (to evict) once written: all slots after W entries, else the first
    # pos0. Not "t >= W": a row longer than the free slots drops its first entries in this step.
    had_old = kept & ((pos0 >= W) | (slot < pos0))
    old_col = torch.where(had_old, st.ring[req, slot].long(), -1)
    cur_col = torch.where(kept, st.col_of[req, torch.where(kept, cand, 0)].long(), -1)
    active = kept & (cur_col >= 0)
    new = kept & (cur_col < 0)

    same_e = (old_col[:, :, None] == old_col[:, None, :]) & had_old[:, None, :]
    n_dec = same_e.sum(-1)
    first_e = had_old & ~(same_e & earlier).any(-1)
    inc_e = ((old_col[:, :, None] == cur_col[:, None, :]) & active[:, None, :]).sum(-1)
    cnt_e = torch.where(had_old, st.count[req, old_col.clamp_min(0)].long(), 0) + inc_e - n_dec
    freed = first_e & (cnt_e == 0)
    dec_i = ((cur_col[:, :, None] == old_col[:, None, :]) & had_old[:, None, :]).sum(-1)
    cnt_i = torch.where(active, st.count[req, cur_col.clamp_min(0)].long(), 0) + 1 - dec_i
    old_tok = torch.where(freed, st.col_tok[req, old_col.clamp_min(0)].long(), 0)

    # Newly active tokens take this step's freed columns first (rank to rank), then pop the stack.
    fr = freed.long().cumsum(-1) - 1
    nf = freed.sum(-1, keepdim=True)
    nr = new.long().cumsum(-1) - 1
    nn = new.sum(-1, keepdim=True)
    match = (fr[:, None, :] == nr[:, :, None]) & freed[:, None, :]
    col_ff = torch.where(match, old_col[:, None, :], 0).sum(-1)
    nfree = st.nfree[req].long()
    col_st = st.stack[req, (nfree - 1 - (nr - nf)).clamp(0, W - 1)].long()
    new_col = torch.where(new & (nr < nf), col_ff, col_st)
    reused = freed & (fr < nn)
    leftover = freed & ~reused
    final_col = torch.where(active, cur_col, new_col)

    row_w = req * W
    _put(st.count, row_w + old_col, cnt_e, first_e & (inc_e == 0) & ~reused)
    _put(st.count, row_w + cur_col, cnt_i, active)
    _put(st.count, row_w + new_col, torch.ones_like(new_col), new)
    _put(st.col_of, req * V + old_tok, torch.full_like(old_tok, -1), freed)
    _put(st.col_of, req * V + cand, new_col, new)
    _put(st.col_tok, row_w + old_col, torch.full_like(old_col, -1), leftover)
    _put(st.col_tok, row_w + new_col, cand, new)
    _put(st.ring, row_w + slot, final_col, kept)
    _put(st.stack, row_w + nfree + fr - nn, old_col, leftover)
    st.nfree[reqs] = (nfree + nf - nn).squeeze(-1).to(torch.int32)
    st.pos[reqs] += n.squeeze(-1)
    st.gathered[reqs] += nn.squeeze(-1)
    dst = torch.where(new, row_w + new_col, -1)
    return dst, cand


def gather(weight: torch.Tensor, packed_flat: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
    """packed_flat[dst[i]] = weight[src[i]] for every dst[i] >= 0.

    weight: [V, d]; packed_flat: [R * W + 1, d] (last row is the spare); dst, src: [...] int64.
    On the CPU NanoSpec's C kernel copies the rows where it is built (nanospec/cpu/stream.py).
    """
    stream = cpu_stream(weight)
    if stream is not None and stream.gather_usable(weight, packed_flat, dst, src):
        stream.gather_rows(weight, packed_flat, dst, src)
        return
    gather_twin(weight, packed_flat, dst, src)


def gather_twin(weight: torch.Tensor, packed_flat: torch.Tensor, dst: torch.Tensor,
                src: torch.Tensor) -> None:
    """``gather`` in tensor operations (the C kernel's oracle)."""
    dst, src = dst.reshape(-1), src.reshape(-1)
    live = dst >= 0
    rows = weight.index_select(0, torch.where(live, src, 0))
    packed_flat.index_copy_(0, torch.where(live, dst, packed_flat.shape[0] - 1), rows)


def logits(
    hidden: torch.Tensor, rows: torch.Tensor, col_tok: torch.Tensor, reqs: torch.Tensor, indexed: bool
) -> torch.Tensor:
    """Draft logits over each row's request's columns; free columns are -inf.

    hidden: [N, d], rows grouped per request: reqs [B] int64 (B divides N) is the request of each
    block of N // B consecutive rows (B = N: any row -> request map). col_tok: [R, W] int32.
    rows: packed buffer [R, W, d] (packed mode) or the full LM head [V, d] (indexed mode).
    Returns [N, W] float32.
    """
    impl = logits_grouped if hidden.device.type == "cpu" else logits_batched
    out = impl(hidden, rows, col_tok, reqs, indexed)
    n, b = hidden.shape[0], reqs.shape[0]
    free = col_tok.index_select(0, reqs) < 0  # [B, W]
    if b and n != b:
        free = free[:, None, :].expand(b, n // b, -1).reshape(n, -1)
    return out.masked_fill_(free, float("-inf"))


@functools.cache
def _kernel_rows() -> int:
    """Most rows a product sends to NanoSpec's few-row CPU kernel (ops_linear's limit); 0 where the
    kernel is not chosen or not usable here (``NANOSPEC_CPU_LINEAR``, docs/cpu.md)."""
    try:
        from nanospec.cpu import ops_linear
    except ImportError:
        return 0
    return ops_linear.MAX_ROWS if ops_linear.gemv_on() else 0


def rows_product(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h [n, d] @ w [m, d].T -> [n, m] float32: one request's draft rows against its active head rows.

    PyTorch's float32 product of a few rows re-reads ``w`` per block of rows: 8 rows cost 3.4-6x one
    row on the project's CPUs. The kernel (nanospec/cpu/gemv.c) reads each row of ``w`` once for up to
    8 rows of ``h`` held in registers: 8 rows cost 1.1-1.3x one row where reading the rows dominates
    (Llama-3.1-8B dims, several requests), more where the arithmetic does (docs/results.md, head table)."""
    if (h.device.type == "cpu" and h.dtype == torch.float32 and w.dtype == torch.float32
            and 0 < h.shape[0] <= _kernel_rows() and w.shape[0]):
        from nanospec.cpu import gemv

        return gemv.linear(h.contiguous(), w.contiguous(), None)
    return (h @ w.T).float()


def logits_grouped(
    hidden: torch.Tensor, rows: torch.Tensor, col_tok: torch.Tensor, reqs: torch.Tensor, indexed: bool
) -> torch.Tensor:
    """CPU path: one matmul per distinct request. There is no device queue to stall on the CPU, so
    reading ``reqs`` on the host is free and saves copying a request's rows once per row."""
    out = torch.full((hidden.shape[0], col_tok.shape[1]), float("-inf"), device=hidden.device)
    if reqs.shape[0] and hidden.shape[0] != reqs.shape[0]:
        reqs = reqs.repeat_interleave(hidden.shape[0] // reqs.shape[0])
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(reqs.tolist()):
        groups.setdefault(r, []).append(i)
    for r, idx in groups.items():
        # Columns are handed out lowest first and reused last-freed first, so the live ones stay
        # packed at the front: stopping at the last live column skips the free tail for free.
        live = (col_tok[r] >= 0).nonzero()  # only this request's row: the pool may hold thousands
        end = int(live[-1]) + 1 if live.numel() else 0
        w = rows.index_select(0, col_tok[r, :end].clamp_min(0).long()) if indexed else rows[r, :end]
        if len(idx) == hidden.shape[0]:
            out[:, :end] = rows_product(hidden, w)
        else:
            sel = torch.tensor(idx, device=hidden.device)
            out[sel, :end] = rows_product(hidden.index_select(0, sel), w)
    return out


def logits_batched(
    hidden: torch.Tensor, rows: torch.Tensor, col_tok: torch.Tensor, reqs: torch.Tensor, indexed: bool
) -> torch.Tensor:
    """Device path without host reads (CUDA graphs): copies each request block's weights once, then
    one bmm of every block's rows with them (what the Triton kernel computes tile by tile)."""
    N, W = hidden.shape[0], col_tok.shape[1]
    B = reqs.shape[0]
    if B == 0:
        return hidden.new_empty(N, W, dtype=torch.float32)
    if indexed:
        toks = col_tok.index_select(0, reqs).clamp_min(0).long()
        w = rows.index_select(0, toks.reshape(-1)).view(B, W, -1)
    else:
        w = rows.index_select(0, reqs)
    # [B, W, d] @ [B, d, G]: with G = 1 the very product of one row at a time.
    out = torch.bmm(w, hidden.view(B, N // B, -1).transpose(1, 2))
    return out.transpose(1, 2).reshape(N, W).float()
