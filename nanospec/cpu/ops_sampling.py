"""Pure-PyTorch EAGLE verification by sampling, and top-k / top-p renormalisation, for CPU hosts.

SGLang 0.5.23 has these only as CUDA/flashinfer kernels: ``tree_speculative_sampling_target_only``
(``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``) and flashinfer's
``top_k_renorm_probs`` / ``top_p_renorm_probs``. Without them its CPU path verifies every request
greedily, even at temperature > 0 (``_verify_uses_greedy`` in ``srt/speculative/eagle_utils.py``);
``nanospec.cpu.sglang_fixes`` plugs these in. Loops run over tree depth and siblings (<= topk) only.
"""

from __future__ import annotations

import torch


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Keep each row's ``top_k`` largest probabilities (ties at the k-th value kept), renormalise.

    probs ``[n, V]`` float; top_k ``[n]`` or int (values <= 0 or >= V keep the row)."""
    n, V = probs.shape
    k = torch.as_tensor(top_k, device=probs.device).long().expand(n).clamp(max=V)
    k = torch.where(k <= 0, torch.full_like(k, V), k)
    kth = torch.sort(probs, dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Keep the most probable tokens until their mass reaches ``top_p`` (the token crossing it
    included), renormalise. probs ``[n, V]``; top_p ``[n]`` or float."""
    n = probs.shape[0]
    p = torch.as_tensor(top_p, device=probs.device, dtype=probs.dtype).expand(n)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, -1) - sorted_p  # mass strictly before each sorted token
    keep_sorted = before < p[:, None]
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Verify a draft tree by sampling from the target (draft probabilities taken as one-hot).

    Per request, walking down from the root: the children of the current node are tried in sibling
    order, adding each candidate's target probability to an accumulator; a candidate is accepted when
    ``coin < acc / threshold_acc`` (or its probability >= ``threshold_single``), after which the walk
    continues below it with that node's coin. A rejected candidate's target probability is copied
    into ``draft_probs`` so that the final token is sampled from ``relu(target - draft)`` at the last
    accepted node (from the target alone when the whole depth was accepted), by inverse CDF with
    ``uniform_samples_for_final_sampling``. Outputs as in ``verify_tree_greedy_cpu``.

    Shapes: candidates/retrive_* ``[bs, D]``; uniform_samples ``[bs, D]``; target/draft probs
    ``[bs, D, V]``; accept_index ``[bs, S]``.
    """
    bs, D = candidates.shape
    S = accept_index.shape[1]
    if bs == 0:
        return
    dev = candidates.device
    V = target_probs.shape[-1]
    tp = target_probs.reshape(bs * D, V)
    dp = draft_probs.view(bs * D, V)
    rows = torch.arange(bs, device=dev)
    ridx = retrive_index.view(bs, D).long()
    rnext = retrive_next_token.view(bs, D).long()
    rsib = retrive_next_sibling.view(bs, D).long()
    cand = candidates.view(bs, D).long()
    coins = uniform_samples.reshape(bs, D)
    pflat = predicts.view(-1)

    cur = torch.zeros(bs, dtype=torch.long, device=dev)  # local node whose distribution is used
    last = ridx[:, 0]
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bs, dtype=torch.long, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    coin = coins[:, 0].clone()
    for j in range(1, S):
        child = torch.where(alive, rnext[rows, cur], torch.full_like(cur, -1))
        acc = torch.zeros(bs, dtype=tp.dtype, device=dev)
        searching = child >= 0
        found = torch.zeros(bs, dtype=torch.bool, device=dev)
        pick = torch.zeros_like(cur)
        row = rows * D + cur
        for _ in range(D - 1):  # siblings, at most topk of them in practice
            if not bool(searching.any()):
                break
            c = child.clamp(min=0)
            tok = cand[rows, c]
            p = tp[row, tok]
            acc = torch.where(searching, acc + p, acc)
            ok = searching & (p > 0) & ((coin < acc / threshold_acc) | (p >= threshold_single))
            rej = searching & ~ok
            dp[row[rej], tok[rej]] = tp[row[rej], tok[rej]]
            found |= ok
            pick = torch.where(ok, c, pick)
            nxt = rsib[rows, c]
            searching = rej & (nxt >= 0)
            child = torch.where(rej, nxt, child)
        if bool(found.any()):
            g = ridx[rows, pick]
            pflat[last[found]] = cand[rows, pick][found].to(pflat.dtype)
            accept_index[found, j] = g[found].to(accept_index.dtype)
            num += found.long()
            last = torch.where(found, g, last)
            cur = torch.where(found, pick, cur)
            coin = torch.where(found, coins[rows, pick], coin)
        alive &= found
        if not bool(alive.any()):
            break
    accept_token_num.view(-1)[:bs] = num.to(accept_token_num.dtype)

    row = rows * D + cur
    q = tp[row]
    p = torch.where((num == S - 1)[:, None], torch.zeros_like(q), dp[row])
    r = (q - p).clamp_min(0)
    u = uniform_samples_for_final_sampling.reshape(bs).to(r.dtype) * r.sum(-1)
    valid = r > 0
    hit = (torch.cumsum(r, -1) > u[:, None]) & valid
    idx = torch.arange(V, device=dev)
    first = torch.where(hit, idx, V).min(-1).values
    last_valid = torch.where(valid, idx, -1).max(-1).values
    sampled = torch.where(first < V, first, torch.where(last_valid >= 0, last_valid, V - 1))
    pflat[last] = sampled.to(pflat.dtype)
