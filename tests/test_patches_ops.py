"""Each pure-PyTorch sgl_kernel op in nanospec/cpu/ against a straightforward loop reference.

The references are written from SGLang 0.5.23's Triton kernels (spec_tree.py, cache_locs.py, eagle.py,
allocation.py, decode/extend attention), one request and one node at a time.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from nanospec.cpu import native, ops_attention, ops_layers, ops_memory, ops_spec

# ---------------------------------------------------------------------------------------------------
# EAGLE draft trees as SGLang builds them (select_top_k_tokens + organize_draft_results).


def make_draft_tree(bs: int, topk: int, steps: int, num_draft: int, gen: torch.Generator):
    """Random draft scores -> (parent_list [bs, n], selected_index [bs, num_draft - 1])."""
    scores_all, parents = [], [torch.arange(-1, topk).repeat(bs, 1)]
    p0 = torch.rand(bs, topk, generator=gen)
    scores = p0
    scores_all.append(p0)
    for i in range(1, steps):
        child = torch.rand(bs, topk, topk, generator=gen)
        expand = scores[:, :, None] * child  # [bs, topk, topk]
        scores_all.append(expand.flatten(1))
        cs_p, cs_idx = torch.topk(expand.flatten(1), topk, dim=-1)
        scores = cs_p
        parents.append(cs_idx + topk * topk * (i - 1) + topk)
    score_list = torch.cat(scores_all, 1)
    top = torch.topk(score_list, num_draft - 1, dim=-1).indices
    selected = torch.sort(top, dim=-1).values
    if len(parents) > 1:
        parent_list = torch.cat(parents[:-1], 1)
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long)
    return parent_list, selected


def ref_build_tree(parent_list, selected, seq_lens, topk, depth, D, mode):
    """Port of sgl_build_tree_kernel_efficient_triton, one request at a time."""
    bs = seq_lens.numel()
    if mode == 0:
        mask = torch.ones(int(seq_lens.sum()) * D + D * D * bs, dtype=torch.bool)
    else:
        mask = torch.ones(D * D * bs, dtype=torch.bool)
    positions = torch.zeros(bs * D, dtype=torch.long)
    ridx = torch.full((bs, D), -1, dtype=torch.long)
    rnext = torch.full((bs, D), -1, dtype=torch.long)
    rsib = torch.full((bs, D), -1, dtype=torch.long)
    prefix_sum = 0
    for b in range(bs):
        seq_len = int(seq_lens[b])
        positions[b * D] = seq_len
        for i in range(D - 1, 0, -1):
            ridx[b, i] = b * D + i
            ptb = int(selected[b, i - 1]) // topk
            parent_pos, found = 0, ptb == 0
            if not found:
                ptok = int(parent_list[b, ptb])
                for pp in range(D - 1):
                    if int(selected[b, pp]) == ptok:
                        parent_pos, found = pp + 1, True
                        break
            if found:
                nxt = int(rnext[b, parent_pos])
                rnext[b, parent_pos] = i
                if nxt != -1:
                    rsib[b, i] = nxt
        ridx[b, 0] = b * D
        for x in range(D):
            if mode == 0:
                t = D * D * b + prefix_sum * D + (seq_len + D) * x + seq_len + 1
            else:
                t = D * D * b + D * x + 1
            mask[t - 1] = True
            mask[t : t + D - 1] = False
            if x > 0:
                cur, position = x - 1, 0
                for _ in range(depth):
                    position += 1
                    mask[t + cur] = True
                    ptb = int(selected[b, cur]) // topk
                    if ptb == 0:
                        break
                    ptok = int(parent_list[b, ptb])
                    nxt = [cp for cp in range(D - 1) if int(selected[b, cp]) == ptok]
                    if not nxt:
                        break
                    cur = nxt[0]
                positions[b * D + x] = position + seq_len
        prefix_sum += seq_len
    return mask, positions, ridx, rnext, rsib


def ref_verify_greedy(candidates, ridx, rnext, rsib, target, S):
    bs, D = candidates.shape
    predicts = torch.zeros(bs * D, dtype=torch.int32)
    accept_index = torch.full((bs, S), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    tflat = target.reshape(-1)
    for b in range(bs):
        last = int(ridx[b, 0])
        accept_index[b, 0] = last
        n, cur = 0, 0
        for _ in range(1, S):
            cur = int(rnext[b, cur])
            tok = int(tflat[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == tok:
                    predicts[last] = tok
                    n += 1
                    accept_index[b, n] = int(ridx[b, cur])
                    last = int(ridx[b, cur])
                    matched = True
                    break
                cur = int(rsib[b, cur])
            if not matched:
                break
        accept_num[b] = n
        predicts[last] = int(tflat[last])
    return predicts, accept_index, accept_num


TREE_CASES = [  # (bs, topk, steps, num_draft)
    (1, 1, 1, 2),  # the controller's usual 1-step chain: an empty parent list
    (3, 1, 1, 2),
    (1, 1, 3, 4),
    (4, 1, 5, 6),
    (1, 4, 3, 8),
    (4, 2, 4, 8),
    (4, 4, 5, 16),
]


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("bs,topk,steps,D", TREE_CASES)
def test_build_tree_matches_reference(bs, topk, steps, D, mode, spec_path):
    gen = torch.Generator().manual_seed(bs * 100 + topk * 10 + steps)
    for _ in range(3):
        parent_list, selected = make_draft_tree(bs, topk, steps, D, gen)
        seq_lens = torch.randint(1, 20, (bs,), generator=gen)
        want = ref_build_tree(parent_list, selected, seq_lens, topk, steps, D, mode)
        mask = torch.ones_like(want[0])
        positions = torch.empty(bs * D, dtype=torch.long)
        ridx, rnext, rsib = torch.full((3, bs, D), -1, dtype=torch.long)
        ops_spec.build_tree_kernel_efficient_cpu(
            parent_list, selected, seq_lens, mask, positions, ridx, rnext, rsib, topk, steps, D, mode
        )
        for got, ref in zip((mask, positions, ridx, rnext, rsib), want, strict=True):
            assert torch.equal(got, ref)
    assert spec_path[1] == (["nanospec_build_tree"] * 3 if spec_path[0] == "kernel" else [])


def test_build_tree_kernel_rejects_a_parent_outside_the_list_and_writes_nothing():
    if not native.available():
        pytest.skip("the C kernels are not built on this host")
    parent_list = torch.tensor([[-1, 0]])
    selected = torch.tensor([[0, 5, 1]])  # 5 // 2 = column 2 of a 2-column parent list
    mask = torch.ones(4 * 4 + 3 * 4, dtype=torch.bool)
    positions = torch.full((4,), 7)
    ridx, rnext, rsib = torch.full((3, 1, 4), -1, dtype=torch.long)
    with pytest.raises(IndexError, match="parent column"):
        ops_spec.build_tree_kernel_efficient_cpu(parent_list, selected, torch.tensor([3]), mask, positions,
                                                 ridx, rnext, rsib, 2, 3, 4, 0)
    assert mask.all() and (positions == 7).all() and (ridx == -1).all()


VERIFY_PATHS = {"kernel": ops_spec.verify_tree_greedy_cpu, "torch": ops_spec.verify_tree_greedy_torch}


@pytest.mark.parametrize("path", list(VERIFY_PATHS))
@pytest.mark.parametrize("bs,topk,steps,D", TREE_CASES + [(3, 1, 0, 1)])
def test_verify_tree_greedy_matches_reference_for_every_accept_length(bs, topk, steps, D, path):
    if path == "kernel" and not native.available():
        pytest.skip("the C kernels are not built on this host")
    gen = torch.Generator().manual_seed(7 + bs + topk + steps)
    S = steps + 1
    seen = set()
    for trial in range(60):
        parent_list, selected = make_draft_tree(bs, topk, steps, D, gen)
        seq_lens = torch.randint(1, 9, (bs,), generator=gen)
        _, _, ridx, rnext, rsib = ref_build_tree(parent_list, selected, seq_lens, topk, steps, D, 1)
        vocab = 2 if trial % 2 else 3  # few distinct tokens: long accepted paths are common
        candidates = torch.randint(0, vocab, (bs, D), generator=gen)
        target = torch.randint(0, vocab, (bs, D), generator=gen)
        if trial % 5 == 0:  # make the target follow the first-child chain: maximal acceptance
            for b in range(bs):
                cur = 0
                while int(rnext[b, cur]) != -1:
                    nxt = int(rnext[b, cur])
                    target[b, cur] = candidates[b, nxt]
                    cur = nxt
        want = ref_verify_greedy(candidates, ridx, rnext, rsib, target, S)
        predicts = torch.zeros(bs * D, dtype=torch.int32)
        accept_index = torch.full((bs, S), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        VERIFY_PATHS[path](predicts, accept_index, accept_num, candidates, ridx, rnext, rsib, target)
        assert torch.equal(predicts, want[0])
        assert torch.equal(accept_index, want[1])
        assert torch.equal(accept_num, want[2])
        seen.update(accept_num.tolist())
    max_len = min(steps, D - 1)
    assert seen == set(range(max_len + 1)), f"accept lengths covered: {sorted(seen)}"


def test_verify_tree_greedy_kernel_rejects_an_index_outside_the_tree_and_writes_nothing():
    if not native.available():
        pytest.skip("the C kernels are not built on this host")
    ridx = torch.tensor([[0, 1, 9]])  # node 2's global id lies past the 3 predictions
    rnext, rsib = torch.tensor([[1, 2, -1]]), torch.full((1, 3), -1)
    predicts, accept_index = torch.zeros(3, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(IndexError, match="outside"):
        ops_spec.verify_tree_greedy_cpu(predicts, accept_index, accept_num,
                                        torch.zeros(1, 3, dtype=torch.long), ridx, rnext, rsib,
                                        torch.zeros(3, dtype=torch.long))
    assert not predicts.any() and bool((accept_index == -1).all()) and not accept_num.any()


# ---------------------------------------------------------------------------------------------------
# KV-slot bookkeeping


def _pool(rows=6, width=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(rows * width, generator=g).view(rows, width).int(), g


@pytest.fixture(params=["kernel", "torch"])
def spec_path(request, monkeypatch):
    """The KV-slot and tree ops through spec.c, then through their tensor twins; yields the C calls made."""
    if request.param == "kernel" and not native.available():
        pytest.skip("the C kernels are not built on this host")
    calls = []
    if request.param == "torch":
        monkeypatch.setattr(native, "available", lambda: False)
    else:
        lib = native.library()
        for name in ("nanospec_kv_segments", "nanospec_fill_bonus", "nanospec_build_tree"):
            real = getattr(lib, name)
            def counted(*a, _real=real, _name=name):
                calls.append(_name)
                return _real(*a)

            monkeypatch.setattr(lib, name, counted)
    return request.param, calls


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("bs", [1, 4])
def test_assign_req_to_token_pool_and_extend_cache_locs_roundtrip(bs, index_dtype, spec_path):
    req_to_token, g = _pool(seed=bs)
    rpi = torch.randperm(6, generator=g)[:bs].to(index_dtype)
    start = torch.randint(0, 10, (bs,), generator=g).to(index_dtype)
    end = start + torch.randint(0, 12, (bs,), generator=g).to(index_dtype)
    total = int((end - start).sum())
    locs = torch.randint(0, 10_000, (total,), generator=g)
    want = req_to_token.clone()
    k = 0
    for b in range(bs):
        n = int(end[b] - start[b])
        want[rpi[b], start[b] : end[b]] = locs[k : k + n].int()
        k += n
    got = req_to_token.clone()
    ops_spec.assign_req_to_token_pool_cpu(rpi, got, start, end, locs, got.shape[1])
    assert torch.equal(got, want)
    out = torch.full((total + 3,), -7, dtype=torch.int64)
    ops_spec.assign_extend_cache_locs_cpu(rpi, got, start, end, out, got.shape[1])
    assert torch.equal(out[:total], locs)
    assert torch.equal(out[total:], torch.full((3,), -7))
    assert spec_path[1] == (["nanospec_kv_segments"] * 2 if spec_path[0] == "kernel" else [])


def test_kv_slot_kernel_rejects_a_range_outside_the_pool_and_writes_nothing():
    if not native.available():
        pytest.skip("the C kernels are not built on this host")
    req_to_token, _ = _pool()
    before = req_to_token.clone()
    for rows, start, end in (([6], [0], [2]), ([0], [39], [41]), ([0], [-1], [1])):
        with pytest.raises(IndexError, match="nothing was written"):
            ops_spec.assign_req_to_token_pool_cpu(torch.tensor(rows), req_to_token, torch.tensor(start),
                                                  torch.tensor(end), torch.arange(2), 40)
        assert torch.equal(req_to_token, before)
    with pytest.raises(IndexError, match="nothing was written"):  # 3 slots, 2 locations
        ops_spec.assign_extend_cache_locs_cpu(torch.tensor([0]), req_to_token, torch.tensor([0]),
                                              torch.tensor([3]), torch.zeros(2, dtype=torch.int64), 40)


@pytest.mark.parametrize("bs,topk,steps", [(1, 1, 3), (4, 1, 5), (1, 4, 3), (4, 2, 4)])
def test_draft_cache_locs_and_decode_metadata(bs, topk, steps):
    req_to_token, g = _pool(width=64, seed=bs + topk)
    rpi = torch.randperm(6, generator=g)[:bs]
    seq = torch.randint(1, 30, (bs,), generator=g)
    out = torch.empty(bs * topk * steps, dtype=torch.int64)
    ops_spec.assign_draft_cache_locs_contiguous_cpu(rpi, req_to_token, seq, out, 64, topk, steps)
    table = ops_spec.build_draft_decode_metadata_cpu(req_to_token, rpi, seq, topk, steps, 64)
    assert table.shape[0] == bs * topk
    view = out.view(bs, topk, steps)
    for b in range(bs):
        row = req_to_token[rpi[b]]
        s = int(seq[b])
        assert torch.equal(out.view(bs, -1)[b], row[s : s + topk * steps].long())
        for k in range(topk):
            t = table[b * topk + k]
            assert torch.equal(t[:s], row[:s])
            assert torch.equal(t[s : s + steps].long(), view[b, k])  # branch k's own draft slots


@pytest.mark.parametrize("bs", [1, 4])
def test_fill_bonus_tokens_and_accept_out_cache_loc(bs, spec_path):
    g = torch.Generator().manual_seed(bs)
    stride = 5
    accept_lens = torch.randint(1, stride + 1, (bs,), generator=g).int()
    for dtype in (torch.int32, torch.int64):  # SGLang's verify output, then another dtype (the twin)
        accept_tokens = torch.randint(0, 100, (bs, stride), generator=g).to(dtype)
        bonus = torch.zeros(bs, dtype=torch.int32)
        ops_spec.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, stride)
        assert bonus.tolist() == [int(accept_tokens[b, accept_lens[b] - 1]) for b in range(bs)]
    assert spec_path[1] == (["nanospec_fill_bonus"] if spec_path[0] == "kernel" else [])

    accept_index = torch.full((bs, stride), -1, dtype=torch.int32)
    for b in range(bs):
        n = int(accept_lens[b])
        accept_index[b, :n] = torch.sort(torch.randperm(bs * stride, generator=g)[:n]).values.int()
    out_cache_loc = torch.randint(0, 1000, (bs * stride,), generator=g)
    got = torch.full((bs * stride,), -1, dtype=torch.int64)
    ops_spec.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
    want = [int(out_cache_loc[i]) for i in accept_index.reshape(-1).tolist() if i != -1]
    assert got[: len(want)].tolist() == want
    assert (got[len(want) :] == -1).all()


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    g = torch.Generator().manual_seed(0)
    bufs = [torch.randn(50, 2, 8, generator=g) for _ in range(4)] + [torch.randn(50, 3, generator=g).half()]
    before = [b.clone() for b in bufs]
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].nbytes for b in bufs], dtype=torch.int64)
    src = torch.tensor([3, 7, 11, 12])
    tgt = torch.tensor([7, 20, 21, 3])  # overlaps a source: sources must be read first
    ops_memory.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for b, old in zip(bufs, before, strict=True):
        want = old.clone()
        want[tgt] = old[src]
        assert torch.equal(b, want)


# ---------------------------------------------------------------------------------------------------
# Attention


def ref_attention_row(q, keys, vals, sm_scale, logit_cap=0.0, sink=None):
    """q [H, D]; keys/vals [L, Hkv, D] -> [H, Dv], one query, plain softmax."""
    H = q.shape[0]
    g = H // keys.shape[1]
    out = []
    for h in range(H):
        k = keys[:, h // g].double()
        s = (k @ q[h].double()) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        if sink is not None:
            s = torch.cat([s, sink[h].double().view(1)])
        p = torch.softmax(s, 0)[: k.shape[0]]
        out.append(p @ vals[:, h // g].double())
    return torch.stack(out)


def _kv_setup(bs, seq, H=4, Hkv=2, D=8, pool=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(pool, Hkv, D, generator=g)
    vc = torch.randn(pool, Hkv, D, generator=g)
    rows = bs + 2
    req_to_token = torch.randperm(pool, generator=g)[: rows * 32].view(rows, 32).int()  # disjoint rows
    rpi = torch.randperm(rows, generator=g)[:bs]
    return g, kc, vc, req_to_token, rpi


@pytest.fixture(params=["native", "torch"])
def attention_path(request, monkeypatch):
    """The attention ops through attention.c (NANOSPEC_CPU_ATTENTION=native), then through the PyTorch
    code; yields (path, calls of the kernel)."""
    if request.param == "native" and not native.available():
        pytest.skip("no C kernels on this host")
    monkeypatch.setattr(ops_attention, "NATIVE", request.param == "native")
    calls = []
    real = ops_attention.native_attention
    monkeypatch.setattr(ops_attention, "native_attention", lambda *a: calls.append(1) or real(*a))
    return request.param, calls


@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("window,cap,use_sink", [(0, 0.0, False), (5, 0.0, False), (0, 2.0, True)])
def test_decode_attention_matches_reference(attention_path, bs, window, cap, use_sink):
    H, Hkv, D = 4, 2, 8
    g, kc, vc, r2t, rpi = _kv_setup(bs, None, seed=bs + window)
    seq = torch.randint(1, 32, (bs,), generator=g)
    q = torch.randn(bs, H, D, generator=g)
    k_new = torch.randn(bs, Hkv, D, generator=g)
    v_new = torch.randn(bs, Hkv, D, generator=g)
    loc = torch.stack([r2t[rpi[b], seq[b] - 1] for b in range(bs)]).long()
    sinks = torch.randn(H, generator=g) if use_sink else None
    o = torch.empty(bs, H, D)
    logits = torch.empty(bs, H, 8, D + 1)
    kc2, vc2 = kc.clone(), vc.clone()
    ops_attention.decode_attention_cpu(
        q, kc2, vc2, 1.0, 1.0, o, k_new, v_new, loc, logits, r2t, rpi, seq, 0.3, cap, False, window, None,
        sinks,
    )  # fmt: skip
    kc[loc], vc[loc] = k_new, v_new
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    for b in range(bs):
        s = int(seq[b])
        lo = max(0, s - window) if window else 0
        slots = r2t[rpi[b], lo:s].long()
        want = ref_attention_row(q[b], kc[slots], vc[slots], 0.3, cap, sinks)
        torch.testing.assert_close(o[b].double(), want, rtol=1e-5, atol=1e-5)
    path, calls = attention_path
    assert bool(calls) == (path == "native" and not cap and not use_sink)  # cap and sinks stay in PyTorch


@pytest.mark.parametrize("seq_len,want_threads", [(31, 1), (ops_attention.ONE_THREAD_WORK // (4 * 8), 2)])
def test_small_attention_runs_on_one_thread_and_restores_the_count(monkeypatch, seq_len, want_threads):
    # One request's decode or verify is too small for two threads to pay off inside a server (docs/cpu.md);
    # a long prefill keeps them, and the caller's thread count is back afterwards. (The PyTorch path;
    # attention.c's choice is tests/test_patches_attention.py's.)
    monkeypatch.setattr(ops_attention, "NATIVE", False)
    H, D = 4, 8
    seen = []
    real = ops_attention._attend
    monkeypatch.setattr(ops_attention, "_attend", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
    g, kc, vc, r2t, rpi = _kv_setup(1, None)
    seq = torch.tensor([seq_len])
    r2t = torch.zeros(1, seq_len, dtype=torch.int32)  # every position reads slot 0 (only the count matters)
    q = torch.randn(1, H, D, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        o = torch.empty(1, H, D)
        ops_attention.decode_attention_cpu(q, kc, vc, 1.0, 1.0, o, None, None, seq - 1, None, r2t,
                                           torch.zeros(1, dtype=torch.long), seq, 0.3, 0.0)
        q_ext = torch.randn(4, H, D, generator=g)
        ops_attention.extend_attention_cpu(q_ext, None, None, torch.empty(4, H, D), kc, vc, 1.0, 1.0, r2t,
                                           torch.zeros(1, dtype=torch.long), seq, torch.tensor([4]),
                                           torch.tensor([0]), 4, 0.3, 0.0)
        assert seen == [want_threads, want_threads] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_layers_switch_sglang_takes_the_general_attention_path_on_all_threads(monkeypatch):
    monkeypatch.setattr(ops_attention, "FAST_PATHS", False)
    monkeypatch.setattr(ops_attention, "_extend_one", lambda *a: pytest.fail("one-request path taken"))
    seen = []
    real = ops_attention._attend
    monkeypatch.setattr(ops_attention, "_attend", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
    H, D = 4, 8
    g, kc, vc, r2t, rpi = _kv_setup(1, None)
    seq = torch.tensor([20])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q_ext = torch.randn(4, H, D, generator=g)
        o = torch.empty(4, H, D)
        ops_attention.extend_attention_cpu(q_ext, None, None, o, kc, vc, 1.0, 1.0, r2t, rpi, seq,
                                           torch.tensor([4]), torch.tensor([0]), 4, 0.3, 0.0)
        assert seen == [2]
    finally:
        torch.set_num_threads(before)
    code = "from nanospec.cpu import ops_attention as a; print(a.FAST_PATHS)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, ops_layers.ENV: "sglang"}, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def _tree_masks(ext, gen):
    """Random ancestor-style masks per request (diagonal set) in both layouts' extend blocks."""
    return [torch.tril(torch.rand(e, e, generator=gen) < 0.5) | torch.eye(e, dtype=torch.bool) for e in ext]


