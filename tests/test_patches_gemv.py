"""One-row float32 linear layers through NanoSpec's AVX2 kernel (nanospec/cpu/gemv.py, gemv.c): results,
the dispatch in nanospec/cpu/ops_linear.py, and how the kernel is built, cached and refused."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from nanospec.cpu import gemv, ops_linear

needs_kernel = pytest.mark.skipif(not gemv.available(), reason="no AVX2/FMA CPU or C compiler here")


class Layer(torch.nn.Module):
    def __init__(self, n: int, k: int, bias: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k) / k**0.5, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n), requires_grad=False) if bias else None


@pytest.fixture
def gemv_chosen(monkeypatch):
    """``NANOSPEC_CPU_LINEAR=gemv`` (the kernel is opt-in)."""
    monkeypatch.setenv(ops_linear.ENV, "gemv")
    ops_linear.gemv_on.cache_clear()
    yield
    monkeypatch.undo()
    ops_linear.gemv_on.cache_clear()


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """An empty kernel cache and no loaded kernel; the real one is loaded again afterwards."""
    monkeypatch.setenv(gemv.CACHE_ENV, str(tmp_path))
    gemv.library.cache_clear()
    ops_linear.gemv_on.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    gemv.library.cache_clear()
    ops_linear.gemv_on.cache_clear()


@needs_kernel
@pytest.mark.parametrize("n,k", [(1, 1), (7, 13), (200, 96), (1030, 577), (64, 4864)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_equals_a_float64_product(n, k, bias):
    torch.manual_seed(n * k)
    layer, x = Layer(n, k, bias), torch.randn(1, k)
    got = gemv.gemv(x, layer.weight, layer.bias)
    want = F.linear(x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double())
    assert got.shape == (1, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_gemv_sums_each_output_in_the_same_order_on_one_and_two_threads():
    torch.manual_seed(0)
    w, x = torch.randn(1001, 900), torch.randn(1, 900)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemv.gemv(x, w, None)
        torch.set_num_threads(2)
        two = gemv.gemv(x, w, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    # and the same row in a smaller matrix (the sum of a row does not depend on N)
    assert torch.equal(gemv.gemv(x, w[500:503].contiguous(), None), one[:, 500:503])


@needs_kernel
def test_one_row_goes_to_gemv_and_more_rows_to_onednn(monkeypatch, gemv_chosen):
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(0)
    layer = Layer(300, 64, True)
    for shape in [(1, 64), (1, 1, 64), (4, 64)]:
        x = torch.randn(*shape)
        got = ops_linear.linear(layer, x, layer.weight, layer.bias)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert got.shape == (*shape[:-1], 300)
    assert calls == [(1, 64), (1, 64)]
    assert ops_linear._CACHE in layer.__dict__  # the 4-row product packed the weight for oneDNN
    # a weight that is not contiguous keeps oneDNN
    w_t, x = torch.randn(64, 300).t(), torch.randn(1, 64)
    torch.testing.assert_close(ops_linear.linear(Layer(1, 1, False), x, w_t, None), x @ w_t.T,
                               rtol=1e-5, atol=1e-5)
    assert len(calls) == 2


@needs_kernel
def test_single_rows_stay_on_onednn_unless_gemv_is_chosen(monkeypatch, fresh_kernel):
    monkeypatch.delenv(ops_linear.ENV, raising=False)
    assert not ops_linear.gemv_on()
    monkeypatch.setenv(ops_linear.ENV, "onednn")
    ops_linear.gemv_on.cache_clear()
    assert not ops_linear.gemv_on()
    monkeypatch.setenv(ops_linear.ENV, "gemv")
    ops_linear.gemv_on.cache_clear()
    assert ops_linear.gemv_on()


@needs_kernel
def test_kernel_is_built_once_into_the_cache_and_loaded_from_it(fresh_kernel):
    assert gemv.available()
    built = list(fresh_kernel.glob("gemv-*.so"))
    assert len(built) == 1 and list(fresh_kernel.glob("*.so")) == built  # no temporary file left
    stamp = built[0].stat().st_mtime_ns
    gemv.library.cache_clear()
    assert gemv.available()
    assert [p.stat().st_mtime_ns for p in fresh_kernel.glob("gemv-*.so")] == [stamp]


@needs_kernel
def test_kernel_uses_pytorchs_openmp_runtime():
    assert gemv.available()
    assert len(gemv._openmp_runtimes()) == 1


def test_a_compiler_that_fails_turns_the_kernel_off_with_the_reason_logged(
        monkeypatch, gemv_chosen, fresh_kernel, caplog):
    (fresh_kernel / "cc").write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'no such flag' >&2\n"
                                     "exit 1\n")
    (fresh_kernel / "cc").chmod(0o755)
    monkeypatch.setenv("CC", str(fresh_kernel / "cc"))
    with caplog.at_level(logging.INFO, logger=gemv.log.name):
        assert not gemv.available()
        assert not ops_linear.gemv_on()
    assert "gemv kernel off" in caplog.text
    assert not list(fresh_kernel.glob("*.so"))  # nothing half-written left in the cache
    torch.manual_seed(0)
    layer, x = Layer(50, 40, True), torch.randn(1, 40)  # and one row still gets the right answer
    torch.testing.assert_close(ops_linear.linear(layer, x, layer.weight, layer.bias),
                               F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_missing_compiler_turns_the_kernel_off(monkeypatch, fresh_kernel, caplog):
    monkeypatch.setenv("CC", str(fresh_kernel / "no-such-cc"))
    with caplog.at_level(logging.INFO, logger=gemv.log.name):
        assert not gemv.available()
    assert "gemv kernel off" in caplog.text
