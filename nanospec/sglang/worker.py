"""``NANOSPEC`` workers: SGLang's EAGLE v2 workers with the draft LM head over dynamic vocabularies.

Everything SGLang does for EAGLE/EAGLE3 (tree drafting, verification, KV bookkeeping, overlap
scheduling, CUDA graphs, per-step runtime states) is inherited unchanged; NanoSpec adds five things:
  1. prefill: start each request's stream from its prompt and the target's top-K_pre;
  2. every draft logit (draft steps and draft-extend) comes from the core ``Proposer``;
  3. after each verify: telemetry, then append tree tokens and the accepted path's top-K_ver;
  4. request end: release the slot and attach telemetry for meta_info;
  5. with NANOSPEC_STEPS=auto: each decode cycle timed (stopwatch.Stopwatch) for the step controller
     (nanospec/controller.py), which SGLang's AdaptiveController asks for the step count of a batch;
     a 0-step cycle skips the draft's catch-up pass when the controller says so (SGLang's own stub
     of the draft state, as under SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND, but per cycle), and so
     does a prefill into a batch size settled on 0 steps, which also skips the target's top-K_pre;
     the next pass that runs writes the skipped positions' draft KV late (nanospec/sglang/gapfill.py).
The draft and draft-extend entries also wait for queued gathers before a possible CUDA-graph replay
and skip a graph captured with another head than the current choice (docs/plugin.md, GPU features).
"""

from __future__ import annotations

import contextlib
import json
import logging
from types import SimpleNamespace

import torch
from sglang.srt.speculative import eagle_worker_v2
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from nanospec.controller import StepController, read_adaptive_config
from nanospec.sglang import hooks, memory, seam
from nanospec.sglang.gapfill import WINDOW, GapFill, verify_width
from nanospec.sglang.runtime import Runtime
from nanospec.sglang.settings import check_against_model, load_settings
from nanospec.sglang.telemetry import LogSuffix
from nanospec.stopwatch import Stopwatch

logger = logging.getLogger(__name__)


def draft_head_weight(model) -> torch.Tensor:
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise ValueError("NANOSPEC needs a plain floating-point draft LM head (lm_head.weight); "
                         f"got {type(head).__name__} (quantized or missing heads are not supported)")
    return weight.data if weight.stride(1) == 1 else weight.data.contiguous()


def reduced_vocab_map(hot: torch.Tensor | None, target_vocab: int) -> torch.Tensor | None:
    """The draft's row -> target-id map, or None when rows already are target ids (no map, or an
    identity ``d2t`` over the whole vocabulary, which only switches on SGLang's hot-token path)."""
    if hot is None:
        return None
    hot = hot.long()
    if hot.shape[0] >= target_vocab and torch.equal(hot[:target_vocab].cpu(), torch.arange(target_vocab)):
        return None
    return hot


def plan_memory(server_args, draft_worker, target_worker, gap_window: int = 0) -> memory.MemoryPlan:
    """NanoSpec's bytes for this server, before SGLang sizes the KV cache: slots are SGLang's
    req_to_token rows (max running requests + 1 padding row; fewer if the KV cache caps the requests,
    so this is an upper bound), the head is the loaded draft's (or the target's, which EAGLE drafts
    share); gap_window: skipped positions kept per slot (``GapFill``; 0: none)."""
    model = draft_worker.draft_runner.model
    try:
        weight = draft_head_weight(model)
    except ValueError:  # no head of its own yet: SGLang binds the target's in init_lm_head
        weight = draft_head_weight(target_worker.model_runner.model)
    target_vocab = target_worker.model_config.vocab_size
    reduced = (weight.shape[0] != target_vocab or getattr(model, "hot_token_id", None) is not None
               or getattr(server_args, "speculative_token_map", None) is not None)
    from sglang.srt.runtime_context import get_schedule

    # The resolved value (the scheduler's server_args may hold the unresolved None): what SGLang's
    # KVCacheConfigurator.resolve_max_num_reqs reads too.
    running = get_schedule().max_running_requests or server_args.max_running_requests
    if running is None:
        raise ValueError("NANOSPEC needs a maximum number of running requests to size its state")
    gap_row = (GapFill.slot_bytes(verify_width(model), target_worker.model_runner.dtype, gap_window)
               if gap_window else 0)
    return memory.plan(slots=int(running) + 1, head=weight,
                       settings=load_settings(), target_vocab=target_vocab, reduced=reduced,
                       draft_tokens=int(draft_worker.speculative_num_draft_tokens), gap_bytes=gap_row)


