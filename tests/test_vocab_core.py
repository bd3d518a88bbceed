"""DynamicVocab against the plain-Python reference, for the PyTorch and Triton kernels (the latter
through Triton's interpreter, switched on in conftest.py)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vocab_reference import ReferenceVocab

from nanospec import DynamicVocab, NanoSpecConfig
from nanospec.kernels import torch_ops

STATE_FIELDS = ("col_of", "col_tok", "count", "ring", "stack", "nfree", "pos", "gathered")


def _sample(rng: random.Random, vocab: int, hot: list[int]) -> int:
    # Mostly hot tokens (repeats, counts above one, evict-and-readd), some long-tail ones.
    return rng.choice(hot) if rng.random() < 0.7 else rng.randrange(vocab)


def _check_against_reference(dv: DynamicVocab, ref: ReferenceVocab, reqs: list[int], weight: torch.Tensor):
    for r in reqs:
        assert dv.active(r).tolist() == ref.active(r)
        assert int(dv.state.gathered[r]) == ref.gathered[r]
    hidden = torch.randn(len(reqs) + 1, weight.shape[1], dtype=weight.dtype)
    rows = torch.tensor(reqs + reqs[:1])
    logits = dv.logits(hidden, rows)
    assert logits.shape == (len(rows), dv.w_max) and logits.dtype == torch.float32
    cols = torch.arange(dv.w_max).expand(len(rows), -1)
    toks = dv.token_ids(rows, cols)
    for i, r in enumerate(rows.tolist()):
        live = toks[i] >= 0
        assert sorted(toks[i][live].tolist()) == ref.active(r)
        assert torch.isneginf(logits[i][~live]).all()
        expect = hidden[i].float() @ weight[toks[i][live]].float().T
        torch.testing.assert_close(logits[i][live], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("w_max", [1, 2, 5, 16, 300, 4096])
def test_active_logits_and_token_ids_match_reference_over_long_streams(backend: str, w_max: int):
    rng = random.Random(w_max)
    torch.manual_seed(w_max)
    vocab = max(64, 3 * w_max)
    weight = torch.randn(vocab, 24)
    n_req = 4
    dv = DynamicVocab(weight, n_req, NanoSpecConfig(w_max=w_max), backend=backend)
    ref = ReferenceVocab(w_max)
    hot = rng.sample(range(vocab), max(4, w_max // 2))
    for r in range(n_req):
        prompt = [_sample(rng, vocab, hot) for _ in range(rng.randint(1, 2 * w_max + 3))]
        topk = [[_sample(rng, vocab, hot) for _ in range(3)] for _ in prompt]
        dv.start(r, torch.tensor(prompt), torch.tensor(topk))
        ref.start(r, prompt, topk)
    _check_against_reference(dv, ref, list(range(n_req)), weight)
    # Enough steps that every window turns over several times.
    big = w_max >= 300
    steps = 3 * w_max // 80 + 10 if big else 60
    for step in range(steps):
        reqs = rng.sample(range(n_req), rng.randint(1, n_req))
        width = rng.randint(1, 128 if big else 48)
        cands = [[_sample(rng, vocab, hot) for _ in range(width)] for _ in reqs]
        valid = [[rng.random() < 0.85 for _ in range(width)] for _ in reqs]
        dv.extend(torch.tensor(reqs), torch.tensor(cands), torch.tensor(valid))
        for r, c, v in zip(reqs, cands, valid, strict=True):
            ref.extend(r, c, v)
        if step % (50 if big else 10) == 9 or step == steps - 1:
            _check_against_reference(dv, ref, list(range(n_req)), weight)


def test_triton_and_torch_kernels_reach_identical_states():
    rng = random.Random(7)
    weight = torch.randn(97, 16)
    cfg = NanoSpecConfig(w_max=11)
    a = DynamicVocab(weight, 3, cfg, backend="torch")
    b = DynamicVocab(weight, 3, cfg, backend="triton")
    hot = list(range(20))
    for r in range(3):
        prompt = torch.tensor([_sample(rng, 97, hot) for _ in range(9)])
        topk = torch.randint(0, 97, (9, 3))
        a.start(r, prompt, topk)
        b.start(r, prompt, topk)
    for _ in range(40):
        reqs = torch.tensor(rng.sample(range(3), 2))
        cands = torch.tensor([[_sample(rng, 97, hot) for _ in range(13)] for _ in range(2)])
        valid = torch.rand(2, 13) < 0.8
        a.extend(reqs, cands, valid)
        b.extend(reqs, cands, valid)
        for name in STATE_FIELDS:
            assert torch.equal(getattr(a.state, name), getattr(b.state, name)), name
    hidden = torch.randn(5, 16)
    rows = torch.tensor([0, 1, 2, 2, 0])
    torch.testing.assert_close(a.logits(hidden, rows), b.logits(hidden, rows))
    assert torch.equal(a.head.packed, b.head.packed)


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    topk=st.lists(st.lists(st.integers(0, 30), min_size=2, max_size=2), max_size=40),
    w_max=st.integers(1, 50),
)
def test_start_keeps_prompt_duplicates_and_dedups_topk_row_major(prompt, topk, w_max):
    topk = (topk + [[0, 1]] * len(prompt))[: len(prompt)]
    dv = DynamicVocab(torch.randn(31, 4), 2, NanoSpecConfig(w_max=w_max))
    ref = ReferenceVocab(w_max)
    dv.start(1, torch.tensor(prompt), torch.tensor(topk))
    ref.start(1, prompt, topk)
    assert dv.active(1).tolist() == ref.active(1)
    assert int(dv.state.pos[1]) == len(ref.streams[1])
    assert int(dv.state.gathered[1]) == len(ref.active(1))


def test_start_without_prefill_topk_uses_the_prompt_only():
    dv = DynamicVocab(torch.randn(10, 4), 1, NanoSpecConfig(w_max=3))
    dv.start(0, torch.tensor([1, 2, 3, 4, 4]))
    assert dv.active(0).tolist() == [3, 4]


def test_evicted_token_columns_become_neg_inf_and_are_reused():
    weight = torch.randn(10, 4)
    dv = DynamicVocab(weight, 1, NanoSpecConfig(w_max=2))
    dv.start(0, torch.tensor([1, 2]))
    used = set(range(2))
    dv.extend(torch.tensor([0]), torch.tensor([[3]]), torch.tensor([[True]]))  # evicts 1
    toks = dv.token_ids(torch.tensor([0]), torch.arange(2)[None])[0].tolist()
    assert sorted(toks) == [2, 3] and set(range(2)) == used  # 3 took 1's freed column
    logits = dv.logits(torch.randn(1, 4), torch.tensor([0]))
    assert torch.isfinite(logits).all()
    dv.extend(torch.tensor([0]), torch.tensor([[5, 6, 7]]), torch.tensor([[True, False, False]]))
    assert dv.active(0).tolist() == [3, 5]


def test_only_newly_active_tokens_are_gathered():
    dv = DynamicVocab(torch.randn(50, 4), 1, NanoSpecConfig(w_max=8))
    dv.start(0, torch.tensor([1, 2, 3]))
    assert int(dv.state.gathered[0]) == 3
    for _ in range(5):  # already active: nothing to gather
        dv.extend(torch.tensor([0]), torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.bool))
    assert int(dv.state.gathered[0]) == 3
    dv.extend(torch.tensor([0]), torch.tensor([[4, 4, 1]]), torch.ones(1, 3, dtype=torch.bool))
    assert int(dv.state.gathered[0]) == 4


def test_restart_after_release_resets_the_slot_and_leaves_others_alone():
    weight = torch.randn(40, 4)
    dv = DynamicVocab(weight, 2, NanoSpecConfig(w_max=6))
    dv.start(0, torch.tensor([1, 2, 3]))
    dv.start(1, torch.tensor([7, 8]))
    before = {n: getattr(dv.state, n)[1].clone() for n in ("col_of", "col_tok", "count", "ring")}
    dv.release(0)
    dv.release(0)  # idempotent
    with pytest.raises(ValueError, match="not started"):
        dv.active(0)
    dv.start(0, torch.tensor([30, 31]))
    assert dv.active(0).tolist() == [30, 31]
    assert dv.active(1).tolist() == [7, 8]
    for n, t in before.items():
        assert torch.equal(getattr(dv.state, n)[1], t)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_indexed_gathering_gives_the_same_logits_as_packed(backend: str):
    weight = torch.randn(60, 12)
    packed = DynamicVocab(weight, 2, NanoSpecConfig(w_max=9), backend=backend)
    indexed = DynamicVocab(weight, 2, NanoSpecConfig(w_max=9, gather="indexed"), backend=backend)
    assert indexed.head.packed is None
    for dv in (packed, indexed):
        dv.start(0, torch.tensor([5, 6, 7, 5]), torch.tensor([[1, 2], [3, 4], [5, 9], [10, 11]]))
        dv.start(1, torch.tensor([40]))
        cands = torch.tensor([[41, 42, 40], [12, 13, 14]])
        dv.extend(torch.tensor([1, 0]), cands, torch.ones(2, 3, dtype=torch.bool))
    hidden = torch.randn(3, 12)
    rows = torch.tensor([0, 1, 0])
    torch.testing.assert_close(packed.logits(hidden, rows), indexed.logits(hidden, rows))


def test_batched_device_path_matches_grouped_cpu_path():
    weight = torch.randn(30, 8)
    dv = DynamicVocab(weight, 3, NanoSpecConfig(w_max=5))
    for r in range(3):
        dv.start(r, torch.randint(0, 30, (7,)))
    hidden = torch.randn(4, 8)
    reqs = torch.tensor([2, 0, 2, 1])
    for indexed, rows in ((False, dv.head.packed), (True, weight)):
        a = torch_ops.logits_grouped(hidden, rows, dv.state.col_tok, reqs, indexed)
        b = torch_ops.logits_batched(hidden, rows, dv.state.col_tok, reqs, indexed)
        live = dv.state.col_tok[reqs] >= 0
        torch.testing.assert_close(a[live], b[live])


def test_extend_and_device_logits_never_read_tensors_on_the_host():
    # Meta tensors have no data: any .item()/.tolist()/.cpu() in these paths would raise.
    weight = torch.empty(1000, 16, device="meta")
    dv = DynamicVocab(weight, 4, NanoSpecConfig(w_max=64), check_inputs=False, backend="torch")
    reqs = torch.tensor([0, 3], device="meta")
    dv.extend(reqs, torch.empty(2, 20, dtype=torch.long, device="meta"),
              torch.empty(2, 20, dtype=torch.bool, device="meta"))
    out = torch_ops.logits(torch.empty(2, 16, device="meta"), dv.head.packed, dv.state.col_tok, reqs, False)
    assert out.shape == (2, 64)


def test_bookkeeping_per_request_stays_under_half_a_mib_at_llama3_vocab():
    d = 8
    dv = DynamicVocab(torch.empty(128256, d), 2, NanoSpecConfig(w_max=3072))
    nb = dv.nbytes()
    assert nb["packed"] == (2 * 3072 + 1) * d * 4
    bookkeeping = (nb["total"] - nb["packed"]) / 2
    assert bookkeeping <= 0.5 * 2**20
    assert nb["per_request"] == nb["total"] // 2


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_empty_batches_and_empty_candidate_rows_change_nothing(backend: str):
    dv = DynamicVocab(torch.randn(20, 4), 2, NanoSpecConfig(w_max=4), backend=backend)
    dv.start(0, torch.tensor([1, 2]))
    before = {n: getattr(dv.state, n).clone() for n in STATE_FIELDS}
    dv.extend(torch.zeros(0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long),
              torch.zeros(0, 3, dtype=torch.bool))
    dv.extend(torch.tensor([0]), torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.bool))
    dv.extend(torch.tensor([0]), torch.tensor([[5, 6]]), torch.zeros(1, 2, dtype=torch.bool))
    assert all(torch.equal(getattr(dv.state, n), t) for n, t in before.items())
    assert dv.logits(torch.randn(0, 4), torch.zeros(0, dtype=torch.long)).shape == (0, 4)


def test_contains_reports_active_tokens_per_row():
    dv = DynamicVocab(torch.randn(20, 4), 2, NanoSpecConfig(w_max=3))
    dv.start(0, torch.tensor([1, 2, 3]))
    dv.start(1, torch.tensor([4]))
    dv.wait_gathers()  # no side stream on the CPU: nothing to wait for
    got = dv.contains(torch.tensor([0, 1]), torch.tensor([[1, 4, -1, 25], [4, 1, 3, 19]]))
    assert got.tolist() == [[True, False, False, False], [True, False, False, False]]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_row_wider_than_the_free_window_of_a_short_stream_keeps_its_last_entries(backend: str):
    # 2 entries, then 5 new ones into a window of 4: the window is the last 4 new ones. The first new
    # entry is dropped within the step and never reaches the ring, so nothing may evict it.
    dv = DynamicVocab(torch.randn(16, 4), 1, NanoSpecConfig(w_max=4), backend=backend)
    dv.start(0, torch.tensor([1, 2]))
    dv.extend(torch.tensor([0]), torch.tensor([[3, 4, 5, 6, 7]]), torch.ones(1, 5, dtype=torch.bool))
    assert dv.active(0).tolist() == [4, 5, 6, 7]
    assert int(dv.state.nfree[0]) == 0 and int(dv.state.count.min()) >= 0
    assert sorted(dv.state.col_tok[0].tolist()) == [4, 5, 6, 7]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_short_streams_with_wide_rows_match_the_reference(backend: str):
    rng = random.Random(11)
    weight = torch.randn(64, 8)
    for w_max in (3, 8, 20):
        dv = DynamicVocab(weight, 2, NanoSpecConfig(w_max=w_max), backend=backend)
        ref = ReferenceVocab(w_max)
        for _ in range(30):
            r = rng.randrange(2)
            prompt = [rng.randrange(64) for _ in range(rng.randint(1, w_max))]
            dv.start(r, torch.tensor(prompt))
            ref.start(r, prompt, None)
            width = rng.randint(w_max, 3 * w_max)
            cands = [rng.randrange(64) for _ in range(width)]
            dv.extend(torch.tensor([r]), torch.tensor([cands]), torch.ones(1, width, dtype=torch.bool))
            ref.extend(r, cands, [True] * width)
            assert dv.active(r).tolist() == ref.active(r)
            assert int(dv.state.count[r].min()) >= 0 and 0 <= int(dv.state.nfree[r]) <= w_max


def test_column_tokens_is_the_map_logits_columns_follow():
    torch.manual_seed(5)
    weight = torch.randn(40, 6)
    dv = DynamicVocab(weight, 3, NanoSpecConfig(w_max=8))
    dv.start(2, torch.tensor([4, 9, 4, 31]), torch.tensor([[7, 9], [1, 2], [3, 7], [9, 9]]))
    table = dv.column_tokens()
    assert table.shape == (3, 8) and table.dtype == torch.int32
    assert torch.equal(table[2], dv.token_ids(torch.tensor([2]), torch.arange(8)[None])[0].int())
    logits = dv.logits(torch.randn(1, 6), torch.tensor([2]))[0]
    live = table[2] >= 0
    assert sorted(table[2][live].tolist()) == dv.active(2).tolist()
    assert torch.isneginf(logits[~live]).all() and torch.isfinite(logits[live]).all()
