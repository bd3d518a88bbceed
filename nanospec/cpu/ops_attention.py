"""``decode_attention_cpu`` / ``extend_attention_cpu`` (SGLang's ``intel_amx`` backend ops) for CPUs without
SGLang's C++ kernels: NanoSpec's C kernel (attention.c) for decode steps and verifies of float32 caches,
PyTorch for the rest and as the kernel's oracle.

The call sites are ``sglang/srt/layers/attention/intel_amx_backend.py`` (SGLang 0.5.23); semantics follow
the Triton ``decode_attention.py`` / ``extend_attention.py`` kernels. In the PyTorch code requests of
different lengths are padded into one batch and masked, so there is no Python loop over requests or
tokens; one request (a CPU server's usual batch) takes shorter paths with the same results. Scores and
softmax run in float32 whatever the cache dtype, like the C++ kernels.

Shapes: ``q`` ``[T, H, Dk]``; KV caches ``[pool, Hkv, Dk|Dv]``; ``req_to_token`` ``[rows, width]`` maps a
request's token positions to cache slots; ``H`` must be a multiple of ``Hkv`` (GQA).
"""

from __future__ import annotations

import contextlib

import torch

from nanospec.cpu import native, ops_layers, switch

# The one-request paths and one-thread attention below are cuts of the decode and verify step; with
# NANOSPEC_CPU_LAYERS=sglang every call takes the general padded path on all threads, as before them
# (bench_verify's "old" path). Read once, when the fallback is loaded.
FAST_PATHS = ops_layers.mode() == "fused"

# NANOSPEC_CPU_ATTENTION: "native" (default) runs decode steps and verifies of float32 caches through
# attention.c where it builds (nanospec/cpu/native.py), "torch" keeps the PyTorch code below (the
# session-8 path, and the kernel's oracle in the tests). Off with NANOSPEC_CPU_LAYERS=sglang.
ENV = "NANOSPEC_CPU_ATTENTION"
MODES = ("native", "torch")


def mode() -> str:
    """The attention path chosen by ``NANOSPEC_CPU_ATTENTION``; an unknown value is an error."""
    return switch.choice(ENV, MODES)


NATIVE = mode() == "native"
# Most new tokens per request the kernel takes; longer extends (prefills) keep PyTorch's fused SDPA.
NATIVE_MAX_EXTEND = 16
# Largest key head size the kernel takes (attention.c's MAX_HEAD).
NATIVE_MAX_HEAD = 1024
_NATIVE_ERRORS = {
    -1: "a request's req_pool_indices / seq_lens / extend lengths fall outside req_to_token",
    -2: "the extend lengths do not add up to the query rows",
    -3: "req_to_token holds a slot outside the KV cache",
    -4: "a cache location to store the new K/V is outside the KV cache",
    -5: "custom_mask has the wrong number of entries",
    -6: "out of memory",
}

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


def native_usable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, logit_cap: float,
                   sinks: torch.Tensor | None, *new: torch.Tensor | None) -> bool:
    """Whether attention.c serves this call: float32 CPU tensors (``new``: the new K/V, or None), whole
    caches, no logit cap or sinks."""
    return (NATIVE and FAST_PATHS and sinks is None and not (logit_cap and logit_cap > 0)
            and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32 and q.device.type == "cpu"
            and all(x is None or (x.dtype == torch.float32 and x.device.type == "cpu") for x in new)
            and k_cache.dim() == v_cache.dim() == 3 and k_cache.is_contiguous() and v_cache.is_contiguous()
            and q.shape[-1] == k_cache.shape[2] <= NATIVE_MAX_HEAD
            and q.shape[1] % k_cache.shape[1] == 0 and native.available())


