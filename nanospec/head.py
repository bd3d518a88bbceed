"""The packed draft LM head: per-request copies of the active rows, filled off the critical path.

On CUDA the gather for newly active tokens runs on a side stream; ``logits`` waits for it only just
before its matmul, so the copy overlaps whatever the caller runs in between (the draft backbone).
"""

from __future__ import annotations

from types import ModuleType

import torch


class PackedHead:
    """LM-head rows of every request's active columns.

    weight: [V, d] the full draft LM head (not copied). packed: [R, W, d] in weight's dtype, or None
    in indexed mode, where rows are read from ``weight`` inside every logits call instead.
    """

    def __init__(self, weight: torch.Tensor, n_req: int, w_max: int, indexed: bool, ops: ModuleType):
        self.weight, self.indexed, self.ops = weight, indexed, ops
        self.packed_flat = None
        if not indexed:
            # One spare row after R*W: masked gathers land there.
            self.packed_flat = torch.zeros(n_req * w_max + 1, weight.shape[1], dtype=weight.dtype,
                                           device=weight.device)
        self.packed = None if indexed else self.packed_flat[: n_req * w_max].view(n_req, w_max, -1)
        cuda = weight.device.type == "cuda"
        self.side = torch.cuda.Stream(weight.device) if cuda and not indexed else None
        self.ready = torch.cuda.Event() if self.side is not None else None

    def gather(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy weight[src[i]] into packed row dst[i] (dst -1: nothing), asynchronously on CUDA."""
        if self.indexed:
            return
        # Inline inside CUDA-graph capture: a captured fork onto the side stream would have to be
        # joined again before the capture ends.
        if self.side is None or torch.cuda.is_current_stream_capturing():
            self.ops.gather(self.weight, self.packed_flat, dst, src)
            return
        self.side.wait_stream(torch.cuda.current_stream(self.weight.device))
        with torch.cuda.stream(self.side):
            self.ops.gather(self.weight, self.packed_flat, dst, src)
        # The caller's stream may free these before the side stream reads them.
        dst.record_stream(self.side)
        src.record_stream(self.side)
        self.ready.record(self.side)

    def wait(self) -> None:
        """Make the current stream wait for every gather issued so far.

        Does nothing inside CUDA-graph capture (an event recorded outside a graph cannot be waited on
        inside it): whoever replays a graph that calls ``logits`` calls ``wait()`` before the replay.
        """
        if self.ready is not None and not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(self.weight.device).wait_event(self.ready)

    def logits(self, hidden: torch.Tensor, col_tok: torch.Tensor, reqs: torch.Tensor) -> torch.Tensor:
        """hidden [N, d], col_tok [R, W] int32, reqs [B] int64 (B divides N: the request of each block
        of N // B consecutive rows) -> [N, W] float32, free columns -inf."""
        self.wait()
        rows = self.weight if self.indexed else self.packed
        return self.ops.logits(hidden, rows, col_tok, reqs, self.indexed)

    def nbytes(self) -> int:
        return 0 if self.packed_flat is None else self.packed_flat.untyped_storage().nbytes()
