"""Intervals timed without waiting on the device: CPU wall time on a CPU, CUDA events on a GPU, read
only once the device has passed them (``Event.query``), so a decode step never blocks on a timer.

    watch = Stopwatch(device)
    a = watch.stamp(); ...; b = watch.stamp()
    watch.interval(key, a, b)
    for key, seconds in watch.poll(): ...      # the intervals finished so far, in order
"""

from __future__ import annotations

import time
from collections import deque

import torch


class Stopwatch:
    """stamp(): a point in time on the current stream (a float on CPU, a recorded CUDA event on a
    GPU). interval(key, a, b): queue the time from a to b. poll(): the queued intervals whose end the
    device has reached, oldest first; at most ``keep`` wait (older ones are dropped, never waited
    for)."""

    def __init__(self, device: torch.device | str, keep: int = 64, event_factory=None):
        self.cuda = torch.device(device).type == "cuda"
        self._event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._pending: deque = deque(maxlen=keep)

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        e = self._event()
        e.record()
        return e

    def interval(self, key, a, b) -> None:
        self._pending.append((key, a, b))

    def poll(self) -> list[tuple[object, float]]:
        out = []
        while self._pending:
            key, a, b = self._pending[0]
            if not self.cuda:
                out.append((key, b - a))
            elif b.query():
                out.append((key, a.elapsed_time(b) / 1e3))  # elapsed_time is in ms
            else:
                break  # later ones end later on the same stream
            self._pending.popleft()
        return out