def build_controller(server_args, steps: int, topk: int) -> StepController | None:
    """The cost-aware step controller for this server, or None for a fixed chain (NANOSPEC_STEPS=fixed,
    a tree: SGLang's step states are chains, or a 0-step chain). Candidates: 0..steps per bucket, or
    the ``--speculative-adaptive-config`` file's."""
    mode = load_settings().steps
    if mode == "fixed" or steps == 0:
        return None
    if topk != 1:
        logger.warning("NANOSPEC steps=auto needs a chain (--speculative-eagle-topk 1); with topk=%d the "
                       "tree is fixed at %d steps", topk, steps)
        return None
    path = getattr(server_args, "speculative_adaptive_config", None)
    candidates, config = read_adaptive_config(path, steps)
    logger.info("NANOSPEC steps=auto: draft steps chosen per batch by measured cost; candidates %s; %s",
                candidates, config)
    return StepController(candidates, initial_steps=steps, config=config)


def is_decode(batch) -> bool:
    mode = batch.forward_mode
    return not (mode.is_extend() or batch.is_extend_in_batch or mode.is_idle())


GRAPH_RUNNER = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.cuda_graph_runner"
HOT_TOKEN_ID = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.hot_token_id"
DRAFT_WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._draft_worker"
REPORT_EVERY = 50  # decode cycles between two "NANOSPEC steps report" log lines
ADAPTIVE = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.adaptive_controller"
PREPARE_EXTEND = "sglang.srt.speculative.eagle_worker_v2.prepare_for_draft_extend"


def graphs_unless_stale(worker, attr: str, head, batch: int, rows: int):
    """Hide the graph runner ``worker.<attr>`` for one call when its graphs run another head than
    the one ``head`` (the proposer) picks now for ``batch`` requests (SGLang then runs that call
    eagerly)."""
    if getattr(worker, attr, None) is None or batch == 0 or head.graph_is_current(batch, rows):
        return contextlib.nullcontext()
    return seam.hide(worker, attr, GRAPH_RUNNER)


