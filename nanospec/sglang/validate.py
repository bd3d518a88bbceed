"""Refuse requests a NANOSPEC server cannot serve, before they reach the scheduler.

SGLang 0.5.23 checks some of a request in the tokenizer process and trusts the rest: a prompt token id
outside the vocabulary (``/generate`` with ``input_ids``, ``/v1/completions`` with a token-id prompt)
raises IndexError inside the scheduler (the embedding lookup, and NanoSpec's vocabulary state, index
with it), and SGLang then tears the whole server down. This module checks a tokenized request against
the model and raises ``ValueError`` naming the problem; SGLang's HTTP layer answers a ValueError from
the tokenizer manager with HTTP 400 (``/generate``, ``/v1/completions``, ``/v1/chat/completions``), and
the request never reaches the scheduler. What is refused:

* prompt: empty, a token id that is not an integer, negative or ``>= vocab_size``, or as long as the
  context length or longer (unless the server truncates, ``--allow-auto-truncate``);
* sampling parameters: keys SGLang's ``SamplingParams`` does not have (SGLang raises TypeError, which
  its HTTP layer does not map to 400), a NaN or infinite number anywhere (SGLang's own range checks
  miss ``logit_bias`` values and integer fields), integer fields that are not integers
  (``max_new_tokens``, ``min_new_tokens``, ``top_k``, ``n``), a negative ``max_new_tokens`` or
  ``min_new_tokens``, and token ids in ``stop_token_ids`` / ``logit_bias`` outside the vocabulary
  (an out-of-range stop token id with ``min_new_tokens`` crashes the scheduler's penalizer too).

The checks are plain functions (``check_prompt``, ``check_sampling_params``, ``check_request``);
``before_validate_one_request`` is the BEFORE hook on ``TokenizerManager._validate_one_request`` that
``nanospec.sglang.register`` installs. It acts on NANOSPEC servers only: a plain or EAGLE3 server in
the same environment keeps SGLang's own behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Real

NAME = "NANOSPEC"  # nanospec.sglang.algo.NAME (this module imports no SGLang code at import time)
INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "stream_interval", "beam_width")
REAL_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
SHOWN_IDS = 5  # offending token ids quoted in a message


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _bad_ids(ids: Iterable, vocab_size: int) -> list:
    return [t for t in ids if not _is_int(t) or not 0 <= t < vocab_size]


def _describe(bad: list) -> str:
    shown = ", ".join(repr(t) for t in bad[:SHOWN_IDS])
    return shown + (f" and {len(bad) - SHOWN_IDS} more" if len(bad) > SHOWN_IDS else "")


def check_prompt(input_ids, *, vocab_size: int, context_len: int | None = None, reserved: int = 0,
                 truncate: bool = False) -> None:
    """ValueError unless ``input_ids`` is a non-empty list of token ids in ``[0, vocab_size)`` that
    (with ``reserved`` tokens) is shorter than ``context_len``; ``truncate`` skips the length check
    (SGLang then cuts the prompt itself)."""
    if input_ids is None or not hasattr(input_ids, "__len__"):
        raise ValueError(f"the prompt must be a list of token ids, got {type(input_ids).__name__}")
    if len(input_ids) == 0:
        raise ValueError("the prompt is empty: input_ids must hold at least one token id")
    bad = _bad_ids(input_ids, vocab_size)
    if bad:
        raise ValueError(f"input_ids holds {len(bad)} token id(s) outside the vocabulary [0, {vocab_size}): "
                         f"{_describe(bad)}")
    if context_len is not None and not truncate and len(input_ids) + reserved >= context_len:
        raise ValueError(f"the prompt has {len(input_ids)} tokens (+{reserved} reserved); the context length "
                         f"is {context_len} tokens")


def _non_finite(value, path: str) -> str | None:
    """Where (a dotted path) ``value`` holds a NaN or infinite number, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Real):
        return None if math.isfinite(value) else path
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = _non_finite(v, f"{path}.{k}")
            if found:
                return found
    elif isinstance(value, list | tuple | set):
        for i, v in enumerate(value):
            found = _non_finite(v, f"{path}[{i}]")
            if found:
                return found
    return None


