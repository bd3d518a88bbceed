"""Device-resident bookkeeping of the per-request dynamic vocabularies.

Each request slot owns a window of its last ``w`` stream entries and a packed column space of ``w``
columns (one per active token; ``w`` columns always suffice because a window of ``w`` entries holds at
most ``w`` distinct tokens). Everything is a fixed-shape tensor so decode steps never synchronise with
the host and can be captured in a CUDA graph.

Every array is allocated with one spare element after its ``R`` rows: masked writes in the PyTorch
kernels are redirected there instead of needing data-dependent shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


def col_dtype(w_max: int) -> torch.dtype:
    """Smallest dtype that holds a column index, a count of at most ``w_max`` and -1."""
    return torch.int16 if w_max <= torch.iinfo(torch.int16).max else torch.int32


def _rows(n_rows: int, width: int, dtype: torch.dtype, fill: int, device: torch.device) -> torch.Tensor:
    flat = torch.full((n_rows * width + 1,), fill, dtype=dtype, device=device)
    return flat[: n_rows * width].view(n_rows, width)


def sink(t: torch.Tensor) -> int:
    """Flat index of the spare element behind a tensor made by ``_rows``."""
    return t.numel()


def flat(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of a tensor made by ``_rows``, spare element included."""
    return t.as_strided((t.numel() + 1,), (1,))


@dataclass
class VocabState:
    """Bookkeeping for ``R`` request slots, vocabulary ``V`` and window ``W``.

    col_of:   [R, V] col dtype. Packed column of each active token, -1 when inactive.
    col_tok:  [R, W] int32.     Token held by each packed column, -1 when the column is free.
    count:    [R, W] col dtype. Occurrences in the window of the token in each column.
    ring:     [R, W] col dtype. Column of each window entry; stream index t lives at t % W.
    stack:    [R, W] col dtype. Free columns; the first ``nfree`` entries are valid, top last.
    nfree:    [R]    int32.     Number of free columns.
    pos:      [R]    int64.     Stream length so far.
    gathered: [R]    int64.     LM-head rows gathered so far (telemetry, and proof of incrementality).
    """

    col_of: torch.Tensor
    col_tok: torch.Tensor
    count: torch.Tensor
    ring: torch.Tensor
    stack: torch.Tensor
    nfree: torch.Tensor
    pos: torch.Tensor
    gathered: torch.Tensor

    @classmethod
    def allocate(cls, n_req: int, vocab: int, w_max: int, device: torch.device) -> VocabState:
        cd = col_dtype(w_max)
        return cls(
            col_of=_rows(n_req, vocab, cd, -1, device),
            col_tok=_rows(n_req, w_max, torch.int32, -1, device),
            count=_rows(n_req, w_max, cd, 0, device),
            ring=_rows(n_req, w_max, cd, 0, device),
            stack=_rows(n_req, w_max, cd, 0, device),
            nfree=torch.zeros(n_req, dtype=torch.int32, device=device),
            pos=torch.zeros(n_req, dtype=torch.int64, device=device),
            gathered=torch.zeros(n_req, dtype=torch.int64, device=device),
        )

    @property
    def w_max(self) -> int:
        return self.col_tok.shape[1]

    @property
    def vocab(self) -> int:
        return self.col_of.shape[1]

    def nbytes(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name).untyped_storage().nbytes() for f in fields(self)}


def start_request(
    st: VocabState, req: int, prompt: torch.Tensor, topk: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reset slot ``req`` to the stream ``prompt ++ unique(topk row-major)`` (device ops, no sync).

    prompt: [L] int64; topk: [L, K] int64 or None. Negative ids are not entries of the stream at all
    (tokens a reduced draft vocabulary has no row for): they take no window place.
    Returns the rows to gather: dst [W] int64 (flat packed row, -1 for none) and src [W] int64 token ids.
    """
    dev, V, W = prompt.device, st.vocab, st.w_max
    if topk is not None and topk.numel():
        tk = topk.reshape(-1)
        srt, order = torch.sort(tk, stable=True)
        first_sorted = torch.ones_like(srt, dtype=torch.bool)
        first_sorted[1:] = srt[1:] != srt[:-1]
        first = torch.empty_like(first_sorted).scatter_(0, order, first_sorted)
        stream = torch.cat([prompt, tk])
        keep = torch.cat([torch.ones_like(prompt, dtype=torch.bool), first]) & (stream >= 0)
    else:
        stream, keep = prompt, prompt >= 0
    t = keep.cumsum(0) - 1  # stream index of each kept entry
    length = keep.sum()
    in_win = keep & (t >= length - W)
    ones = torch.ones_like(stream, dtype=torch.int32)
    counts = torch.zeros(V + 1, dtype=torch.int32, device=dev)
    counts.index_add_(0, torch.where(in_win, stream, V), ones)
    counts = counts[:V]
    act = counts > 0
    rank = act.cumsum(0) - 1
    col = torch.where(act, rank, W)  # W is the spare column of the temporaries below

    col_tok = torch.full((W + 1,), -1, dtype=torch.int64, device=dev)
    col_tok.index_put_((col,), torch.arange(V, device=dev))
    count = torch.zeros(W + 1, dtype=torch.int64, device=dev)
    count.index_put_((col,), counts.long())
    ring = torch.zeros(W + 1, dtype=torch.int64, device=dev)
    ring.index_put_((torch.where(in_win, t % W, W),), rank[stream.clamp_min(0)])

    st.col_of[req] = torch.where(act, rank, -1).to(st.col_of.dtype)
    st.col_tok[req] = col_tok[:W].to(torch.int32)
    st.count[req] = count[:W].to(st.count.dtype)
    st.ring[req] = ring[:W].to(st.ring.dtype)
    # Free columns are [m, W); popping from the top hands out m first, keeping columns dense.
    st.stack[req] = torch.arange(W - 1, -1, -1, device=dev).to(st.stack.dtype)
    n_act = act.sum()
    st.nfree[req] = (W - n_act).to(torch.int32)
    st.pos[req] = length
    st.gathered[req] = n_act
    live = col_tok[:W] >= 0
    dst = torch.where(live, req * W + torch.arange(W, device=dev), -1)
    return dst, col_tok[:W]
