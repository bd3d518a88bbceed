"""Fixes applied to SGLang 0.5.23 modules right after they are imported, only on CPU-only hosts.

``TARGETS`` maps a module name to a function called with the freshly executed module (only when the
pure-PyTorch ``sgl_kernel`` fallback is in use). Each fix names the SGLang file and version it
targets, so that an upgrade knows what to drop. No heavy imports at module level:
``nanospec.cpu._bootstrap`` imports this file on the first ``sglang.*`` import.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("nanospec.cpu")

# KV-cache size used on CPU when --max-total-tokens is not given (SGLang 0.5.23 otherwise sizes the
# CPU KV cache from free RAM: 14 GB for a 4.9 MB model). Override with NANOSPEC_CPU_MAX_TOTAL_TOKENS.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 32768


def _install(owner, name: str, replacement) -> None:
    """Set ``owner.name`` to ``replacement`` unless a NanoSpec fix is there already (a module executed
    twice, a second bootstrap). The replacement is marked ``__nanospec__`` and keeps SGLang's function
    as ``__nanospec_original__`` (the tests' oracle)."""
    original = getattr(owner, name)
    if getattr(original, "__nanospec__", False):
        return
    replacement.__nanospec__ = True
    replacement.__nanospec_original__ = original
    replacement.__qualname__ = original.__qualname__
    setattr(owner, name, replacement)


def _fix_attention_hook(mod) -> None:
    """sglang/srt/arg_groups/attention_hook.py (0.5.23) runs ``_attention_backend_platform_fallbacks``
    (from overrides.py), which rewrites ``intel_amx`` to ``torch_native`` when the CPU lacks AMX.
    torch_native has no EAGLE support (srt/speculative/draft_utils.py), while the intel_amx backend only
    needs ``decode_attention_cpu``/``extend_attention_cpu``, which the fallback provides for any CPU.
    Keep intel_amx on CPU; other rewrites are unchanged."""
    original = mod._attention_backend_platform_fallbacks

    def _attention_backend_platform_fallbacks(view):
        if view.device == "cpu" and "intel_amx" in (
            view.attention_backend,
            view.prefill_attention_backend,
            view.decode_attention_backend,
        ):
            return {}
        return original(view)

    _install(mod, "_attention_backend_platform_fallbacks", _attention_backend_platform_fallbacks)


def _fix_platform_hook(mod) -> None:
    """sglang/srt/arg_groups/platform_hook.py (0.5.23) ``handle_cpu_backends`` picks CPU backends but
    leaves ``max_total_tokens`` unset, so the KV cache takes a fraction of all free RAM. Default it to
    ``CPU_DEFAULT_MAX_TOTAL_TOKENS`` (SGLang still lowers it if memory is short)."""
    original = mod.handle_cpu_backends

    def handle_cpu_backends(server_args):
        original(server_args)
        cfg = mod.resolving_view(server_args)
        if cfg.device == "cpu" and cfg.max_total_tokens is None:
            value = int(os.environ.get("NANOSPEC_CPU_MAX_TOTAL_TOKENS", CPU_DEFAULT_MAX_TOTAL_TOKENS))
            mod.declare_resolution(server_args, "_nanospec_cpu_defaults", max_total_tokens=value)

    _install(mod, "handle_cpu_backends", handle_cpu_backends)


def _fix_eagle_utils(mod) -> None:
    """sglang/srt/speculative/eagle_utils.py (0.5.23): ``_verify_uses_greedy`` is true whenever
    ``is_cpu``, so on CPU an EAGLE request with temperature > 0 gets the target's argmax instead of a
    sample (not the distribution plain decoding samples from), because the tree sampling and the
    top-k/top-p renormalisation kernels exist only for CUDA (``tree_speculative_sampling_target_only``
    and ``top_k_renorm_prob``/``top_p_renorm_prob`` are None there). Provide pure-PyTorch ones
    (nanospec/cpu/ops_sampling.py) and let CPU take SGLang's sampling branch."""
    from nanospec.cpu.registry import OPS

    original = mod._verify_uses_greedy

    def _verify_uses_greedy(*, is_cpu, **kwargs):
        return original(is_cpu=False, **kwargs)

    _install(mod, "_verify_uses_greedy", _verify_uses_greedy)
    mod.tree_speculative_sampling_target_only = OPS["tree_speculative_sampling_target_only"]
    mod.top_k_renorm_prob = OPS["top_k_renorm_prob"]
    mod.top_p_renorm_prob = OPS["top_p_renorm_prob"]


def _fix_intel_amx_backend(mod) -> None:
    """sglang/srt/layers/attention/intel_amx_backend.py (0.5.23) calls its two attention ops through
    ``torch.ops.sgl_kernel``; with the Python fallback that is a dispatcher round trip (19 boxed
    arguments) per layer call. Call the same functions directly. And ``forward_extend`` writes the new
    K/V through the pool's ``set_kv_buffer`` (24 us a layer in a SmolLM2 verify, measured at commit b467097)
    before its op; where the op is attention.c (nanospec/cpu/ops_attention.py) on a plain float32
    ``MHATokenToKVPool``, let the kernel store them, as this backend's ``forward_decode`` already does for
    every unquantised cache. Not defects, CPU cost cuts; every other case keeps SGLang's code."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from nanospec.cpu import ops_attention
    from nanospec.cpu.registry import OPS

    cls = mod.IntelAMXAttnBackend
    original_init, original_extend = cls.__init__, cls.forward_extend

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.decode_attention_fwd = OPS["decode_attention_cpu"]
        self.extend_attention_fwd = OPS["extend_attention_cpu"]

    def _lean(self, layer) -> bool:
        """Whether this layer's extends may store their K/V in attention.c (fixed for the backend's life,
        so kept on it)."""
        known = self.__dict__.setdefault("_nanospec_lean", {})
        ok = known.get(layer.layer_id)
        if ok is None:
            pool = self.token_to_kv_pool
            ok = known[layer.layer_id] = bool(
                ops_attention.NATIVE and ops_attention.FAST_PATHS and not self.use_mla
                and type(pool) is MHATokenToKVPool and not pool.use_hnd and not pool.is_quantized_kv_cache
                and not pool.requires_physical_write_loc and pool.dtype == pool.store_dtype == torch.float32
                and not layer.is_cross_attention and layer.attn_type != mod.AttentionType.ENCODER_ONLY
                and not self._is_swa_layer(layer.layer_id) and not (layer.logit_cap and layer.logit_cap > 0))
        return ok

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None):
        if (save_kv_cache and k is not None and v is not None and sinks is None
                and self.forward_metadata[1] <= ops_attention.NATIVE_MAX_EXTEND and _lean(self, layer)):
            key_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            value_buffer = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
            H, D, Dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
            q3 = q.view(-1, H, D)
            if ops_attention.native_usable(q3, key_buffer, value_buffer, 0.0, None, k, v):
                seq_lens, extend_seq_lens, _, tree_mask = self.extend_metadata
                o = q.new_empty((q.shape[0], H * Dv))
                ops_attention.native_attention(
                    q3, k, v, forward_batch.out_cache_loc, o.view(-1, H, Dv), key_buffer,
                    value_buffer, self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices,
                    seq_lens, extend_seq_lens, tree_mask, True, layer.sliding_window_size + 1,
                    layer.scaling * (layer.k_scale_float or 1.0), layer.v_scale_float or 1.0)
                return o
        return original_extend(self, q, k, v, layer, forward_batch, save_kv_cache, sinks)

    _install(cls, "__init__", __init__)
    _install(cls, "forward_extend", forward_extend)


def _fix_unquant(mod) -> None:
    """sglang/srt/layers/quantization/unquant.py (0.5.23): ``UnquantizedLinearMethod.apply`` runs
    ``F.linear`` when SGLang's AMX path (``weight_packed_linear``, from a source-built sgl_kernel) is
    off, which is MKL's slow small-M GEMM in float32 on some CPUs. Run float32 layers of few rows
    through NanoSpec's kernel (gemv.py) or oneDNN with the weight prepacked once
    (nanospec/cpu/ops_linear.py). Not a defect, a CPU cost cut; ``NANOSPEC_CPU_LINEAR=mkl`` keeps
    SGLang's."""
    from nanospec.cpu import ops_linear, profiling

    if ops_linear.mode() == "mkl":
        return
    cls = mod.UnquantizedLinearMethod
    original = cls.apply
    linear = profiling.timed("op:linear", ops_linear.linear)

    def apply(self, layer, x, bias=None):
        if not getattr(layer, "use_intel_amx_backend", False) and ops_linear.usable(x, layer.weight):
            return linear(layer, x, layer.weight, bias)
        return original(self, layer, x, bias)

    _install(cls, "apply", apply)


