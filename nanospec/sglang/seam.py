"""The seam between NanoSpec and SGLang: every SGLang symbol the plugin uses or replaces, in one table.

Kinds, from the most to the least stable:

* ``api``: SGLang's public extension points (algorithm registry, ``CustomSpecAlgo``, ``HookRegistry``)
  and the fields of SGLang's batch and result objects that the plugin reads.
* ``hook``: a ``HookRegistry`` registration on an SGLang function (SGLang applies it; only the
  target's signature matters).
* ``override``: a method of an SGLang class overridden in one of the plugin's subclasses
  (``NanoSpecAlgo``, ``NanoSpecWorker``, ``NanoSpecDraftWorker``).
* ``private``: a private SGLang function the plugin calls, or SGLang state it writes in place.
* ``replacement``: an attribute of a live SGLang object replaced or swapped (not an API). Each says
  why no extension point serves.

``check()`` runs when a NANOSPEC server starts (``validate_server_args`` in the launcher and
``NanoSpecWorker.__init__`` in the scheduler): every symbol must resolve, the leading parameter names
of every function must be the ones below, and every attribute listed for a class must exist there.
A mismatch stops the launch with an error that names the SGLang version and the symbol.
``tests/test_plugin_seam.py`` enumerates the plugin's touchpoints (HookRegistry registrations,
method overrides, attributes written on SGLang objects) and compares them with this table, so an
undocumented touchpoint fails the suite.

Writes on SGLang objects go through ``patch`` / ``hide`` / ``set_server_arg`` below (or name the
attribute literally), so that the test can see them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import pkgutil
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"  # the version every row was read against
KINDS = ("api", "hook", "override", "private", "replacement")

_EW = "sglang.srt.speculative.eagle_worker_v2"
_LP = "sglang.srt.layers.logits_processor.LogitsProcessor"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_ALGO = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm"
_CSA = "sglang.srt.speculative.spec_registry.CustomSpecAlgo"
_UNITS = "tests/test_plugin_units.py"
_GPU = "tests/test_plugin_gpu_paths.py"
_SEAM = "tests/test_plugin_seam.py"
_SERVER = "tests/test_plugin_server.py"
_LOSSLESS = f"{_SERVER}::test_greedy_output_equals_plain_decoding"
_SAMPLING = "tests/test_plugin_sampling.py"
_REGISTERS = f"{_UNITS}::test_entry_point_registers_nanospec_with_sglang"
_META = f"{_SERVER}::test_response_meta_info_reports_active_vocabulary_and_hit_rate"
_IDMAP = f"{_UNITS}::test_id_map_maps_only_columns_of_the_last_draft_logits"
_HEADS = f"{_UNITS}::test_each_head_proposes_the_best_token_of_its_vocabulary"
_MEMORY = "tests/test_plugin_memory.py"
_FLAGS = "tests/test_plugin_flags.py"
_AD = "sglang.srt.speculative.adaptive_runtime_state"
_GAPS = f"{_SERVER}::test_skipped_catch_up_positions_are_written_before_the_draft_drafts_again"


class SeamError(RuntimeError):
    """SGLang differs from the version NanoSpec was written against, at a named symbol."""


@dataclass(frozen=True)
class Touchpoint:
    """One SGLang symbol NanoSpec depends on.

    symbol: dotted path of the SGLang object. kind: one of ``KINDS``. where: the NanoSpec code that
    touches it. reason: why (for a replacement: why no extension point serves). test: the test that
    breaks if SGLang changes it. params: leading parameter names NanoSpec relies on (checked), or
    None. attrs: attribute names NanoSpec reads (api) or writes (others) on the symbol's objects;
    for classes they are checked to exist. hook_type: the HookRegistry type of a ``hook`` row.
    optional: registered only on request (``NANOSPEC_TIME_DRAFT=1``).
    """

    symbol: str
    kind: str
    where: str
    reason: str
    test: str
    params: tuple[str, ...] | None = None
    attrs: tuple[str, ...] = ()
    hook_type: str | None = None
    optional: bool = False
    version: str = SGLANG_VERSION


def _row(symbol, kind, where, reason, test, **kw) -> Touchpoint:
    return Touchpoint(symbol, kind, where, reason, test, **kw)


SEAM: tuple[Touchpoint, ...] = (
    # -- official extension points ------------------------------------------------------------
    _row(f"{_ALGO}.register", "api", "__init__.register",
         "adds --speculative-algorithm NANOSPEC", _REGISTERS,
         params=("name", "supports_overlap", "validate_server_args", "spec_class")),
    _row(_CSA, "api", "algo.NanoSpecAlgo",
         "the plugin algorithm's base class", _REGISTERS,
         params=("name", "factory", "supports_overlap", "validate_server_args")),
    _row("sglang.srt.plugins.hook_registry.HookRegistry.register", "api", "__init__.register",
         "registers every hook below", f"{_SEAM}::test_hook_registrations_are_the_table_hooks",
         params=("target", "hook", "hook_type")),
    _row("sglang.srt.plugins.hook_registry.HookType", "api", "__init__.register",
         "hook kinds", f"{_SEAM}::test_hook_registrations_are_the_table_hooks",
         attrs=("BEFORE", "AFTER", "AROUND")),
    _row("sglang.srt.runtime_context.get_spec", "api", "algo.NanoSpecAlgo.is_eagle3",
         "the draft path, to tell an EAGLE-3 draft from an EAGLE one in every process",
         f"{_UNITS}::test_eagle3_detection_follows_the_draft_config", params=()),
    _row("sglang.srt.managers.overlap_utils.FutureMap", "api", "algo.NanoSpecAlgo.create_future_map",
         "the overlap scheduler's future map, built as for EAGLE",
         _REGISTERS,
         params=("device", "spec_algo", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay")),
    _row(f"{_AD}.AdaptiveController", "api", "worker.NanoSpecWorker.__init__",
         "SGLang's adaptive speculative decoding: builds one runtime state (attention backends, CUDA "
         "graphs) per candidate step count in init_cuda_graphs, swaps them before each decode batch "
         "(activate_step_by_batch) and feeds verify results (on_verify_complete_cpu, accept lengths "
         "already on the host); NanoSpec gives it its own policy, controller.StepController",
         f"{_SERVER}::test_controller_switches_steps_mid_stream_and_output_equals_plain_decoding",
         params=("worker", "policy"),
         attrs=("register", "init_states", "activate_step_by_batch", "on_verify_complete")),
    _row(f"{_EW}.EAGLEWorkerV2", "api", "worker.NanoSpecWorker",
         "the adaptive protocol NanoSpec's worker inherits unchanged: per-step runtime states and the "
         "0-step verify (a plain decode through the verify graph)",
         f"{_SERVER}::test_controller_switches_steps_mid_stream_and_output_equals_plain_decoding",
         attrs=("build_adaptive_runtime_state", "apply_runtime_state", "on_verify_complete_cpu",
                "activate_step_by_batch", "_build_trivial_verify_input", "speculative_num_steps")),
    _row("sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams", "api",
         "controller.read_adaptive_config",
         "the --speculative-adaptive-config format (batch-size keys holding candidate_steps) NanoSpec "
         "reads; its accept-length rule is not used", "tests/test_controller.py",
         attrs=("candidate_steps", "set_cuda_graph_bs", "get_steps_for_batch", "on_verify_complete",
                "cuda_graph_bs_for_step")),
    # -- fields read --------------------------------------------------------------------------
    _row("sglang.srt.managers.schedule_batch.ScheduleBatch", "api", "runtime, worker, penalties",
         "prefill and decode batches", _LOSSLESS,
         attrs=("reqs", "req_pool_indices", "prefix_lens", "extend_lens", "chunked_req", "seq_lens",
                "forward_mode", "spec_info", "spec_algorithm", "sampling_info")),
    _row("sglang.srt.managers.schedule_batch.Req", "api", "runtime, hooks",
         "prompt ids, slot, output length", _LOSSLESS,
         attrs=("rid", "full_untruncated_fill_ids", "kv", "output_ids", "customized_info")),
    _row("sglang.srt.model_executor.forward_batch_info.ForwardBatch", "api", "hooks",
         "the draft head's request slots, the prefill's real row count", f"{_GPU}",
         attrs=("req_pool_indices", "forward_mode", "extend_num_tokens", "extend_seq_lens_cpu")),
    _row("sglang.srt.speculative.eagle_info.EagleVerifyInput", "api",
         "worker.NanoSpecWorker.verify, penalties",
         "the verified tree", _LOSSLESS,
         attrs=("draft_token", "retrieve_next_token", "retrieve_next_sibling", "draft_token_num",
                "spec_steps")),
    _row("sglang.srt.managers.utils.GenerationBatchResult", "api", "worker.NanoSpecWorker.verify",
         "the accepted path and the verify logits", _LOSSLESS,
         attrs=("accept_index", "accept_lens", "next_token_ids", "logits_output")),
    _row("sglang.srt.server_args.ServerArgs", "api", "flags.check_flags, worker.plan_memory",
         "launch flags that would trace or capture the plugin's hooks (refused); the request slots "
         "and token map NanoSpec's memory plan is sized from", f"{_FLAGS}",
         attrs=("enable_torch_compile", "cuda_graph_backend_prefill", "cuda_graph_config",
                "max_running_requests", "speculative_token_map")),
    _row("sglang.srt.runtime_context.get_schedule", "api", "worker.plan_memory",
         "the resolved max running requests (SGLang's req_to_token rows are that + 1), read as "
         "KVCacheConfigurator.resolve_max_num_reqs reads it", f"{_MEMORY}", params=()),
    _row("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator", "api",
         "memory.take_from_kv_budget",
         "the target's configurator is the one whose budget NanoSpec's bytes leave", f"{_MEMORY}",
         attrs=("is_draft_worker",)),
    # -- HookRegistry hooks -------------------------------------------------------------------
    _row(f"{_TM}.update_request_meta_info", "hook", "hooks.collapse_meta",
         "telemetry per-token copies become meta_info fields", _META,
         params=("self", "meta_info"), hook_type="AFTER"),
    _row(f"{_TM}._validate_one_request", "hook", "validate.before_validate_one_request",
         "refuse bad requests with HTTP 400 before the scheduler", "tests/test_plugin_bad_requests.py",
         params=("self", "obj", "input_ids"), hook_type="BEFORE"),
    _row("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward", "hook",
         "penalties.keep_orchestrator", "exact penalties: the worker's copy keeps the penalizers",
         _SAMPLING, params=("self",), hook_type="AFTER"),
    _row("sglang.srt.managers.schedule_batch.ScheduleBatch.cumulate_penalty_output_tokens", "hook",
         "penalties.skip_step_cumulation", "exact penalties: SGLang's one-token feed is skipped",
         _SAMPLING, params=("self",), hook_type="AROUND"),
    _row(f"{_EW}.EAGLEWorkerV2._forward_prefill_batch", "hook", "penalties.cumulate_prefill_token",
         "exact penalties: the prefill's token is fed at once", _SAMPLING,
         params=("self", "batch"), hook_type="AROUND"),
    _row("sglang.srt.speculative.eagle_utils.eagle_sample", "hook", "penalties.exact_verify",
         "exact penalties per tree row", _SAMPLING,
         params=("verify_input", "batch", "logits_output"), hook_type="AROUND"),
    _row("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes",
         "hook", "memory.take_from_kv_budget",
         "NanoSpec's planned bytes (memory.MemoryPlan, announced by NanoSpecWorker.__init__ after the "
         "draft loads) leave the target's KV budget (bytes: free memory less the mem-fraction slack) "
         "before the pools are sized; the one function SGLang sizes the KV cache from on every device, "
         "no public reserve exists (mm_runtime_reservation_gb is multimodal-only, the mem-fraction "
         "default ignores a user's --mem-fraction-static); skips configurators with is_draft_worker",
         f"{_MEMORY}::test_kv_pool_shrinks_by_what_nanospec_reserves_against_eagle3",
         params=("self", "pre_model_load_memory"), hook_type="AFTER"),
    _row(f"{_EW}.EagleDraftWorker.draft", "hook", "telemetry.DraftTimer",
         "draft-step timing for the serving benchmark (NANOSPEC_TIME_DRAFT=1 only)",
         f"{_UNITS}::test_draft_timer_logs_median_and_mean_of_all_calls",
         params=("self", "batch"), hook_type="AROUND", optional=True),
    # -- method overrides ---------------------------------------------------------------------
    _row(f"{_CSA}.is_eagle", "override", "algo.NanoSpecAlgo", "behave as the EAGLE family",
         _REGISTERS, params=("self",)),
    _row(f"{_CSA}.is_eagle3", "override", "algo.NanoSpecAlgo",
         "EAGLE-3 drafts need the target's auxiliary hidden states",
         f"{_UNITS}::test_eagle3_detection_follows_the_draft_config", params=("self",)),
    _row(f"{_CSA}.handle_server_args", "override", "algo.NanoSpecAlgo",
         "EAGLE-family defaults (SGLang applies them to built-in algorithms only); every write is logged",
         f"{_UNITS}::test_server_arg_overrides_are_logged", params=("self", "server_args"),
         attrs=("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                "max_running_requests", "disable_overlap_schedule", "cuda_graph_config",
                "enable_mixed_chunk")),
    _row(f"{_ALGO}.carries_draft_hidden_states", "override", "algo.NanoSpecAlgo",
         "the scheduler calls it on every algorithm; CustomSpecAlgo lacks it",
         _REGISTERS, params=("self",)),
    _row(f"{_ALGO}.need_topk", "override", "algo.NanoSpecAlgo",
         "the scheduler calls it on every algorithm; CustomSpecAlgo lacks it",
         _REGISTERS, params=("self",)),
    _row(f"{_ALGO}.get_platform_worker_cls", "override", "algo.NanoSpecAlgo",
         "the scheduler calls it on every algorithm; CustomSpecAlgo lacks it",
         _REGISTERS, params=("self",)),
    _row(f"{_ALGO}.create_future_map", "override", "algo.NanoSpecAlgo",
         "the overlap scheduler calls it on every algorithm; CustomSpecAlgo lacks it",
         _REGISTERS,
         params=("self", "device", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay")),
    _row(f"{_EW}.EAGLEWorkerV2.__init__", "override", "worker.NanoSpecWorker",
         "makes the draft worker a NanoSpecDraftWorker (see the __class__ row)", _LOSSLESS,
         params=("self", "server_args", "gpu_id", "nccl_port", "target_worker")),
    _row(f"{_EW}.EAGLEWorkerV2.forward_batch_generation", "override", "worker.NanoSpecWorker",
         "times each decode cycle (start to the next start), its draft and verify parts, for the step "
         "controller: CPU wall time, or CUDA events read once passed (stopwatch.Stopwatch); before a "
         "prefill, asks the controller whether it runs cold (no top-K_pre, no draft prefill pass)",
         f"{_SERVER}::test_controller_switches_steps_mid_stream_and_output_equals_plain_decoding",
         params=("self", "batch")),
    _row(f"{_EW}.EAGLEWorkerV2.verify", "override", "worker.NanoSpecWorker",
         "after each verify: telemetry and the stream's extension", _LOSSLESS,
         params=("self", "batch", "pp_proxy_tensors", "grammar_barrier")),
    _row(f"{_EW}.EagleDraftWorker.init_lm_head", "override", "worker.NanoSpecDraftWorker",
         "builds the proposer once SGLang has loaded the draft head and sized the slot pool", _LOSSLESS,
         params=("self",)),
    _row(f"{_EW}.EagleDraftWorker.draft_forward", "override", "worker.NanoSpecDraftWorker",
         "a draft pass starts from draft-extend's vocabulary ids: drops any column map left pending",
         _IDMAP, params=("self", "forward_batch")),
    _row(f"{_EW}.EagleDraftWorker.draft", "override", "worker.NanoSpecDraftWorker",
         "waits for side-stream gathers before a possible graph replay; skips a stale-head graph",
         f"{_GPU}::test_graph_replayed_draft_step_sees_every_queued_gather", params=("self", "batch")),
    _row(f"{_EW}.EagleDraftWorker._draft_extend_for_decode", "override", "worker.NanoSpecDraftWorker",
         "(private) the only entry of draft-extend after a verify, graph or not: same wait and skip as draft",
         f"{_GPU}::test_graph_replayed_draft_extend_sees_every_queued_gather",
         params=("self", "batch", "batch_result", "kv_loc_plan")),
    _row(f"{_EW}.EagleDraftWorker._draft_extend_for_prefill", "override", "worker.NanoSpecDraftWorker",
         "(private) the first point where a prefill's prompt ids and target top-k are both known; a "
         "cold prefill returns SGLang's stub draft state instead of running the pass",
         _LOSSLESS, params=("self", "batch", "target_hidden_states", "next_token_ids", "mm_input_embeds",
                               "kv_loc_plan")),
    # -- private calls and in-place state -------------------------------------------------------
    _row(f"{_LP}._compute_lm_head", "private", "hooks.install_prefill_topk",
         "the target's LM head on prompt rows: the only function that runs any head kind (plain, "
         "quantized, CPU-packed weights); no public method computes logits for given rows",
         f"{_GPU}::test_prefill_hook_ignores_the_padding_rows_of_a_prefill_graph",
         params=("self", "hidden_states", "lm_head")),
    _row("sglang.srt.sampling.penaltylib.repetition_penalty.apply_scaling_penalties", "private",
         "penalties.exact_verify", "SGLang's own scaling-penalty arithmetic, bit for bit", _SAMPLING,
         params=("logits", "scaling_penalties")),
    _row("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo", "private", "penalties.exact_verify",
         "the uniform speculative penalties are switched off for one eagle_sample call (applied per "
         "row instead); the forward copy keeps a reference to the penalizers", _SAMPLING,
         attrs=("acc_additive_penalties", "acc_scaling_penalties", "penalizer_orchestrator",
                "nanospec_penalizer")),
    _row("sglang.srt.sampling.penaltylib.min_new_tokens.BatchedMinNewTokensPenalizer", "private",
         "penalties.cumulate_accepted", "every accepted token is fed to the penalizers on the device "
         "(also the cumulated_* tensors of the frequency, presence and repetition penalizers, in place)",
         _SAMPLING, attrs=("len_output_tokens",)),
    _row(f"{_EW}.EAGLEWorkerV2._stub_skipped_draft_extend", "private", "worker.NanoSpecWorker.skip_extend",
         "a 0-step cycle that skips the draft's catch-up pass leaves SGLang's own stub as the next draft "
         "state (what SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND does for every 0-step cycle), as does a "
         "cold prefill; the step controller runs one cycle with the pass before any cycle drafts from it",
         f"{_SERVER}::test_controller_switches_steps_mid_stream_and_output_equals_plain_decoding",
         params=("self", "batch", "batch_output")),
    _row("sglang.srt.speculative.eagle_info.EagleDraftExtendInput", "private",
         "worker.NanoSpecDraftWorker.widened, hooks.install_draft_head",
         "SGLang's widened draft-extend window (num_front_tokens, as its multi-layer MTP worker uses "
         "it): the skipped positions' inputs run in front of the verify window; the draft head "
         "drops those rows, so that the head's work and SGLang's row selection stay the window's", _GAPS,
         attrs=("num_front_tokens", "num_tokens_per_req", "num_tokens_for_logprob_per_req")),
    # -- replacements (not API) -----------------------------------------------------------------
    _row("sglang.srt.speculative.eagle_info.EagleDraftInput", "private",
         "worker.NanoSpecDraftWorker._draft_extend_for_decode, _draft_extend_for_prefill",
         "draft-extend's top-k comes back over extend_head's columns (logits [N, W_max], not [N, V]); "
         "it is rewritten to vocabulary ids right after the pass, before SGLang stores it across "
         "scheduler iterations (no hook sits between its top-k and that store). A cold prefill "
         "builds one (bonus tokens, per-request counts) for SGLang's stub to fill",
         f"{_MEMORY}::test_draft_extend_logits_span_the_window_and_map_to_each_requests_best_token",
         attrs=("topk_index",)),
    _row(f"{_EW}.prepare_for_draft_extend", "replacement", "worker.NanoSpecDraftWorker.widened",
         "swapped for one draft-extend call that fills skipped positions: SGLang's own function runs "
         "with its widened window (locations and positions of the skipped positions in front), and the "
         "front rows' token ids and hidden states are written after it returns, as SGLang's "
         "multi-layer worker does; EAGLEWorkerV2 builds that window for no other worker", _GAPS,
         params=("draft_extend_input", "batch", "predict", "num_draft_tokens", "draft_model_runner",
                 "cuda_graph_runner", "return_hidden_states_before_norm", "widened_out_cache_loc",
                 "widened_positions"),
         attrs=("prepare_for_draft_extend",)),
    _row(f"{_EW}.EAGLEWorkerV2._draft_worker", "replacement", "worker.NanoSpecWorker.__init__",
         "__class__ of the live draft worker becomes NanoSpecDraftWorker (a subclass adding no state "
         "before init_lm_head): EAGLEWorkerV2.__init__ builds EagleDraftWorker by name, no factory "
         "or class attribute to override", _LOSSLESS, attrs=("__class__",)),
    _row(f"{_LP}.forward", "replacement", "hooks.install_prefill_topk, hooks.install_draft_head",
         "instance attribute of the target's and the draft's two LogitsProcessors only. Target: the "
         "top-K_pre of every prompt row needs the hidden states before SGLang prunes them to the last "
         "position. Draft: keeps the ForwardBatch (request slots) that LogitsMetadata drops, for "
         "_get_logits. A HookRegistry hook on the class would wrap every LogitsProcessor of the "
         "process, other algorithms' included", f"{_GPU}", params=("self", "input_ids", "hidden_states",
                                                                  "lm_head", "logits_metadata"),
         attrs=("forward",)),
    _row(f"{_LP}._get_logits", "replacement", "hooks.install_draft_head",
         "instance attribute of the draft's LogitsProcessor: the draft head over dynamic vocabularies; "
         "SGLang has no pluggable LM head. Draft-extend results are scattered to [N, V] because SGLang "
         "keeps their top-k (in vocabulary ids) across scheduler iterations and batch changes, and "
         "computes it itself from next_token_logits", _HEADS,
         params=("self", "hidden_states", "lm_head", "logits_metadata"), attrs=("_get_logits",)),
    _row(f"{_EW}.EAGLEWorkerV2.adaptive_controller", "replacement", "worker.NanoSpecWorker.__init__",
         "an AdaptiveController with NanoSpec's policy: SGLang builds one only for EAGLE/EAGLE3 under "
         "--speculative-adaptive (its rule reads accept lengths, not costs), with no policy factory",
         f"{_SERVER}::test_controller_switches_steps_mid_stream_and_output_equals_plain_decoding",
         attrs=("adaptive_controller",)),
    _row(f"{_EW}.EagleDraftWorker.hot_token_id", "replacement", "worker.NanoSpecDraftWorker.init_lm_head",
         "hooks.IdMap stands where SGLang maps a reduced draft vocabulary: draft_forward maps every "
         "step's top-k through it (hot_token_id[topk_index]); it maps the columns of the draft logits "
         "computed since its last lookup, and passes ids through when there are none (the pass's "
         "first lookup, of draft-extend's vocabulary ids). No other hook sits between the draft "
         "logits and SGLang's use of their top-k", _IDMAP,
         attrs=("hot_token_id",)),
    _row("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.free", "replacement", "hooks.install_release",
         "instance attribute of this server's pool: the one call every request end goes through "
         "(finish, abort, disconnect, retraction); SGLang has no request-end hook",
         f"{_SERVER}::test_many_requests_reuse_slots_without_growing_state",
         params=("self", "req"), attrs=("free",)),
    _row("sglang.srt.managers.schedule_batch.Req.customized_info", "replacement", "hooks.attach_meta",
         "the request's telemetry reaches the tokenizer process through customized_info, which SGLang's "
         "output streamer slices per output token: one copy per token", _META,
         attrs=("customized_info",)),
    _row("sglang.srt.managers.scheduler_components.metrics_reporter", "replacement", "telemetry.LogSuffix",
         "a logging.Filter on this module's logger appends NanoSpec's counters to the record whose "
         "message starts with 'Decode batch' and holds 'accept len' (SGLang has no metrics hook)",
         f"{_SERVER}::test_decode_log_line_carries_running_averages", attrs=("msg", "args")),
    _row(f"{_EW}.EagleDraftWorker.cuda_graph_runner", "replacement", "worker.graphs_unless_stale",
         "set to None for one call (also cuda_graph_runner_for_draft_extend) when the graph holds "
         "another head than the current choice: SGLang then runs that call eagerly; SGLang has no "
         "per-call graph switch", f"{_GPU}::test_step_runs_eagerly_when_its_graph_holds_another_head",
         attrs=("cuda_graph_runner", "cuda_graph_runner_for_draft_extend")),
)


def rows(kind: str | None = None) -> tuple[Touchpoint, ...]:
    return tuple(t for t in SEAM if kind is None or t.kind == kind)


# -- writes on SGLang objects --------------------------------------------------------------------

PATCHES: list[tuple[str, str]] = []  # (symbol, attribute) of every patch applied in this process


def _row_for(symbol: str, attr: str) -> Touchpoint:
    for t in SEAM:
        if t.symbol == symbol and attr in t.attrs:
            return t
    raise SeamError(f"NANOSPEC: {symbol}.{attr} is not in nanospec/sglang/seam.py's table")


def patch(obj, attr: str, value, symbol: str) -> None:
    """Replace ``obj.<attr>`` (an SGLang object's) with ``value``; ``symbol`` must be a table row."""
    _row_for(symbol, attr)
    setattr(obj, attr, value)
    PATCHES.append((symbol, attr))


@contextlib.contextmanager
def swapped(obj, attr: str, value, symbol: str):
    """Set ``obj.<attr>`` to ``value`` for the duration of the block, then restore it."""
    _row_for(symbol, attr)
    saved = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, saved)


