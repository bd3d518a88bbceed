# benchmark only: extra timed methods for NANOSPEC_PROFILE_OPS runs (PYTHONPATH=runs/s8)
import os
if os.environ.get("NANOSPEC_PROFILE_OPS"):
    try:
        from nanospec.cpu import sglang_fixes
        from nanospec.cpu import profiling
        WRAP = {
            "sglang.srt.models.llama": [("LlamaDecoderLayer", "forward"), ("LlamaAttention", "forward"),
                                        ("LlamaMLP", "forward"), ("LlamaModel", "forward"), ("LlamaForCausalLM", "forward"),
                                        ("LlamaAttention", "forward_prepare_native")],
            "sglang.srt.layers.radix_attention": [("RadixAttention", "forward")],
            "sglang.srt.layers.logits_processor": [("LogitsProcessor", "forward")],
            "sglang.srt.layers.attention.intel_amx_backend": [("IntelAMXAttnBackend", "init_forward_metadata"),
                                                              ("IntelAMXAttnBackend", "forward_extend"), ("IntelAMXAttnBackend", "forward_decode")],
            "sglang.srt.model_executor.runner.eager_runner": [("EagerRunner", "execute")],
            "sglang.srt.layers.layer_boundary.stage": [("StageBoundary", "prepare")],
            "sglang.srt.layers.vocab_parallel_embedding": [("VocabParallelEmbedding", "forward")],
            "sglang.srt.mem_cache.memory_pool": [("MHATokenToKVPool", "set_kv_buffer")],
        }
        def make(modname, prev):
            def fix(mod):
                if prev: prev(mod)
                for cls, meth in WRAP[modname]:
                    c = getattr(mod, cls)
                    setattr(c, meth, profiling.timed(f"x:{cls}.{meth}", getattr(c, meth)))
            return fix
        for m in WRAP:
            sglang_fixes.TARGETS[m] = make(m, sglang_fixes.TARGETS.get(m))
    except Exception as e:
        print("sitecustomize failed", e)
if os.environ.get("NANOSPEC_GEMV_SRC"):
    from pathlib import Path
    from nanospec.cpu import gemv
    gemv.SOURCE = Path(os.environ["NANOSPEC_GEMV_SRC"])
    gemv.FLAGS = gemv.FLAGS + tuple(os.environ.get("NANOSPEC_GEMV_DEFS", "").split())
