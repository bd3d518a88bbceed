"""The streams' decode-step update in C (nanospec/cpu/stream.c) against its tensor twin
(torch_ops.extend_twin): same state, same rows to gather, step after step, through window wrap-around,
evictions within a step, repeated and masked candidates and several requests at once."""

from __future__ import annotations

import random

import pytest
import torch

from nanospec.config import NanoSpecConfig
from nanospec.cpu import native, stream
from nanospec.kernels import torch_ops
from nanospec.proposer import verify_candidates_twin
from nanospec.state import VocabState, flat, start_request
from nanospec.vocab import DynamicVocab

pytestmark = pytest.mark.skipif(not native.available(), reason="NanoSpec's C kernels are not built here")

FIELDS = ("col_of", "col_tok", "count", "ring", "stack", "nfree", "pos", "gathered")


def started(n_req: int, vocab: int, w: int, seed: int) -> VocabState:
    g = torch.Generator().manual_seed(seed)
    st = VocabState.allocate(n_req, vocab, w, torch.device("cpu"))
    for r in range(n_req):
        length = int(torch.randint(1, 2 * w, (1,), generator=g))
        start_request(st, r, torch.randint(0, vocab, (length,), generator=g),
                      torch.randint(0, vocab, (length, 2), generator=g))
    return st


def copy(st: VocabState) -> VocabState:
    """A deep copy that keeps the spare element behind each [R, *] array (the twin writes there)."""
    def dup(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 1:
            return t.clone()
        return flat(t).clone()[: t.numel()].view(t.shape)

    return VocabState(*(dup(getattr(st, f)) for f in FIELDS))


@pytest.mark.parametrize("w, vocab, width", [(8, 20, 6), (16, 40, 24), (3072, 49152, 16), (5, 12, 16)])
def test_c_update_equals_the_twin_step_after_step(w, vocab, width):
    rng = random.Random(w)
    c_st = started(4, vocab, w, seed=w)
    t_st = copy(c_st)
    for step in range(300):
        b = rng.randint(1, 4)
        reqs = torch.tensor(rng.sample(range(4), b))
        # A small alphabet makes repeats within a row and across steps common.
        cand = torch.tensor([[rng.randrange(min(vocab, 3 * w)) for _ in range(width)] for _ in range(b)])
        valid = torch.rand(b, width, generator=torch.Generator().manual_seed(step)) < 0.8
        assert stream.usable(c_st, cand)
        c_dst, c_src = stream.extend(c_st, reqs, cand, valid)
        t_dst, t_src = torch_ops.extend_twin(t_st, reqs, cand, valid)
        assert torch.equal(c_dst, t_dst) and torch.equal(c_src, t_src), step
        for f in FIELDS:
            assert torch.equal(getattr(c_st, f), getattr(t_st, f)), (step, f)


def test_extend_on_the_cpu_runs_the_c_update():
    st = started(2, 50, 8, seed=1)
    twin = copy(st)
    reqs, cand = torch.tensor([1]), torch.tensor([[3, 3, 7, 49]])
    valid = torch.tensor([[True, True, False, True]])
    dst, _ = torch_ops.extend(st, reqs, cand, valid)
    want, _ = torch_ops.extend_twin(twin, reqs, cand, valid)
    assert torch.equal(dst, want) and torch.equal(st.col_of, twin.col_of)
    assert torch_ops._native_extend(st, cand) is stream


def test_states_the_kernel_does_not_take_keep_the_twin():
    wide = VocabState.allocate(1, 10, 40000, torch.device("cpu"))  # int32 columns
    assert not stream.usable(wide, torch.zeros(1, 4, dtype=torch.long))
    st = started(1, 50, 8, seed=2)
    assert not stream.usable(st, torch.zeros(1, stream.MAX_CANDIDATES + 1, dtype=torch.long))


def test_out_of_range_slots_or_candidates_raise_and_leave_the_state_unchanged():
    st = started(2, 50, 8, seed=3)
    before = copy(st)
    for reqs, cand in ((torch.tensor([2]), torch.tensor([[1, 2]])),    # slot 2 of 2
                       (torch.tensor([0]), torch.tensor([[1, 50]])),   # token 50 of 50
                       (torch.tensor([0]), torch.tensor([[-3, 1]]))):
        with pytest.raises(IndexError, match="state is unchanged"):
            stream.extend(st, reqs, cand, torch.ones(1, 2, dtype=torch.bool))
        for f in FIELDS:
            assert torch.equal(getattr(st, f), getattr(before, f)), f
    # A masked lane may hold anything.
    stream.extend(st, torch.tensor([0]), torch.tensor([[-3, 1]]), torch.tensor([[False, True]]))


def vocab_over(st: VocabState, n_req: int) -> DynamicVocab:
    """A DynamicVocab whose state is ``st`` (what Proposer's tensor path reads)."""
    dv = DynamicVocab(torch.zeros(st.vocab, 1), n_req, NanoSpecConfig(w_max=st.w_max), check_inputs=False,
                      backend="torch")
    dv.state = st
    return dv


@pytest.mark.parametrize("sources", ["full", "context"])
@pytest.mark.parametrize("reduced", [False, True])
def test_c_verify_candidates_equal_the_tensor_path(sources, reduced):
    """Tree, top-k of each accepted row and emitted-token counts, with -1 padded paths, short accept
    lengths, -1 tree entries and a reduced draft vocabulary whose map misses most target ids."""
    rng = random.Random(7)
    g = torch.Generator().manual_seed(7)
    target_vocab, w = 300, 16
    t2d = None
    draft_vocab = target_vocab
    if reduced:
        hot = torch.randperm(target_vocab, generator=g)[:120]
        t2d = torch.full((target_vocab,), -1, dtype=torch.long)
        t2d[hot] = torch.arange(120)
        draft_vocab = 120
    st = started(4, draft_vocab, w, seed=11)
    for step in range(200):
        b, t, width, k = rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 5)
        reqs = torch.tensor(rng.sample(range(4), b))
        tree = torch.randint(-1, target_vocab, (b * t,), generator=g)
        accept = torch.randint(-1, b * t, (b, width), generator=g, dtype=torch.int32)
        lens = torch.randint(0, width + 1, (b,), generator=g, dtype=torch.int32)
        predict = torch.randint(0, target_vocab, (b * max(t, width),), generator=g, dtype=torch.int32)
        logits = torch.randn(b * t, target_vocab + 5, generator=g)
        vocab = target_vocab
        assert stream.candidates_usable(st, logits, k)
        cand, valid, stats = stream.verify_candidates(
            st, reqs=reqs, draft_tokens=tree, accept_index=accept, accept_lens=lens, predict=predict,
            logits=logits, vocab=vocab, k_ver=k, context=sources == "context", t2d=t2d)
        want_cand, want_valid, want = verify_candidates_twin(
            vocab_over(st, 4), reqs=reqs, draft_tokens=tree, accept_index=accept, accept_lens=lens,
            predict=predict, logits=logits, vocab=vocab, k_ver=k, sources=sources, t2d=t2d)
        assert torch.equal(valid, want_valid), step
        assert torch.equal(cand[valid], want_cand[valid]), step
        assert torch.equal(stats, torch.stack([want.active, want.emitted, want.hits], dim=1)), step
        stream.extend(st, reqs, cand, valid)  # the next step sees another active vocabulary


