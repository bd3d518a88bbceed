"""``sgl_kernel.speculative`` of the fallback: the CPU speculative-decoding ops."""

from nanospec.cpu.registry import OPS

assign_draft_cache_locs_contiguous_cpu = OPS["assign_draft_cache_locs_contiguous_cpu"]
assign_extend_cache_locs_cpu = OPS["assign_extend_cache_locs_cpu"]
assign_req_to_token_pool_cpu = OPS["assign_req_to_token_pool_cpu"]
build_draft_decode_metadata_cpu = OPS["build_draft_decode_metadata_cpu"]
build_tree_kernel_efficient_cpu = OPS["build_tree_kernel_efficient_cpu"]
fill_accept_out_cache_loc_cpu = OPS["fill_accept_out_cache_loc_cpu"]
fill_bonus_tokens_cpu = OPS["fill_bonus_tokens_cpu"]
verify_tree_greedy_cpu = OPS["verify_tree_greedy_cpu"]
