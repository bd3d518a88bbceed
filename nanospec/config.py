"""Settings of the dynamic draft vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

SOURCES = ("full", "context", "extension")
GATHERS = ("async", "indexed")


def _positive_int(name: str, value: object) -> None:
    # bool is an int subclass; True as a window size is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"NanoSpecConfig.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class NanoSpecConfig:
    """Per-request dynamic vocabulary settings.

    k_pre: target top-k candidates taken at each of the last ``pre_positions`` prompt positions at prefill.
    pre_positions: how many of the prompt's last positions contribute their top-K_pre (0: none). Each
        costs a row of the target's LM head at prefill (the target itself computes only the last), about
        1 ms per position for SmolLM2 on this project's CPU; MT-bench coverage (SmolLM2, 16 answers):
        81.6 % from every position, 81.2 % from the last 64, 78.8 % from none (docs/results.md).
    k_ver: target top-k candidates taken from the verify logits of the accepted branch each step.
    w_max: window length; the active vocabulary is the distinct tokens of the last w_max stream entries.
    sources: which candidates enter the stream: "full" (prompt context and extensions), "context"
        (prompt tokens and accepted tokens only) or "extension" (top-k candidates and draft tokens only).
    gather: "async" keeps a packed per-request copy of the active LM-head rows, filled on a side
        stream; "indexed" gathers the rows inside every logits call (the ablation baseline).
    """

    k_pre: int = 3
    k_ver: int = 3
    pre_positions: int = 64
    w_max: int = 3072
    sources: str = "full"
    gather: str = "async"

    def __post_init__(self) -> None:
        for name in ("k_pre", "k_ver", "w_max"):
            _positive_int(name, getattr(self, name))
        n = self.pre_positions
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"NanoSpecConfig.pre_positions must be a non-negative integer, got {n!r}")
        if self.sources not in SOURCES:
            raise ValueError(f"NanoSpecConfig.sources must be one of {SOURCES}, got {self.sources!r}")
        if self.gather not in GATHERS:
            raise ValueError(f"NanoSpecConfig.gather must be one of {GATHERS}, got {self.gather!r}")