def _fix_logits_processor(mod) -> None:
    """sglang/srt/layers/logits_processor.py (0.5.23): ``LogitsProcessor._compute_lm_head`` multiplies a
    plain LM head with ``torch.matmul`` without SGLang's AMX path: 95 ms for 4 rows of Qwen2.5's
    151,936 x 896 head in float32 on the AVX2 EPYC, against 19 ms through oneDNN with the weight
    prepacked (nanospec/cpu/ops_linear.py; or NanoSpec's kernel, gemv.py, the default).
    Same switch as ``_fix_unquant``; LoRA, quantised and biased heads keep SGLang's path."""
    from nanospec.cpu import ops_linear, profiling

    if ops_linear.mode() == "mkl":
        return
    cls = mod.LogitsProcessor
    original = cls._compute_lm_head
    linear = profiling.timed("op:lm_head", ops_linear.linear)

    def _compute_lm_head(self, hidden_states, lm_head, embedding_bias=None, *, out=None):
        weight = getattr(lm_head, "weight", None)
        if (embedding_bias is None and not hasattr(lm_head, "set_lora")
                and not mod.should_apply_lm_head_quant_method(lm_head, getattr(lm_head, "quant_method", None))
                and not getattr(lm_head, "use_intel_amx_backend", False)
                and getattr(self, "rl_on_policy_target", None) is None
                and ops_linear.usable(hidden_states, weight)):
            return linear(lm_head, hidden_states, weight, None)
        return original(self, hidden_states, lm_head, embedding_bias, out=out)

    _install(cls, "_compute_lm_head", _compute_lm_head)


