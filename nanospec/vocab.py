"""``DynamicVocab``: the public API of the per-request dynamic draft vocabulary."""

from __future__ import annotations

import torch

from nanospec import kernels
from nanospec.config import NanoSpecConfig
from nanospec.head import PackedHead
from nanospec.state import VocabState, start_request

_INT = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)


class DynamicVocab:
    """Dynamic vocabularies for a pool of ``max_requests`` request slots, all on the weight's device.

    lm_head_weight: [V, d] the draft's full LM head (floating point, kept by reference).
    check_inputs: validate values of every call (token ranges, live slots). This reads tensors on the
        host, so a serving loop whose inputs come from the model itself turns it off to keep decode
        steps free of host synchronisation; shapes, dtypes and devices are always checked.
    backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch" or "triton".
    """

    def __init__(
        self,
        lm_head_weight: torch.Tensor,
        max_requests: int,
        config: NanoSpecConfig | None = None,
        *,
        check_inputs: bool = True,
        backend: str = "auto",
    ):
        if not isinstance(lm_head_weight, torch.Tensor) or lm_head_weight.dim() != 2:
            raise ValueError("lm_head_weight must be a 2-D tensor [V, d]")
        if not lm_head_weight.is_floating_point():
            raise ValueError(f"lm_head_weight must be floating point, got {lm_head_weight.dtype}")
        if lm_head_weight.stride(1) != 1:
            raise ValueError("lm_head_weight rows must be contiguous (stride(1) == 1)")
        if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
            raise ValueError(f"max_requests must be a positive integer, got {max_requests!r}")
        self.config = config or NanoSpecConfig()
        self.weight = lm_head_weight
        self.device = lm_head_weight.device
        self.vocab, self.dim = lm_head_weight.shape
        self.max_requests = max_requests
        self.w_max = self.config.w_max
        self.check_inputs = check_inputs
        self.ops = kernels.load(backend, self.device)
        self.state = VocabState.allocate(max_requests, self.vocab, self.w_max, self.device)
        self.head = PackedHead(lm_head_weight, max_requests, self.w_max, self.config.gather == "indexed",
                               self.ops)
        self._live = [False] * max_requests

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, req: int, prompt_ids: torch.Tensor, prefill_topk: torch.Tensor | None = None) -> None:
        """Reset slot ``req`` to the stream: prompt_ids [L] in order, then prefill_topk [L, K] row-major
        with repeats removed (first occurrence kept). An id of -1 is no entry (a token the head has no
        row for, as with a reduced draft vocabulary): it is skipped and takes no window place."""
        self._check_slot("req", req)
        self._check_int("prompt_ids", prompt_ids, 1)
        if prompt_ids.numel() == 0:
            raise ValueError("prompt_ids must hold at least one token")
        if prefill_topk is not None:
            self._check_int("prefill_topk", prefill_topk, 2)
            if prefill_topk.shape[0] != prompt_ids.shape[0]:
                raise ValueError(f"prefill_topk has {prefill_topk.shape[0]} rows but prompt_ids has "
                                 f"{prompt_ids.shape[0]} tokens")
        if self.check_inputs:
            self._check_tokens("prompt_ids", prompt_ids, absent=True)
            if prefill_topk is not None:
                self._check_tokens("prefill_topk", prefill_topk, absent=True)
        topk = None if prefill_topk is None else prefill_topk.long()
        dst, src = start_request(self.state, req, prompt_ids.long(), topk)
        self.head.gather(dst, src)
        self._live[req] = True

    def release(self, req: int) -> None:
        """Free slot ``req`` for another request. Releasing a free slot does nothing, so abort paths
        may call it unconditionally."""
        self._check_slot("req", req)
        self._live[req] = False

    # -- decode step ------------------------------------------------------------------------------

    def extend(self, reqs: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor) -> None:
        """Append each row's valid candidates [B, C] (repeats in a row removed) to the streams of the
        distinct live slots reqs [B]; gathers the LM-head rows of tokens that become active."""
        self._check_int("reqs", reqs, 1)
        self._check_int("candidates", candidates, 2)
        self._check_tensor("valid", valid, 2)
        if valid.dtype != torch.bool:
            raise ValueError(f"valid must be a bool tensor, got {valid.dtype}")
        if candidates.shape[0] != reqs.shape[0] or valid.shape != candidates.shape:
            raise ValueError(
                f"shapes disagree: reqs {tuple(reqs.shape)}, candidates {tuple(candidates.shape)}, "
                f"valid {tuple(valid.shape)} (expected [B], [B, C], [B, C])"
            )
        if self.check_inputs:
            self._check_reqs("reqs", reqs, distinct=True)
            self._check_tokens("candidates", candidates[valid])
        dst, src = self.ops.extend(
            self.state, reqs.long().contiguous(), candidates.long().contiguous(), valid.contiguous()
        )
        self.head.gather(dst, src)

    def wait_gathers(self) -> None:
        """Order the current CUDA stream after all pending gathers; call it before replaying a CUDA
        graph that contains ``logits`` (inside capture ``logits`` cannot wait by itself)."""
        self.head.wait()

    def logits(self, hidden: torch.Tensor, reqs: torch.Tensor, rows_per_req: int = 1) -> torch.Tensor:
        """Draft logits [N, w_max] float32 of hidden [N, d] over each row's request's packed columns;
        free columns are -inf. Map columns back with ``token_ids``.

        reqs: [N // rows_per_req] the slot of each block of ``rows_per_req`` consecutive rows (1: any
        row -> slot map). Rows grouped per slot are computed together: the slot's active rows are
        read once for the whole block, not once per row."""
        self._check_tensor("hidden", hidden, 2)
        self._check_int("reqs", reqs, 1)
        if isinstance(rows_per_req, bool) or not isinstance(rows_per_req, int) or rows_per_req < 1:
            raise ValueError(f"rows_per_req must be a positive integer, got {rows_per_req!r}")
        if hidden.shape != (reqs.shape[0] * rows_per_req, self.dim):
            raise ValueError(f"hidden must be [N, {self.dim}] with N = len(reqs) * rows_per_req "
                             f"({rows_per_req}); got {tuple(hidden.shape)} and reqs {tuple(reqs.shape)}")
        if hidden.dtype != self.weight.dtype:
            raise ValueError(f"hidden dtype {hidden.dtype} differs from lm_head_weight dtype "
                             f"{self.weight.dtype}")
        if self.check_inputs:
            self._check_reqs("reqs", reqs, distinct=False)
        return self.head.logits(hidden.contiguous(), self.state.col_tok, reqs.long())

    def token_ids(self, reqs: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids [N, k] int64 of packed columns cols [N, k] of requests reqs [N] (-1 where free)."""
        self._check_int("reqs", reqs, 1)
        self._check_int("cols", cols, 2)
        if cols.shape[0] != reqs.shape[0]:
            raise ValueError(f"cols has {cols.shape[0]} rows but reqs has {reqs.shape[0]}")
        if self.check_inputs:
            self._check_reqs("reqs", reqs, distinct=False)
            if cols.numel() and (int(cols.min()) < 0 or int(cols.max()) >= self.w_max):
                raise ValueError(f"cols must lie in [0, {self.w_max})")
        return self.state.col_tok[reqs.long()[:, None], cols.long()].long()

    def column_tokens(self) -> torch.Tensor:
        """The column -> token map [max_requests, w_max] int32 of every slot (-1 where free): row r,
        column c holds the token of slot r's packed column c, the column ``logits`` computed there.
        A view of the persistent state (read it, do not write it): it changes only at ``start`` and
        ``extend`` of that slot, so a CUDA graph may read it at replay."""
        return self.state.col_tok

    # -- telemetry --------------------------------------------------------------------------------

    def active(self, req: int) -> torch.Tensor:
        """Sorted token ids [n] int64 of the active vocabulary of live slot ``req``."""
        self._check_live(req)
        toks = self.state.col_tok[req]
        return toks[toks >= 0].long().sort().values

    def contains(self, reqs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Whether each of tokens [B, k] is active for its row's slot reqs [B]: BoolTensor [B, k] on the
        device (no sync; for hit-rate telemetry). Ids outside [0, V) are never active."""
        in_range = (tokens >= 0) & (tokens < self.vocab)
        cols = self.state.col_of[reqs.long()[:, None], tokens.long().clamp(0, self.vocab - 1)]
        return in_range & (cols >= 0)

    def active_sizes(self, reqs: torch.Tensor) -> torch.Tensor:
        """Active vocabulary size [B] int64 of each slot, on the device (no sync)."""
        return (self.w_max - self.state.nfree[reqs.long()]).long()

    def nbytes(self) -> dict[str, int]:
        """Device memory of the state by component, plus ``total`` and ``per_request``."""
        out = self.state.nbytes()
        out["packed"] = self.head.nbytes()
        out["total"] = sum(out.values())
        out["per_request"] = out["total"] // self.max_requests
        return out

    # -- validation -------------------------------------------------------------------------------

    def _check_tensor(self, name: str, t: object, dim: int) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dim:
            raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
        if t.device != self.device:
            raise ValueError(f"{name} is on {t.device} but the vocabulary state is on {self.device}")

    def _check_int(self, name: str, t: object, dim: int) -> None:
        self._check_tensor(name, t, dim)
        if t.dtype not in _INT:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")

    def _check_tokens(self, name: str, t: torch.Tensor, absent: bool = False) -> None:
        low = -1 if absent else 0
        if t.numel() and (int(t.min()) < low or int(t.max()) >= self.vocab):
            raise ValueError(f"{name} holds token ids outside [{low}, {self.vocab})")

    def _check_slot(self, name: str, req: object) -> None:
        if isinstance(req, bool) or not isinstance(req, int) or not 0 <= req < self.max_requests:
            raise ValueError(f"{name} must be an int slot in [0, {self.max_requests}), got {req!r}")

    def _check_live(self, req: object) -> None:
        self._check_slot("req", req)
        if not self._live[req]:
            raise ValueError(f"req {req} is not started (call start() first)")

    def _check_reqs(self, name: str, reqs: torch.Tensor, distinct: bool) -> None:
        ids = reqs.tolist()
        for r in ids:
            if not 0 <= r < self.max_requests:
                raise ValueError(f"{name} holds slot {r} outside [0, {self.max_requests})")
            if not self._live[r]:
                raise ValueError(f"{name} holds slot {r}, which is not started")
        if distinct and len(set(ids)) != len(ids):
            raise ValueError(f"{name} must not repeat a slot within one step")
