"""``sgl_kernel.kvcacheio`` of the fallback: only the CPU all-layer KV copy exists."""

from nanospec.cpu.registry import OPS

copy_all_layer_kv_cache_cpu = OPS["copy_all_layer_kv_cache_cpu"]