def _fix_layernorm(mod) -> None:
    """sglang/srt/layers/layernorm.py (0.5.23): on a CPU without AMX, SGLang's op dispatch
    (``sglang/kernels/fused_op.py``, ``_platform_key``) runs ``RMSNorm.forward_native``, about ten
    one-row ops per call. Run plain float32 CPU norms (with or without the residual sum) as
    ``F.rms_norm`` (nanospec/cpu/ops_layers.py), bitwise the same. Not a defect, a CPU cost cut;
    ``NANOSPEC_CPU_LAYERS=sglang`` keeps SGLang's. Norms with a variance override or a post-residual
    addition, and subclasses with their own ``forward_native``, keep theirs. SGLang's own method stays
    reachable as ``forward_native.__nanospec_original__`` (``_install``)."""
    import torch

    from nanospec.cpu import ops_layers, profiling

    if ops_layers.mode() != "fused":
        return
    cls = mod.RMSNorm
    original = cls.forward_native
    rms_norm = profiling.timed("op:rms_norm", ops_layers.rms_norm)

    def forward_native(self, x, residual=None, post_residual_addition=None, quant_linear=None):
        weight = self.weight
        if (post_residual_addition is None and self.variance_size_override is None
                and getattr(self, "override_orig_dtype", None) in (None, torch.float32)
                and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
                and x.shape[-1] == self.hidden_size
                and (residual is None or residual.dtype == torch.float32)):
            return rms_norm(x, weight.data, self.variance_epsilon, residual)
        return original(self, x, residual, post_residual_addition, quant_linear)

    _install(cls, "forward_native", forward_native)


