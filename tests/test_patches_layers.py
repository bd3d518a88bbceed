"""RMSNorm and rotary embedding with fewer ops (nanospec/cpu/ops_layers.py) and the two SGLang fixes that
route SGLang's CPU path there: bitwise equal to SGLang's own ``forward_native`` (kept by the fixes as
``__nanospec_original__``), which is the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nanospec.cpu import ops_layers

# Runs in a fresh interpreter so that the .pth start-up hook patches SGLang as a server's process would.
_CHECK = """
    import json, torch
    import sgl_kernel
    import sglang.srt.layers.rotary_embedding.base as rope_base
    rope_base._is_cpu = True  # this process has no --device cpu; SGLang's server sets it
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    def oracle(cls):
        return getattr(cls.forward_native, "__nanospec_original__", cls.forward_native)

    torch.manual_seed(0)
    out = {"fallback": getattr(sgl_kernel, "__nanospec_fallback__", False),
           "patched": [getattr(RMSNorm.forward_native, "__nanospec__", False),
                       getattr(RotaryEmbedding.forward_native, "__nanospec__", False)],
           "norm": [], "rope": []}
    ref_norm, ref_rope = oracle(RMSNorm), oracle(RotaryEmbedding)
    for hidden in (576, 8):
        norm = RMSNorm(hidden, eps=1e-5)
        norm.weight.data = torch.randn(hidden)
        for t in (1, 5):
            x, r = torch.randn(t, hidden) * 3, torch.randn(t, hidden)
            same = torch.equal(norm(x), ref_norm(norm, x))  # norm(x): SGLang's dispatch on this CPU
            (a, ra), (b, rb) = norm(x, r), ref_norm(norm, x, r)
            out["norm"].append(same and torch.equal(a, b) and torch.equal(ra, rb))
    # Calls the fused path does not serve still give SGLang's result.
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    (a, ra), (b, rb) = norm(x, r, post_residual_addition=r), ref_norm(norm, x, r, post_residual_addition=r)
    out["norm_other"] = torch.equal(a, b) and torch.equal(ra, rb)
    cast = RMSNorm(8, eps=1e-5, override_orig_dtype=torch.bfloat16)
    out["norm_other"] &= cast(x).dtype == torch.bfloat16 and torch.equal(cast(x), ref_norm(cast, x))
    for neox in (True, False):
        for rot in (64, 32):
            emb = RotaryEmbedding(64, rot, 512, 10000, neox, torch.float32)
            for t in (1, 7):
                pos = torch.randint(0, 512, (t,))
                q, k = torch.randn(t, 9 * 64), torch.randn(t, 3 * 64)
                (a, b), (c, d) = emb(pos, q, k), ref_rope(emb, pos, q, k)
                off = torch.full((t,), 3)
                (e, f), (g, h) = emb(pos, q, k, off), ref_rope(emb, pos, q, k, off)
                out["rope"].append(all(torch.equal(u, v) and u.shape == v.shape
                                       for u, v in ((a, c), (b, d), (e, g), (f, h))))
    print(json.dumps(out))
"""


def _run(env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHECK)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sglang_norm_and_rotary_take_the_fused_path_and_stay_bitwise_equal():
    out = _run({})
    if not out["fallback"]:
        pytest.skip("the real sgl_kernel loads here: SGLang's own CPU kernels are used")
    assert out["patched"] == [True, True]
    assert out["norm"] == [True] * 4 and out["rope"] == [True] * 8 and out["norm_other"]


def test_switch_restores_sglangs_own_norm_and_rotary():
    out = _run({ops_layers.ENV: "sglang"})
    if not out["fallback"]:
        pytest.skip("the real sgl_kernel loads here: SGLang's own CPU kernels are used")
    assert out["patched"] == [False, False]


def test_rope_keeps_three_dimensional_inputs_and_refuses_other_dtypes():
    cache = torch.randn(16, 8)
    q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    a, b = ops_layers.rope(torch.tensor([1, 5]), q, k, cache, 8, 8, True)
    c, d = ops_layers.rope(torch.tensor([1, 5]), q.reshape(2, -1), k.reshape(2, -1), cache, 8, 8, True)
    assert a.shape == q.shape and b.shape == k.shape
    assert torch.equal(a.reshape(2, -1), c) and torch.equal(b.reshape(2, -1), d)
    assert ops_layers.rope_usable(q, k, cache, 8, 8)
    assert not ops_layers.rope_usable(q.bfloat16(), k.bfloat16(), cache, 8, 8)
    assert not ops_layers.rope_usable(q, k, cache, 8, 6)  # the cache is for another rotary width
