"""The plugin's per-server state around the core ``Proposer``: SGLang's batches in, telemetry out.

Duck-typed on SGLang's batch objects (``reqs``, ``req_pool_indices``, ``prefix_lens``,
``extend_lens``; the fields are rows of ``seam.SEAM``) so it can be exercised without a server.
Everything that is not about SGLang's batches (streams, heads, the head policy) is the core's
``nanospec.proposer.Proposer``.
"""

from __future__ import annotations

import numpy as np
import torch

from nanospec import streams
from nanospec.proposer import Proposer
from nanospec.sglang.gapfill import GapFill
from nanospec.sglang.memory import prefill_chunk_rows
from nanospec.sglang.settings import Settings
from nanospec.sglang.telemetry import SlotStats


def prefill_topk(hidden: torch.Tensor, lm_head_fn, vocab: int, k: int,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k ids [T, k] of the target at the positions ``rows`` ([m] int64, None: all) of hidden
    [T, d], -1 at the others, chunk by chunk so that at most ``memory.prefill_chunk_rows(vocab)``
    rows of logits exist at once (the bound NanoSpec reserves). lm_head_fn: hidden [t, d] -> logits
    [t, >= vocab]."""
    picked = hidden if rows is None else hidden[rows]
    top = torch.empty(picked.shape[0], k, dtype=torch.long, device=hidden.device)
    step = prefill_chunk_rows(vocab)
    for s in range(0, picked.shape[0], step):
        logits = lm_head_fn(picked[s : s + step])
        top[s : s + step] = streams.top_ids(logits, None, vocab, k)
        del logits  # the next chunk's logits take its place, not its side
    if rows is None:
        return top
    out = torch.full((hidden.shape[0], k), -1, dtype=torch.long, device=hidden.device)
    out[rows] = top
    return out


def tail_rows(extend_lens: list[int] | None, rows: int, n: int) -> torch.Tensor | None:
    """Rows [m] int64 of a prefill's [rows, d] hidden states that are among the last n of their
    request's extend (the batch's requests lie one after another, ``extend_lens`` long); None: all rows
    (each extend is at most n long, or the lengths do not add up to ``rows``). Each chunk of a chunked
    prompt keeps its last n, so the prompt's last n positions are always among them."""
    if extend_lens is None or sum(extend_lens) != rows or max(extend_lens, default=0) <= n:
        return None
    ends = np.cumsum(extend_lens)
    return torch.from_numpy(np.concatenate(
        [np.arange(end - min(e, n), end) for e, end in zip(extend_lens, ends, strict=True)]).astype(np.int64))


def token_tensor(ids, n: int) -> torch.Tensor:
    """The first n ids (SGLang keeps them in an ``array('q')``) as a CPU int64 tensor."""
    return torch.from_numpy(np.asarray(ids[:n], dtype=np.int64))