def sampling_fields() -> frozenset[str]:
    """Every keyword SGLang's ``SamplingParams`` accepts (its struct fields, internal ones included,
    so nothing SGLang itself sends is refused)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    return frozenset(SamplingParams.__struct_fields__)


def check_sampling_params(params: Mapping | None, *, vocab_size: int,
                          known: Iterable[str] | None = None) -> None:
    """ValueError naming the first problem of a request's ``sampling_params`` (see the module doc).

    known: the accepted keys (default: ``sampling_fields()``).
    """
    if params is None:
        return
    if not isinstance(params, Mapping):
        raise ValueError(f"sampling_params must be an object, got {type(params).__name__}")
    known = frozenset(known) if known is not None else sampling_fields()
    unknown = sorted(str(k) for k in params if k not in known)
    if unknown:
        raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
    where = _non_finite(dict(params), "sampling_params")
    if where:
        raise ValueError(f"{where} is not a finite number")
    for key in INT_FIELDS:
        value = params.get(key)
        if value is not None and not _is_int(value):
            raise ValueError(f"sampling_params.{key} must be an integer, got {value!r}")
    for key in REAL_FIELDS:
        value = params.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            raise ValueError(f"sampling_params.{key} must be a number, got {value!r}")
    for key in ("max_new_tokens", "min_new_tokens"):
        value = params.get(key)
        if value is not None and value < 0:
            raise ValueError(f"sampling_params.{key} must be >= 0, got {value}")
    stop_ids = params.get("stop_token_ids")
    if stop_ids is not None:
        if isinstance(stop_ids, str | bytes) or not isinstance(stop_ids, Iterable):
            raise ValueError(f"sampling_params.stop_token_ids must be a list of token ids, got {stop_ids!r}")
        bad = _bad_ids([t for t in stop_ids if t is not None], vocab_size)
        if bad:
            raise ValueError(f"sampling_params.stop_token_ids holds token id(s) outside the vocabulary "
                             f"[0, {vocab_size}): {_describe(bad)}")
    bias = params.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise ValueError(f"sampling_params.logit_bias must map token ids to numbers, got {bias!r}")
        bad = [k for k in bias if not str(k).lstrip("-").isdigit() or not 0 <= int(k) < vocab_size]
        if bad:
            raise ValueError(f"sampling_params.logit_bias has key(s) outside the vocabulary "
                             f"[0, {vocab_size}): {_describe(bad)}")
        values = [v for v in bias.values() if isinstance(v, bool) or not isinstance(v, Real)]
        if values:
            raise ValueError(f"sampling_params.logit_bias values must be numbers, got {_describe(values)}")


def check_request(obj, input_ids, *, vocab_size: int, context_len: int | None = None, reserved: int = 0,
                  truncate: bool = False, known: Iterable[str] | None = None) -> None:
    """Both checks for one tokenized generate request (``GenerateReqInput``-like ``obj``). Requests
    with input embeddings or multimodal data skip the prompt-id check: their ids carry placeholder
    values that the model replaces before any lookup."""
    check_sampling_params(getattr(obj, "sampling_params", None), vocab_size=vocab_size, known=known)
    if getattr(obj, "input_embeds", None) is not None:
        return
    has_mm = getattr(obj, "contains_mm_input", None)
    if callable(has_mm) and has_mm():
        return
    check_prompt(input_ids, vocab_size=vocab_size, context_len=context_len, reserved=reserved,
                 truncate=truncate)


def serves_nanospec(manager) -> bool:
    """Whether a TokenizerManager belongs to a NANOSPEC server."""
    algo = getattr(getattr(manager, "server_args", None), "speculative_algorithm", None)
    return isinstance(algo, str) and algo.upper() == NAME


_known_cache: list[frozenset[str]] = []


def before_validate_one_request(manager, obj, input_ids, *args, **kwargs):
    """BEFORE hook on ``TokenizerManager._validate_one_request(obj, input_ids)``: refuse what a
    NANOSPEC server cannot serve (ValueError, which SGLang answers with HTTP 400)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not serves_nanospec(manager) or not isinstance(obj, GenerateReqInput):
        return None
    if not _known_cache:
        _known_cache.append(sampling_fields())
    check_request(obj, input_ids, vocab_size=int(manager.model_config.vocab_size),
                  context_len=getattr(manager, "context_len", None),
                  reserved=int(getattr(manager, "num_reserved_tokens", 0) or 0),
                  truncate=bool(getattr(manager, "allow_auto_truncate", False)), known=_known_cache[0])
    return None