@pytest.mark.parametrize("bs", [1, 4])
@pytest.mark.parametrize("mask_kind", ["causal", "qlen", "full", "noncausal", "window"])
def test_extend_attention_matches_reference(attention_path, bs, mask_kind):
    H, Hkv, D = 4, 2, 8
    g, kc, vc, r2t, rpi = _kv_setup(bs, None, seed=10 * bs + len(mask_kind))
    prefix = torch.randint(0, 24, (bs,), generator=g)
    ext = torch.randint(1, 7, (bs,), generator=g)
    seq = prefix + ext
    start = torch.cumsum(ext, 0) - ext
    N = int(ext.sum())
    q = torch.randn(N, H, D, generator=g)
    k_ext = torch.randn(N, Hkv, D, generator=g)
    v_ext = torch.randn(N, Hkv, D, generator=g)
    for b in range(bs):  # the backend stores the new K/V in the cache before calling the kernel
        slots = r2t[rpi[b], prefix[b] : seq[b]].long()
        kc[slots] = k_ext[start[b] : start[b] + ext[b]]
        vc[slots] = v_ext[start[b] : start[b] + ext[b]]
    masks = _tree_masks(ext.tolist(), g)
    custom = None
    if mask_kind == "qlen":
        custom = torch.cat([m.reshape(-1) for m in masks])
    elif mask_kind == "full":
        custom = torch.cat(
            [torch.cat([torch.ones(int(ext[b]), int(prefix[b]), dtype=torch.bool), masks[b]], 1).reshape(-1)
             for b in range(bs)]
        )  # fmt: skip
    window = 4 if mask_kind == "window" else 0
    o = torch.zeros(N, H, D)
    ops_attention.extend_attention_cpu(
        q, k_ext, v_ext, o, kc, vc, 1.0, 1.0, r2t, rpi, seq, ext, start, int(ext.max()), 0.25, 0.0,
        False, window, None, None, custom, mask_kind != "noncausal",
    )  # fmt: skip
    for b in range(bs):
        P, E = int(prefix[b]), int(ext[b])
        for i in range(E):
            cols = list(range(P))
            for j in range(E):
                if mask_kind in ("qlen", "full"):
                    ok = bool(masks[b][i, j])
                elif mask_kind == "noncausal":
                    ok = True
                else:
                    ok = j <= i
                if ok:
                    cols.append(P + j)
            if window:
                cols = [c for c in cols if c > P + i - window]
            slots = r2t[rpi[b], cols].long()
            want = ref_attention_row(q[start[b] + i], kc[slots], vc[slots], 0.25)
            torch.testing.assert_close(o[start[b] + i].double(), want, rtol=1e-5, atol=1e-5)
    assert bool(attention_path[1]) == (attention_path[0] == "native")