def _fix_rotary(mod) -> None:
    """sglang/srt/layers/rotary_embedding/base.py (0.5.23): on a CPU without AMX, SGLang runs
    ``RotaryEmbedding.forward_native``, which rotates the query and the key separately in about 15 ops
    each. Rotate both as one tensor (nanospec/cpu/ops_layers.py), bitwise the same, for float32 CPU
    tensors; subclasses with their own ``forward_native`` keep theirs. Same switch and oracle as
    ``_fix_layernorm``."""
    from nanospec.cpu import ops_layers, profiling

    if ops_layers.mode() != "fused":
        return
    cls = mod.RotaryEmbedding
    original = cls.forward_native
    rope = profiling.timed("op:rope", ops_layers.rope)

    def forward_native(self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
        if (fused_set_kv_buffer_arg is None and not hasattr(self, "sin_cos_cache")
                and ops_layers.rope_usable(query, key, self.cos_sin_cache, self.head_size, self.rotary_dim)):
            if offsets is not None:
                positions = positions + offsets
            return rope(positions, query, key, self.cos_sin_cache, self.head_size,
                        self.rotary_dim, self.is_neox_style)
        return original(self, positions, query, key, offsets, fused_set_kv_buffer_arg)

    _install(cls, "forward_native", forward_native)


def _fix_allocation(mod) -> None:
    """sglang/srt/mem_cache/allocation.py (0.5.23): ``get_last_loc`` launches the Triton kernel
    ``get_last_loc_triton`` for every attention backend but ascend/torch_native; with ``--page-size``
    above 1 the speculative decode allocation reaches it, and a CPU host has no Triton driver
    ("0 active drivers"). Use SGLang's own ``get_last_loc_torch`` for CPU tensors."""
    original = mod.get_last_loc

    def get_last_loc(req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
        if req_to_token.device.type == "cpu":
            return mod.get_last_loc_torch(req_to_token, req_pool_indices_tensor, prefix_lens_tensor)
        return original(req_to_token, req_pool_indices_tensor, prefix_lens_tensor)

    _install(mod, "get_last_loc", get_last_loc)


def _mark_draft_layers(runner) -> None:
    """A draft model runner's linear layers (``UnquantizedLinearMethod``: attention and MLP
    projections; not its LM head or embeddings, whose cost is what the speculative methods differ in)
    take bfloat16 weights in NanoSpec's kernel (``ops_linear.draft_bf16``), for EAGLE/EAGLE3 and
    NANOSPEC drafts alike."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from nanospec.cpu import ops_linear

    model = getattr(runner, "model", None)
    if model is None or not ops_linear.draft_bf16():
        return
    n = ops_linear.mark_draft_layers(
        m for m in model.modules() if isinstance(getattr(m, "quant_method", None), UnquantizedLinearMethod))
    logging.getLogger(__name__).info("NanoSpec CPU: %d linear layers of the draft model read bfloat16 "
                                     "weights (%s=float32 keeps float32)", n, ops_linear.DRAFT_ENV)


def _fix_model_runner(mod) -> None:
    """sglang/srt/model_executor/model_runner.py (0.5.23) ``ModelRunner.forward``: run decode and
    target-verify passes inside ``ops_linear.decode_or_verify()``, so that with gemv.py on their linear
    layers all take the kernel (one summation order per output whatever the row count) and a verify
    gives the logits of plain decoding bit for bit, also in batches of over ``ops_linear.MAX_ROWS`` rows;
    at a draft runner's first pass, mark its linear layers for bfloat16 weights (``_mark_draft_layers``).
    Not a defect; with NANOSPEC_PROFILE_OPS also times every forward pass, target and draft, in total
    ("forward") and by model and mode ("forward:target:DECODE", "forward:draft:DRAFT_EXTEND", ...)."""
    import functools
    import time

    from nanospec.cpu import ops_linear, profiling

    cls = mod.ModelRunner
    original = cls.forward

    @functools.wraps(original)
    def forward(self, forward_batch, *args, **kwargs):
        if getattr(self, "is_draft_worker", False) and not self.__dict__.get("_nanospec_marked"):
            self.__dict__["_nanospec_marked"] = True
            _mark_draft_layers(self)
        mode = getattr(forward_batch, "forward_mode", None)
        if mode is not None and (mode.is_decode() or mode.is_target_verify()) and ops_linear.gemv_on():
            with ops_linear.decode_or_verify():
                return original(self, forward_batch, *args, **kwargs)
        return original(self, forward_batch, *args, **kwargs)

    if profiling.enabled():
        step = forward

        @functools.wraps(original)
        def forward(self, forward_batch, *args, **kwargs):
            model = "draft" if getattr(self, "is_draft_worker", False) else "target"
            mode = getattr(getattr(forward_batch, "forward_mode", None), "name", "?")
            t0 = time.perf_counter()
            try:
                with profiling.scope(f"{model}:{mode}"):
                    return step(self, forward_batch, *args, **kwargs)
            finally:
                profiling.record(f"forward:{model}:{mode}", time.perf_counter() - t0)

        forward = profiling.timed("forward", forward)
    _install(cls, "forward", forward)


TARGETS = {
    "sglang.srt.mem_cache.allocation": _fix_allocation,
    "sglang.srt.layers.quantization.unquant": _fix_unquant,
    "sglang.srt.layers.logits_processor": _fix_logits_processor,
    "sglang.srt.layers.layernorm": _fix_layernorm,
    "sglang.srt.layers.rotary_embedding.base": _fix_rotary,
    "sglang.srt.layers.attention.intel_amx_backend": _fix_intel_amx_backend,
    "sglang.srt.arg_groups.attention_hook": _fix_attention_hook,
    "sglang.srt.arg_groups.platform_hook": _fix_platform_hook,
    "sglang.srt.speculative.eagle_utils": _fix_eagle_utils,
    "sglang.srt.model_executor.model_runner": _fix_model_runner,
}


def _profile_eagle_worker(mod) -> None:
    """Benchmark only (NANOSPEC_PROFILE_OPS): time one speculative cycle (draft, verify, draft extend)."""
    from nanospec.cpu import profiling

    cls = mod.EAGLEWorkerV2
    cls.forward_batch_generation = profiling.timed("cycle", cls.forward_batch_generation)


if os.environ.get("NANOSPEC_PROFILE_OPS"):
    TARGETS["sglang.srt.speculative.eagle_worker_v2"] = _profile_eagle_worker