class NanoSpecDraftWorker(EagleDraftWorker):
    nano_skip_extend = None
    nano_stub = None
    nano_gap_window = 0

    def set_skip_extend(self, skip, stub, gap_window: int) -> None:
        """``skip(batch, batch_result, must_run) -> bool``, asked at each decode cycle's draft-extend:
        True when the cycle skips it (NanoSpecWorker.skip_extend has then stubbed the draft state);
        never when ``must_run``. ``stub(batch, batch_result)`` fills SGLang's stub draft state, for a
        cold prefill. gap_window: skipped positions kept per slot for a later pass (``GapFill``)."""
        self.nano_skip_extend, self.nano_stub, self.nano_gap_window = skip, stub, gap_window

    def init_lm_head(self) -> None:
        super().init_lm_head()
        settings = load_settings()
        target_vocab = self.target_worker.model_config.vocab_size
        check_against_model(settings, vocab_size=target_vocab, eagle_topk=self.topk)
        weight = draft_head_weight(self.draft_runner.model)
        hot = reduced_vocab_map(self.hot_token_id, target_vocab)
        slots = self.req_to_token_pool.req_to_token.shape[0]
        gaps = (GapFill(slots, verify_width(self.draft_runner.model), self.target_worker.model_runner.dtype,
                        weight.device, self.nano_gap_window) if self.nano_gap_window else None)
        self.nano = Runtime(weight, slots, settings, hot=hot, target_vocab=target_vocab, gaps=gaps)
        self.nano.warm_up(self.speculative_num_draft_tokens, self.speculative_num_steps + 1)
        ids = hooks.IdMap(self.nano.proposer.out_vocab)
        hooks.install_draft_head(self.draft_runner.model.logits_processor, self.nano, ids)
        hooks.install_prefill_topk(self.target_worker.model_runner.model.logits_processor, self.nano)
        hooks.install_release(self.req_to_token_pool, self.nano)
        hooks.install_log_suffix(LogSuffix(self.nano.describe))
        # SGLang maps every draft step's top-k through hot_token_id; NanoSpec's map goes there.
        seam.patch(self, "hot_token_id", ids, HOT_TOKEN_ID)
        mem = self.nano.proposer.nbytes()
        logger.info("NANOSPEC: %s; %d slots, vocabulary state %.1f MiB (%.1f KiB per slot), draft "
                    "head %s", settings.describe(), slots, mem["total"] / 2**20,
                    mem["per_request"] / 2**10, "reduced" if hot is not None else "full")
        reserved = memory.announced()
        logger.info("NANOSPEC memory: allocated %d bytes of persistent state; reserved %s bytes before "
                    "the KV cache (persistent %s)", memory.allocated_bytes(self.nano, exclude=(weight, hot)),
                    None if reserved is None else reserved.total,
                    None if reserved is None else reserved.persistent_bytes)

    def draft_forward(self, forward_batch):
        self.hot_token_id.clear()  # the incoming top-k come from draft-extend: vocabulary ids
        return super().draft_forward(forward_batch)

    # The two entries of a decode step's draft work. Either may replay a CUDA graph, which never
    # runs draft_forward or any other Python of ours, so both wait here for the side-stream gathers
    # queued by after_verify, and both leave the graph out when it was captured with another head.

    def draft(self, batch, **kwargs):
        self.nano.proposer.wait_gathers()
        n = len(batch.seq_lens)
        with graphs_unless_stale(self, "cuda_graph_runner", self.nano.proposer, n, n * self.topk):
            return super().draft(batch, **kwargs)

    def _draft_extend_for_decode(self, batch, batch_result, **kwargs):
        n = len(batch.seq_lens)
        gaps = self.nano.gaps if n else None
        slots = [int(r.kv.req_pool_idx) for r in batch.reqs] if gaps is not None else []
        if n and self.nano_skip_extend is not None and self.nano_skip_extend(
                batch, batch_result, gaps is not None and gaps.due(slots)):
            if gaps is not None:
                gaps.stash(slots, batch.req_pool_indices, batch.seq_lens, batch_result.next_token_ids,
                           batch_result.logits_output.hidden_states)
            return None
        self.nano.proposer.wait_gathers()
        front = gaps.front(slots) if gaps is not None else 0
        if front:
            ctx = self.widened(batch, batch_result, front)
        else:
            ctx = graphs_unless_stale(self, "cuda_graph_runner_for_draft_extend", self.nano.proposer, n,
                                      n * self.speculative_num_draft_tokens)
        with ctx:
            out = super()._draft_extend_for_decode(batch, batch_result, **kwargs)
        if gaps is not None:
            gaps.written(slots, front)
        nxt = getattr(batch_result, "next_draft_input", None)
        if n and getattr(nxt, "topk_index", None) is not None:
            # SGLang took the top-k over extend_head's columns: vocabulary ids from here on.
            nxt.topk_index = hooks.extend_token_ids(self.nano.proposer, batch.req_pool_indices,
                                                    nxt.topk_index)
        return out

    @contextlib.contextmanager
    def widened(self, batch, batch_result, front: int):
        """For one draft-extend call: its window starts ``front`` positions early, at the batch's
        skipped positions, whose kept inputs run in front of the verify's (``GapFill``); the draft
        head leaves those rows out (``hooks.install_draft_head``), so SGLang selects each request's
        last accepted row as usual. Eager: a captured graph has the usual window."""
        gaps, d = self.nano.gaps, self.speculative_num_draft_tokens
        locs, positions = gaps.window_of(self.req_to_token_pool.req_to_token, batch.req_pool_indices,
                                         batch.seq_lens, front, d)
        original = eagle_worker_v2.prepare_for_draft_extend

        def prepare(inp, batch_, predict, num_draft_tokens, *args, **kwargs):
            verify_hidden = inp.hidden_states
            inp.num_front_tokens = front
            inp.num_tokens_per_req = inp.num_tokens_for_logprob_per_req = front + num_draft_tokens
            fb = original(inp, batch_, predict, num_draft_tokens, *args, **kwargs,
                          widened_out_cache_loc=locs, widened_positions=positions)
            gaps.fill(fb.input_ids, fb.spec_info.hidden_states, batch_.req_pool_indices, batch_.seq_lens,
                      front, predict, verify_hidden)
            return fb

        with (seam.swapped(eagle_worker_v2, "prepare_for_draft_extend", prepare, PREPARE_EXTEND),
              seam.hide(self, "cuda_graph_runner_for_draft_extend", GRAPH_RUNNER)):
            yield

    def _draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids,
                                  mm_input_embeds=None, kv_loc_plan=None):
        live = not batch.forward_mode.is_idle()
        if live and self.nano.gaps is not None:
            self.nano.gaps.started([int(r.kv.req_pool_idx) for r in batch.reqs])
        if live and self.nano.cold_prefill and self.nano_stub is not None:
            # The controller settled on plain decoding: no draft pass; the draft state is SGLang's
            # stub, and the controller runs a catch-up cycle before any cycle drafts from it.
            self.nano.start_batch(batch)
            self.nano.finish_prefill(batch)
            out = EagleDraftInput(bonus_tokens=next_token_ids, num_tokens_per_req=1,
                                  num_tokens_for_logprob_per_req=1)
            self.nano_stub(batch, SimpleNamespace(next_draft_input=out))
            return out
        if live:
            self.nano.start_batch(batch)  # before the rotation below rewrites batch.input_ids
        out = super()._draft_extend_for_prefill(batch, target_hidden_states, next_token_ids,
                                                mm_input_embeds, kv_loc_plan=kv_loc_plan)
        if live:
            self.nano.finish_prefill(batch)
            if getattr(out, "topk_index", None) is not None:  # extend_head's columns -> vocabulary ids
                out.topk_index = hooks.extend_token_ids(self.nano.proposer, batch.req_pool_indices,
                                                        out.topk_index)
        return out


