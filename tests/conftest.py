"""Test-session set-up: NanoSpec's Triton kernels run on the CPU through Triton's interpreter.

Triton chooses between interpreted and compiled functions when it decorates them (its own
``triton.language`` helpers included, and modules it imports lazily on the first launch), so the
interpreter must be on when triton is first imported and first launched. One small warm-up launch of
every kernel happens here; then the switch is turned off again so that the SGLang servers the tests
start run as a user's do.
"""

import os

_old = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
import torch  # noqa: E402

from nanospec import DynamicVocab, NanoSpecConfig  # noqa: E402

_dv = DynamicVocab(torch.randn(8, 4), 1, NanoSpecConfig(w_max=2), backend="triton")
_dv.start(0, torch.tensor([1, 2]))
_dv.extend(torch.tensor([0]), torch.tensor([[3]]), torch.ones(1, 1, dtype=torch.bool))
_dv.logits(torch.randn(1, 4), torch.tensor([0]))
del _dv
if _old is None:
    os.environ.pop("TRITON_INTERPRET")
else:
    os.environ["TRITON_INTERPRET"] = _old


import pytest  # noqa: E402


@pytest.fixture(params=["host", "avx2"])
def native_build(request, monkeypatch, tmp_path):
    """NanoSpec's C kernels (nanospec/cpu/native.py) as built for this CPU (AVX-512 where it has it), then
    the AVX2 build (in a private kernel cache); the host's build is loaded again afterwards."""
    from nanospec.cpu import native

    if request.param == "avx2":
        monkeypatch.setattr(native, "flags", lambda: native.FLAGS)
        monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
        native.library.cache_clear()
    yield request.param
    monkeypatch.undo()
    native.library.cache_clear()
