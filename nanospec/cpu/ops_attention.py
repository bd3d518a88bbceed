"""Pure-PyTorch ``decode_attention_cpu`` / ``extend_attention_cpu`` (SGLang's ``intel_amx`` backend ops).

The call sites are ``sglang/srt/layers/attention/intel_amx_backend.py`` (SGLang 0.5.23); semantics follow
the Triton ``decode_attention.py`` / ``extend_attention.py`` kernels. Requests of different lengths are
padded into one batch and masked, so there is no Python loop over requests or tokens; one request (a CPU
server's usual batch) takes shorter paths with the same results. Scores and softmax run in float32
whatever the cache dtype, like the C++ kernels.

Shapes: ``q`` ``[T, H, Dk]``; KV caches ``[pool, Hkv, Dk|Dv]``; ``req_to_token`` ``[rows, width]`` maps a
request's token positions to cache slots; ``H`` must be a multiple of ``Hkv`` (GQA).
"""

from __future__ import annotations

import contextlib

import torch

from nanospec.cpu import ops_layers

# The one-request paths and one-thread attention below are cuts of the decode and verify step; with
# NANOSPEC_CPU_LAYERS=sglang every call takes the general padded path on all threads, as before them
# (bench_verify's "old" path). Read once, when the fallback is loaded.
FAST_PATHS = ops_layers.mode() == "fused"

# Below this many multiply-adds (heads x queries x keys x head size) an attention call runs on one
# thread. One request's decode or verify is ~0.1-1M: on two threads each of its parallel regions waits
# for the second, and when other processes hold that core the wait is milliseconds (under load: 19-23 ms
# a SmolLM2 decode call on two threads, 0.09 ms on one); on a quiet host the two are within noise
# (docs/cpu.md). Linear layers, outside these calls, keep every thread.
ONE_THREAD_WORK = 1 << 22


@contextlib.contextmanager
def _threads_for(work: int):
    """Run the block on one thread when ``work`` (multiply-adds) is under ``ONE_THREAD_WORK``."""
    n = torch.get_num_threads()
    if n == 1 or work >= ONE_THREAD_WORK or not FAST_PATHS:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _scores_to_probs(
    s: torch.Tensor, visible: torch.Tensor, logit_cap: float, sinks: torch.Tensor | None
) -> torch.Tensor:
    """``s`` ``[..., H, Q, L]`` float32 -> attention weights with the masked entries at 0."""
    if logit_cap and logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.float().view(*([1] * (s.dim() - 3)), -1, 1, 1)
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sink - m)
    return p / denom.clamp_min(torch.finfo(torch.float32).tiny)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """q ``[B, Q, H, Dk]``, k/v ``[B, L, Hkv, D]``, visible ``[B, Q, L]`` (None: all) -> ``[B, Q, H, Dv]``
    float32.

    Rows with nothing visible (padding) come out as zeros."""
    if visible is None and ((logit_cap and logit_cap > 0) or sinks is not None):
        visible = torch.ones(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool, device=q.device)
    if not (logit_cap and logit_cap > 0) and sinks is None:  # common case: one fused SDPA call
        mask = None if visible is None else visible[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
            attn_mask=mask, scale=sm_scale * k_scale, enable_gqa=True,
        )  # fmt: skip
        out = out.transpose(1, 2)
        return out * v_scale if v_scale != 1.0 else out
    B, Q, H, Dk = q.shape
    Hkv = k.shape[2]
    g = H // Hkv
    qf = q.float().view(B, Q, Hkv, g, Dk).permute(0, 2, 3, 1, 4)  # [B, Hkv, g, Q, Dk]
    kf = k.float().permute(0, 2, 1, 3)[:, :, None]  # [B, Hkv, 1, L, Dk]
    vf = v.float().permute(0, 2, 1, 3)[:, :, None]
    s = torch.matmul(qf, kf.transpose(-1, -2)) * (sm_scale * k_scale)  # [B, Hkv, g, Q, L]
    s = s.reshape(B, H, Q, -1)
    p = _scores_to_probs(s, visible[:, None], logit_cap, sinks).view(B, Hkv, g, Q, -1)
    out = torch.matmul(p, vf) * v_scale  # [B, Hkv, g, Q, Dv]
    return out.reshape(B, H, Q, -1).permute(0, 2, 1, 3)


