"""The CPU path's environment switches (``NANOSPEC_CPU_LINEAR``, ``NANOSPEC_CPU_LAYERS``): one reader."""

from __future__ import annotations

import os


def choice(env: str, modes: tuple[str, ...]) -> str:
    """The value of ``env`` (case and surrounding blanks ignored), ``modes[0]`` when unset; a value not in
    ``modes`` is an error naming the variable."""
    value = os.environ.get(env, modes[0]).strip().lower()
    if value not in modes:
        raise ValueError(f"{env} must be one of {modes}, got {value!r}")
    return value