@pytest.mark.parametrize("bs", [1, 3])
def test_extend_attention_uses_the_given_new_keys_not_the_cached_ones(attention_path, bs):
    H, Hkv, D = 4, 2, 8
    g, kc, vc, r2t, rpi = _kv_setup(bs, None, seed=7 + bs)
    ext = torch.full((bs,), 3)
    seq = torch.randint(4, 20, (bs,), generator=g)
    start = torch.cumsum(ext, 0) - ext
    q = torch.randn(3 * bs, H, D, generator=g)
    k_ext, v_ext = torch.randn(3 * bs, Hkv, D, generator=g), torch.randn(3 * bs, Hkv, D, generator=g)
    outs = []
    for cached in (True, False):
        kc2, vc2 = kc.clone(), vc.clone()
        for b in range(bs):
            slots = r2t[rpi[b], seq[b] - 3 : seq[b]].long()
            kc2[slots] = k_ext[3 * b : 3 * b + 3] if cached else 100.0  # stale cache entries
            vc2[slots] = v_ext[3 * b : 3 * b + 3] if cached else -100.0
        o = torch.zeros(3 * bs, H, D)
        ops_attention.extend_attention_cpu(q, k_ext, v_ext, o, kc2, vc2, 1.0, 1.0, r2t, rpi, seq, ext, start,
                                           3, 0.25, 0.0)
        outs.append(o)
    torch.testing.assert_close(outs[1], outs[0])