def _extend_one(q, k_new, v_new, out, k_buffer, v_buffer, k_scale, v_scale, slots, sm_scale, logit_cap, sinks,
                custom_mask, is_causal) -> None:
    """``extend_attention_cpu`` for one request (a verify or a draft extend on CPU): ``q`` ``[E, H, Dk]``,
    ``slots`` ``[L]`` its cache slots, the last ``E`` of them new. About a third of the general path's
    ops: no padding, no per-token index tensors, the mask only when one is needed."""
    E, L = q.shape[0], slots.shape[0]
    P = L - E
    keys, vals = k_buffer.index_select(0, slots), v_buffer.index_select(0, slots)  # [L, Hkv, D]
    if k_new is not None and v_new is not None:  # the new tokens' K/V as given, not as cached
        keys[P:] = k_new.to(keys.dtype)
        vals[P:] = v_new.to(vals.dtype)
    visible = None
    if custom_mask is not None:
        cm = custom_mask.reshape(-1)
        if cm.numel() == E * E:  # QLEN_ONLY: the new keys' block; the prefix is visible
            visible = torch.ones(E, L, dtype=torch.bool, device=q.device)
            visible[:, P:] = cm.view(E, E)
        elif cm.numel() == E * L:  # FULL_MASK: every column given
            visible = cm.view(E, L).bool()
        else:
            raise ValueError(f"custom_mask has {cm.numel()} entries; expected ext*ext or ext*seq_len sums")
    elif is_causal and E > 1:  # query i sees keys j <= P + i
        visible = torch.ones(E, L, dtype=torch.bool, device=q.device).tril_(P)
    mask = None if visible is None else visible[None]
    o = _attend(q[None], keys[None], vals[None], mask, sm_scale, k_scale, v_scale, logit_cap, sinks)
    out.copy_(o.reshape(out.shape))


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """One new token per request: store ``key``/``value`` at ``loc`` (when given), then attend to the
    request's first ``seq_lens[b]`` cache slots (the last ``sliding_window_size`` only, when > 0).
    ``attn_logits`` is the real kernel's split-K scratch buffer and is left as is."""
    if is_cross_attention:
        raise NotImplementedError("cross-attention has no pure-PyTorch decode fallback")
    if key is not None and value is not None:
        k_cache.index_copy_(0, loc.long(), key.to(k_cache.dtype))
        v_cache.index_copy_(0, loc.long(), value.to(v_cache.dtype))
    B = query.shape[0]
    if B == 0:
        return
    with _threads_for(B * query.shape[1] * int(seq_lens.max()) * query.shape[2]):
        _decode(query, k_cache, v_cache, k_scale, v_scale, output, req_to_token, req_pool_indices, seq_lens,
                sm_scale, logit_cap, sliding_window_size, sinks)


def _decode(query, k_cache, v_cache, k_scale, v_scale, output, req_to_token, req_pool_indices, seq_lens,
            sm_scale, logit_cap, sliding_window_size, sinks) -> None:
    B = query.shape[0]
    if FAST_PATHS and B == 1 and not (sliding_window_size and sliding_window_size > 0):
        # One request (the common CPU case): a view of its slots and no mask. Every op here is paid
        # once per layer and decode step, and Python dispatch is most of this op's cost.
        n = int(seq_lens[0])
        slots = req_to_token[int(req_pool_indices[0]), :n]
        keys, vals = k_cache.index_select(0, slots)[None], v_cache.index_select(0, slots)[None]
        out = _attend(query[:, None], keys, vals, None, sm_scale, k_scale, v_scale, logit_cap, sinks)
        output.copy_(out[:, 0])
        return
    seq = seq_lens.long()
    L = int(seq.max())
    pos = torch.arange(L, device=seq.device)
    visible = pos[None, :] < seq[:, None]
    if sliding_window_size and sliding_window_size > 0:
        visible &= pos[None, :] >= (seq[:, None] - sliding_window_size)
    # Slots past a request's length are read but masked; req_to_token entries are valid pool indices.
    # index_select on the flat slots: advanced indexing (k_cache[slots]) is ~3x slower on the CPU.
    slots = req_to_token.index_select(0, req_pool_indices.long())[:, :L].reshape(-1).long()
    keys = k_cache.index_select(0, slots).view(B, L, *k_cache.shape[1:])
    vals = v_cache.index_select(0, slots).view(B, L, *v_cache.shape[1:])
    out = _attend(query[:, None], keys, vals, visible[:, None], sm_scale, k_scale, v_scale, logit_cap, sinks)
    output.copy_(out[:, 0])


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    custom_mask: torch.Tensor | None = None,
    is_causal: bool = True,
) -> None:
    """Prefill / verify: request ``b`` has ``prefix = seq_lens[b] - extend_seq_lens[b]`` cached tokens and
    ``extend_seq_lens[b]`` new ones at rows ``extend_start_loc[b] + i`` of ``q_extend``/``k_extend``.

    Query ``i`` sees the whole prefix and new keys ``j <= i`` (all of them when not ``is_causal``).
    ``custom_mask`` (speculative verify trees) replaces the causal rule for the new keys: either
    ``ext x ext`` per request (SGLang's QLEN_ONLY layout, the one CPU uses) or ``ext x seq_len`` per
    request (FULL_MASK layout, prefix columns included), concatenated over requests.
    """
    if is_cross_attention:
        raise NotImplementedError("cross-attention has no pure-PyTorch extend fallback")
    B = seq_lens.numel()
    N = q_extend.shape[0]
    if B == 0 or N == 0:
        return
    with _threads_for(N * int(seq_lens.max()) * q_extend.shape[1] * q_extend.shape[2]):
        _extend(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale, req_to_token,
                req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, sm_scale, logit_cap,
                sliding_window_size, sinks, custom_mask, is_causal)


