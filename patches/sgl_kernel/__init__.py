"""Pure-PyTorch stand-in for ``sgl_kernel`` on hosts where the real one cannot load (CPU-only).

Loaded under the name ``sgl_kernel`` by ``patches._bootstrap`` only after the real package failed.
It provides the ops SGLang 0.5.23 calls on its CPU path for plain and EAGLE/EAGLE3 decoding, both as
``sgl_kernel.<name>`` and ``torch.ops.sgl_kernel.<name>``. Any other name resolves to a function that
raises ``NotImplementedError`` naming the op when called, so that SGLang modules importing CUDA-only
names at import time still load.
"""

from patches.registry import OPS as _OPS
from patches.registry import register as _register

globals().update(_OPS)  # decode_attention_cpu, verify_tree_greedy_cpu, ... (see patches/registry.py)
__nanospec_fallback__ = True
__version__ = "0.0.0+nanospec.cpu"
_register()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} has no pure-PyTorch fallback (NanoSpec patches/); "
            "this SGLang feature needs the real sgl_kernel build"
        )

    missing.__name__ = name
    return missing