def test_attention_softmax_is_stable_for_large_scores(attention_path):
    g = torch.Generator().manual_seed(3)
    _, kc, vc, r2t, rpi = _kv_setup(1, None, seed=3)
    q = torch.randn(1, 4, 8, generator=g) * 1e3
    seq = torch.tensor([17])
    o = torch.empty(1, 4, 8)
    ops_attention.decode_attention_cpu(
        q, kc, vc, 1.0, 1.0, o, None, None, torch.tensor([0]), torch.empty(1), r2t, rpi, seq,
        1 / math.sqrt(8), 0.0, False, 0, None, None,
    )  # fmt: skip
    assert torch.isfinite(o).all()


# ---------------------------------------------------------------------------------------------------
# Verification by sampling (SGLang's CUDA tree_speculative_sampling_target_only) and renormalisation


def ref_tree_sampling(candidates, ridx, rnext, rsib, coins, final_coins, target, S, th_single, th_acc):
    bs, D = candidates.shape
    V = target.shape[-1]
    tp = target.reshape(bs * D, V)
    dp = torch.zeros_like(tp)
    predicts = torch.zeros(bs * D, dtype=torch.int32)
    accept_index = torch.full((bs, S), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        acc, row, coin = 0.0, b * D, float(coins[b, 0])
        last = int(ridx[b, 0])
        accept_index[b, 0] = last
        n, cur = 0, 0
        for _ in range(1, S):
            cur = int(rnext[b, cur])
            while cur != -1:
                tok = int(candidates[b, cur])
                p = float(tp[row, tok])
                acc += p
                if p > 0 and (coin < acc / th_acc or p >= th_single):
                    acc, row, coin = 0.0, b * D + cur, float(coins[b, cur])
                    predicts[last] = tok
                    n += 1
                    accept_index[b, n] = int(ridx[b, cur])
                    last = int(ridx[b, cur])
                    break
                dp[row, tok] = tp[row, tok]
                cur = int(rsib[b, cur])
            if cur == -1:
                break
        accept_num[b] = n
        q = tp[row].double()
        p = torch.zeros_like(q) if n == S - 1 else dp[row].double()
        r = (q - p).clamp_min(0)
        u = float(final_coins[b]) * float(r.sum())
        run, sampled, last_valid = 0.0, None, -1
        for i in range(V):
            if r[i] > 0:
                run += float(r[i])
                last_valid = i
                if run > u:
                    sampled = i
                    break
        if sampled is None:
            sampled = last_valid if last_valid >= 0 else V - 1
        predicts[last] = sampled
    return predicts, accept_index, accept_num, dp


@pytest.mark.parametrize("bs,topk,steps,D", TREE_CASES)
def test_tree_speculative_sampling_matches_reference(bs, topk, steps, D):
    from nanospec.cpu import ops_sampling

    gen = torch.Generator().manual_seed(99 + bs + topk + steps)
    V, S = 6, steps + 1
    seen = set()
    for trial in range(40):
        parent_list, selected = make_draft_tree(bs, topk, steps, D, gen)
        seq_lens = torch.randint(1, 9, (bs,), generator=gen)
        _, _, ridx, rnext, rsib = ref_build_tree(parent_list, selected, seq_lens, topk, steps, D, 1)
        candidates = torch.randint(0, V, (bs, D), generator=gen)
        logits = torch.randn(bs, D, V, generator=gen) * (3.0 if trial % 2 else 0.5)
        target = torch.softmax(logits.double(), -1)
        target = torch.where(target < 0.02, 0.0, target)  # zero-mass tokens occur after top-k/top-p
        target = (target / target.sum(-1, keepdim=True)).float()
        coins = torch.rand(bs, D, generator=gen)
        final = torch.rand(bs, generator=gen)
        th_single, th_acc = (1.0, 1.0) if trial % 3 else (0.6, 0.8)
        want = ref_tree_sampling(candidates, ridx, rnext, rsib, coins, final, target, S, th_single, th_acc)
        predicts = torch.zeros(bs * D, dtype=torch.int32)
        accept_index = torch.full((bs, S), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        draft_probs = torch.zeros_like(target)
        ops_sampling.tree_speculative_sampling_target_only(
            predicts, accept_index, accept_num, candidates, ridx, rnext, rsib, coins, final, target,
            draft_probs, th_single, th_acc, True,
        )  # fmt: skip
        assert torch.equal(accept_index, want[1])
        assert torch.equal(accept_num, want[2])
        assert torch.equal(predicts, want[0])
        assert torch.equal(draft_probs.reshape(bs * D, V), want[3])
        seen.update(accept_num.tolist())
    assert 0 in seen and len(seen) >= 2


def test_top_k_and_top_p_renormalisation():
    from nanospec.cpu import ops_sampling

    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    k = ops_sampling.top_k_renorm_prob(probs, torch.tensor([2, 0, 1]))
    torch.testing.assert_close(k[0], torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))
    torch.testing.assert_close(k[1], probs[1])  # k <= 0: unchanged
    torch.testing.assert_close(k[2], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    p = ops_sampling.top_p_renorm_prob(probs, torch.tensor([0.5, 1.0, 0.7]))
    torch.testing.assert_close(p[0], torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))  # 0.4 < 0.5, +0.3 crosses
    torch.testing.assert_close(p[1], probs[1])
    torch.testing.assert_close(p[2], torch.tensor([1.0, 0.0, 0.0, 0.0]))  # 0.7 reaches 0.7 alone