def test_c_verify_candidates_raise_on_rows_outside_the_logits():
    st = started(2, 50, 8, seed=4)
    logits = torch.randn(2, 50)
    ok = dict(draft_tokens=torch.tensor([1, 2]), accept_lens=torch.tensor([1]), predict=torch.tensor([1, 2]),
              logits=logits, vocab=50, k_ver=3, context=False, t2d=None)
    with pytest.raises(IndexError, match="accepted row"):
        stream.verify_candidates(st, reqs=torch.tensor([0]), accept_index=torch.tensor([[0, 2]]), **ok)
    with pytest.raises(IndexError, match="slot"):
        stream.verify_candidates(st, reqs=torch.tensor([2]), accept_index=torch.tensor([[0, 1]]), **ok)


def test_a_verify_on_the_cpu_takes_its_candidates_from_the_c_kernel():
    from nanospec.proposer import _native_candidates

    st = started(1, 50, 8, seed=5)
    assert _native_candidates(st, torch.randn(2, 50), 3) is stream
    assert _native_candidates(st, torch.randn(2, 50, dtype=torch.float64), 3) is None  # the twin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_gather_copies_the_rows_the_twin_copies(dtype):
    from nanospec.kernels import torch_ops

    g = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 24, generator=g).to(dtype)
    got, want = torch.zeros(17, 24, dtype=dtype), torch.zeros(17, 24, dtype=dtype)
    for _ in range(50):
        dst = torch.randint(-1, 16, (2, 5), generator=g)  # -1: no row; the spare row 16 stays the twin's
        src = torch.randint(0, 40, (2, 5), generator=g)
        assert stream.gather_usable(weight, got, dst, src)
        torch_ops.gather(weight, got, dst, src)
        torch_ops.gather_twin(weight, want, dst, src)
        assert torch.equal(got[:16], want[:16])


def test_c_gather_raises_on_rows_outside_and_copies_nothing():
    weight, packed = torch.randn(10, 4), torch.zeros(5, 4)
    outside = ((torch.tensor([0, 5]), torch.tensor([1, 2])),    # packed row 5 of 5
               (torch.tensor([0, 1]), torch.tensor([1, 10])))   # weight row 10 of 10
    for dst, src in outside:
        with pytest.raises(IndexError, match="nothing was copied"):
            stream.gather_rows(weight, packed, dst, src)
        assert not packed.any()
