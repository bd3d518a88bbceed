"""Float32 linear layers on CPU through oneDNN, with each weight reordered ("prepacked") once.

PyTorch's ``F.linear`` in float32 goes to MKL, whose small-M GEMM is slow on this project's CPUs:
a [4, 896] x [896, 9728] product (a Qwen2.5-0.5B MLP matrix) took 5.3 ms against 2.6 ms for one
row, so verifying 4 draft tokens cost about two decode steps. oneDNN on a weight reordered into its
blocked layout runs 1 to 16 rows in about the time of one (1.2-1.4 ms there; 17-27 GB/s of weight
read, where this host reads memory at about 35). Only products of at most ``MAX_ROWS`` rows take
this path (below). Outputs are float32 like before; only the summation order differs (a few ulp).

``NANOSPEC_CPU_LINEAR``: ``onednn`` (default), ``gemv`` (one-row products, i.e. decode and draft steps,
through NanoSpec's own kernel, nanospec/cpu/gemv.py, which reads the weight faster; 2 to ``MAX_ROWS``
rows through oneDNN) or ``mkl`` (PyTorch's ``F.linear``, the old path). ``gemv`` is opt-in: a decode
step and a verify then sum the same logits in different orders, and at an exact tie (penalties can make
one) a speculative method can pick another token than plain decoding (docs/cpu.md).
"""

from __future__ import annotations

import functools

import torch

from nanospec.cpu import gemv, switch

ENV = "NANOSPEC_CPU_LINEAR"
MODES = ("onednn", "gemv", "mkl")
# Row count oneDNN picks its weight layout for; 4 was fastest from 1 to 16 rows (docs/cpu.md).
ROWS_HINT = 4
_CACHE = "_nanospec_onednn_weight"


def mode() -> str:
    """The linear back end chosen by ``NANOSPEC_CPU_LINEAR``; an unknown value is an error."""
    return switch.choice(ENV, MODES)


@functools.cache
def gemv_on() -> bool:
    """Whether one-row products go to gemv.py: chosen (``gemv``) and usable on this host."""
    return mode() == "gemv" and gemv.available()


# Most rows sent through oneDNN. oneDNN keeps a primitive (and its memory) for every row count it meets,
# about 0.5 MiB each per weight shape, and never frees them; prefills come in every size. Decode and
# verify steps (1 to 16 rows per request batch) are where MKL is slow; larger products stay with MKL.
MAX_ROWS = 16


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` serves x [..., K] @ weight [N, K].T (float32 CPU tensors, plain layout)."""
    return (isinstance(weight, torch.Tensor) and x.device.type == "cpu" and weight.device.type == "cpu"
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.layout == torch.strided and x.shape[-1] == weight.shape[1])


def packed_weight(owner: object, weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's reordered copy of weight [N, K], cached on ``owner`` (the layer) and made again when
    the weight's storage or version changes (a weight reload)."""
    key = (weight.data_ptr(), weight._version)
    cached = owner.__dict__.get(_CACHE)
    if cached is None or cached[0] != key:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        cached = (key, packed)
        owner.__dict__[_CACHE] = cached
    return cached[1]


def linear(owner: object, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] float32 @ weight [N, K].T (+ bias [N]) -> [..., N] float32: one row through gemv.py
    (``gemv_on()``), up to ``MAX_ROWS`` rows through the prepacked copy of ``weight`` kept on ``owner``,
    more through ``F.linear``."""
    if x.numel() > MAX_ROWS * x.shape[-1]:  # before the copy below: a prefill need not pay for it
        return torch.nn.functional.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if rows.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], weight.shape[0])
    if (rows.shape[0] == 1 and gemv_on() and weight.is_contiguous()
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))):
        return gemv.gemv(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    out = torch.ops.mkldnn._linear_pointwise(rows, packed_weight(owner, weight), bias, "none", [], "")
    return out.view(*x.shape[:-1], weight.shape[0])
