"""Few-row float32 linear layers through NanoSpec's AVX2/AVX-512 kernel (nanospec/cpu/gemv.py, gemv.c):
results, the same bits for a row whatever the row count, the dispatch in nanospec/cpu/ops_linear.py, and
how the kernel is built, cached and refused."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from nanospec.cpu import gemv, native, ops_linear

needs_kernel = pytest.mark.skipif(not gemv.available(), reason="no AVX2/FMA CPU or C compiler here")


class Layer(torch.nn.Module):
    def __init__(self, n: int, k: int, bias: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k) / k**0.5, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n), requires_grad=False) if bias else None


@pytest.fixture
def gemv_chosen(monkeypatch):
    """``NANOSPEC_CPU_LINEAR=gemv`` set explicitly (it is also the default)."""
    monkeypatch.setenv(ops_linear.ENV, "gemv")
    ops_linear.gemv_on.cache_clear()
    yield
    monkeypatch.undo()
    ops_linear.gemv_on.cache_clear()


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """An empty kernel cache and no loaded kernel; the real one is loaded again afterwards."""
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    native.library.cache_clear()
    ops_linear.gemv_on.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    native.library.cache_clear()
    ops_linear.gemv_on.cache_clear()


@needs_kernel
@pytest.mark.parametrize("n,k", [(1, 1), (7, 13), (200, 96), (1030, 577), (64, 4864)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 8, 16])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_equals_a_float64_product(native_build, m, n, k, bias):
    torch.manual_seed(n * k + m)
    layer, x = Layer(n, k, bias), torch.randn(m, k)
    got = gemv.linear(x, layer.weight, layer.bias)
    want = F.linear(x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double())
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_kernel_gives_a_row_the_same_bits_alone_among_other_rows_and_on_any_thread_count(native_build):
    """A decode step (one row) and a verify (several) must agree bit for bit, or an exact tie between two
    logits could make a speculative method pick another token than plain decoding."""
    torch.manual_seed(0)
    w, x = torch.randn(1001, 900), torch.randn(16, 900)
    alone = torch.cat([gemv.linear(x[i:i + 1], w, None) for i in range(16)])
    for m in range(2, 17):
        assert torch.equal(gemv.linear(x[:m], w, None), alone[:m]), m
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemv.linear(x[:7], w, None)
        torch.set_num_threads(2)
        two = gemv.linear(x[:7], w, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and torch.equal(one, alone[:7])
    # and the same output in a smaller matrix (the sum of a row does not depend on N)
    assert torch.equal(gemv.linear(x[:3], w[500:503].contiguous(), None), alone[:3, 500:503])


@needs_kernel
def test_decode_and_verify_shaped_products_agree_bit_for_bit_through_ops_linear(gemv_chosen):
    torch.manual_seed(1)
    layer, x = Layer(4096, 576, True), torch.randn(8, 576)
    verify = ops_linear.linear(layer, x.view(1, 8, 576), layer.weight, layer.bias)[0]
    for i in range(8):
        assert torch.equal(ops_linear.linear(layer, x[i:i + 1], layer.weight, layer.bias), verify[i:i + 1])


@needs_kernel
def test_up_to_max_rows_go_to_the_kernel_and_more_rows_to_f_linear(monkeypatch, gemv_chosen):
    calls = []
    real = gemv.linear
    monkeypatch.setattr(gemv, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(0)
    layer = Layer(300, 64, True)
    big = ops_linear.MAX_ROWS + 1
    for shape in [(1, 64), (1, 1, 64), (4, 64), (2, 8, 64), (big, 64)]:
        x = torch.randn(*shape)
        got = ops_linear.linear(layer, x, layer.weight, layer.bias)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert got.shape == (*shape[:-1], 300)
    assert calls == [(1, 64), (1, 64), (4, 64), (16, 64)]
    assert ops_linear._CACHE not in layer.__dict__  # no oneDNN copy of the weight was made
    # a weight that is not contiguous keeps oneDNN
    w_t, x = torch.randn(64, 300).t(), torch.randn(1, 64)
    torch.testing.assert_close(ops_linear.linear(Layer(1, 1, False), x, w_t, None), x @ w_t.T,
                               rtol=1e-5, atol=1e-5)
    assert len(calls) == 4


@needs_kernel
def test_inside_a_decode_or_verify_pass_every_row_count_goes_to_the_kernel(monkeypatch, gemv_chosen):
    calls = []
    real = gemv.linear
    monkeypatch.setattr(gemv, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(2)
    layer, x = Layer(300, 64, True), torch.randn(48, 4, 64)  # 48 requests verifying 4 tokens each
    ops_linear.linear(layer, x, layer.weight, layer.bias)
    assert calls == []  # a prefill of 192 rows: F.linear
    with ops_linear.decode_or_verify():
        batch = ops_linear.linear(layer, x, layer.weight, layer.bias)
    assert calls == [(192, 64)] and batch.shape == (48, 4, 300)
    assert torch.equal(batch[5, 2:3], ops_linear.linear(layer, x[5, 2:3], layer.weight, layer.bias))
    # a weight the kernel cannot take goes to F.linear, not to oneDNN with an unbounded row count
    odd = Layer(1, 1, False)
    w_t, before = torch.randn(64, 300).t(), len(calls)
    with ops_linear.decode_or_verify():
        got = ops_linear.linear(odd, x, w_t, None)
    torch.testing.assert_close(got, x @ w_t.T, rtol=1e-5, atol=1e-5)
    assert ops_linear._CACHE not in odd.__dict__ and len(calls) == before


@needs_kernel
@pytest.mark.parametrize("n,k", [(1, 1), (7, 13), (200, 96), (1030, 577)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
def test_kernel_with_bfloat16_weights_equals_the_float64_product_of_the_widened_ones(native_build, m, n, k):
    torch.manual_seed(n * k + m)
    layer, x = Layer(n, k, True), torch.randn(m, k)
    w16 = layer.weight.to(torch.bfloat16)
    got = gemv.linear(x, w16, layer.bias)
    want = F.linear(x.double(), w16.double(), layer.bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # the same bits for a row alone and among others, as with float32 weights
    assert torch.equal(got[m - 1:], gemv.linear(x[m - 1:], w16, layer.bias))


@needs_kernel
def test_a_marked_draft_layer_reads_a_bfloat16_copy_and_other_layers_float32(monkeypatch, gemv_chosen):
    calls = []
    real = gemv.linear
    monkeypatch.setattr(gemv, "linear", lambda *a: calls.append(a[1].dtype) or real(*a))
    monkeypatch.setenv(ops_linear.DRAFT_ENV, "bfloat16")
    ops_linear.draft_bf16.cache_clear()
    torch.manual_seed(3)
    draft, target, x = Layer(300, 64, True), Layer(300, 64, True), torch.randn(2, 64)
    assert ops_linear.mark_draft_layers([draft]) == 1
    got = ops_linear.linear(draft, x, draft.weight, draft.bias)
    torch.testing.assert_close(got, F.linear(x, draft.weight.to(torch.bfloat16).float(), draft.bias))
    assert draft.weight.dtype == torch.float32  # the layer keeps its float32 weight for everything else
    ops_linear.linear(target, x, target.weight, target.bias)
    assert calls == [torch.bfloat16, torch.float32]
    copy = draft.__dict__[ops_linear._BF16][1]
    ops_linear.linear(draft, x, draft.weight, draft.bias)
    assert draft.__dict__[ops_linear._BF16][1] is copy  # made once
    with torch.no_grad():
        draft.weight.mul_(2)  # a reload: the copy follows
    torch.testing.assert_close(ops_linear.linear(draft, x, draft.weight, draft.bias),
                               F.linear(x, draft.weight.to(torch.bfloat16).float(), draft.bias))
    # a prefill-sized product keeps the float32 weight
    big = torch.randn(ops_linear.MAX_ROWS + 1, 64)
    torch.testing.assert_close(ops_linear.linear(draft, big, draft.weight, draft.bias),
                               F.linear(big, draft.weight, draft.bias))
    monkeypatch.setenv(ops_linear.DRAFT_ENV, "float32")
    ops_linear.draft_bf16.cache_clear()
    calls.clear()
    ops_linear.linear(draft, x, draft.weight, draft.bias)
    ops_linear.draft_bf16.cache_clear()
    assert calls == [torch.float32]


def test_the_model_runner_fix_marks_a_draft_runners_linear_layers_only(monkeypatch):
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from nanospec.cpu import sglang_fixes

    monkeypatch.setenv(ops_linear.DRAFT_ENV, "bfloat16")
    ops_linear.draft_bf16.cache_clear()

    def model():
        linear, head = Layer(4, 4, False), Layer(4, 4, False)
        linear.quant_method, head.quant_method = UnquantizedLinearMethod(), object()
        return torch.nn.Sequential(linear, head)

    mod = _fake_model_runner()
    sglang_fixes._fix_model_runner(mod)
    draft, target = mod.ModelRunner(), mod.ModelRunner()
    draft.is_draft_worker, draft.model = True, model()
    target.is_draft_worker, target.model = False, model()
    for runner in (draft, target):
        runner.forward(_batch("extend"))
    marked = [bool(m.__dict__.get(ops_linear._DRAFT)) for r in (draft, target) for m in r.model]
    ops_linear.draft_bf16.cache_clear()
    assert marked == [True, False, False, False]


def _fake_model_runner():
    """A stand-in for sglang.srt.model_executor.model_runner whose forward reports whether it ran
    inside ``ops_linear.decode_or_verify()``."""
    from types import SimpleNamespace

    class ModelRunner:
        def forward(self, forward_batch):
            return ops_linear._STEP.get()

    return SimpleNamespace(ModelRunner=ModelRunner)


def _batch(mode: str):
    from types import SimpleNamespace

    return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: mode == "decode",
                                                        is_target_verify=lambda: mode == "verify"))


@needs_kernel
@pytest.mark.parametrize("linear_mode,marked", [("gemv", {"decode", "verify"}), ("onednn", set())])
def test_model_runner_fix_marks_decode_and_verify_passes_only(monkeypatch, linear_mode, marked):
    from nanospec.cpu import sglang_fixes

    monkeypatch.setenv(ops_linear.ENV, linear_mode)
    ops_linear.gemv_on.cache_clear()
    mod = _fake_model_runner()
    sglang_fixes._fix_model_runner(mod)
    runner = mod.ModelRunner()
    try:
        assert {m for m in ("decode", "verify", "extend") if runner.forward(_batch(m))} == marked
    finally:
        monkeypatch.undo()
        ops_linear.gemv_on.cache_clear()
    assert not ops_linear._STEP.get()  # and nothing leaks out of the pass


@needs_kernel
def test_the_kernel_is_the_default_and_onednn_or_mkl_can_be_chosen(monkeypatch, fresh_kernel):
    monkeypatch.delenv(ops_linear.ENV, raising=False)
    assert ops_linear.mode() == "gemv" and ops_linear.gemv_on()
    for other in ("onednn", "mkl"):
        monkeypatch.setenv(ops_linear.ENV, other)
        ops_linear.gemv_on.cache_clear()
        assert not ops_linear.gemv_on()


@needs_kernel
def test_kernel_is_built_once_into_the_cache_and_loaded_from_it(fresh_kernel):
    assert gemv.available()
    built = list(fresh_kernel.glob("nanospec-*.so"))
    assert len(built) == 1 and list(fresh_kernel.glob("*.so")) == built  # no temporary file left
    stamp = built[0].stat().st_mtime_ns
    native.library.cache_clear()
    assert gemv.available()
    assert [p.stat().st_mtime_ns for p in fresh_kernel.glob("nanospec-*.so")] == [stamp]


@needs_kernel
def test_kernel_uses_pytorchs_openmp_runtime():
    assert gemv.available()
    assert len(native.openmp_runtimes()) == 1


def test_a_compiler_that_fails_turns_the_kernel_off_with_the_reason_logged(
        monkeypatch, gemv_chosen, fresh_kernel, caplog):
    (fresh_kernel / "cc").write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'no such flag' >&2\n"
                                     "exit 1\n")
    (fresh_kernel / "cc").chmod(0o755)
    monkeypatch.setenv("CC", str(fresh_kernel / "cc"))
    with caplog.at_level(logging.INFO, logger=native.log.name):
        assert not gemv.available()
        assert not ops_linear.gemv_on()
    assert "NanoSpec C kernels off" in caplog.text
    assert not list(fresh_kernel.glob("*.so"))  # nothing half-written left in the cache
    torch.manual_seed(0)
    layer, x = Layer(50, 40, True), torch.randn(1, 40)  # and a row still gets the right answer
    torch.testing.assert_close(ops_linear.linear(layer, x, layer.weight, layer.bias),
                               F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_missing_compiler_turns_the_kernel_off(monkeypatch, fresh_kernel, caplog):
    monkeypatch.setenv("CC", str(fresh_kernel / "no-such-cc"))
    with caplog.at_level(logging.INFO, logger=native.log.name):
        assert not gemv.available()
    assert "NanoSpec C kernels off" in caplog.text
