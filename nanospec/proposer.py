"""``Proposer``: the draft side of speculative decoding over dynamic vocabularies, engine-independent.

One object per server (vLLM v1's ``EagleProposer`` is the model: persistent buffers, a small
interface) with four calls over request slots:

* ``start(slot, prompt_ids, prefill_topk)``: a request's stream, from its prompt and the target's
  top-K_pre at its last ``pre_positions`` positions (the ``sources`` setting keeps part of it);
* ``logits(hidden, reqs) -> DraftLogits``: draft logits over each request's dynamic vocabulary, by the
  per-batch head of ``nanospec.policy`` (packed per request, one head over the batch's union, or the
  full head), returned with their column -> token map;
* ``after_verify(...)``: append a verify's tree tokens and the accepted path's top-K_ver, and report
  what telemetry needs;
* ``release(slot)``.

Everything here is device ops on fixed shapes (no host read in ``logits`` or ``after_verify``), so a
decode step can be captured in a CUDA graph: Python-side choices (which head, which tensors) are fixed
at capture, and every tensor used is either persistent or produced inside the same call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanospec import streams
from nanospec.config import NanoSpecConfig
from nanospec.kernels import torch_ops
from nanospec.policy import UnionEstimate, choose_head
from nanospec.vocab import DynamicVocab

HEADS = ("auto", "packed", "union", "full")
UNION_PROBE_EVERY = 16  # decode steps between measurements of the batch's union size


def union_columns(col_tok: torch.Tensor, vocab: int, cap: int) -> torch.Tensor:
    """Sorted distinct active tokens of the rows col_tok [B, W] (-1 free) as ids [cap] int64, -1
    padded; fixed shape, no host sync. Tokens beyond ``cap`` are dropped (fewer draft choices,
    never a wrong output)."""
    mark = torch.zeros(vocab + 1, dtype=torch.bool, device=col_tok.device)
    t = col_tok.reshape(-1).long()
    mark[torch.where(t >= 0, t, vocab)] = True  # vocab: the sink element for free columns
    return torch.nonzero_static(mark[:vocab], size=cap, fill_value=-1).view(-1)


def union_size(col_tok: torch.Tensor, vocab: int) -> torch.Tensor:
    """Number [] int64 of distinct active tokens in col_tok [B, W] (on the device)."""
    mark = torch.zeros(vocab + 1, dtype=torch.bool, device=col_tok.device)
    t = col_tok.reshape(-1).long()
    mark[torch.where(t >= 0, t, vocab)] = True
    return mark[:vocab].sum()


def capturing(t: torch.Tensor) -> bool:
    """Whether work on t's device is being recorded into a CUDA graph right now."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _native_candidates(state, logits: torch.Tensor, k_ver: int):
    """nanospec.cpu.stream where its C kernel takes this verify (a CPU state and logits), else None."""
    stream = torch_ops.cpu_stream(logits)
    return stream if stream is not None and stream.candidates_usable(state, logits, k_ver) else None


