"""Float32 linear layers through oneDNN with prepacked weights (nanospec/cpu/ops_linear.py,
``NANOSPEC_CPU_LINEAR=onednn``; the default kernel is tests/test_patches_gemv.py's) and the two SGLang
fixes that route the CPU path's linear layers and LM head there."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from nanospec.cpu import ops_attention, ops_layers, ops_linear


@pytest.fixture(autouse=True)
def onednn_chosen(monkeypatch):
    monkeypatch.setenv(ops_linear.ENV, "onednn")  # also for the subprocesses below
    ops_linear.gemv_on.cache_clear()
    yield
    monkeypatch.undo()
    ops_linear.gemv_on.cache_clear()


class Layer(torch.nn.Module):
    def __init__(self, n: int, k: int, bias: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k) / k**0.5, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n), requires_grad=False) if bias else None


@pytest.mark.parametrize("shape", [(0, 96), (1, 96), (4, 96), (17, 96), (2, 3, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(shape, bias):
    torch.manual_seed(0)
    layer, x = Layer(200, 96, bias), torch.randn(*shape)
    got = ops_linear.linear(layer, x, layer.weight, layer.bias)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert got.shape == (*shape[:-1], 200) and got.dtype == torch.float32


def test_weight_is_packed_once_and_again_after_a_reload():
    torch.manual_seed(0)
    layer, x = Layer(64, 32, False), torch.randn(3, 32)
    ops_linear.linear(layer, x, layer.weight, None)
    first = ops_linear.packed_weight(layer, layer.weight)
    ops_linear.linear(layer, x, layer.weight, None)
    assert ops_linear.packed_weight(layer, layer.weight) is first
    with torch.no_grad():
        layer.weight.copy_(torch.randn(64, 32))  # update_weights_from_disk writes in place
    torch.testing.assert_close(ops_linear.linear(layer, x, layer.weight, None), x @ layer.weight.T,
                               rtol=1e-5, atol=1e-5)
    assert ops_linear.packed_weight(layer, layer.weight) is not first


def test_only_float32_cpu_tensors_take_the_packed_path():
    w = torch.randn(8, 4)
    assert ops_linear.usable(torch.randn(2, 4), w)
    assert not ops_linear.usable(torch.randn(2, 4, dtype=torch.bfloat16), w.bfloat16())
    assert not ops_linear.usable(torch.randn(2, 5), w)
    assert not ops_linear.usable(torch.randn(2, 4), None)


@pytest.mark.parametrize("module,variable,spelled,value,default", [
    (ops_linear, "NANOSPEC_CPU_LINEAR", "MKL", "mkl", "gemv"),
    (ops_layers, "NANOSPEC_CPU_LAYERS", " SGLang ", "sglang", "fused"),
    (ops_attention, "NANOSPEC_CPU_ATTENTION", "Torch", "torch", "native"),
])
def test_unknown_cpu_switch_value_is_an_error_naming_the_variable(monkeypatch, module, variable, spelled,
                                                                    value, default):
    monkeypatch.setenv(module.ENV, "fast")
    with pytest.raises(ValueError, match=variable):
        module.mode()
    monkeypatch.setenv(module.ENV, spelled)
    assert module.mode() == value
    monkeypatch.delenv(module.ENV)
    assert module.mode() == default


def _sglang_paths(env: dict) -> str:
    code = """
        import sgl_kernel
        from sglang.srt.layers.logits_processor import LogitsProcessor
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
        print(getattr(sgl_kernel, "__nanospec_fallback__", False),
              getattr(UnquantizedLinearMethod.apply, "__nanospec__", False),
              getattr(LogitsProcessor._compute_lm_head, "__nanospec__", False))
    """
    full = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=full, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_sglang_linear_and_lm_head_use_onednn_unless_switched_off():
    fallback, *patched = _sglang_paths({}).split()
    if fallback != "True":
        pytest.skip("the real sgl_kernel loads here: SGLang's own CPU kernels are used")
    assert patched == ["True", "True"]
    assert _sglang_paths({ops_linear.ENV: "mkl"}).split() == ["True", "False", "False"]


def test_patched_linear_method_matches_sglangs_own():
    code = """
        import torch, torch.nn.functional as F
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(300, 64), requires_grad=False)
        x, b = torch.randn(4, 64), torch.randn(300)
        out = UnquantizedLinearMethod().apply(layer, x, b)
        print(bool(torch.allclose(out, F.linear(x, layer.weight, b), rtol=1e-5, atol=1e-5)),
              "_nanospec_onednn_weight" in layer.__dict__)
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["True", "True"]
