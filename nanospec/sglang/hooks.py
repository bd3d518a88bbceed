"""NanoSpec's attachments to live SGLang objects and the tokenizer-side meta_info hook.

``install_*`` replace attributes of single instances (the target's and the draft's logits processors,
this server's ``req_to_token`` pool) and add a filter to one logger; ``NanoSpecDraftWorker.init_lm_head``
calls them when the draft worker starts. ``collapse_meta`` is the one function here registered through
SGLang's HookRegistry (by ``nanospec.sglang.register``, with the other hooks). Each attachment is a
row of ``seam.SEAM``, which says why no SGLang extension point serves; the writes go through
``seam.patch`` so that an undocumented one fails at once.
"""

from __future__ import annotations

import logging

import torch

from nanospec.proposer import DraftLogits
from nanospec.sglang import seam
from nanospec.sglang.memory import extend_kind
from nanospec.sglang.runtime import Runtime, prefill_topk, tail_rows

META_KEY = "nanospec"
LOGITS_FORWARD = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"
LOGITS_GET = "sglang.srt.layers.logits_processor.LogitsProcessor._get_logits"
POOL_FREE = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool.free"
METRICS_LOGGER = "sglang.srt.managers.scheduler_components.metrics_reporter"


def install_prefill_topk(proc, runtime: Runtime) -> None:
    """Make the target's logits processor stash the top-K_pre of a prefill's prompt positions, the
    last ``pre_positions`` of each request's extend (it keeps only last-position logits itself; the
    others get -1; all get -1, with no head run, in a cold prefill: ``Runtime.cold_prefill``).
    proc: the target model's LogitsProcessor."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    original = proc.forward
    k, keep = runtime.cfg.k_pre, runtime.cfg.pre_positions

    def forward(input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        fb = logits_metadata
        if isinstance(fb, ForwardBatch) and fb.forward_mode == ForwardMode.EXTEND:
            real = hidden_states[: prompt_rows(fb, hidden_states.shape[0])]
            lens = getattr(fb, "extend_seq_lens_cpu", None)
            if runtime.cold_prefill or keep == 0:
                rows = torch.empty(0, dtype=torch.long)
            else:
                rows = tail_rows(None if lens is None else [int(x) for x in lens], real.shape[0], keep)
            runtime.stash_prefill_topk(prefill_topk(
                real, lambda h: proc._compute_lm_head(h, lm_head), proc.vocab_size, k,
                None if rows is None else rows.to(real.device, non_blocking=True)))
        return original(input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)

    seam.patch(proc, "forward", forward, LOGITS_FORWARD)


def prompt_rows(fb, rows: int) -> int:
    """Rows of a prefill's hidden states [rows, d] that hold prompt tokens.

    SGLang's prefill CUDA graph (on by default on CUDA) pads the token count up to a captured bucket
    and hands the logits processor the padded hidden states; the padding rows sit at the end. The
    real count is the batch's ``extend_num_tokens`` (or the sum of its host-side extend lengths).
    """
    n = getattr(fb, "extend_num_tokens", None)
    if n is None and getattr(fb, "extend_seq_lens_cpu", None) is not None:
        n = sum(int(x) for x in fb.extend_seq_lens_cpu)
    return rows if n is None else min(int(n), rows)


def install_draft_head(proc, runtime: Runtime, ids: IdMap) -> None:
    """Route the draft model's LM head through the proposer. proc: the draft's LogitsProcessor.

    Draft decode steps get packed-column logits; their column map waits in ``ids`` (SGLang's
    ``hot_token_id``) for SGLang's lookup of their top-k. Draft-extend passes get logits over the
    columns of ``extend_head`` ([N, W_max] float32 for the packed head, never [N, V]); SGLang keeps
    their top-k across scheduler iterations and batch changes, so ``NanoSpecDraftWorker`` maps it to
    vocabulary ids (``extend_token_ids``) as soon as the draft-extend returns (seam table,
    ``_get_logits``). A draft-extend widened by skipped positions (``NanoSpecDraftWorker.widened``)
    ran its front rows for their KV entries only: the head and the returned hidden states see the
    verify window's rows alone, so SGLang's usual row selection applies.
    """
    original = proc.forward
    current: dict = {}  # the ForwardBatch of the forward call in progress (LogitsMetadata drops it)

    def forward(input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        current["fb"] = logits_metadata
        front = getattr(getattr(logits_metadata, "spec_info", None), "num_front_tokens", 0)
        if front and logits_metadata.forward_mode.is_draft_extend_v2():
            b = logits_metadata.req_pool_indices.shape[0]
            hidden_states = hidden_states.view(b, -1, hidden_states.shape[-1])[:, front:].flatten(0, 1)
            if input_ids is not None:
                input_ids = input_ids.view(b, -1)[:, front:].flatten()
        try:
            return original(input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)
        finally:
            current.clear()

    def get_logits(hidden_states, lm_head, logits_metadata, embedding_bias=None, use_logits_buffer=True):
        fb = current.get("fb")
        if fb is None or not hasattr(fb, "req_pool_indices"):
            raise RuntimeError("NANOSPEC draft head called without a ForwardBatch: requests unknown")
        if fb.forward_mode.is_decode():
            out = runtime.proposer.logits(hidden_states, fb.req_pool_indices)
            ids.expect(out)
            return out.logits
        return runtime.proposer.logits(hidden_states, fb.req_pool_indices,
                                       kind=extend_head(runtime.proposer)).logits

    seam.patch(proc, "forward", forward, LOGITS_FORWARD)
    seam.patch(proc, "_get_logits", get_logits, LOGITS_GET)


def extend_head(proposer) -> str:
    """The head of every draft-extend pass: fixed per server, so that its column map is known after
    the pass whether it ran eagerly or replayed a CUDA graph (which runs no Python of ours). The full
    head when the vocabulary is no wider than the window (or the full head is forced), else packed."""
    return extend_kind(proposer.forced, proposer.w_max, proposer.vocab)


def extend_token_ids(proposer, reqs: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Target ids [B, k] int64 of a draft-extend's top-k columns cols [B, k], one row per request of
    reqs [B] (SGLang selects each request's last accepted row). A free column maps to 0, which
    verification rejects like any wrong guess."""
    table = proposer.dv.column_tokens() if extend_head(proposer) == "packed" else None
    rows = reqs.long()
    out = DraftLogits(cols, table, rows, proposer.hot, proposer.out_vocab, "extend")
    return out.token_ids(cols)


