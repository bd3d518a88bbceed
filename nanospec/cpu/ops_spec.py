"""Pure-PyTorch versions of sgl_kernel's CPU ops for EAGLE trees and KV-slot bookkeeping.

Semantics follow SGLang 0.5.23's Triton kernels (``sglang/kernels/ops/speculative/spec_tree.py``,
``cache_locs.py``, ``eagle.py``, ``sglang/srt/mem_cache/allocation.py``), which document what the
C++ ``*_cpu`` ops in sgl_kernel compute. All outputs are written in place, as the real ops do.
Only loops over tree depth or top-k (a handful of iterations) remain; tokens and nodes are vectorised.

Shapes: ``bs`` requests, ``D = draft_token_num`` tree nodes per request (node 0 is the root, i.e. the
last verified token), ``S = num_speculative_tokens`` (``accept_index.shape[1]``).
"""

from __future__ import annotations

import torch

from nanospec.cpu import native


def _segments(req_pool_indices, start: torch.Tensor, end: torch.Tensor):
    """Per-request ranges [start, end) as a padded grid: (rows [bs, 1], cols [bs, n], valid mask or None).

    Selecting ``grid[valid]`` walks requests in order, i.e. the packed layout of the Triton kernels."""
    lens = (end - start).long()
    n = int(lens.max()) if lens.numel() else 0
    cols = start.long()[:, None] + torch.arange(n, device=lens.device)
    uniform = int(lens.min()) == n if lens.numel() else True
    valid = None if uniform else torch.arange(n, device=lens.device)[None, :] < lens[:, None]
    return req_pool_indices.long()[:, None], cols, valid