class NanoSpecWorker(EAGLEWorkerV2):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        seam.check()  # in the scheduler process: SGLang as the seam table describes it
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.steps: StepController | None = None
        self.watch = Stopwatch(self.device)
        self.nano_cycle = None  # (batch size, steps, start stamp, catch-up?) of the decode cycle under way
        self.nano_verify_at = None  # this cycle's verify start stamp
        if self._draft_worker is not None:
            self.steps = build_controller(server_args, self.speculative_num_steps, self.topk)
            if self.steps is not None:
                # SGLang's own controller swaps the per-step runtime states (built in init_cuda_graphs,
                # one set of graphs per candidate); NanoSpec's policy decides which.
                seam.patch(self, "adaptive_controller", AdaptiveController(self, self.steps), ADAPTIVE)
            # Same object, NanoSpec's methods: they take effect at alloc_memory_pool (init_lm_head).
            seam.patch(self._draft_worker, "__class__", NanoSpecDraftWorker, DRAFT_WORKER)
            gap_window = WINDOW if self.steps is not None and self.steps.config.cold_plain else 0
            if self.steps is not None:
                self._draft_worker.set_skip_extend(self.skip_extend, self._stub_skipped_draft_extend,
                                                   gap_window)
            # The draft is loaded and the KV cache not yet sized: announce what init_lm_head will
            # allocate, so that SGLang's KV budget leaves room for it (nanospec/sglang/memory.py).
            memory.announce(plan_memory(server_args, self._draft_worker, target_worker, gap_window))

    def forward_batch_generation(self, batch, *args, **kwargs):
        """SGLang's step, timed for the step controller: a decode cycle runs from its start to the
        start of the next decode cycle (one that follows a prefill or an idle wait is not timed)."""
        if self.steps is None:
            return super().forward_batch_generation(batch, *args, **kwargs)
        decode = is_decode(batch)
        if batch.forward_mode.is_extend() and self._draft_worker is not None:
            nano = self._draft_worker.nano
            nano.set_cold_prefill(self.steps.cold_prefill(nano.decode_size(batch.reqs)))
        now = self.watch.stamp()
        if self.nano_cycle is not None and decode:
            bs, k, start, caught_up = self.nano_cycle
            if not caught_up:  # a catch-up cycle prices switching up, not a 0-step cycle
                self.watch.interval(("cycle", bs, k), start, now)
        self.nano_cycle = None
        out = super().forward_batch_generation(batch, *args, **kwargs)
        if decode:
            bs, k = int(batch.seq_lens.shape[0]), self.speculative_num_steps
            self.steps.launched(bs, k, self._draft_worker.nano.warm_rows(batch.reqs))
            if self.nano_verify_at is not None:
                self.watch.interval(("draft", bs, k), now, self.nano_verify_at)
            self.nano_cycle = (bs, k, now, self.steps.caught_up)
        self.nano_verify_at = None
        for (kind, bs, k), seconds in self.watch.poll():
            self.steps.record(kind, bs, k, seconds)
        if decode and self.steps.decisions % REPORT_EVERY == 0:
            # The learned cost model, for the benchmarks (last line wins) and for users reading logs.
            gaps = self._draft_worker.nano.gaps
            report = {**self.steps.report(), **({"gap_fill": gaps.report()} if gaps is not None else {})}
            logger.info("NANOSPEC steps report: %s", json.dumps(report))
        return out

    def skip_extend(self, batch, batch_result, must_run: bool = False) -> bool:
        """At a decode cycle's draft-extend: when the controller skips it (a plain cycle that no
        drafting cycle follows directly, and ``must_run`` is false), fill the next draft state with
        SGLang's stub."""
        if not self.steps.skip_catch_up(self.speculative_num_steps, must_run):
            return False
        self._stub_skipped_draft_extend(batch, batch_result)
        return True

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        timed = self.steps is not None
        if timed:
            self.nano_verify_at = self.watch.stamp()
        verify_input = batch.spec_info
        result = super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        if not batch.forward_mode.is_idle() and self._draft_worker is not None:
            self._draft_worker.nano.after_verify(
                reqs=batch.req_pool_indices,
                draft_tokens=verify_input.draft_token,
                accept_index=result.accept_index,
                accept_lens=result.accept_lens,
                predict=result.next_token_ids,
                logits=result.logits_output.next_token_logits,
            )
        if timed:
            self.watch.interval(("verify", int(batch.seq_lens.shape[0]), self.speculative_num_steps),
                                self.nano_verify_at, self.watch.stamp())
        return result
