"""NanoSpec's per-server state and the three moments it acts: prefill, after verify, request end.

Duck-typed on SGLang's batch objects (``reqs``, ``req_pool_indices``, ``prefix_lens``,
``extend_lens``) so it can be exercised without a server.
"""

from __future__ import annotations

import numpy as np
import torch

from nanospec.sglang import streams
from nanospec.sglang.heads import DraftHead, union_size
from nanospec.sglang.settings import Settings
from nanospec.sglang.telemetry import SlotStats

PREFILL_CHUNK_ROWS = 1024  # rows of target logits materialised at once for the prefill top-k
UNION_PROBE_EVERY = 16  # decode steps between measurements of the batch's union size


def prefill_topk(hidden: torch.Tensor, lm_head_fn, vocab: int, k: int) -> torch.Tensor:
    """Top-k ids [T, k] of the target at every position of hidden [T, d], chunk by chunk so the
    [T, V] logits never exist at once. lm_head_fn: hidden [t, d] -> logits [t, >= vocab]."""
    out = torch.empty(hidden.shape[0], k, dtype=torch.long, device=hidden.device)
    for s in range(0, hidden.shape[0], PREFILL_CHUNK_ROWS):
        logits = lm_head_fn(hidden[s : s + PREFILL_CHUNK_ROWS])
        out[s : s + PREFILL_CHUNK_ROWS] = logits[:, :vocab].topk(k, dim=-1).indices
    return out


def token_tensor(ids, n: int) -> torch.Tensor:
    """The first n ids (SGLang keeps them in an ``array('q')``) as a CPU int64 tensor."""
    return torch.from_numpy(np.asarray(ids[:n], dtype=np.int64))


class Runtime:
    def __init__(self, weight: torch.Tensor, max_requests: int, settings: Settings, *,
                 hot: torch.Tensor | None = None, target_vocab: int):
        self.settings = settings
        self.cfg = settings.vocab
        self.target_vocab = target_vocab
        self.head = DraftHead(weight, max_requests, self.cfg, head=settings.head, hot=hot,
                              target_vocab=target_vocab)
        self.dv = self.head.dv
        self.device = weight.device
        self.stats = SlotStats(max_requests, self.device)
        self.pending_topk: torch.Tensor | None = None  # [T, k_pre] of the last target prefill
        # rid -> (first position with target logits, top-k rows since then): chunked prefill.
        self.partial: dict[str, tuple[int, torch.Tensor]] = {}
        self.slot_rid: dict[int, str] = {}
        self.starts = 0
        self.slots_used: set[int] = set()
        self.step = 0
        self._union_probe: torch.Tensor | None = None
        self._union_batch = 0

    # -- prefill ------------------------------------------------------------------------------

    def start_batch(self, batch) -> None:
        """Start (or continue, for a chunked prompt) the stream of every request of a prefill batch,
        from the target top-k stashed by the target's logits processor."""
        topk = self.pending_topk
        self.pending_topk = None
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
            ids = token_tensor(req.full_untruncated_fill_ids, p + e).to(self.device, non_blocking=True)
            prompt, ptk = streams.start_args(ids, streams.fill_missing_rows(rows, first), self.cfg.sources)
            slot = int(req.kv.req_pool_idx)
            self.dv.start(slot, prompt, ptk)
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
        """Telemetry for the tokens just emitted, then append this step's candidates. Device ops
        only; shapes fixed by the draft tree, so this can sit inside a captured region too."""
        batch, width = accept_index.shape
        if batch == 0:
            return
        emitted, ok = streams.emitted_tokens(predict, accept_lens, batch, width)
        d_emit, d_ok = streams.to_draft_space(emitted, ok, self.head.t2d)
        hit = d_ok & self.dv.contains(reqs, d_emit)
        self.stats.record(reqs, self.dv.active_sizes(reqs), ok.sum(1), hit.sum(1))
        cands, valid = streams.verify_candidates(
            draft_tokens=draft_tokens, accept_index=accept_index, logits=logits,
            vocab=min(self.target_vocab, logits.shape[1]), k_ver=self.cfg.k_ver, emitted=emitted,
            emitted_valid=ok, sources=self.cfg.sources)
        cands, valid = streams.to_draft_space(cands, valid, self.head.t2d)
        self.dv.extend(reqs, cands, valid)
        self._probe_union(reqs)

    def _probe_union(self, reqs: torch.Tensor) -> None:
        # The union head is only worth it with overlapping vocabularies; learn the overlap from an
        # asynchronous measurement now and then, read one probe later.
        self.step += 1
        if self.settings.head != "auto" or reqs.shape[0] < 2 or self.step % UNION_PROBE_EVERY:
            return
        if self._union_probe is not None:
            self.head.estimate.observe(int(self._union_probe), self._union_batch, self.cfg.w_max)
        size = union_size(self.dv.state.col_tok[reqs.long()], self.head.vocab)
        if size.is_cuda:
            probe = torch.empty((), dtype=size.dtype, pin_memory=True)
            probe.copy_(size, non_blocking=True)
            size = probe
        self._union_probe, self._union_batch = size, reqs.shape[0]

    def warm_up(self, tree_tokens: int, width: int) -> None:
        """Run every kernel of a request's life once on slot 0 (then free it), so that Triton
        compiles at server start-up instead of inside the first decode steps. tree_tokens: T, the
        draft tokens verified per request; width: S1, the longest accepted path."""
        dev, k = self.device, self.cfg.k_pre
        self.dv.start(0, torch.zeros(1, dtype=torch.long, device=dev),
                      torch.zeros(1, k, dtype=torch.long, device=dev))
        self.after_verify(reqs=torch.zeros(1, dtype=torch.long, device=dev),
                          draft_tokens=torch.zeros(tree_tokens, dtype=torch.long, device=dev),
                          accept_index=(torch.arange(width, device=dev) % tree_tokens)[None],
                          accept_lens=torch.ones(1, dtype=torch.long, device=dev),
                          predict=torch.zeros(tree_tokens, dtype=torch.long, device=dev),
                          logits=torch.zeros(tree_tokens, self.target_vocab, device=dev))
        self.dv.logits(torch.zeros(1, self.head.dim, dtype=self.head.weight.dtype, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev))
        self.dv.release(0)
        self.stats.reset(0)
        self.step = 0

    # -- request end --------------------------------------------------------------------------

    def release(self, slot: int) -> dict[str, float] | None:
        """Free ``slot``; returns the finished request's telemetry (None if it never started)."""
        rid = self.slot_rid.pop(slot, None)
        if rid is None:
            return None
        self.partial.pop(rid, None)
        self.dv.release(slot)
        return self.stats.finish(slot)

    def describe(self) -> str:
        """Running averages and state size, for the decode log line."""
        s = self.stats.running()
        return (f"nanospec active vocab: {s['mean_active_vocab']:.1f}, hit rate: {s['hit_rate']:.3f}, "
                f"live: {len(self.slot_rid)}, started: {self.starts}, slots used: {len(self.slots_used)}, "
                f"pending prompts: {len(self.partial)}, state bytes: {self.dv.nbytes()['total']}")
