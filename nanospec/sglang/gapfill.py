"""The draft's KV entries of skipped catch-up passes, written late by the next pass that runs.

A 0-step cycle may skip the draft's catch-up pass (draft-extend; ``StepController.skip_catch_up``),
which leaves no draft KV entry at that cycle's position: a later drafting cycle would attend there to
whatever the cache slot last held (another request's entry, or zeros), and accept less than a draft
that saw every token. A draft-extend row's inputs are the target's hidden state at its position and
the next token, both known once the verify ran; running the skipped positions' rows, in order, in
front of a later pass writes the entries the skipped passes would have written (the rows attend to the
same cache before them, and to each other causally).

``GapFill`` keeps those inputs per request slot for its last ``window`` skipped positions (a ring
indexed by position) and counts each request's gap on the host. The next draft-extend that runs is
widened by the batch's smallest gap in front of its usual window (SGLang's ``num_front_tokens``
window of ``prepare_for_draft_extend``), and a batch whose gap reaches ``window`` runs one even in a
cycle that would skip it, so a request that stays in its batch is left with no hole. Positions that a
request skipped beyond the batch's smallest gap (members joined during a plain stretch) stay holes;
``holes`` counts them. All tensor work is indexing on the device with shapes fixed by the batch; the
gaps live on the host, so choosing the width reads nothing back from the device.
"""

from __future__ import annotations

import numpy as np
import torch

WINDOW = 32  # skipped positions kept per slot: a plain stretch runs one widened pass per 32 cycles


class GapFill:
    """Inputs of skipped catch-up positions: ``tokens`` [slots, window] int64 (the next token at the
    position) and ``hidden`` [slots, window, width] (the target's verify hidden state there), ring
    column ``position % window``."""

    def __init__(self, slots: int, width: int, dtype: torch.dtype, device, window: int = WINDOW):
        if window < 1:
            raise ValueError(f"gap-fill window must be >= 1, got {window}")
        self.window, self.width = window, width
        self.tokens = torch.zeros(slots, window, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(slots, window, width, dtype=dtype, device=device)
        self.gap = np.zeros(slots, dtype=np.int64)  # skipped positions since the slot's last pass
        self.filled = 0  # positions written late
        self.holes = 0  # skipped positions never written
        self.off: str | None = None  # why the fill stopped (verify hidden states it cannot keep)

    def stash(self, slots: list[int], reqs: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor,
              hidden: torch.Tensor) -> None:
        """A 0-step cycle skipped its pass: keep its one position per request. slots: the batch's
        request slots on the host; reqs [B] the same on the device; seq_lens [B] the position of each
        request's verified token; tokens [B] the verify's next tokens; hidden [B, width] its hidden
        states."""
        if hidden is None or hidden.dim() != 2 or hidden.shape[-1] != self.width:
            # Not the hidden states this draft takes: keep none (the skipped positions stay holes, as
            # without the fill) rather than stop the server.
            shape = None if hidden is None else tuple(hidden.shape)
            self.off = f"verify hidden states {shape}, not [B, {self.width}]"
        if self.off is not None:
            return
        col = (seq_lens % self.window).long()
        rows = reqs.long()
        self.tokens[rows, col] = tokens.long()
        self.hidden[rows, col] = hidden.to(self.hidden.dtype)
        self.gap[slots] += 1

    def front(self, slots: list[int]) -> int:
        """Skipped positions the batch's next pass writes in front of its window: the smallest gap
        (at most ``window``)."""
        return int(min(self.gap[slots].min(), self.window)) if slots and self.off is None else 0

    def due(self, slots: list[int]) -> bool:
        """Whether a request of the batch has ``window`` skipped positions: one more would overwrite
        the oldest, so this cycle's pass must run."""
        return bool(slots) and self.off is None and int(self.gap[slots].max()) >= self.window

    def written(self, slots: list[int], front: int) -> None:
        """The batch's pass ran with ``front`` positions in front: every gap is closed."""
        gaps = self.gap[slots]
        self.filled += front * len(slots)
        self.holes += int(np.maximum(gaps - front, 0).sum())
        self.gap[slots] = 0

    def started(self, slots: list[int]) -> None:
        """A prefill (of a new request, or a prompt chunk) starts the slot's positions afresh."""
        self.gap[slots] = 0

    def report(self) -> dict[str, int]:
        return {"window": self.window, "filled": self.filled, "holes": self.holes,
                **({"off": self.off} if self.off is not None else {})}

    @staticmethod
    def slot_bytes(width: int, dtype: torch.dtype, window: int = WINDOW) -> int:
        """Bytes per slot of ``tokens`` and ``hidden``: what the memory plan reserves."""
        return window * (width * dtype.itemsize + 8)

    # -- the widened pass -----------------------------------------------------------------------

    def window_of(self, req_to_token: torch.Tensor, reqs: torch.Tensor, seq_lens: torch.Tensor,
                  front: int, draft_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(KV cache locations [B * (front + draft_tokens)] int64, positions [same] int64) of the
        widened window: per request, positions seq_len - front .. seq_len + draft_tokens - 1, where
        seq_len [B] is the verify window's start. req_to_token: SGLang's [slots, max_len] map."""
        span = torch.arange(-front, draft_tokens, device=seq_lens.device, dtype=torch.int64)
        pos = seq_lens.long()[:, None] + span[None, :]
        locs = req_to_token[reqs.long()[:, None], pos].long()
        return locs.reshape(-1), pos.reshape(-1)

    def fill(self, input_ids: torch.Tensor, hidden: torch.Tensor, reqs: torch.Tensor, seq_lens: torch.Tensor,
             front: int, predict: torch.Tensor, verify_hidden: torch.Tensor) -> None:
        """Write the widened pass's inputs in place: input_ids [B * (front + D)] and hidden
        [B * (front + D), width], per request the ``front`` kept positions, then the verify's
        predict [B * D] and verify_hidden [B * D, width]."""
        b = reqs.shape[0]
        d = predict.shape[0] // b
        ids = input_ids.view(b, front + d)
        hid = hidden.view(b, front + d, -1)
        ids[:, front:] = predict.view(b, d)
        hid[:, front:] = verify_hidden.view(b, d, -1)
        if front:
            span = torch.arange(-front, 0, device=seq_lens.device, dtype=torch.int64)
            col = (seq_lens.long()[:, None] + span[None, :]) % self.window
            rows = reqs.long()[:, None]
            ids[:, :front] = self.tokens[rows, col]
            hid[:, :front] = self.hidden[rows, col].to(hid.dtype)


def verify_width(draft_model) -> int:
    """Width of the target hidden states an EAGLE draft takes: an EAGLE-3 draft's ``fc`` input (the
    target's captured layers side by side), else the draft's hidden size."""
    fc = getattr(getattr(draft_model, "model", None), "fc", None)
    if isinstance(fc, torch.nn.Linear):
        return int(fc.in_features)
    return int(draft_model.config.hidden_size)