def _row_stride(x: torch.Tensor, width: int) -> int | None:
    """The stride between rows of x ``[n, ...]`` when each row is ``width`` contiguous floats, else None."""
    if x.dim() == 2:
        return x.stride(0) if x.shape[1] == width and x.stride(1) == 1 else None
    if x.dim() == 3 and x.shape[1] * x.shape[2] == width and x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x.stride(0)
    return x.stride(0) if x.is_contiguous() and x[0].numel() == width else None


def _rows(x: torch.Tensor | None, width: int) -> tuple[torch.Tensor | None, int]:
    """(x or a contiguous copy, its row stride): x ``[n, ...]`` as rows of ``width`` contiguous floats."""
    if x is None:
        return None, 0
    stride = _row_stride(x, width)
    if stride is None:
        x = x.contiguous()
        stride = width
    return x, stride


def _index(x: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """x as a contiguous ``dtype`` tensor (itself when it is one: most calls)."""
    if x is None or (x.dtype == dtype and x.is_contiguous()):
        return x
    return x.to(dtype).contiguous()


def native_attention(q, k_new, v_new, store_loc, out, k_cache, v_cache, req_to_token, req_pool_indices,
                     seq_lens, ext_lens, mask, causal, window, scale, v_scale) -> None:
    """attention.c over q ``[N, H, D]`` into out ``[N, H, Dv]``; the arguments as in
    ``nanospec_attention`` (attention.c). ``ext_lens`` None: one new token per request; ``mask`` bool,
    in SGLang's QLEN_ONLY or FULL_MASK layout. Python's share is most of a small call's cost (a SmolLM2
    decode: ~5 us in the kernel), hence the plain attribute checks instead of tensor ops."""
    N, H, D = q.shape
    Hkv, Dv = k_cache.shape[1], v_cache.shape[2]
    i64 = torch.int64
    seq, ext, rpi = _index(seq_lens, i64), _index(ext_lens, i64), _index(req_pool_indices, i64)
    r2t, loc = _index(req_to_token, torch.int32), _index(store_loc, i64)
    m = None if mask is None else _index(mask.reshape(-1), torch.bool)
    q, q_row = _rows(q, H * D)
    kn, kn_row = _rows(k_new, Hkv * D)
    vn, vn_row = _rows(v_new, Hkv * Dv)
    o = out if _row_stride(out, H * Dv) is not None else torch.empty(N, H * Dv)
    code = native.library().nanospec_attention(
        q.data_ptr(), q_row, None if kn is None else kn.data_ptr(), kn_row,
        None if vn is None else vn.data_ptr(), vn_row, None if loc is None else loc.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], r2t.data_ptr(), r2t.shape[0], r2t.shape[1],
        rpi.data_ptr(), seq.data_ptr(),
        None if ext is None else ext.data_ptr(), seq.numel(), N, None if m is None else m.data_ptr(),
        0 if m is None else m.numel(), int(bool(causal)), int(window or 0), o.data_ptr(), o.stride(0), H, Hkv,
        D, Dv, float(scale), float(v_scale), ONE_THREAD_WORK if torch.get_num_threads() > 1 else -1)
    if code:
        raise ValueError(f"attention: {_NATIVE_ERRORS.get(code, f'error {code}')}")
    if o is not out:
        out.copy_(o.view(out.shape))


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
    if query.shape[0] and native_usable(query, k_cache, v_cache, logit_cap, sinks, key, value):
        store = key is not None and value is not None
        native_attention(query, key if store else None, value if store else None, loc if store else None,
                         output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, None, None, True,
                         sliding_window_size, sm_scale * k_scale, v_scale)
        return
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
    if max_len_extend <= NATIVE_MAX_EXTEND and native_usable(q_extend, k_buffer, v_buffer, logit_cap, sinks,
                                                             k_extend, v_extend):
        native_attention(q_extend, k_extend, v_extend, None, o_extend, k_buffer, v_buffer, req_to_token,
                         req_pool_indices, seq_lens, extend_seq_lens, custom_mask, is_causal,
                         sliding_window_size, sm_scale * k_scale, v_scale)
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
