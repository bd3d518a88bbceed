"""Pure-PyTorch stand-in for ``sgl_kernel`` on hosts where the real one cannot load (CPU-only).

Loaded under the name ``sgl_kernel`` by ``patches._bootstrap`` only after the real package failed.
It provides the ops SGLang 0.5.23 calls on its CPU path for plain and EAGLE/EAGLE3 decoding, both as
``sgl_kernel.<name>`` and ``torch.ops.sgl_kernel.<name>``. Any other name resolves to a function that
raises ``NotImplementedError`` naming the op when called, so that SGLang modules importing CUDA-only
names at import time still load.
"""

from patches.ops_attention import decode_attention_cpu, extend_attention_cpu  # noqa: F401
from patches.ops_memory import copy_all_layer_kv_cache_cpu  # noqa: F401
from patches.ops_spec import (  # noqa: F401
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)
from patches.registry import register as _register

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
