"""Exact sampling penalties for NANOSPEC's verify step (frequency, presence, repetition, min_new_tokens).

Why this exists: SGLang 0.5.23 applies penalties to speculative decoding in what its own comments call
"a relaxed version" (``speculative/eagle_utils.py``), which is not lossless:

* ``eagle_prepare_for_decode`` feeds the penalizers only ``req.output_ids[-1]`` per decode step
  (``ScheduleBatch.cumulate_penalty_output_tokens``), so when a verify accepts several tokens, all but
  the last never reach the frequency/presence/repetition/min_new_tokens state;
* ``eagle_sample`` adds the same per-request penalties (computed at the start of the step) to every
  row of the draft tree, so the row that predicts the token after an accepted draft token is not
  penalised for that token, and ``min_new_tokens`` still blocks stop tokens at rows whose output
  length has already reached the minimum.

Plain decoding penalises each token with every earlier output token counted, so the greedy outputs of
EAGLE/EAGLE3/NANOSPEC and plain decoding part as soon as a multi-token step meets a penalty that
matters. NanoSpec changes nothing in how the target's logits are computed; the divergence is SGLang's
and hits EAGLE3 the same way (which of the two diverges on a given prompt depends on where each
accepts several tokens). For NANOSPEC servers this module makes the verify exact:

1. ``exact_verify`` (AROUND ``eagle_sample``): every tree row ``r`` is penalised as plain decoding
   would penalise that position, i.e. with the request's penalty state plus the draft tokens on the
   path from the root to ``r`` (and ``min_new_tokens`` against the output length at ``r``); SGLang's
   own uniform penalties are switched off for that call. Afterwards every accepted token is fed to
   the penalizers on the device, so the state is complete without waiting for the host (this also
   holds under the overlap scheduler, where ``req.output_ids`` lags one step behind).
2. ``skip_step_cumulation`` (AROUND ``cumulate_penalty_output_tokens``): SGLang's one-token-per-step
   feed is skipped for NANOSPEC batches (it would count the last token twice).
3. ``cumulate_prefill_token`` (AROUND ``EAGLEWorkerV2._forward_prefill_batch``): the first output
   token, sampled by the prefill, is fed at once (SGLang feeds it at the first decode step, which 2.
   now skips).
4. ``keep_orchestrator`` (AFTER ``SamplingBatchInfo.copy_for_forward``): the forward-only copy of the
   sampling info that the worker sees has no penalizer; keep a reference to the scheduler's.

The arithmetic mirrors SGLang's penalizers operation for operation (additive penalties summed into a
zero buffer in the orchestrator's order, then ``apply_scaling_penalties``), so the root row is bit-for-bit
what SGLang computes and deeper rows are what plain decoding computes one step later.

Other servers with the plugin installed are not affected (every hook checks the batch's algorithm).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

NAME = "NANOSPEC"  # nanospec.sglang.algo.NAME; repeated so that this module imports no SGLang code
ORCH_ATTR = "nanospec_penalizer"  # attribute of the forward-only SamplingBatchInfo copy
FREQUENCY, PRESENCE, REPETITION, MIN_NEW = (
    "BatchedFrequencyPenalizer", "BatchedPresencePenalizer", "BatchedRepetitionPenalizer",
    "BatchedMinNewTokensPenalizer")
KNOWN = (FREQUENCY, PRESENCE, REPETITION, MIN_NEW)

_warned: set[str] = set()


def is_nanospec(algorithm) -> bool:
    """Whether a batch's ``spec_algorithm`` is NANOSPEC (SGLang's enum values and plugin algorithms
    both carry ``name``)."""
    return getattr(algorithm, "name", None) == NAME


# -- the draft tree ---------------------------------------------------------------------------------


def tree_parents(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """Parent [B, n] int64 (-1 for the root) of every node of SGLang's verify trees.

    next_token / next_sibling: [B, n] ``retrieve_next_token`` / ``retrieve_next_sibling``: local index
    of a node's first child / next sibling, -1 for none. Device ops only; every node has one parent,
    so the writes never collide (the ``-1`` lanes all rewrite the root's own value).
    """
    b, n = next_token.shape
    nt, ns = next_token.long(), next_sibling.long()
    parent = torch.full((b, n), -1, dtype=torch.long, device=nt.device)
    owner = torch.arange(n, device=nt.device).expand(b, n)
    child = nt
    for _ in range(n - 1):  # the k-th child of every node at once; no list is longer than n - 1
        ok = child >= 0
        idx = child.clamp_min(0)
        parent.scatter_(1, idx, torch.where(ok, owner, parent.gather(1, idx)))
        child = torch.where(ok, ns.gather(1, idx), -1)
    return parent


def tree_paths(parent: torch.Tensor, max_depth: int) -> torch.Tensor:
    """path [B, n, n] bool: ``path[b, i, j]`` when node j is on the way from the root to node i
    (i itself included, the root excluded: its token is already an output token)."""
    b, n = parent.shape
    path = torch.zeros(b, n, n, dtype=torch.bool, device=parent.device)
    cur = torch.arange(n, device=parent.device).expand(b, n).clone()
    for _ in range(max_depth):
        ok = cur > 0
        path.scatter_(2, cur.clamp_min(0).unsqueeze(-1), ok.unsqueeze(-1))  # a False lands on the root
        cur = torch.where(ok, parent.gather(1, cur.clamp_min(0)), -1)
    return path


def path_counts(tokens: torch.Tensor, path: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [B*n, vocab] float32, depth [B*n] int64): how often each token occurs on the path to
    each row (the tokens a plain decode would have emitted before that position), and its length.

    tokens: [B, n] the tree's tokens (root first); path: from ``tree_paths``.
    """
    b, n = tokens.shape
    idx = tokens.long().clamp(0, vocab - 1)[:, None, :].expand(b, n, n).reshape(b * n, n)
    weight = path.reshape(b * n, n).float()
    counts = torch.zeros(b * n, vocab, dtype=torch.float32, device=tokens.device)
    counts.scatter_add_(1, idx, weight)
    return counts, path.sum(-1).reshape(-1)


# -- penalties --------------------------------------------------------------------------------------


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.repeat_interleave(n, dim=0)


def row_penalties(penalizers, counts: torch.Tensor, depth: torch.Tensor, n: int,
                  max_depth: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(additive [B*n, V], scaling [B*n, V] or None) for every tree row, from SGLang's prepared
    penalizers (``orchestrator.penalizers.values()``, in their order) and ``path_counts``.

    Row ``(b, i)`` gets what request b's penalizers would hold after also seeing the path's tokens:
    frequency ``+f`` per occurrence (added one at a time, as ``scatter_add_`` does step by step),
    presence / repetition set for every token on the path, and ``min_new_tokens`` compared with
    the output length plus the row's depth. None if a prepared penalizer is of an unknown kind.
    """
    seen = counts > 0
    additive = torch.zeros_like(counts)
    scaling = None
    for pen in penalizers:
        if not pen.is_prepared():
            continue
        kind = type(pen).__name__
        if kind == FREQUENCY:
            f = _rows(pen.frequency_penalties, n)
            cum = _rows(pen.cumulated_frequency_penalties, n)
            for k in range(1, max_depth + 1):
                cum = cum + torch.where(counts >= k, f, 0.0)
            additive.sub_(cum)
        elif kind == PRESENCE:
            additive.sub_(torch.where(seen, _rows(pen.presence_penalties, n),
                                      _rows(pen.cumulated_presence_penalties, n)))
        elif kind == MIN_NEW:
            blocked = (_rows(pen.len_output_tokens, n) + depth[:, None]) < _rows(pen.min_new_tokens, n)
            additive.add_(torch.where(blocked, _rows(pen.stop_token_penalties, n), 0.0))
        elif kind == REPETITION:
            s = torch.where(seen, _rows(pen.repetition_penalties, n),
                            _rows(pen.cumulated_repetition_penalties, n))
            scaling = s if scaling is None else scaling * s
        else:
            return None
    return additive, scaling


def cumulate_accepted(penalizers, predict: torch.Tensor, accept_index: torch.Tensor,
                      accept_lens: torch.Tensor) -> bool:
    """Feed every accepted token of one verify to the penalizers, on the device.

    predict: [B*n] verified tokens; accept_index: [B, S1] rows of the accepted path (-1 padded);
    accept_lens: [B]. Lanes past a request's accepted length point at its first accepted token and
    add nothing (frequency) or rewrite the value it already gets (presence, repetition). Returns
    False (and changes nothing) if a prepared penalizer is of an unknown kind.
    """
    prepared = [p for p in penalizers if p.is_prepared()]
    if any(type(p).__name__ not in KNOWN for p in prepared):
        return False
    valid = accept_index >= 0
    tokens = predict[accept_index.clamp_min(0).long()].long()
    tokens = torch.where(valid, tokens, tokens[:, :1])
    for pen in prepared:
        kind = type(pen).__name__
        if kind == FREQUENCY:
            src = torch.where(valid, pen.frequency_penalties, 0.0)
            pen.cumulated_frequency_penalties.scatter_add_(1, tokens, src)
        elif kind == PRESENCE:
            pen.cumulated_presence_penalties.scatter_(1, tokens, pen.presence_penalties.expand_as(tokens))
        elif kind == REPETITION:
            pen.cumulated_repetition_penalties.scatter_(1, tokens, pen.repetition_penalties.expand_as(tokens))
        elif kind == MIN_NEW:
            pen.len_output_tokens += accept_lens.view(-1, 1).to(pen.len_output_tokens.dtype)
    return True


def _warn_once(what: str) -> None:
    if what not in _warned:
        _warned.add(what)
        logger.warning("NANOSPEC: cannot apply penalties exactly for %s; SGLang's relaxed speculative "
                       "penalties apply (greedy output may differ from plain decoding)", what)


def _unknown(penalizers) -> str | None:
    return next((type(p).__name__ for p in penalizers if p.is_prepared() and type(p).__name__ not in KNOWN),
                None)


# -- hooks (registered in nanospec.sglang.register) --------------------------------------------------


def keep_orchestrator(result, info, *args, **kwargs):
    """AFTER ``SamplingBatchInfo.copy_for_forward``: the copy keeps a reference to the scheduler's
    penalizer orchestrator (SGLang sets the copy's to None)."""
    result.nanospec_penalizer = info.penalizer_orchestrator  # ORCH_ATTR
    return result


def _orchestrator(info):
    orch = getattr(info, ORCH_ATTR, None)
    return orch if orch is not None and orch.is_required else None


def skip_step_cumulation(original, batch, *args, **kwargs):
    """AROUND ``ScheduleBatch.cumulate_penalty_output_tokens``: NANOSPEC batches feed their
    penalizers from the verify (every accepted token) and the prefill instead."""
    if is_nanospec(getattr(batch, "spec_algorithm", None)):
        orch = batch.sampling_info.penalizer_orchestrator
        kind = _unknown(orch.penalizers.values()) if orch is not None else None
        if kind is None:
            return None
        _warn_once(f"penalizer {kind}")
    return original(batch, *args, **kwargs)


def cumulate_prefill_token(original, worker, batch, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2._forward_prefill_batch``: feed the first output token to the penalizers.

    A chunked request's row gets its (discarded) token too, but SGLang drops that row from the batch
    and builds fresh penalizers for the next chunk, so it never counts.
    """
    out = original(worker, batch, *args, **kwargs)
    if not is_nanospec(getattr(batch, "spec_algorithm", None)) or batch.forward_mode.is_idle():
        return out
    orch = _orchestrator(batch.sampling_info)
    ids = getattr(out, "next_token_ids", None)
    if orch is not None and ids is not None and _unknown(orch.penalizers.values()) is None:
        orch.cumulate_output_tokens(ids.long())
    return out


def exact_verify(original, verify_input, batch, logits_output, *args, **kwargs):
    """AROUND ``eagle_sample``: exact per-row penalties for NANOSPEC, then feed the accepted tokens."""
    info = batch.sampling_info
    orch = _orchestrator(info) if is_nanospec(getattr(batch, "spec_algorithm", None)) else None
    if orch is None or batch.forward_mode.is_idle():
        return original(verify_input, batch, logits_output, *args, **kwargs)
    penalizers = list(orch.penalizers.values())
    kind = _unknown(penalizers)
    if kind is not None:
        _warn_once(f"penalizer {kind}")
        return original(verify_input, batch, logits_output, *args, **kwargs)

    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    logits = logits_output.next_token_logits
    n = int(verify_input.draft_token_num)
    bs = len(batch.seq_lens)
    vocab = orch.vocab_size
    saved = info.acc_additive_penalties, info.acc_scaling_penalties
    exact = tuple(logits.shape) == (bs * n, vocab)  # SGLang's own penalties assume this layout too
    if exact:
        max_depth = int(getattr(verify_input, "spec_steps", n - 1) or 0)
        tokens = verify_input.draft_token.view(bs, n)
        parent = tree_parents(verify_input.retrieve_next_token.view(bs, n),
                              verify_input.retrieve_next_sibling.view(bs, n))
        counts, depth = path_counts(tokens, tree_paths(parent, max_depth), vocab)
        additive, scaling = row_penalties(penalizers, counts, depth, n, max_depth)
        logits.add_(additive)
        if scaling is not None:
            apply_scaling_penalties(logits, scaling)
        info.acc_additive_penalties = info.acc_scaling_penalties = None  # applied above, row by row
    else:
        _warn_once(f"(verify logits {tuple(logits.shape)} for {bs} x {n} rows of {vocab} tokens)")
    try:
        predict, accept_lens, accept_index = original(verify_input, batch, logits_output, *args, **kwargs)
    finally:
        info.acc_additive_penalties, info.acc_scaling_penalties = saved
    # Always: SGLang's own one-token feed is skipped for NANOSPEC batches (skip_step_cumulation).
    cumulate_accepted(penalizers, predict, accept_index, accept_lens)
    return predict, accept_lens, accept_index


# (target, hook, HookType name) for SGLang's HookRegistry; registered by ``nanospec.sglang.register``.
HOOKS = (
    ("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward", keep_orchestrator,
     "AFTER"),
    ("sglang.srt.managers.schedule_batch.ScheduleBatch.cumulate_penalty_output_tokens", skip_step_cumulation,
     "AROUND"),
    ("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch", cumulate_prefill_token,
     "AROUND"),
    ("sglang.srt.speculative.eagle_utils.eagle_sample", exact_verify, "AROUND"),
)
