"""Launch-time settings of the NANOSPEC algorithm.

SGLang's command line belongs to SGLang, so the plugin reads its own settings from the environment
(inherited by every process SGLang spawns) and, optionally, from a YAML file named by
``NANOSPEC_CONFIG``. Environment variables win over the file; the file wins over the defaults.

    NANOSPEC_K_PRE    top-k of the target at each prompt position      (default 3)
    NANOSPEC_PRE_POSITIONS  the last prompt positions that give it      (default 64; 0: none)
    NANOSPEC_K_VER    top-k of the verify logits on the accepted path  (default 3)
    NANOSPEC_W_MAX    window length = packed head width                (default 3072)
    NANOSPEC_SOURCES  full | context | extension                       (default full)
    NANOSPEC_GATHER   async | indexed                                  (default async)
    NANOSPEC_HEAD     auto | packed | union | full  (per-batch head choice, see policy.py)
    NANOSPEC_STEPS    auto | fixed  (auto: the cost-aware draft-step controller, nanospec/controller.py,
                      choosing 0..--speculative-num-steps per batch; fixed: always the full chain)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nanospec.config import NanoSpecConfig

HEADS = ("auto", "packed", "union", "full")
STEPS = ("auto", "fixed")
KEYS = ("k_pre", "k_ver", "pre_positions", "w_max", "sources", "gather", "head", "steps")
INT_KEYS = ("k_pre", "k_ver", "pre_positions", "w_max")
ENV_PREFIX = "NANOSPEC_"


@dataclass(frozen=True)
class Settings:
    """Everything the plugin needs besides SGLang's own server arguments."""

    vocab: NanoSpecConfig = field(default_factory=NanoSpecConfig)
    head: str = "auto"
    steps: str = "auto"

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"NANOSPEC head must be one of {HEADS}, got {self.head!r}")
        if self.steps not in STEPS:
            raise ValueError(f"NANOSPEC steps must be one of {STEPS}, got {self.steps!r}")

    def describe(self) -> str:
        v = self.vocab
        return (f"k_pre={v.k_pre} k_ver={v.k_ver} pre_positions={v.pre_positions} w_max={v.w_max} "
                f"sources={v.sources} gather={v.gather} head={self.head} steps={self.steps}")


def _read_file(path: str) -> dict:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"NANOSPEC_CONFIG={path!r} is not a file")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"NANOSPEC_CONFIG {path!r} must hold a mapping, got {type(data).__name__}")
    data = data.get("nanospec", data)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"NANOSPEC_CONFIG {path!r} has unknown keys {unknown}; known: {list(KEYS)}")
    return dict(data)


def _as_int(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"NANOSPEC {key} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"NANOSPEC {key} must be an integer, got {value!r}") from None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``NANOSPEC_CONFIG`` (YAML) and ``NANOSPEC_*`` variables; ValueError if invalid."""
    env = os.environ if environ is None else environ
    raw: dict = {}
    if env.get(ENV_PREFIX + "CONFIG"):
        raw.update(_read_file(env[ENV_PREFIX + "CONFIG"]))
    for key in KEYS:
        name = ENV_PREFIX + key.upper()
        if env.get(name, "") != "":
            raw[key] = env[name]
    for key in INT_KEYS:
        if key in raw:
            raw[key] = _as_int(key, raw[key])
    for key in ("sources", "gather", "head", "steps"):
        if key in raw:
            raw[key] = str(raw[key]).strip().lower()
    head = raw.pop("head", "auto")
    steps = raw.pop("steps", "auto")
    return Settings(vocab=NanoSpecConfig(**raw), head=head, steps=steps)


def check_against_model(settings: Settings, *, vocab_size: int, eagle_topk: int) -> None:
    """Settings that only make sense for a given model and draft tree; ValueError naming the problem."""
    v = settings.vocab
    for key in ("k_pre", "k_ver"):
        if getattr(v, key) > vocab_size:
            raise ValueError(f"NANOSPEC {key}={getattr(v, key)} exceeds the vocabulary size {vocab_size}")
    if v.w_max < eagle_topk:
        raise ValueError(
            f"NANOSPEC w_max={v.w_max} is smaller than --speculative-eagle-topk={eagle_topk}: the draft "
            "takes its top-k over the packed columns"
        )
