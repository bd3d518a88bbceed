"""Per-request telemetry: mean active vocabulary size and hit rate, kept on the device.

Counters per request slot (float64 on the device, updated without host synchronisation):
draft steps, summed active vocabulary size, emitted tokens, emitted tokens that were in the active
vocabulary when drafted (hits). A host mirror is refreshed asynchronously each step (on CPU it *is*
the device tensor); reading it at request end or for the log line never waits for the device, so on
a GPU the numbers may miss the step still in flight.
"""

from __future__ import annotations

import logging
import statistics

import torch

STEPS, ACTIVE, EMITTED, HITS = range(4)


class SlotStats:
    def __init__(self, max_requests: int, device: torch.device):
        self.dev = torch.zeros(max_requests, 4, dtype=torch.float64, device=device)
        self.host = self.dev if device.type == "cpu" else torch.zeros(
            max_requests, 4, dtype=torch.float64, pin_memory=True)
        self.done = torch.zeros(4, dtype=torch.float64)  # totals of finished requests (host)
        self.finished = 0

    def reset(self, req: int) -> None:
        self.dev[req].zero_()

    def record(self, reqs: torch.Tensor, active: torch.Tensor, emitted: torch.Tensor,
               hits: torch.Tensor) -> None:
        """One verify step for reqs [B]: active sizes [B], emitted [B], hits [B]."""
        upd = torch.stack([torch.ones_like(active, dtype=torch.float64), active.double(),
                           emitted.double(), hits.double()], dim=1)
        self.dev.index_add_(0, reqs.long(), upd)
        if self.host is not self.dev:
            self.host.copy_(self.dev, non_blocking=True)

    def finish(self, req: int) -> dict[str, float]:
        """Summary of slot ``req`` (host values), folded into the totals; the slot is then zeroed."""
        row = self.host[req].clone()
        self.done += row.cpu()
        self.finished += 1
        self.dev[req].zero_()
        return summary(row)

    def running(self) -> dict[str, float]:
        return summary(self.done + self.host.sum(0).cpu())


def summary(row: torch.Tensor) -> dict[str, float]:
    steps, active, emitted, hits = (float(x) for x in row.tolist())
    return {
        "mean_active_vocab": active / steps if steps else 0.0,
        "hit_rate": hits / emitted if emitted else 0.0,
        "draft_steps": steps,
    }


class LogSuffix(logging.Filter):
    """Appends ``describe()`` (NanoSpec's running averages) to SGLang's "Decode batch ... accept len"
    log line."""

    def __init__(self, describe):
        super().__init__()
        self.describe = describe

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is SGLang's to report, not ours
            return True
        if msg.startswith("Decode batch") and "accept len" in msg:
            record.msg = f"{msg}, {self.describe()}"
            record.args = ()
        return True


class DraftTimer:
    """Wall time of SGLang's draft phase (``EagleDraftWorker.draft``), for the serving benchmark.

    Installed only when ``NANOSPEC_TIME_DRAFT=1`` (it synchronises CUDA around each call, which the
    serving loop must not do otherwise); logs every ``every`` calls the median and the mean of the
    calls so far. The median is what benchmarks compare: the first calls include one-off work
    (torch.compile of SGLang's top-k selection) and a shared host adds spikes; both move the mean.
    """

    def __init__(self, every: int = 10, keep: int = 100_000):
        self.every, self.keep = every, keep
        self.times: list[float] = []
        self.calls, self.total = 0, 0.0
        self.log = logging.getLogger("nanospec.timing")

    def __call__(self, original, worker, *args, **kwargs):
        import time

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = original(worker, *args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        self.total += dt
        self.calls += 1
        if len(self.times) < self.keep:
            self.times.append(dt)
        if self.calls % self.every == 0:
            self.log.warning("NANOSPEC timing: draft step %.3f ms median, %.3f ms mean over %d calls",
                             1e3 * statistics.median(self.times), 1e3 * self.total / self.calls, self.calls)
        return out