class Runtime:
    """SGLang's three moments for NanoSpec: prefill (``start_batch``), after each verify
    (``after_verify``), request end (``release``); plus chunked-prefill bookkeeping and telemetry.

    proposer: the core object every draft logit and stream update goes through.
    """

    def __init__(self, weight: torch.Tensor, max_requests: int, settings: Settings, *,
                 hot: torch.Tensor | None = None, target_vocab: int, gaps: GapFill | None = None):
        self.settings = settings
        self.cfg = settings.vocab
        self.proposer = Proposer(weight, max_requests, self.cfg, head=settings.head, hot=hot,
                                 target_vocab=target_vocab)
        self.device = weight.device
        self.stats = SlotStats(max_requests, self.device)
        self._pending_topk: torch.Tensor | None = None  # [T, k_pre] of the last target prefill
        # rid -> (first position with target logits, top-k rows since then): chunked prefill.
        self.partial: dict[str, tuple[int, torch.Tensor]] = {}
        self.slot_rid: dict[int, str] = {}
        self.starts = 0
        self.slots_used: set[int] = set()
        # Set before each prefill by the step controller (StepController.cold_prefill): this prefill
        # skips the target's top-K_pre (streams start from the prompt) and the draft's prefill pass.
        self.cold_prefill = False
        self.cold_rids: set[str] = set()  # live requests whose prefill ran cold
        # The skipped catch-up positions' inputs, with the step controller's cold_plain (worker.py).
        self.gaps = gaps

    # -- prefill ------------------------------------------------------------------------------

    def stash_prefill_topk(self, topk: torch.Tensor) -> None:
        """Top-K_pre [T, k] of every prompt row of the target prefill that just ran (its logits
        processor calls this); ``start_batch`` takes it."""
        self._pending_topk = topk

    def decode_size(self, reqs) -> int:
        """Requests that decode once a prefill of ``reqs`` is done: the live ones and the new ones."""
        return len(set(self.slot_rid.values()) | {r.rid for r in reqs})

    def warm_rows(self, reqs) -> list[bool]:
        """Per request of a decode batch, in order: whether its prefill ran warm (the draft saw its
        prompt), so its acceptance counts for the step controller."""
        return [r.rid not in self.cold_rids for r in reqs]

    def set_cold_prefill(self, cold: bool) -> None:
        """Before a prefill: whether it skips the drafting-only work (``StepController.cold_prefill``)."""
        self.cold_prefill = cold

    def start_batch(self, batch) -> None:
        """Start (or continue, for a chunked prompt) the stream of every request of a prefill batch,
        from the target top-k stashed by the target's logits processor."""
        topk = self._pending_topk
        self._pending_topk = None
        total = sum(batch.extend_lens)
        if topk is None or topk.shape[0] != total:
            got = None if topk is None else topk.shape[0]
            raise RuntimeError(f"NANOSPEC: prefill top-k rows {got} do not match the batch's {total} "
                               "extend tokens; the target logits hook did not run on this batch")
        pt = 0
        for i, req in enumerate(batch.reqs):
            p, e = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
            rows = topk[pt : pt + e]
            pt += e
            first, prev = self.partial.get(req.rid, (p, rows[:0]))
            if first + prev.shape[0] != p:  # not the continuation of the chunk we saw last
                first, prev = p, rows[:0]
            rows = torch.cat([prev, rows]) if prev.shape[0] else rows
            self.partial[req.rid] = (first, rows)
            if self.cold_prefill:
                self.cold_rids.add(req.rid)
            ids = token_tensor(req.full_untruncated_fill_ids, p + e).to(self.device, non_blocking=True)
            slot = int(req.kv.req_pool_idx)
            self.proposer.start(slot, ids, streams.fill_missing_rows(rows, first))
            self.stats.reset(slot)
            if self.slot_rid.get(slot) != req.rid:
                self.starts += 1
            self.slot_rid[slot] = req.rid
            self.slots_used.add(slot)

    def finish_prefill(self, batch) -> None:
        """Drop the kept top-k rows of requests whose prompt is complete (not a chunked one)."""
        chunked = getattr(batch, "chunked_req", None)
        for req in batch.reqs:
            if req is not chunked:
                self.partial.pop(req.rid, None)

    # -- decode -------------------------------------------------------------------------------

    def after_verify(self, *, reqs: torch.Tensor, draft_tokens: torch.Tensor, accept_index: torch.Tensor,
                     accept_lens: torch.Tensor, predict: torch.Tensor, logits: torch.Tensor) -> None:
        """Telemetry for the tokens just emitted, then append this step's candidates
        (``Proposer.after_verify``). Device ops only, shapes fixed by the draft tree."""
        if accept_index.shape[0] == 0:
            return
        seen = self.proposer.after_verify(reqs=reqs, draft_tokens=draft_tokens, accept_index=accept_index,
                                          accept_lens=accept_lens, predict=predict, logits=logits)
        self.stats.record(reqs, seen.active, seen.emitted, seen.hits)

    def warm_up(self, tree_tokens: int, width: int) -> None:
        """``Proposer.warm_up`` (Triton compiles at start-up), leaving the telemetry as new."""
        self.proposer.warm_up(tree_tokens, width)
        self.stats.reset(0)

    # -- request end --------------------------------------------------------------------------

    def release(self, slot: int) -> dict[str, float] | None:
        """Free ``slot``; returns the finished request's telemetry (None if it never started)."""
        rid = self.slot_rid.pop(slot, None)
        if rid is None:
            return None
        self.partial.pop(rid, None)
        self.cold_rids.discard(rid)
        self.proposer.release(slot)
        return self.stats.finish(slot)

    def describe(self) -> str:
        """Running averages and state size, for the decode log line."""
        s = self.stats.running()
        return (f"nanospec active vocab: {s['mean_active_vocab']:.1f}, hit rate: {s['hit_rate']:.3f}, "
                f"live: {len(self.slot_rid)}, started: {self.starts}, slots used: {len(self.slots_used)}, "
                f"pending prompts: {len(self.partial)}, state bytes: {self.proposer.nbytes()['total']}")
