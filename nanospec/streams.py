"""What enters each request's candidate stream: plain functions on tensors, no SGLang types.

Prefill: the prompt tokens, then the target's top-K_pre at the prompt's last positions (``start``).
Decode: after each verify, the draft tree's tokens, then the target's top-K_ver at every position of
the accepted branch (``extend``). The ``sources`` setting keeps only part of this (the ablation):
"context" keeps prompt and emitted tokens, "extension" keeps top-k candidates and draft tokens.
"""

from __future__ import annotations

import torch


def fill_missing_rows(topk: torch.Tensor, first: int) -> torch.Tensor:
    """Top-k rows [first + n, K] for a prompt whose first ``first`` positions have no target logits
    (a radix-cache hit); topk: [n, K] rows for the rest.

    The missing rows repeat ``topk[0, 0]``, the token that ``unique(topk row-major)`` already places
    first, so the stream is exactly ``prompt ++ unique(computed rows)``: the cached part contributes
    its prompt tokens and nothing else.
    """
    if first == 0:
        return topk
    filler = topk[:1, :1].expand(first, topk.shape[1])
    return torch.cat([filler, topk], dim=0)


def last_positions(topk: torch.Tensor, n: int) -> torch.Tensor:
    """topk [L, K] with every row but the last n set to -1 (no entry): only the prompt's last n
    positions give their top-K_pre (``NanoSpecConfig.pre_positions``)."""
    if topk.shape[0] <= n:
        return topk
    out = topk.clone()
    out[: topk.shape[0] - n] = -1
    return out


def start_args(ids: torch.Tensor, topk: torch.Tensor, sources: str,
               positions: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(prompt_ids [L], prefill_topk [L, K] or None) for ``DynamicVocab.start``.

    ids: [L] prompt tokens; topk: [L, K] target top-k per position, of which the last ``positions``
    rows count (``last_positions``). "extension" has no prompt tokens of its own: the top-1 of each
    position stands in for them.
    """
    topk = last_positions(topk, positions)
    if sources == "full":
        return ids, topk
    if sources == "context":
        return ids, None
    if sources == "extension":
        return topk[:, 0].contiguous(), topk
    raise ValueError(f"unknown sources {sources!r}")


def emitted_tokens(predict: torch.Tensor, accept_lens: torch.Tensor, batch: int,
                   width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens emitted by one verify and their mask: ([B, S1], [B, S1] bool).

    predict: [B * T] verified tokens with the accepted path at the front of each request's block
    (SGLang compacts tree paths there); accept_lens: [B] accepted drafts + bonus; width: S1 =
    spec_steps + 1, the longest accepted path.
    """
    tokens = predict.view(batch, -1)[:, :width].long()
    valid = torch.arange(width, device=predict.device)[None, :] < accept_lens.view(batch, 1)
    return tokens, valid


def verify_candidates(
    *,
    draft_tokens: torch.Tensor,
    accept_index: torch.Tensor,
    logits: torch.Tensor,
    vocab: int,
    k_ver: int,
    emitted: torch.Tensor,
    emitted_valid: torch.Tensor,
    sources: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates [B, C] int64 and mask [B, C] bool to append after one verify.

    draft_tokens: [B * T] the verified tree (root first); accept_index: [B, S1] rows of ``logits``
    on the accepted path (-1 padded); logits: [B * T, >= vocab] target verify logits.
    Fixed shapes (C = T + S1 * k_ver, or S1 for "context"), so no host synchronisation.
    """
    if sources == "context":
        return emitted, emitted_valid
    batch, width = accept_index.shape
    tree = draft_tokens.view(batch, -1).long()
    rows = accept_index.clamp_min(0).reshape(-1).long()
    top = top_ids(logits, rows, vocab, k_ver).view(batch, width * k_ver)
    top_valid = (accept_index >= 0).repeat_interleave(k_ver, dim=1)
    cands = torch.cat([tree, top], dim=1)
    valid = torch.cat([tree >= 0, top_valid], dim=1)
    return cands, valid


def top_ids(logits: torch.Tensor, rows: torch.Tensor | None, vocab: int, k: int) -> torch.Tensor:
    """Ids [n, k] int64 of the k largest of ``logits[rows[i], :vocab]`` for each i, largest first.

    logits: [N, >= vocab]; rows: [n] int64 row numbers, or None for all N rows. On the CPU NanoSpec's C
    kernel runs it where it is built (nanospec/cpu/topk.py: equal values go by lower id, a NaN counts as
    -inf); elsewhere ``top_ids_twin``, the kernel's oracle, which agrees wherever the values differ."""
    if logits.device.type == "cpu":
        try:
            from nanospec.cpu import topk
        except ImportError:
            topk = None
        if topk is not None and topk.usable(logits, k):
            return topk.top_ids(logits, rows, vocab, k)
    return top_ids_twin(logits, rows, vocab, k)


def top_ids_twin(logits: torch.Tensor, rows: torch.Tensor | None, vocab: int, k: int) -> torch.Tensor:
    """``top_ids`` through ``torch.topk``."""
    picked = logits[:, :vocab] if rows is None else logits[rows.reshape(-1).long(), :vocab]
    return picked.topk(k, dim=-1).indices


def to_draft_space(tokens: torch.Tensor, valid: torch.Tensor,
                   t2d: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Target ids -> rows of a reduced draft head (t2d: [V_target], -1 where absent); tokens the
    draft cannot emit are masked out."""
    if t2d is None:
        return tokens, valid
    rows = draft_rows(tokens, t2d)
    return rows.clamp_min(0), valid & (rows >= 0)


def draft_rows(tokens: torch.Tensor, t2d: torch.Tensor | None) -> torch.Tensor:
    """Target ids [...] int64 -> rows of a reduced draft head (t2d: [V_target], -1 where absent), -1
    for ids the draft has no row for or that lie outside the target vocabulary; unchanged when
    ``t2d`` is None (the draft's rows are target ids)."""
    if t2d is None:
        return tokens
    inside = (tokens >= 0) & (tokens < t2d.shape[0])
    return torch.where(inside, t2d[tokens.clamp(0, t2d.shape[0] - 1)], -1)
