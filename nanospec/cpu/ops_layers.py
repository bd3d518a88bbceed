"""RMSNorm and rotary embedding for SGLang's float32 CPU path with fewer PyTorch ops per call.

Without AMX, SGLang 0.5.23 runs ``RMSNorm`` and ``RotaryEmbedding`` through their ``forward_native``,
a dozen small ops each (casts, views, a ``cat`` with an empty pass-through part, the same rotation done
for the query and the key separately). In a decode step of a small model every op is a few microseconds
of dispatch on a one-row tensor: SmolLM2-135M's 61 norms and 30 rotary calls cost about 10 ms of a
50 ms step. These do the same arithmetic in the same order, so the results are bitwise equal to
``forward_native`` (tests/test_patches_layers.py), with 2 ops per norm and about 10 per rotary call.

``NANOSPEC_CPU_LAYERS``: ``fused`` (default) or ``sglang`` (SGLang's own ``forward_native``, the old path).
"""

from __future__ import annotations

import torch

from nanospec.cpu import switch

ENV = "NANOSPEC_CPU_LAYERS"
MODES = ("fused", "sglang")


def mode() -> str:
    """The norm/rotary path chosen by ``NANOSPEC_CPU_LAYERS``; an unknown value is an error."""
    return switch.choice(ENV, MODES)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] float32 (plus residual [T, H] float32: summed first, the sum is the new residual) ->
    rmsnorm(x) * weight [T, H], or (that, new residual). ``F.rms_norm`` reduces in the same order as
    SGLang's ``x.pow(2).mean(-1)``."""
    if residual is None:
        return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)
    s = x + residual
    return torch.nn.functional.rms_norm(s, weight.shape, weight, eps), s


def rope_usable(query: torch.Tensor, key: torch.Tensor, cache: torch.Tensor, head_size: int,
                rotary_dim: int) -> bool:
    """Whether ``rope`` serves this call: float32 CPU tensors, whole heads, an even rotary part."""
    return (query.dtype == key.dtype == cache.dtype == torch.float32 and query.device.type == "cpu"
            and query.shape[-1] % head_size == 0 and key.shape[-1] % head_size == 0
            and query.shape[0] == key.shape[0] and rotary_dim % 2 == 0 and rotary_dim <= head_size
            and cache.shape[-1] == rotary_dim)


def rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cache: torch.Tensor,
         head_size: int, rotary_dim: int, neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of query [T, Hq*D] and key [T, Hk*D] (or [T, H, D]) at positions [T] int,
    with cache [max_pos, rotary_dim] float32 (cos half, then sin half). The first ``rotary_dim`` of each
    head rotate (neox: halves; else interleaved pairs), the rest pass. Query and key rotate as one
    tensor. Returns new tensors shaped like query and key."""
    t = positions.numel()
    cos, sin = cache.index_select(0, positions.reshape(-1)).unsqueeze(-2).chunk(2, dim=-1)  # [T, 1, R/2]
    hq = query.shape[-1] // head_size if query.dim() == 2 else query.shape[-2]
    qk = torch.cat((query.reshape(t, -1, head_size), key.reshape(t, -1, head_size)), dim=1)  # [T, H, D]
    half = rotary_dim // 2
    if neox:
        x1, x2 = qk[..., :half], qk[..., half:rotary_dim]
    else:
        x1, x2 = qk[..., 0:rotary_dim:2], qk[..., 1:rotary_dim:2]
    # SGLang's apply_rotary_emb: o1 = x1*cos - x2*sin, o2 = x2*cos + x1*sin, each product rounded.
    o1 = torch.mul(x1, cos).sub_(x2 * sin)
    o2 = torch.mul(x2, cos).add_(x1 * sin)
    if neox:
        rotated = (o1, o2) if rotary_dim == head_size else (o1, o2, qk[..., rotary_dim:])
        out = torch.cat(rotated, dim=-1)
    else:
        out = torch.stack((o1, o2), dim=-1).flatten(-2)
        if rotary_dim < head_size:
            out = torch.cat((out, qk[..., rotary_dim:]), dim=-1)
    return out[:, :hq].reshape(query.shape), out[:, hq:].reshape(key.shape)
