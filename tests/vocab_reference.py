"""Plain-Python reference of the dynamic vocabulary, written straight from the definition."""

from __future__ import annotations


class ReferenceVocab:
    """Streams as Python lists; the active vocabulary is set(stream[-w_max:])."""

    def __init__(self, w_max: int):
        self.w_max = w_max
        self.streams: dict[int, list[int]] = {}
        self.gathered: dict[int, int] = {}

    def active(self, req: int) -> list[int]:
        return sorted(set(self.streams[req][-self.w_max :]))

    def start(self, req: int, prompt: list[int], topk: list[list[int]] | None) -> None:
        stream = list(prompt)
        seen: set[int] = set()
        for row in topk or []:
            for tok in row:
                if tok not in seen:
                    seen.add(tok)
                    stream.append(tok)
        self.streams[req] = stream
        self.gathered[req] = len(self.active(req))

    def extend(self, req: int, cands: list[int], valid: list[bool]) -> None:
        before = set(self.active(req))
        seen: set[int] = set()
        for tok, ok in zip(cands, valid, strict=True):
            if ok and tok not in seen:
                seen.add(tok)
                self.streams[req].append(tok)
        # Only tokens absent before the step are gathered; one evicted and re-added in the same step
        # keeps its packed row.
        self.gathered[req] += len(set(self.active(req)) - before)