@dataclass(frozen=True)
class DraftLogits:
    """Draft logits and the map from their columns to target vocabulary ids.

    logits: [N, C] float32, -inf at free columns. table: [T, C] int (-1 free) draft rows of each
    column, or None when columns are draft rows already (the full head); rows: [N] int64 row of
    ``table`` for each logits row. hot: [V_d] int64 draft row -> target id (reduced draft
    vocabulary) or None. out_vocab: size of the target vocabulary ids live in.

    For the packed head ``table`` is the vocabulary state's [R, W] column map itself (persistent, so
    a CUDA graph reads it at replay): the map holds until those slots' next ``start`` or
    ``after_verify``, which is how long SGLang uses a draft step's top-k.
    """

    logits: torch.Tensor
    table: torch.Tensor | None
    rows: torch.Tensor | None
    hot: torch.Tensor | None
    out_vocab: int
    kind: str

    def token_ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Target ids [M, k] int64 of columns cols [M, k]; M a multiple of N (SGLang's top-k rows come
        in the logits' row order, expanded by its tree). A free column maps to 0, which verification
        rejects like any wrong guess, so it cannot change the output."""
        cols = cols.long()
        if self.table is None:
            ids = cols
        elif cols.shape[0] == 0 or self.rows.shape[0] == 0:
            ids = cols.clamp_min(0)
        else:
            rows = self.rows.repeat_interleave(cols.shape[0] // self.rows.shape[0])
            ids = self.table[rows[:, None], cols].long()
        ids = ids.clamp_min(0)
        return ids if self.hot is None else self.hot[ids]

    def to_vocab(self) -> torch.Tensor:
        """The logits placed at their target ids: [N, out_vocab] float32, -inf elsewhere. For callers
        that keep the draft's top-k beyond this call in vocabulary ids (SGLang's draft-extend)."""
        logits = self.logits
        n = logits.shape[0]
        if self.table is None and self.hot is None:
            return logits
        if n == 0:
            return logits.new_full((0, self.out_vocab), float("-inf"))
        if self.table is None:
            ids = torch.arange(logits.shape[1], device=logits.device)[None, :].expand(n, -1)
        else:
            ids = self.table[self.rows].long()
        if self.hot is not None:
            ids = torch.where(ids >= 0, self.hot[ids.clamp_min(0)], -1)
        out = logits.new_full((n, self.out_vocab), float("-inf"))
        # Free columns hold -inf and land on id 0, where "amax" leaves any real logit intact.
        return out.scatter_reduce_(1, ids.clamp_min(0), logits, reduce="amax", include_self=True)


@dataclass(frozen=True)
class VerifyStats:
    """What one ``after_verify`` saw, per request [B], on the device: active vocabulary size when the
    tokens were drafted, tokens emitted, and emitted tokens that were in the active vocabulary."""

    active: torch.Tensor
    emitted: torch.Tensor
    hits: torch.Tensor


def verify_candidates_twin(dv: DynamicVocab, *, reqs: torch.Tensor, draft_tokens: torch.Tensor,
                           accept_index: torch.Tensor, accept_lens: torch.Tensor, predict: torch.Tensor,
                           logits: torch.Tensor, vocab: int, k_ver: int, sources: str,
                           t2d: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, VerifyStats]:
    """One verify's candidates (in draft rows) and what it emitted, in tensor operations: the device
    path of ``Proposer.after_verify`` and the oracle of nanospec.cpu.stream.verify_candidates.

    dv: the ``DynamicVocab`` of slots reqs [B]; the other arguments as in ``after_verify``, plus the
    target vocabulary size ``vocab`` and t2d [V_target] target id -> draft row (-1: none) or None.
    Returns cands [B, C] int64, valid [B, C] bool and ``VerifyStats``. Fixed shapes, no host sync.
    """
    batch, width = accept_index.shape
    emitted, ok = streams.emitted_tokens(predict, accept_lens, batch, width)
    d_emit, d_ok = streams.to_draft_space(emitted, ok, t2d)
    hit = d_ok & dv.contains(reqs, d_emit)
    stats = VerifyStats(dv.active_sizes(reqs), ok.sum(1), hit.sum(1))
    cands, valid = streams.verify_candidates(
        draft_tokens=draft_tokens, accept_index=accept_index, logits=logits, vocab=vocab, k_ver=k_ver,
        emitted=emitted, emitted_valid=ok, sources=sources)
    cands, valid = streams.to_draft_space(cands, valid, t2d)
    return cands, valid, stats


class Proposer:
    """Draft proposals over per-request dynamic vocabularies for ``max_requests`` slots.

    weight: [V_d, d] the draft's LM head (kept by reference). config: the vocabulary settings.
    head: "auto" (per batch, ``nanospec.policy``) or a forced "packed" / "union" / "full".
    hot: [V_d] draft row -> target id for a reduced draft vocabulary (None when rows are target
    ids); target_vocab: the target's vocabulary size (ids of the verify logits and of the output).
    """

    def __init__(self, weight: torch.Tensor, max_requests: int, config: NanoSpecConfig | None = None, *,
                 head: str = "auto", hot: torch.Tensor | None = None, target_vocab: int | None = None,
                 backend: str = "auto"):
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        self.cfg = config or NanoSpecConfig()
        self.weight = weight
        self.vocab, self.dim = weight.shape
        self.w_max = self.cfg.w_max
        self.device = weight.device
        self.forced = head
        self.dv = DynamicVocab(weight, max_requests, self.cfg, check_inputs=False, backend=backend)
        self.hot = None if hot is None else hot.to(self.device).long()
        self.target_vocab = int(target_vocab) if target_vocab is not None else (
            int(self.hot.max()) + 1 if self.hot is not None else self.vocab)
        self.t2d = None  # [V_target] target id -> draft row, -1 where the draft has none
        if self.hot is not None:
            t2d = torch.full((self.target_vocab,), -1, dtype=torch.long, device=self.device)
            t2d[self.hot] = torch.arange(self.hot.shape[0], device=self.device)
            self.t2d = t2d
        self.out_vocab = self.target_vocab if self.hot is not None else self.vocab
        self.estimate = UnionEstimate()
        self.capture_ratio: float | None = None  # union estimate when CUDA graphs were captured
        self.calls = {"packed": 0, "union": 0, "full": 0}
        self.step = 0
        self._union_probe: torch.Tensor | None = None
        self._union_batch = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, slot: int, prompt_ids: torch.Tensor, prefill_topk: torch.Tensor | None) -> None:
        """Start slot's stream: prompt_ids [L] int64 target ids, prefill_topk [L, K] int64 the target's
        top-K_pre at every prompt position (or None; rows before the last ``pre_positions`` are not
        read and may hold -1), both on the weight's device."""
        prompt, ptk = (prompt_ids, None) if prefill_topk is None else streams.start_args(
            prompt_ids, prefill_topk, self.cfg.sources, self.cfg.pre_positions)
        # The stream lives in draft-row space: with a reduced draft vocabulary a target id the head
        # has no row for becomes -1, which the vocabulary skips (the draft can never propose it).
        self.dv.start(slot, streams.draft_rows(prompt, self.t2d),
                      None if ptk is None else streams.draft_rows(ptk, self.t2d))

    def release(self, slot: int) -> None:
        self.dv.release(slot)

    # -- drafting ----------------------------------------------------------------------------------

    def choose(self, batch: int, rows: int, ratio: float | None = None) -> str:
        """The head for ``batch`` requests and ``rows`` draft rows at the current union estimate (or
        at the overlap ``ratio``)."""
        return choose_head(batch=batch, rows=rows, vocab=self.vocab, w_max=self.w_max, dim=self.dim,
                           elem=self.weight.element_size(),
                           union_size=self.estimate.estimate(batch, self.w_max, ratio), forced=self.forced)

    def graph_is_current(self, batch: int, rows: int) -> bool:
        """Whether a CUDA graph captured for this batch runs the head that ``choose`` picks now.

        A graph keeps the head chosen when it was captured (with the union estimate of that moment);
        once the measured overlap moves the choice, the caller runs the step eagerly instead.
        """
        if self.capture_ratio is None:
            return True
        return self.choose(batch, rows) == self.choose(batch, rows, self.capture_ratio)

    def wait_gathers(self) -> None:
        """Order the current stream after pending side-stream gathers (before a graph replay)."""
        self.dv.wait_gathers()

    def logits(self, hidden: torch.Tensor, reqs: torch.Tensor, kind: str | None = None) -> DraftLogits:
        """Draft logits of hidden [N, d] whose rows belong, N // B consecutive rows each, to the B
        requests (slots) reqs [B] int64; with their column map (``DraftLogits``). kind: a head for
        this call ("packed", "union" or "full") instead of ``choose``'s."""
        n, b = hidden.shape[0], reqs.shape[0]
        if b == 0 or n == 0:
            empty = hidden.new_full((n, self.w_max), float("-inf"), dtype=torch.float32)
            return self._out(empty, self.dv.column_tokens(), reqs.long()[:0], "packed")
        if n % b:
            raise ValueError(f"draft head got {n} rows for {b} requests; expected a multiple")
        hidden = hidden.to(self.weight.dtype)
        kind = self.choose(b, n) if kind is None else kind
        if capturing(hidden):
            self.capture_ratio = self.estimate.ratio
        self.calls[kind] += 1
        reqs = reqs.long()
        if kind == "packed":
            rows = reqs.repeat_interleave(n // b)
            # Rows grouped per request: the kernel reads each request's packed rows once for all of them.
            return self._out(self.dv.logits(hidden, reqs, n // b), self.dv.column_tokens(), rows, kind)
        if kind == "full":
            return self._out((hidden @ self.weight.T).float(), None, None, kind)
        cap = min(self.vocab, b * self.w_max, self.estimate.estimate(b, self.w_max) * 5 // 4 + 64)
        cols = union_columns(self.dv.column_tokens()[reqs], self.vocab, cap)
        out = (hidden @ self.weight[cols.clamp_min(0)].T).float()
        out.masked_fill_(cols[None, :] < 0, float("-inf"))
        return self._out(out, cols[None, :], torch.zeros(n, dtype=torch.long, device=self.device), kind)

    def _out(self, logits, table, rows, kind) -> DraftLogits:
        return DraftLogits(logits, table, rows, self.hot, self.out_vocab, kind)

    # -- after a verify ----------------------------------------------------------------------------

    def after_verify(self, *, reqs: torch.Tensor, draft_tokens: torch.Tensor, accept_index: torch.Tensor,
                     accept_lens: torch.Tensor, predict: torch.Tensor, logits: torch.Tensor) -> VerifyStats:
        """Append one verify's candidates to the streams of reqs [B] and report what was emitted.

        draft_tokens: [B * T] the verified trees (target ids, root first); accept_index: [B, S1] rows of
        ``logits`` on the accepted paths (-1 padded); accept_lens: [B] accepted drafts + bonus;
        predict: [B * T] verified tokens, accepted path first in each request's block; logits:
        [B * T, >= V_target] the target's verify logits. Device ops on shapes fixed by the tree.
        """
        vocab = min(self.target_vocab, logits.shape[1])
        native = _native_candidates(self.dv.state, logits, self.cfg.k_ver)
        if native is not None:
            # The same values in one C call: the tensor operations below cost their dispatch on the
            # CPU, about 0.17 ms a verify outside a server and 0.4 ms inside one, plain cycles included.
            cands, valid, counts = native.verify_candidates(
                self.dv.state, reqs=reqs, draft_tokens=draft_tokens, accept_index=accept_index,
                accept_lens=accept_lens, predict=predict, logits=logits, vocab=vocab, k_ver=self.cfg.k_ver,
                context=self.cfg.sources == "context", t2d=self.t2d)
            stats = VerifyStats(counts[:, 0], counts[:, 1], counts[:, 2])
        else:
            cands, valid, stats = verify_candidates_twin(
                self.dv, reqs=reqs, draft_tokens=draft_tokens, accept_index=accept_index,
                accept_lens=accept_lens, predict=predict, logits=logits, vocab=vocab, k_ver=self.cfg.k_ver,
                sources=self.cfg.sources, t2d=self.t2d)
        self.dv.extend(reqs, cands, valid)
        self._probe_union(reqs)
        return stats

    def _probe_union(self, reqs: torch.Tensor) -> None:
        # The union head is only worth it with overlapping vocabularies; learn the overlap from an
        # asynchronous measurement now and then, read one probe later (never waits for the device).
        self.step += 1
        if self.forced != "auto" or reqs.shape[0] < 2 or self.step % UNION_PROBE_EVERY:
            return
        if self._union_probe is not None:
            self.estimate.observe(int(self._union_probe), self._union_batch, self.w_max)
        size = union_size(self.dv.column_tokens()[reqs.long()], self.vocab)
        if size.is_cuda:
            probe = torch.empty((), dtype=size.dtype, pin_memory=True)
            probe.copy_(size, non_blocking=True)
            size = probe
        self._union_probe, self._union_batch = size, reqs.shape[0]

    # -- start-up ----------------------------------------------------------------------------------

    def warm_up(self, tree_tokens: int, width: int) -> None:
        """Run every kernel of a request's life once on slot 0 (then free it), so that Triton
        compiles at start-up instead of inside the first decode steps. tree_tokens: T, the draft
        tokens verified per request; width: S1, the longest accepted path."""
        dev, k = self.device, self.cfg.k_pre
        self.dv.start(0, torch.zeros(1, dtype=torch.long, device=dev),
                      torch.zeros(1, k, dtype=torch.long, device=dev))
        self.after_verify(reqs=torch.zeros(1, dtype=torch.long, device=dev),
                          draft_tokens=torch.zeros(tree_tokens, dtype=torch.long, device=dev),
                          accept_index=(torch.arange(width, device=dev) % tree_tokens)[None],
                          accept_lens=torch.ones(1, dtype=torch.long, device=dev),
                          predict=torch.zeros(tree_tokens, dtype=torch.long, device=dev),
                          logits=torch.zeros(tree_tokens, self.target_vocab, device=dev))
        self.dv.logits(torch.zeros(1, self.dim, dtype=self.weight.dtype, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev))
        self.dv.release(0)
        self.step = 0

    def nbytes(self) -> dict[str, int]:
        """Device memory of the vocabulary state (``DynamicVocab.nbytes``)."""
        return self.dv.nbytes()
