"""The draft LM head that replaces SGLang's: packed per request, union of the batch, or full.

``DraftHead.logits`` is called from inside the draft model's logits processor (eager or during CUDA
graph capture); ``DraftHead.token_ids`` maps the draft's top-k columns back to target vocabulary ids
right after. Python-side choices (which head, which tensors) are fixed when a graph is captured, so
every tensor used here is either persistent or produced inside the same call.
"""

from __future__ import annotations

import torch

from nanospec.sglang.policy import UnionEstimate, choose_head
from nanospec.vocab import DynamicVocab


def union_columns(col_tok: torch.Tensor, vocab: int, cap: int) -> torch.Tensor:
    """Sorted distinct active tokens of the rows col_tok [B, W] (-1 free) as ids [cap] int64, -1
    padded; fixed shape, no host sync. Tokens beyond ``cap`` are dropped (fewer draft choices,
    never a wrong output)."""
    mark = torch.zeros(vocab + 1, dtype=torch.bool, device=col_tok.device)
    t = col_tok.reshape(-1).long()
    mark[torch.where(t >= 0, t, vocab)] = True
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


class DraftHead:
    """Draft logits over each request's dynamic vocabulary.

    weight: [V_d, d] the draft's LM head; hot: [V_d] draft row -> target id for a reduced draft
    vocabulary (None when rows are target ids). ``reqs`` are SGLang ``req_pool_indices``.
    """

    def __init__(self, weight: torch.Tensor, max_requests: int, config, *, head: str = "auto",
                 hot: torch.Tensor | None = None, target_vocab: int | None = None):
        self.weight = weight
        self.vocab, self.dim = weight.shape
        self.dv = DynamicVocab(weight, max_requests, config, check_inputs=False)
        self.w_max = config.w_max
        self.forced = head
        self.hot = None if hot is None else hot.to(weight.device).long()
        self.t2d = None
        if self.hot is not None:
            n = int(target_vocab if target_vocab is not None else int(self.hot.max()) + 1)
            self.t2d = torch.full((n,), -1, dtype=torch.long, device=weight.device)
            self.t2d[self.hot] = torch.arange(self.hot.shape[0], device=weight.device)
        self.estimate = UnionEstimate()
        self.kind = "packed"
        self.reqs: torch.Tensor | None = None
        self.columns: torch.Tensor | None = None
        self.calls = {"packed": 0, "union": 0, "full": 0}
        self.capture_ratio: float | None = None  # union estimate when CUDA graphs were captured
        self.out_vocab = int(target_vocab) if self.hot is not None else self.vocab

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

    def logits(self, hidden: torch.Tensor, reqs: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, cols] of hidden [N, d] whose rows belong, N // B consecutive rows each,
        to the B requests reqs [B]; free columns are -inf."""
        n, b = hidden.shape[0], reqs.shape[0]
        if b == 0 or n == 0:
            self.kind, self.reqs = "packed", reqs
            return hidden.new_full((n, self.w_max), float("-inf"), dtype=torch.float32)
        if n % b:
            raise ValueError(f"draft head got {n} rows for {b} requests; expected a multiple")
        hidden = hidden.to(self.weight.dtype)
        kind = self.choose(b, n)
        if capturing(hidden):
            self.capture_ratio = self.estimate.ratio
        self.kind, self.reqs = kind, reqs
        self.calls[kind] += 1
        if kind == "packed":
            return self.dv.logits(hidden, reqs.long().repeat_interleave(n // b))
        if kind == "full":
            return (hidden @ self.weight.T).float()
        cap = min(self.vocab, b * self.w_max, self.estimate.estimate(b, self.w_max) * 5 // 4 + 64)
        cols = union_columns(self.dv.state.col_tok[reqs.long()], self.vocab, cap)
        self.columns = cols
        out = (hidden @ self.weight[cols.clamp_min(0)].T).float()
        return out.masked_fill_(cols[None, :] < 0, float("-inf"))

    def token_ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Target vocabulary ids [M, k] int64 of columns cols [M, k] of the last ``logits`` call
        (M a multiple of its batch size). A free column maps to 0, which verification rejects like
        any wrong guess, so it cannot change the output."""
        reqs = self.reqs
        if self.kind == "packed":
            if reqs is None or reqs.shape[0] == 0 or cols.shape[0] == 0:
                return cols.long().clamp_min(0)
            rows = reqs.long().repeat_interleave(cols.shape[0] // reqs.shape[0])
            ids = self.dv.token_ids(rows, cols)
        elif self.kind == "union":
            ids = self.columns[cols.long()]
        else:
            ids = cols.long()
        ids = ids.clamp_min(0)
        return ids if self.hot is None else self.hot[ids]

    def scatter_to_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [N, cols] of the last ``logits`` call placed at their vocabulary ids: [N, out_vocab]
        float32, -inf elsewhere. Used where SGLang keeps the draft's top-k beyond this call."""
        n = logits.shape[0]
        if self.kind == "full" and self.hot is None:
            return logits
        if self.kind == "packed":
            if n == 0:
                return logits.new_full((0, self.out_vocab), float("-inf"))
            reqs = self.reqs.long()
            ids = self.dv.state.col_tok[reqs.repeat_interleave(n // reqs.shape[0])].long()
        elif self.kind == "union":
            ids = self.columns[None, :].expand(n, -1)
        else:
            ids = torch.arange(self.vocab, device=logits.device)[None, :].expand(n, -1)
        if self.hot is not None:
            ids = torch.where(ids >= 0, self.hot[ids.clamp_min(0)], -1)
        out = logits.new_full((n, self.out_vocab), float("-inf"))
        # Free columns hold -inf and land on id 0, where "amax" leaves any real logit intact.
        return out.scatter_reduce_(1, ids.clamp_min(0), logits, reduce="amax", include_self=True)
