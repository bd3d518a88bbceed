"""Decode and verify attention through NanoSpec's C kernel (nanospec/cpu/attention.c via ops_attention.py):
the PyTorch path as the oracle, the same bits for a query in a decode step and in a verify, bad indices.
(The loop-reference tests of both paths are tests/test_patches_ops.py's.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nanospec.cpu import native, ops_attention

pytestmark = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA CPU or C compiler here")


@pytest.fixture
def build(native_build, monkeypatch):
    """Each build of the kernels (conftest.native_build), with the attention kernel chosen."""
    monkeypatch.setattr(ops_attention, "NATIVE", True)
    return native_build


def _cache(H, Hkv, D, pool=4096, rows=4, width=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(pool, Hkv, D, generator=g), torch.randn(pool, Hkv, D, generator=g)
    r2t = torch.randperm(pool, generator=g).view(rows, -1)[:, :width].int().contiguous()
    return g, kc, vc, r2t


def _decode(q, kc, vc, r2t, row, seq, scale=0.125, window=0):
    o = torch.empty_like(q)
    loc = torch.zeros(q.shape[0], dtype=torch.long)
    ops_attention.decode_attention_cpu(q, kc, vc, 1.0, 1.0, o, None, None, loc, None, r2t, torch.tensor(row),
                                       torch.tensor(seq), scale, 0.0, False, window)
    return o


def _extend(q, kc, vc, r2t, rows, seq, ext, k_new=None, v_new=None, mask=None, causal=True, scale=0.125,
            window=0):
    ext_t = torch.tensor(ext)
    o = torch.empty(q.shape[0], q.shape[1], vc.shape[2])
    start = torch.cumsum(ext_t, 0) - ext_t
    ops_attention.extend_attention_cpu(q, k_new, v_new, o, kc, vc, 1.0, 1.0, r2t, torch.tensor(rows),
                                       torch.tensor(seq), ext_t, start, max(ext), scale, 0.0, False, window,
                                       None, None, mask, causal)
    return o


@pytest.mark.parametrize("H,Hkv,D", [(9, 3, 64), (4, 4, 80), (14, 2, 64), (2, 1, 8)])
def test_a_query_gets_the_same_bits_in_a_decode_step_and_in_every_row_of_a_verify(build, monkeypatch, H, Hkv,
                                                                                  D):
    """A verify's logits must be the decode step's bit for bit, or an exact tie between two tokens could make
    a speculative method pick another token than plain decoding (gemv.c keeps the linear layers so)."""
    g, kc, vc, r2t = _cache(H, Hkv, D, seed=H + D)
    P, E = 301, 6
    q = torch.randn(E, H, D, generator=g)
    alone = torch.cat([_decode(q[i:i + 1], kc, vc, r2t, [2], [P + i + 1]) for i in range(E)])
    assert torch.equal(_extend(q, kc, vc, r2t, [2], [P + E], [E]), alone)
    chain = torch.ones(E, E, dtype=torch.bool).tril()  # a tree mask that is a chain: the causal rule
    assert torch.equal(_extend(q, kc, vc, r2t, [2], [P + E], [E], mask=chain.reshape(-1)), alone)
    full = torch.cat([torch.ones(E, P, dtype=torch.bool), chain], 1)  # FULL_MASK layout
    assert torch.equal(_extend(q, kc, vc, r2t, [2], [P + E], [E], mask=full.reshape(-1)), alone)
    # Among other requests of another length, and on two threads with every call split between them.
    other = torch.randn(3, H, D, generator=g)
    batch = _extend(torch.cat([other, q]), kc, vc, r2t, [0, 2], [40, P + E], [3, E])
    assert torch.equal(batch[3:], alone)
    monkeypatch.setattr(ops_attention, "ONE_THREAD_WORK", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(_extend(q, kc, vc, r2t, [2], [P + E], [E]), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("seq,ext", [([700], [1]), ([5, 900, 33], [1, 1, 1]), ([64], [16]),
                                     ([12, 500], [3, 7])])
@pytest.mark.parametrize("mask_kind", ["causal", "qlen", "noncausal", "window"])
def test_kernel_matches_the_pytorch_path(build, monkeypatch, seq, ext, mask_kind):
    H, Hkv, D = 6, 2, 80  # 80: a head size with a partial vector at the end on both builds
    g, kc, vc, r2t = _cache(H, Hkv, D, seed=len(seq) + sum(ext))
    q = torch.randn(sum(ext), H, D, generator=g)
    k_new, v_new = torch.randn(sum(ext), Hkv, D, generator=g), torch.randn(sum(ext), Hkv, D, generator=g)
    mask = None
    if mask_kind == "qlen":
        mask = torch.cat([((torch.rand(e, e, generator=g) < 0.5).tril() | torch.eye(e, dtype=torch.bool))
                          .reshape(-1) for e in ext])
    args = dict(k_new=k_new, v_new=v_new, mask=mask, causal=mask_kind != "noncausal",
                window=37 if mask_kind == "window" else 0)
    rows = list(range(len(seq)))
    got = _extend(q, kc, vc, r2t, rows, seq, ext, **args)
    monkeypatch.setattr(ops_attention, "NATIVE", False)
    want = _extend(q, kc, vc, r2t, rows, seq, ext, **args)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)


def test_longer_extends_keep_the_pytorch_path(monkeypatch):
    calls = []
    monkeypatch.setattr(ops_attention, "native_attention", lambda *a: calls.append(1))
    g, kc, vc, r2t = _cache(2, 1, 8)
    E = ops_attention.NATIVE_MAX_EXTEND + 1
    _extend(torch.randn(E, 2, 8, generator=g), kc, vc, r2t, [1], [E + 3], [E])
    assert not calls
    _extend(torch.randn(E - 1, 2, 8, generator=g), kc, vc, r2t, [1], [E + 3], [E - 1])
    assert calls == [1]


@pytest.mark.parametrize("bad", ["slot", "store", "row", "length"])
def test_bad_indices_raise_a_clear_error_and_leave_the_cache_untouched(bad):
    H, Hkv, D = 4, 2, 16
    g, kc, vc, r2t = _cache(H, Hkv, D, pool=64, rows=2, width=32)
    kc0, vc0 = kc.clone(), vc.clone()
    q, key, value = torch.randn(1, H, D), torch.randn(1, Hkv, D), torch.randn(1, Hkv, D)
    loc, row, seq = torch.tensor([int(r2t[1, 9])]), torch.tensor([1]), torch.tensor([10])
    if bad == "slot":
        r2t[1, 3] = 64
    elif bad == "store":
        loc = torch.tensor([-1])
    elif bad == "row":
        row = torch.tensor([2])
    else:
        seq = torch.tensor([33])
    want = {"slot": "req_to_token holds a slot outside the KV cache",
            "store": "location to store the new K/V is outside",
            "row": "fall outside req_to_token", "length": "fall outside req_to_token"}[bad]
    with pytest.raises(ValueError, match=want):
        ops_attention.decode_attention_cpu(q, kc, vc, 1.0, 1.0, torch.empty(1, H, D), key, value, loc, None,
                                           r2t, row, seq, 0.25, 0.0)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


def test_the_kernel_is_the_default_and_the_pytorch_path_can_be_chosen():
    code = "from nanospec.cpu import ops_attention as a; print(a.NATIVE)"
    for value, want in ((None, "True"), ("torch", "False"), ("native", "True")):
        env = {k: v for k, v in os.environ.items() if k != ops_attention.ENV}
        if value:
            env[ops_attention.ENV] = value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.stdout.strip() == want, (value, out.stderr[-2000:])


def _amx_backend(pool, r2t_pool):
    """An IntelAMXAttnBackend with only what forward_extend reads (no model runner)."""
    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend

    from nanospec.cpu.registry import OPS

    backend = object.__new__(IntelAMXAttnBackend)
    backend.token_to_kv_pool, backend.req_to_token_pool = pool, r2t_pool
    backend.use_mla, backend.use_sliding_window_kv_pool, backend.swa_out_cache_loc = False, False, None
    backend.extend_attention_fwd = OPS["extend_attention_cpu"]
    return backend


@pytest.mark.parametrize("tree", [False, True])
def test_sglang_forward_extend_lets_the_kernel_store_the_new_kv_with_sglangs_results(monkeypatch, tree):
    """The lean forward_extend (sglang_fixes._fix_intel_amx_backend) skips set_kv_buffer and must leave the
    cache and the output as SGLang's own forward_extend does."""
    import sgl_kernel
    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    if not getattr(sgl_kernel, "__nanospec_fallback__", False):
        pytest.skip("a real sgl_kernel is installed: the fixes are off")
    monkeypatch.setattr(ops_attention, "NATIVE", True)
    lean = IntelAMXAttnBackend.forward_extend
    assert lean.__nanospec__
    H, Hkv, D, P, E = 6, 2, 16, 21, 4
    results = []
    for forward_extend in (lean.__nanospec_original__, lean):
        pool = MHATokenToKVPool(64, 1, torch.float32, Hkv, D, 1, "cpu", False)
        pool.k_buffer[0].copy_(torch.randn(65, Hkv, D, generator=torch.Generator().manual_seed(5)))
        pool.v_buffer[0].copy_(torch.randn(65, Hkv, D, generator=torch.Generator().manual_seed(6)))
        r2t_pool = ReqToTokenPool(4, 32, "cpu", False)
        r2t_pool.req_to_token[2, : P + E] = torch.arange(3, 3 + P + E, dtype=torch.int32)
        backend = _amx_backend(pool, r2t_pool)
        mask = None
        if tree:
            mask = ((torch.rand(E, E, generator=torch.Generator().manual_seed(7)) < 0.5).tril()
                    | torch.eye(E, dtype=torch.bool)).reshape(-1)
        backend.forward_metadata = (None, E)
        backend.extend_metadata = (torch.tensor([P + E]), torch.tensor([E], dtype=torch.int32),
                                   torch.tensor([0], dtype=torch.int32), mask)
        layer = RadixAttention(H, D, 0.25, Hkv, 0)
        batch = type("Batch", (), {"out_cache_loc": torch.arange(3 + P, 3 + P + E), "encoder_lens": None,
                                   "req_pool_indices": torch.tensor([2]), "encoder_out_cache_loc": None})()
        calls = []
        real_set = pool.set_kv_buffer
        pool.set_kv_buffer = lambda *a, _calls=calls, _set=real_set, **kw: _calls.append(1) or _set(*a, **kw)
        gq = torch.Generator().manual_seed(8)
        q, k, v = (torch.randn(E, n, D, generator=gq) for n in (H, Hkv, Hkv))
        q = q.view(E, H * D)
        o = forward_extend(backend, q, k, v, layer, batch)
        results.append((o, pool.k_buffer[0].clone(), pool.v_buffer[0].clone(), bool(calls)))
    (o0, k0, v0, stored0), (o1, k1, v1, stored1) = results
    assert stored0 and not stored1  # SGLang's stores through set_kv_buffer, the lean one in the kernel
    assert torch.equal(o1, o0) and torch.equal(k1, k0) and torch.equal(v1, v0)
