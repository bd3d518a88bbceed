"""Per-batch choice of the draft LM head by estimated bytes moved (used by ``nanospec.proposer``).

Three heads compute the same kind of draft logits for a batch of ``B`` requests (``N`` rows):

* ``packed``: every request multiplies its own packed ``[W, d]`` copy of its active rows with all of
  its ``N / B`` draft rows at once (the logits kernel loads each weight tile once per block of up to
  ``ROWS_PER_PROGRAM`` rows). Reads ``B * ceil(N / B / ROWS_PER_PROGRAM) * W * d`` weight elements,
  so 8 draft rows per request cost the weight reads of 1; writes ``N * W`` float32 logits.
* ``union``: one head over the union ``U`` of the batch's active vocabularies: rows are gathered from
  the full head into one block (read + write ``U * d``) and multiplied (read ``U * d`` again);
  writes ``N * U`` logits. Pays off when the requests' vocabularies overlap a lot (``U << B * W``).
* ``full``: the draft's whole head. Reads ``V * d``; writes ``N * V`` logits.

The cheapest wins (ties go to the earlier entry of the list above). Without overlap (``U = B * W``)
the packed head beats the full one until ``B * W ~ V``, the break-even near ``V / W_max`` requests.
"""

from __future__ import annotations

from nanospec.kernels import ROWS_PER_PROGRAM

HEAD_ORDER = ("packed", "union", "full")
LOGIT_BYTES = 4  # float32 logits


def head_bytes(*, batch: int, rows: int, vocab: int, w_max: int, dim: int, elem: int,
               union_size: int) -> dict[str, int]:
    """Estimated bytes each head moves for one LM-head call of ``rows`` draft rows, ``rows // batch``
    consecutive ones per request."""
    u = max(1, min(union_size, vocab, batch * w_max))
    per_req = max(1, rows // max(1, batch))
    passes = -(-per_req // ROWS_PER_PROGRAM)  # weight tiles loaded once per block of rows
    return {
        "packed": batch * passes * w_max * dim * elem + rows * w_max * LOGIT_BYTES,
        "union": 3 * u * dim * elem + rows * u * LOGIT_BYTES,
        "full": vocab * dim * elem + rows * vocab * LOGIT_BYTES,
    }


def choose_head(*, batch: int, rows: int, vocab: int, w_max: int, dim: int, elem: int,
                union_size: int, forced: str = "auto") -> str:
    """The head to use: ``forced`` unless it is "auto", else the cheapest by ``head_bytes``."""
    if forced != "auto":
        return forced
    cost = head_bytes(batch=batch, rows=rows, vocab=vocab, w_max=w_max, dim=dim, elem=elem,
                      union_size=union_size)
    return min(HEAD_ORDER, key=lambda h: (cost[h], HEAD_ORDER.index(h)))


class UnionEstimate:
    """Host-side estimate of a batch's union size, so choosing a head needs no device read.

    Keeps the last measured ratio of union size to summed window capacity (``B * W``); starts at 1
    (no overlap assumed). Measurements arrive late through ``observe`` (from a copy the device made
    asynchronously), which is fine for a cost estimate.
    """

    def __init__(self) -> None:
        self.ratio = 1.0

    def observe(self, union_size: int, batch: int, w_max: int) -> None:
        if batch > 0 and union_size > 0:
            self.ratio = min(1.0, union_size / (batch * w_max))

    def estimate(self, batch: int, w_max: int, ratio: float | None = None) -> int:
        """Union size of ``batch`` windows of ``w_max`` at the current ratio (or at ``ratio``)."""
        r = self.ratio if ratio is None else ratio
        return max(1, int(r * batch * w_max + 0.5))