def hide(obj, attr: str, symbol: str):
    """Set ``obj.<attr>`` to None for the duration of the block, then restore it."""
    return swapped(obj, attr, None, symbol)


def set_server_arg(server_args, name: str, value, why: str) -> None:
    """Write one server argument from ``handle_server_args`` and log it (SGLang records the write)."""
    _row_for(f"{_CSA}.handle_server_args", name)
    old = getattr(server_args, name)
    setattr(server_args, name, value)
    logger.warning("NANOSPEC sets %s = %r (was %r): %s", name, value, old, why)


# -- the start-up check --------------------------------------------------------------------------


def _version() -> str:
    try:
        import sglang

        return str(getattr(sglang, "__version__", "unknown"))
    except Exception:
        return "unknown"


def _fail(t: Touchpoint, problem: str) -> SeamError:
    return SeamError(f"NANOSPEC was written against SGLang {t.version}; the installed SGLang {_version()} "
                     f"differs at {t.symbol} ({t.kind}, used by nanospec.sglang.{t.where}): {problem}. "
                     f"See docs/plugin.md, 'The seam'.")


def _resolve(symbol: str):
    """The object at ``symbol``, or (for a class attribute set per instance) its class."""
    try:
        return pkgutil.resolve_name(symbol), None
    except (ImportError, AttributeError, ValueError):
        owner, _, attr = symbol.rpartition(".")
        try:
            return pkgutil.resolve_name(owner), attr
        except (ImportError, AttributeError, ValueError) as e:
            raise LookupError(str(e)) from None


