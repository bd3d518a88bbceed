"""Float32 linear layers of few rows on CPU: NanoSpec's kernel (gemv.py) or oneDNN with each weight
reordered ("prepacked") once, instead of MKL.

PyTorch's ``F.linear`` in float32 goes to MKL, whose small-M GEMM was slow on the project's first CPU (an
AVX2 AMD EPYC): a [4, 896] x [896, 9728] product (a Qwen2.5-0.5B MLP matrix) took 5.3 ms against 2.6 ms
for one row, so verifying 4 draft tokens cost about two decode steps. Few-row products are bound by
reading the weight; the kernel and oneDNN's blocked layout run 1 to 8 rows in not much more than the
time of one (docs/cpu.md has the measurements on each CPU). Outputs are float32 like before; only the
summation order differs (a few ulp).

``NANOSPEC_CPU_LINEAR``: ``gemv`` (default: up to ``MAX_ROWS`` rows, and every row of a decode step or a
target-verify, through NanoSpec's own kernel, nanospec/cpu/gemv.py, where it builds; else as ``onednn``),
``onednn`` (up to ``MAX_ROWS`` rows through oneDNN) or ``mkl`` (PyTorch's ``F.linear``, the old path).
The kernel sums each output in one order for any row count, so a verify gives the logits of the decode
step bit for bit and an exact tie (penalties can make one) is broken the same way in both; with
``onednn`` a batch of over ``MAX_ROWS`` rows goes to MKL, which sums in another order.

``NANOSPEC_CPU_DRAFT_WEIGHTS``: ``bfloat16`` (default) or ``float32``. A speculative draft's layers run
every cycle and, a few rows at a time, are bound by reading their weights (69 MB for Qwen2.5-Coder's
one-layer EAGLE-3 draft); with ``bfloat16`` the kernel reads a bfloat16 copy of each linear layer of a
draft model (``mark_draft_layers``; its LM head and embeddings keep float32), half the bytes, widened to
float32 as it is loaded. The draft proposes slightly different tokens; the target verifies them as
before, so outputs are unchanged. Prefill-sized products keep the float32 weight.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from nanospec.cpu import gemv, switch

ENV = "NANOSPEC_CPU_LINEAR"
MODES = ("gemv", "onednn", "mkl")
DRAFT_ENV = "NANOSPEC_CPU_DRAFT_WEIGHTS"
DRAFT_MODES = ("bfloat16", "float32")
_DRAFT = "_nanospec_draft_layer"  # set on a draft model's linear layers by mark_draft_layers
_BF16 = "_nanospec_bf16_weight"
# Row count oneDNN picks its weight layout for; 4 was fastest from 1 to 16 rows (docs/cpu.md).
ROWS_HINT = 4
_CACHE = "_nanospec_onednn_weight"


def mode() -> str:
    """The linear back end chosen by ``NANOSPEC_CPU_LINEAR``; an unknown value is an error."""
    return switch.choice(ENV, MODES)


@functools.cache
def gemv_on() -> bool:
    """Whether products of up to ``MAX_ROWS`` rows go to gemv.py: chosen (``gemv``) and usable here."""
    return mode() == "gemv" and gemv.available()


# Most rows sent through oneDNN. oneDNN keeps a primitive (and its memory) for every row count it meets,
# about 0.5 MiB each per weight shape, and never frees them; prefills come in every size. Decode and
# verify steps (1 to 16 rows per request batch) are where MKL is slow; larger products stay with MKL.
MAX_ROWS = 16


# True while a decode or target-verify forward runs (set by sglang_fixes around ModelRunner.forward): with
# gemv.py on, every product in it takes the kernel whatever its row count (a batch of 48 requests verifies
# 192 rows), so a verify sums each logit as the plain decode step of the same batch would.
_STEP = contextvars.ContextVar("nanospec_decode_or_verify", default=False)


@contextlib.contextmanager
def decode_or_verify():
    """Marks the forward pass run inside as a decode step or a target-verify (see ``_STEP``)."""
    token = _STEP.set(True)
    try:
        yield
    finally:
        _STEP.reset(token)


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` serves x [..., K] @ weight [N, K].T (float32 CPU tensors, plain layout)."""
    return (isinstance(weight, torch.Tensor) and x.device.type == "cpu" and weight.device.type == "cpu"
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.layout == torch.strided and x.shape[-1] == weight.shape[1])


@functools.cache
def draft_bf16() -> bool:
    """Whether a draft model's linear layers take the kernel with bfloat16 weights (``DRAFT_ENV``)."""
    return switch.choice(DRAFT_ENV, DRAFT_MODES) == "bfloat16"


def mark_draft_layers(layers) -> int:
    """Mark ``layers`` (a draft model's linear layers) for bfloat16 weights in the kernel; returns how
    many were marked."""
    n = 0
    for layer in layers:
        layer.__dict__[_DRAFT] = True
        n += 1
    return n


def kernel_weight(owner: object, weight: torch.Tensor) -> torch.Tensor:
    """The weight the kernel reads for ``owner``'s product: a bfloat16 copy of ``weight`` [N, K], kept
    on the layer and made again when the weight changes, for a marked draft layer when ``draft_bf16()``;
    else ``weight``."""
    if not (owner.__dict__.get(_DRAFT) and draft_bf16()):
        return weight
    key = (weight.data_ptr(), weight._version)
    cached = owner.__dict__.get(_BF16)
    if cached is None or cached[0] != key:
        cached = (key, weight.detach().to(torch.bfloat16).contiguous())
        owner.__dict__[_BF16] = cached
    return cached[1]


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
    """x [..., K] float32 @ weight [N, K].T (+ bias [N]) -> [..., N] float32: up to ``MAX_ROWS`` rows
    (any number inside ``decode_or_verify()``) through gemv.py where ``gemv_on()`` (with
    ``kernel_weight``: bfloat16 for a marked draft layer), else up to
    ``MAX_ROWS`` rows through the prepacked copy of ``weight`` kept on ``owner``; more through
    ``F.linear``."""
    kernel = (gemv_on() and weight.is_contiguous()
              and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())))
    # Over MAX_ROWS rows only the kernel may take the product: oneDNN would keep a primitive per row count.
    if x.numel() > MAX_ROWS * x.shape[-1] and not (kernel and _STEP.get()):
        return torch.nn.functional.linear(x, weight, bias)  # before the copy below: prefills skip it
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if rows.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], weight.shape[0])
    if kernel:
        return gemv.linear(rows, kernel_weight(owner, weight), bias).view(*x.shape[:-1], weight.shape[0])
    out = torch.ops.mkldnn._linear_pointwise(rows, packed_weight(owner, weight), bias, "none", [], "")
    return out.view(*x.shape[:-1], weight.shape[0])