def _extend(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale, req_to_token,
            req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, sm_scale, logit_cap,
            sliding_window_size, sinks, custom_mask, is_causal) -> None:
    B = seq_lens.numel()
    N = q_extend.shape[0]
    if FAST_PATHS and B == 1 and not (sliding_window_size and sliding_window_size > 0):
        _extend_one(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                    req_to_token[int(req_pool_indices[0]), : int(seq_lens[0])], sm_scale, logit_cap, sinks,
                    custom_mask, is_causal)
        return
    dev = q_extend.device
    seq = seq_lens.long()
    ext = extend_seq_lens.long()
    prefix = seq - ext
    E = int(ext.max())
    L = int(seq.max())
    uniform = N == B * E  # every request extends by E (verify, draft extend): plain reshapes
    if uniform:
        tok_b = torch.arange(B, device=dev).repeat_interleave(E)
        tok_j = torch.arange(E, device=dev).repeat(B)
        q = q_extend.view(B, E, *q_extend.shape[1:])
    else:
        tok_b = torch.repeat_interleave(torch.arange(B, device=dev), ext, output_size=N)
        tok_j = torch.arange(N, device=dev) - extend_start_loc.long()[tok_b]
        q = q_extend.new_zeros(B, E, *q_extend.shape[1:])
        q[tok_b, tok_j] = q_extend
    # Slots past a request's length are read but masked; req_to_token entries are valid pool indices.
    slots = req_to_token.index_select(0, req_pool_indices.long())[:, :L].long()
    keys = k_buffer[slots]
    vals = v_buffer[slots]
    if k_extend is not None and v_extend is not None:  # the new tokens' K/V as given, not as cached
        kpos_new = prefix[tok_b] + tok_j
        keys[tok_b, kpos_new] = k_extend.to(keys.dtype)
        vals[tok_b, kpos_new] = v_extend.to(vals.dtype)

    qpos = torch.arange(E, device=dev)
    kpos = torch.arange(L, device=dev)
    q_abs = prefix[:, None] + qpos[None, :]  # [B, E]
    if custom_mask is not None:
        cm = custom_mask.reshape(-1).bool()
        if cm.numel() == int((ext * ext).sum()):  # QLEN_ONLY: ext x ext per request, new keys only
            if uniform:
                tree = cm.view(B, E, E)
            else:
                base = torch.cumsum(ext * ext, 0) - ext * ext
                idx = base[:, None, None] + qpos[None, :, None] * ext[:, None, None] + qpos[None, None, :]
                ok = (qpos[None, :, None] < ext[:, None, None]) & (qpos[None, None, :] < ext[:, None, None])
                tree = cm[torch.where(ok, idx, 0)] & ok
            # Prefix columns visible; scatter the tree into the new-key columns (a spare column L
            # takes the padding of shorter requests).
            visible = torch.arange(L + 1, device=dev)[None, None, :] < prefix[:, None, None]
            visible = visible.expand(B, E, L + 1).clone()
            cols = prefix[:, None] + qpos[None, :]
            cols = torch.where(qpos[None, :] < ext[:, None], cols, L)[:, None, :].expand(B, E, E)
            visible.scatter_(2, cols, tree)
            visible = visible[..., :L]
        elif cm.numel() == int((ext * seq).sum()):  # FULL_MASK: ext x seq_len per request
            base = torch.cumsum(ext * seq, 0) - ext * seq
            idx = base[:, None, None] + qpos[None, :, None] * seq[:, None, None] + kpos[None, None, :]
            ok = (kpos[None, None, :] < seq[:, None, None]) & (qpos[None, :, None] < ext[:, None, None])
            visible = cm[torch.where(ok, idx, 0)] & ok
        else:
            raise ValueError(f"custom_mask has {cm.numel()} entries; expected ext*ext or ext*seq_len sums")
    elif is_causal:
        visible = kpos[None, None, :] <= q_abs[..., None]
    else:
        visible = (kpos[None, :] < seq[:, None])[:, None, :].expand(B, E, L)
    if sliding_window_size and sliding_window_size > 0:
        visible = visible & (kpos[None, None, :] > (q_abs[..., None] - sliding_window_size))

    out = _attend(q, keys, vals, visible, sm_scale, k_scale, v_scale, logit_cap, sinks)  # [B, E, H, Dv]
    if uniform:
        o_extend.copy_(out.reshape(o_extend.shape))
    else:
        o_extend.copy_(out[tok_b, tok_j])