class IdMap:
    """Stands in for SGLang's ``hot_token_id`` inside ``EagleDraftWorker.draft_forward``, which maps
    every step's top-k through it (``hot_token_id[topk_index]``).

    A lookup maps the columns of the draft decode logits computed since the previous lookup (held
    with their column map, ``DraftLogits``), then forgets them; with none pending it passes ids
    through: the first lookup of a draft pass sees draft-extend's top-k, already vocabulary ids
    (``NanoSpecDraftWorker.draft_forward`` drops anything pending when a pass starts). So a lookup
    never depends on how many lookups came before it, only on the logits it follows.
    """

    def __init__(self, out_vocab: int):
        self.out_vocab = out_vocab
        self.pending: DraftLogits | None = None

    def expect(self, out: DraftLogits) -> None:
        self.pending = out

    def clear(self) -> None:
        self.pending = None

    def __getitem__(self, cols: torch.Tensor) -> torch.Tensor:
        out, self.pending = self.pending, None
        return cols if out is None else out.token_ids(cols)

    def __len__(self) -> int:
        return self.out_vocab

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)


def install_release(pool, runtime: Runtime) -> None:
    """Release a request's vocabulary when SGLang frees its req_to_token row (finish, abort,
    retraction), and attach its telemetry for the response's meta_info."""
    original = pool.free

    def free(req):
        slot = getattr(getattr(req, "kv", None), "req_pool_idx", None)
        if slot is not None:
            stats = runtime.release(int(slot))
            if stats is not None and hasattr(req, "customized_info"):
                attach_meta(req, stats)
        return original(req)

    seam.patch(pool, "free", free, POOL_FREE)


def attach_meta(req, stats: dict) -> None:
    # customized_info values are sliced per output token by SGLang's output streamer; one copy
    # per token makes the summary survive both streamed and one-shot responses.
    if req.customized_info is None:
        req.customized_info = {}
    req.customized_info[META_KEY] = [stats] * max(1, len(req.output_ids))


def collapse_meta(result, manager, meta_info, *args, **kwargs):
    """Tokenizer-side AFTER hook on ``update_request_meta_info``: the accumulated per-token copies
    become plain fields ``nanospec_mean_active_vocab``, ``nanospec_hit_rate``, ``nanospec_draft_steps``."""
    values = meta_info.pop(META_KEY, None)
    if values:
        last = next((v for v in reversed(values) if isinstance(v, dict)), None)
        if last is not None:
            for key, value in last.items():
                meta_info[f"{META_KEY}_{key}"] = value
    return result


def install_log_suffix(filter_: logging.Filter) -> None:
    logging.getLogger(METRICS_LOGGER).addFilter(filter_)
