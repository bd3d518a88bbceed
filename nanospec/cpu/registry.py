"""Register the pure-PyTorch ops as ``torch.ops.sgl_kernel.*`` (SGLang calls some through torch.ops).

Schemas mirror the positional order of SGLang 0.5.23's call sites; ``(a!)`` marks the tensors an op
writes, as the real sgl_kernel schemas do.
"""

from __future__ import annotations

import torch

from nanospec.cpu import ops_attention, ops_memory, ops_sampling, ops_spec, profiling

SCHEMAS = {
    "decode_attention_cpu": (
        ops_attention.decode_attention_cpu,
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, float v_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
        "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()",
    ),
    "extend_attention_cpu": (
        ops_attention.extend_attention_cpu,
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, Tensor k_buffer, "
        "Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? custom_mask, bool is_causal) -> ()",
    ),
    "build_tree_kernel_efficient_cpu": (
        ops_spec.build_tree_kernel_efficient_cpu,
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, Tensor(a!) tree_mask, "
        "Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, "
        "int tree_mask_mode) -> ()",
    ),
    "verify_tree_greedy_cpu": (
        ops_spec.verify_tree_greedy_cpu,
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor target_predict) -> ()",
    ),
    "assign_req_to_token_pool_cpu": (
        ops_spec.assign_req_to_token_pool_cpu,
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor out_cache_loc, int pool_len) -> ()",
    ),
    "assign_extend_cache_locs_cpu": (
        ops_spec.assign_extend_cache_locs_cpu,
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len) -> ()",
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        ops_spec.assign_draft_cache_locs_contiguous_cpu,
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, "
        "int pool_len, int topk, int num_steps) -> ()",
    ),
    "build_draft_decode_metadata_cpu": (
        ops_spec.build_draft_decode_metadata_cpu,
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, int num_steps, "
        "int pool_len) -> Tensor",
    ),
    "fill_bonus_tokens_cpu": (
        ops_spec.fill_bonus_tokens_cpu,
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()",
    ),
    "fill_accept_out_cache_loc_cpu": (
        ops_spec.fill_accept_out_cache_loc_cpu,
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc) -> ()",
    ),
    "copy_all_layer_kv_cache_cpu": (
        ops_memory.copy_all_layer_kv_cache_cpu,
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
    ),
    "tree_speculative_sampling_target_only": (
        ops_sampling.tree_speculative_sampling_target_only,
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
        "Tensor uniform_samples, Tensor uniform_samples_for_final_sampling, Tensor target_probs, "
        "Tensor(d!) draft_probs, float threshold_single=1.0, float threshold_acc=1.0, "
        "bool deterministic=True) -> ()",
    ),
    # Python-level only (flashinfer names; SGLang's CPU path has none): no torch.ops schema.
    "top_k_renorm_prob": (ops_sampling.top_k_renorm_prob, None),
    "top_p_renorm_prob": (ops_sampling.top_p_renorm_prob, None),
}

# The Python functions sgl_kernel exports (timed when NANOSPEC_PROFILE_OPS is set; see profiling.py).
OPS = {name: profiling.timed("op:" + name, fn) for name, (fn, _) in SCHEMAS.items()}

_LIB: torch.library.Library | None = None


def register() -> None:
    """Define and implement every op in ``SCHEMAS`` under ``torch.ops.sgl_kernel`` (once per process)."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name, (_, schema) in SCHEMAS.items():
        if schema is None or hasattr(torch.ops.sgl_kernel, name):
            continue  # defined by a real sgl_kernel build: never shadow it
        lib.define(name + schema)
        lib.impl(name, OPS[name], "CompositeExplicitAutograd")
    _LIB = lib