def _class_has(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    for k in cls.__mro__:
        if not k.__module__.startswith("sglang"):
            continue
        try:
            src = inspect.getsource(k)
        except (OSError, TypeError):
            continue
        if f"self.{name} =" in src or f"self.{name}:" in src:
            return True
    return False


def check_row(t: Touchpoint) -> None:
    """Raise SeamError if SGLang does not have ``t`` as the table describes it."""
    if t.kind not in KINDS:
        raise _fail(t, f"unknown kind {t.kind!r}")
    try:
        obj, instance_attr = _resolve(t.symbol)
    except LookupError as e:
        raise _fail(t, f"cannot be imported ({e})") from None
    if instance_attr is not None:
        # An attribute SGLang sets per instance (self.hot_token_id = ...) or a module-level logger.
        if isinstance(obj, type):
            for name in dict.fromkeys((instance_attr, *t.attrs)):
                if name != "__class__" and not _class_has(obj, name):
                    raise _fail(t, f"{obj.__qualname__} no longer sets {name}")
        return
    if t.params is not None:
        try:
            names = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError) as e:
            raise _fail(t, f"has no signature ({e})") from None
        if names[: len(t.params)] != t.params:
            raise _fail(t, f"parameters are {names}, NanoSpec expects them to start with {t.params}")
    if isinstance(obj, type) and t.kind in ("api", "private"):
        missing = [a for a in t.attrs if a != "nanospec_penalizer" and not _class_has(obj, a)]
        if missing:
            raise _fail(t, f"has no attribute(s) {missing}")


_checked: list[bool] = []


def check(force: bool = False) -> None:
    """Check every row against the installed SGLang (once per process unless ``force``)."""
    if _checked and not force:
        return
    if _version() != SGLANG_VERSION:
        logger.warning("NANOSPEC was written against SGLang %s; SGLang %s is installed (the seam check "
                       "below still passes, so it starts)", SGLANG_VERSION, _version())
    for t in SEAM:
        check_row(t)
    _checked.append(True)


def table_markdown() -> str:
    """The table as docs/plugin.md shows it."""
    out = [f"| symbol (SGLang {SGLANG_VERSION}) | kind | NanoSpec | reason | test |",
           "|---|---|---|---|---|"]
    for t in SEAM:
        sym = t.symbol.replace("sglang.srt.", "")
        if t.attrs and t.kind != "api":
            sym += " (" + ", ".join(t.attrs) + ")"
        out.append(f"| `{sym}` | {t.kind} | `{t.where}` | {t.reason} | `{t.test}` |")
    return "\n".join(out)