def _native_segments(req_pool_indices, req_to_token, start, end, locs, to_pool: bool) -> bool:
    """Run one of the two segment copies below in spec.c (``nanospec_kv_segments``) where the kernels
    are built, the pool is SGLang's contiguous int32 CPU table and, when locs is written, it is
    contiguous int64; False: the caller runs its twin. Every decode and verify cycle runs one or both,
    plain cycles too: the twins' tensor operations cost about 0.05 ms each."""
    tensors = (req_pool_indices, start, end, locs)
    if not (req_to_token.dtype == torch.int32 and req_to_token.is_contiguous() and req_to_token.dim() == 2
            and all(t.device.type == "cpu" and not t.is_floating_point() for t in (req_to_token, *tensors))
            and (to_pool or (locs.dtype == torch.int64 and locs.is_contiguous())) and native.available()):
        return False
    req_pool_indices, start, end = (t.reshape(-1).long().contiguous() for t in (req_pool_indices, start, end))
    if to_pool:
        locs = locs.reshape(-1).long().contiguous()
    rc = native.library().nanospec_kv_segments(
        req_to_token.data_ptr(), req_to_token.shape[0], req_to_token.shape[1], req_pool_indices.data_ptr(),
        start.data_ptr(), end.data_ptr(), req_pool_indices.numel(), locs.data_ptr(), locs.numel(),
        int(to_pool))
    if rc:
        raise IndexError(f"KV slots: a pool row outside [0, {req_to_token.shape[0]}), a range outside "
                         f"[0, {req_to_token.shape[1]}] or more than {locs.numel()} locations; nothing "
                         "was written")
    return True


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[b], start[b]:end[b]] = out_cache_loc[packed range of b]``."""
    if _native_segments(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, True):
        return
    rows, cols, valid = _segments(req_pool_indices, start_offset, end_offset)
    if cols.numel() == 0:
        return
    if valid is None:
        req_to_token[rows, cols] = out_cache_loc[: cols.numel()].view(cols.shape).to(req_to_token.dtype)
    else:
        rows = rows.expand(cols.shape)[valid]
        req_to_token[rows, cols[valid]] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``out_cache_loc[packed range of b] = req_to_token[req_pool_indices[b], start[b]:end[b]]``."""
    if _native_segments(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, False):
        return
    rows, cols, valid = _segments(req_pool_indices, start_offset, end_offset)
    if cols.numel() == 0:
        return
    if valid is None:
        vals = req_to_token[rows, cols]
    else:
        vals = req_to_token[rows.expand(cols.shape)[valid], cols[valid]]
    out_cache_loc[: vals.numel()] = vals.reshape(-1).to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Row ``b`` of ``out_cache_loc.view(bs, topk * num_steps)`` = request ``b``'s slots
    ``req_to_token[req_pool_indices[b], seq_lens[b] : seq_lens[b] + topk * num_steps]``."""
    bs = seq_lens.numel()
    width = topk * num_steps
    if bs == 0 or width == 0:
        return
    cols = seq_lens.long()[:, None] + torch.arange(width, device=seq_lens.device)
    vals = req_to_token[req_pool_indices.long()[:, None], cols]
    out_cache_loc[: bs * width] = vals.reshape(-1).to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Per-branch KV table for multi-step draft decoding: ``[bs * topk, max(seq_lens) + num_steps]``.

    Row ``b * topk + k`` holds request ``b``'s ``seq_lens[b]`` prefix slots followed by branch ``k``'s
    ``num_steps`` draft slots ``req_to_token[., seq_lens[b] + k * num_steps + s]`` (the contiguous layout
    written by ``assign_draft_cache_locs_contiguous``); entries past that are 0.
    """
    bs = seq_lens.numel()
    seq = seq_lens.long()
    width = (int(seq.max()) if bs else 0) + num_steps
    col = torch.arange(width, device=seq.device)
    seq_b = seq.repeat_interleave(topk)[:, None]  # [bs * topk, 1]
    shift = (torch.arange(topk, device=seq.device) * num_steps).repeat(bs)[:, None]
    # Prefix columns read themselves; draft column seq + s reads seq + k * num_steps + s.
    src = col[None, :] + torch.where(col[None, :] >= seq_b, shift, 0)
    used = col[None, :] < seq_b + num_steps
    src = torch.where(used, src, 0).clamp_(max=req_to_token.shape[1] - 1)
    rows = req_pool_indices.long().repeat_interleave(topk)[:, None]
    table = req_to_token[rows, src]
    return table.masked_fill_(~used, 0)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]``; in spec.c where
    the kernels are built and all three are contiguous int32 CPU tensors (SGLang's verify output)."""
    bs = accept_lens.numel()
    ts = (accept_tokens, accept_lens, bonus_tokens)
    if (all(t.device.type == "cpu" and t.dtype == torch.int32 and t.is_contiguous() for t in ts)
            and bonus_tokens.numel() >= bs and native.available()):
        rc = native.library().nanospec_fill_bonus(accept_tokens.data_ptr(), accept_tokens.numel(),
                                                  accept_lens.data_ptr(), bonus_tokens.data_ptr(), bs,
                                                  accept_stride)
        if rc:
            raise IndexError(f"fill_bonus_tokens: an accepted position outside [0, {accept_tokens.numel()}); "
                             "nothing was written")
        return
    idx = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.long() - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Pack ``out_cache_loc[i]`` for every ``i = accept_index.flat[p] != -1``, in order of ``p``."""
    flat = accept_index.reshape(-1)
    sel = flat[flat != -1].long()
    accept_out_cache_loc[: sel.numel()] = out_cache_loc[sel].to(accept_out_cache_loc.dtype)


def _tree_parents(parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int) -> torch.Tensor:
    """Parent node of every node 1..D-1 as ``[bs, D]`` (node 0: -1); 0 = root, -1 = parent not found.

    Node ``i`` is ``selected_index[:, i - 1]``; its parent is the root when ``selected // topk == 0``,
    else the node whose selected index equals ``parent_list[:, selected // topk]``.
    """
    bs, n = selected_index.shape
    sel = selected_index.long()
    ptb = sel // topk  # [bs, n]
    if parent_list.numel() == 0:
        ptok = torch.full_like(ptb, -1)
    else:
        ptok = torch.gather(parent_list.long(), 1, ptb.clamp(max=parent_list.shape[1] - 1))
    match = sel[:, None, :] == ptok[:, :, None]  # [bs, node-1, candidate pp]
    found = match.any(-1)
    pos = match.int().argmax(-1) + 1  # first matching pp, as the kernel's forward search
    parent = torch.where(ptb == 0, 0, torch.where(found, pos, -1))
    return torch.cat([torch.full((bs, 1), -1, dtype=parent.dtype, device=parent.device), parent], 1)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the EAGLE verify tree: retrieval links, depths (positions) and attention mask.

    ``retrive_next_token[b, p]`` is the first child of ``p`` (smallest node id) and
    ``retrive_next_sibling[b, i]`` the next larger sibling; entries the kernel would not write keep
    their value (callers pre-fill -1). Mask rows (``tree_mask_mode`` 0 = FULL_MASK: ``seq_len + D``
    columns per row after the caller-filled prefix; 1 = QLEN_ONLY: ``D`` columns) mark the root and
    every ancestor of a node, itself included; other tree columns are cleared. Runs in spec.c
    (``nanospec_build_tree``) where the C kernels are built and the outputs are SGLang's contiguous
    CPU tensors (bool mask, int64 positions and links); else ``build_tree_kernel_efficient_torch``,
    the twin.
    """
    outs = (positions, retrive_index, retrive_next_token, retrive_next_sibling)
    bs, D = verified_seq_len.numel(), int(draft_token_num)
    if (int(tree_mask_mode) in (0, 1) and native.available() and tree_mask.dtype == torch.bool
            and all(t.device.type == "cpu" and t.is_contiguous() for t in (tree_mask, *outs))
            and all(t.dtype == torch.int64 and t.numel() >= bs * D for t in outs)
            and all(t.device.type == "cpu" for t in (parent_list, selected_index, verified_seq_len))):
        if bs == 0:
            return
        parents = parent_list.reshape(bs, -1).long().contiguous()
        sel = selected_index.reshape(bs, -1).long().contiguous()
        seq = verified_seq_len.reshape(-1).long().contiguous()
        rc = native.library().nanospec_build_tree(
            parents.data_ptr(), parents.shape[1], sel.data_ptr(), sel.shape[1], seq.data_ptr(),
            tree_mask.data_ptr(), tree_mask.numel(), *(t.data_ptr() for t in outs), bs, D, int(topk),
            int(depth), int(tree_mask_mode))
        if rc:
            raise IndexError(f"build tree: a selected index below 0 or with a parent column outside the "
                             f"{parents.shape[1]} of parent_list, fewer than {D - 1} selected columns, or "
                             f"a mask of {tree_mask.numel()} entries too short for the rows; nothing was "
                             "written")
        return
    build_tree_kernel_efficient_torch(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                      retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                      draft_token_num, tree_mask_mode)


def build_tree_kernel_efficient_torch(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """``build_tree_kernel_efficient_cpu`` in tensor operations (other devices and dtypes, and the
    bit-packed mask modes, which it refuses); the C kernel's oracle."""
    bs = verified_seq_len.numel()
    D = draft_token_num
    if bs == 0:
        return
    dev = verified_seq_len.device
    seq = verified_seq_len.long()
    nodes = torch.arange(D, device=dev)
    b_ids = torch.arange(bs, device=dev)
    retrive_index.view(bs, D).copy_((b_ids[:, None] * D + nodes[None, :]).to(retrive_index.dtype))
    if _is_chain(parent_list, selected_index, topk, D):
        # topk == 1: node i's parent is i - 1 (a walk of at most `depth` steps); same results, few ops.
        rn = retrive_next_token.view(bs, D)
        rn[:, : D - 1] = nodes[1:].to(rn.dtype)
        c, x = nodes[None, :], nodes[:, None]
        anc = ((c == 0) | ((c <= x) & (c > x - depth))).expand(bs, D, D)
        level = nodes.clamp(max=depth)[None, :]
        positions.view(bs, D).copy_((seq[:, None] + level).to(positions.dtype))
        _write_tree_mask(tree_mask, anc, seq, nodes, b_ids, D, tree_mask_mode)
        return
    parent = _tree_parents(parent_list, selected_index[:, : D - 1], topk)  # [bs, D]

    # Links: children of each parent in ascending node order.
    has_parent = parent >= 0
    has_parent[:, 0] = False
    same = (parent[:, :, None] == parent[:, None, :]) & has_parent[:, :, None] & has_parent[:, None, :]
    later = nodes[None, :] > nodes[:, None]  # [i, j]: j > i
    nxt = same & later[None]
    big = D + 1
    sib = torch.where(nxt, nodes[None, None, :], big).min(-1).values  # [bs, D]
    sib_mask = has_parent & (sib < big)
    rs = retrive_next_sibling.view(bs, D)
    rs.copy_(torch.where(sib_mask, sib, rs))
    child = (parent[:, None, :] == nodes[None, :, None]) & has_parent[:, None, :]  # [bs, p, i]
    first = torch.where(child, nodes[None, None, :], big).min(-1).values
    rn = retrive_next_token.view(bs, D)
    rn.copy_(torch.where(first < big, first, rn))

    # Ancestors and depth: walk up at most `depth` levels, all nodes at once.
    anc = torch.zeros(bs, D, D, dtype=torch.bool, device=dev)
    anc[:, :, 0] = True
    cur = nodes[None, :].expand(bs, D).clone()
    active = torch.ones(bs, D, dtype=torch.bool, device=dev)
    active[:, 0] = False
    level = torch.zeros(bs, D, dtype=torch.long, device=dev)
    for _ in range(depth):
        if not bool(active.any()):
            break
        level += active.long()
        anc.scatter_(2, cur[..., None], active[..., None] | anc.gather(2, cur[..., None]))
        p = parent.gather(1, cur)
        active = active & (p > 0)
        cur = torch.where(active, p, cur)
    positions.view(bs, D).copy_((seq[:, None] + level).to(positions.dtype))
    _write_tree_mask(tree_mask, anc, seq, nodes, b_ids, D, tree_mask_mode)


def _is_chain(parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int, D: int) -> bool:
    """topk == 1 drafts whose nodes are the chain 0 -> 1 -> ... -> D - 1 (the usual case)."""
    if topk != 1 or selected_index.shape[1] < D - 1 or parent_list.shape[1] < D - 1:
        return False
    ar = torch.arange(D - 1, device=selected_index.device)
    return bool((selected_index[:, : D - 1] == ar).all()) and bool(
        (parent_list[:, 1 : D - 1] == ar[: D - 2]).all()
    )


def _write_tree_mask(tree_mask, anc, seq, nodes, b_ids, D: int, tree_mask_mode: int) -> None:
    """Write the tree part of each mask row (``anc`` ``[bs, D, D]``); FULL_MASK prefixes stay as filled."""
    if tree_mask_mode == 0:  # FULL_MASK: rows of seq_len + D columns
        row_len = seq + D
        block = torch.cumsum(D * row_len, 0) - D * row_len
        base = block[:, None, None] + nodes[None, :, None] * row_len[:, None, None] + seq[:, None, None]
        idx = base + nodes[None, None, :]
    elif tree_mask_mode == 1:  # QLEN_ONLY: D x D per request, contiguous
        tree_mask.view(-1)[: b_ids.numel() * D * D] = anc.reshape(-1).to(tree_mask.dtype)
        return
    else:
        raise NotImplementedError(f"tree_mask_mode {tree_mask_mode} (bit-packed) has no CPU fallback")
    tree_mask.view(-1)[idx.reshape(-1)] = anc.reshape(-1).to(tree_mask.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification (SGLang ``verify_tree_greedy``).

    From the root, repeatedly descend to the first child (in sibling order) whose candidate token equals
    the target's prediction at the current node; stop when none does. Writes ``accept_index[b, 0..n]``
    (global node ids; rest untouched), ``accept_token_num[b] = n`` and ``predicts[node] =
    target_predict[node]`` for every accepted node and the last one. Runs in spec.c where the C kernels
    are built and the outputs are contiguous int32 CPU tensors; else in PyTorch
    (``verify_tree_greedy_torch``, the twin).
    """
    if candidates.shape[0] == 0:
        return
    outs = (predicts, accept_index, accept_token_num)
    if (all(t.device.type == "cpu" and t.dtype == torch.int32 and t.is_contiguous() for t in outs)
            and candidates.device.type == "cpu" and native.available()):
        bs, D = candidates.shape
        ins = [t.reshape(bs, D).long().contiguous() for t in
               (candidates, retrive_index, retrive_next_token, retrive_next_sibling)]
        tflat = target_predict.reshape(-1).long().contiguous()
        n = min(predicts.numel(), tflat.numel())
        rc = native.library().nanospec_verify_greedy(
            predicts.data_ptr(), accept_index.data_ptr(), accept_token_num.data_ptr(),
            *(t.data_ptr() for t in ins), tflat.data_ptr(), bs, D, accept_index.shape[1], n)
        if rc:
            raise IndexError(f"verify_tree_greedy: a tree index outside [0, {n}) or a child or sibling "
                             f"outside [-1, {D}); nothing was written")
        return
    verify_tree_greedy_torch(predicts, accept_index, accept_token_num, candidates, retrive_index,
                             retrive_next_token, retrive_next_sibling, target_predict)


def verify_tree_greedy_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """``verify_tree_greedy_cpu`` in tensor operations (the C kernel's twin), any device and dtypes."""
    bs, D = candidates.shape
    S = accept_index.shape[1]
    if bs == 0:
        return
    dev = candidates.device
    rows = torch.arange(bs, device=dev)
    ridx = retrive_index.view(bs, D).long()
    rnext = retrive_next_token.view(bs, D).long()
    rsib = retrive_next_sibling.view(bs, D).long()
    cand = candidates.view(bs, D)
    tflat = target_predict.reshape(-1)
    pflat = predicts.view(-1)
    nodes = torch.arange(D, device=dev)
    chain_next = torch.where(nodes < D - 1, nodes + 1, -1)
    if bool((rsib == -1).all()) and bool((rnext == chain_next).all()):
        # A chain (topk == 1): accept the longest prefix whose drafts equal the target's predictions.
        tgt = tflat[ridx]  # target prediction at every node [bs, D]
        levels = min(S - 1, D - 1)
        match = (cand[:, 1 : levels + 1] == tgt[:, :levels]).long()
        num = torch.cumprod(match, 1).sum(1)  # [bs]
        keep = nodes[None, : levels + 1] <= num[:, None]
        ai = accept_index[:, : levels + 1]
        ai.copy_(torch.where(keep, ridx[:, : levels + 1].to(ai.dtype), ai))
        pflat[ridx[:, : levels + 1][keep]] = tgt[:, : levels + 1][keep].to(pflat.dtype)
        accept_token_num.view(-1)[:bs] = num.to(accept_token_num.dtype)
        return
    # children[b, n, c]: c-th child of node n in sibling order (-1 past the end); at most D - 1.
    max_children = D - 1
    children = torch.full((bs, D, max(max_children, 1)), -1, dtype=torch.long, device=dev)
    c = rnext
    for k in range(max_children):  # topk bounds this in practice; vectorised over all nodes
        children[:, :, k] = c
        if not bool((c >= 0).any()):
            break
        c = torch.where(c >= 0, rsib.gather(1, c.clamp(min=0)), c)

    cur = torch.zeros(bs, dtype=torch.long, device=dev)  # local node id
    last = ridx[:, 0]  # global retrieve index of the last accepted node
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bs, dtype=torch.long, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    for j in range(1, S):
        kids = children[rows, cur]  # [bs, C]
        valid = kids >= 0
        target = tflat[last]
        tok = cand.gather(1, kids.clamp(min=0))
        hit = valid & (tok == target[:, None]) & alive[:, None]
        found = hit.any(1)
        pick = kids.gather(1, hit.int().argmax(1, keepdim=True)).squeeze(1)
        if bool(found.any()):
            g = ridx.gather(1, pick.clamp(min=0)[:, None]).squeeze(1)
            pflat[last[found]] = target[found].to(pflat.dtype)
            accept_index[found, j] = g[found].to(accept_index.dtype)
            num = num + found.long()
            last = torch.where(found, g, last)
            cur = torch.where(found, pick, cur)
        alive = alive & found
        if not bool(alive.any()):
            break
    accept_token_num.view(-1)[:bs] = num.to(accept_token_num.dtype)
    pflat[last] = tflat[last].to(pflat.dtype)
