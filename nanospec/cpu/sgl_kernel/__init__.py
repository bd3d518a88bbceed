"""Pure-PyTorch stand-in for ``sgl_kernel`` on hosts where the real one cannot load (CPU-only).

Loaded under the name ``sgl_kernel`` by ``nanospec.cpu._bootstrap`` only after the real package failed.
It provides the ops SGLang 0.5.23 calls on its CPU path for plain and EAGLE/EAGLE3 decoding, both as
``sgl_kernel.<name>`` and ``torch.ops.sgl_kernel.<name>``. Other names are missing (``from sgl_kernel
import X`` raises ImportError), which SGLang's guarded imports of optional kernels expect.
"""

from nanospec.cpu.registry import OPS as _OPS
from nanospec.cpu.registry import register as _register

globals().update(_OPS)  # decode_attention_cpu, verify_tree_greedy_cpu, ... (see nanospec/cpu/registry.py)
__nanospec_fallback__ = True
__version__ = "0.0.0+nanospec.cpu"
_register()


def __getattr__(name: str):
    # No catch-all stubs: SGLang guards optional kernels with ``try: from sgl_kernel import X`` and
    # must see them missing (ImportError) to take its PyTorch path.
    raise AttributeError(
        f"sgl_kernel.{name} has no pure-PyTorch fallback in NanoSpec's nanospec/cpu/ (the real sgl_kernel "
        "could not be loaded on this host)"
    )
