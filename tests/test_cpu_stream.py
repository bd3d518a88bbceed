"""The streams' decode-step update in C (nanospec/cpu/stream.c) against its tensor twin
(torch_ops.extend_twin): same state, same rows to gather, step after step, through window wrap-around,
evictions within a step, repeated and masked candidates and several requests at once."""

from __future__ import annotations

import random

import pytest
import torch

from nanospec.cpu import native, stream
from nanospec.kernels import torch_ops
from nanospec.state import VocabState, flat, start_request

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
