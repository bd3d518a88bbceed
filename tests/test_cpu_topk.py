"""The k largest logits in C (nanospec/cpu/topk.c) against its twin (torch.topk through
streams.top_ids_twin): chosen rows, a vocabulary narrower than the logits, padded row strides, ties,
NaNs, and bad rows refused with nothing written."""

from __future__ import annotations

import pytest
import torch

from nanospec import streams
from nanospec.cpu import native, topk

pytestmark = pytest.mark.skipif(not native.available(), reason="NanoSpec's C kernels are not built here")


@pytest.mark.parametrize("n_rows, width, vocab, k", [(1, 49152, 49152, 3), (7, 151936, 151665, 3),
                                                     (20, 1000, 997, 8), (3, 70, 70, 64), (5, 4, 4, 4)])
def test_c_topk_equals_torch_topk_on_distinct_logits(n_rows, width, vocab, k):
    g = torch.Generator().manual_seed(n_rows * width)
    logits = torch.randn(n_rows, width, generator=g)
    some = torch.randint(0, n_rows, (2, 2), generator=g)
    for rows in (None, torch.tensor([n_rows - 1, 0, n_rows - 1]), some):
        assert topk.usable(logits, k)
        got = topk.top_ids(logits, rows, vocab, k)
        assert torch.equal(got, streams.top_ids_twin(logits, rows, vocab, k)), rows


def test_c_topk_reads_rows_of_a_wider_buffer():
    wide = torch.randn(6, 130)
    logits = wide[::2, :100]  # row stride 260 floats, unit column stride
    assert topk.usable(logits, 3) and not logits.is_contiguous()
    assert torch.equal(topk.top_ids(logits, None, 90, 3), streams.top_ids_twin(logits, None, 90, 3))


def test_c_topk_orders_equal_values_by_lower_id_and_counts_nan_as_minus_infinity():
    row = torch.full((1, 40), -1.0)
    row[0, [30, 5, 17]] = 2.0  # a three-way tie for first place
    row[0, 9] = 3.0
    row[0, [0, 1]] = float("nan")
    assert topk.top_ids(row, None, 40, 4).tolist() == [[9, 5, 17, 30]]
    all_nan = torch.full((1, 10), float("nan"))
    assert topk.top_ids(all_nan, None, 10, 2).tolist() == [[0, 1]]
    minus_inf = torch.full((1, 50), float("-inf"))
    minus_inf[0, 44] = 0.0
    assert topk.top_ids(minus_inf, None, 50, 3).tolist() == [[44, 0, 1]]


def test_c_topk_refuses_a_row_outside_the_logits():
    logits = torch.randn(4, 32)
    with pytest.raises(IndexError, match="row outside"):
        topk.top_ids(logits, torch.tensor([0, 4]), 32, 3)
    with pytest.raises(IndexError):
        topk.top_ids(logits, torch.tensor([-1]), 32, 3)
    with pytest.raises(ValueError, match="vocab 33"):
        topk.top_ids(logits, None, 33, 3)


def test_top_ids_on_the_cpu_runs_the_c_kernel(monkeypatch):
    calls = []
    real = native.library().nanospec_topk
    monkeypatch.setattr(topk.native, "library", lambda: type("Lib", (), {
        "nanospec_topk": staticmethod(lambda *a: calls.append(a) or real(*a))})())
    logits = torch.randn(3, 64)
    got = streams.top_ids(logits, torch.tensor([2]), 64, 3)
    assert calls and torch.equal(got, logits[2:3].topk(3).indices)


def test_top_ids_keeps_the_twin_for_other_dtypes():
    logits = torch.randn(2, 64, dtype=torch.bfloat16)
    assert not topk.usable(logits, 3)
    assert torch.equal(streams.top_ids(logits, None, 64, 3), logits.topk(3).indices)
