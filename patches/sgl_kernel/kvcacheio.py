"""``sgl_kernel.kvcacheio`` of the fallback: only the CPU all-layer KV copy exists."""

from patches.ops_memory import copy_all_layer_kv_cache_cpu  # noqa: F401
