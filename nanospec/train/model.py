"""The EAGLE-3 draft: fused target features, one decoder layer, full-vocabulary head, training-time test.

Parameter names follow the checkpoint layout SGLang's `LlamaForCausalLMEagle3` reads (`fc`, `midlayer.*`,
`norm`, `lm_head`), so export is a plain state-dict save. The token embedding is not a parameter here: it
is the target's (frozen) and SGLang shares it at load time, so callers pass embeddings in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

# The capture layers and the draft config are the draft format's (nanospec/draft_format.py); re-exported.
from nanospec.draft_format import check_aux_layer_ids, default_aux_layer_ids, draft_config  # noqa: F401


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # float32 statistics, like the Llama reference and SGLang's RMSNorm.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)


def ttt_mask(seq_len: int, step: int, device: torch.device) -> torch.Tensor:
    """Boolean attention mask (T, T*(step+1)) for training-time-test step `step` (0-based).

    Keys are [step-0 keys | step-1 keys | ... | step-`step` keys]. Step-0 keys are causal (the draft's
    prefill over the real prefix); later keys are visible only on the diagonal, because at inference each
    drafted position extends only its own chain.
    """
    idx = torch.arange(seq_len, device=device)
    causal = idx[None, :] <= idx[:, None]
    diag = torch.eye(seq_len, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diag] * step, dim=1)


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft model. `cfg` is the draft config (see `draft_config`)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        num_aux = len(cfg.eagle_config["eagle_aux_hidden_state_layer_ids"])
        self.fc = nn.Linear(num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None
        if cfg.draft_vocab_size is not None:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def step(
        self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, cache: list, step: int
    ) -> torch.Tensor:
        """One draft forward at TTT step `step`.

        hidden: (B, T, H) fused feature (step 0) or the previous step's pre-norm output; embeds: (B, T, H)
        embeddings of the tokens fed at this step; positions: (B, T) RoPE positions; cache: list of (k, v)
        per earlier step, appended to. Returns the pre-norm output (B, T, H) (what the next step consumes).
        """
        layer, attn = self.midlayer, self.midlayer.self_attn
        b, t, _ = hidden.shape
        residual = hidden
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        q = attn.q_proj(x).view(b, t, attn.n_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, attn.n_kv, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, attn.n_kv, attn.head_dim).transpose(1, 2)
        cos, sin = self.rotary(v, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        cache.append((k, v))
        keys = torch.cat([kv[0] for kv in cache], dim=2)
        values = torch.cat([kv[1] for kv in cache], dim=2)
        mask = ttt_mask(t, step, hidden.device)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=attn.n_heads != attn.n_kv
        )
        hidden = attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)) + residual
        return layer.mlp(layer.post_attention_layernorm(hidden)) + hidden

    def logits(self, hidden: torch.Tensor, head_weight: torch.Tensor | None = None) -> torch.Tensor:
        """(N, H) pre-norm outputs -> (N, V) logits; `head_weight` (V, H) is the target's head when tied."""
        w = self.lm_head.weight if self.lm_head is not None else head_weight
        if w is None:
            raise ValueError("draft has no LM head (tied) and no head_weight was given")
        x = self.norm(hidden)
        return F.linear(x, w.to(x.dtype))

    def forward(
        self,
        aux: torch.Tensor,
        embeds: torch.Tensor,
        target_probs: torch.Tensor,
        loss_mask: torch.Tensor,
        num_steps: int = 7,
        decay: float = 0.8,
        head_weight: torch.Tensor | None = None,
        vocab_map: torch.Tensor | None = None,
        target_ids: torch.Tensor | None = None,
        candidates: torch.Tensor | None = None,
        full_every: int = 0,
    ) -> dict[str, torch.Tensor]:
        """Training-time test over `num_steps` draft steps, against the target's next-token distribution.

        aux: (B, T, n_aux*H_t) target features at positions 0..T-1; embeds: (B, T, H) embeddings of the input
        tokens x_0..x_{T-1}; loss_mask: (B, T) 1 where token x_t counts (assistant tokens, not padding).
        target_probs: (B, T, V) float32 target probabilities (row t = distribution of x_{t+1}), or with
        `target_ids` (B, T, K) int64 the target's top-K tokens (most likely first) and target_probs (B, T, K)
        their probabilities, renormalised here.
        Step k at position i reads x_{i+1+k} and predicts x_{i+2+k}, whose distribution is target row i+1+k.
        vocab_map: (N,) target id of each draft-vocabulary row, for a reduced (top-N) head (full target
        distribution only); accuracy maps the draft's choice back to a target id (outside the head: a miss).
        candidates: (C,) ascending target ids holding every `target_ids` entry at loss positions: the draft's
        softmax then runs over these C head rows only (a sampled softmax: the head costs C/V of a full one),
        except on every `full_every`-th scored row (0: none), which keeps the full-vocabulary softmax so the
        draft also learns to keep mass off tokens outside the candidates. Accuracy is then over the
        candidates (the target's top-1 is always among them).
        Returns loss (scalar, decay-weighted sum over steps) and per-step `loss`, `correct`, `count` (K,).
        """
        if target_ids is None and candidates is not None:
            raise ValueError("a sampled softmax (candidates) needs the target's top-K (target_ids)")
        if target_ids is not None and vocab_map is not None:
            raise ValueError("a reduced head (vocab_map) trains against the full target distribution")
        w = self.lm_head.weight if self.lm_head is not None else head_weight
        if w is None:
            raise ValueError("draft has no LM head (tied) and no head_weight was given")
        w_cand = None if candidates is None else w[candidates]
        b, t, _ = embeds.shape
        pos0 = torch.arange(t, device=embeds.device).expand(b, t)
        hidden, cache = self.fc(aux.to(self.fc.weight.dtype)), []
        losses, correct, count = [], [], []
        total = hidden.new_zeros(())
        for k in range(num_steps):
            shifted = torch.zeros_like(embeds)
            if t - 1 - k > 0:
                shifted[:, : t - 1 - k] = embeds[:, 1 + k :]
            hidden = self.step(hidden, shifted, pos0 + k, cache, k)
            n = max(t - 2 - k, 0)  # positions with both a target row and a label
            sel = loss_mask[:, 2 + k : 2 + k + n].bool()
            x = self.norm(hidden[:, :n][sel])
            probs = target_probs[:, 1 + k : 1 + k + n][sel].float()
            if x.shape[0] == 0:
                loss_k = hidden.sum() * 0.0  # keeps every parameter in the graph (DDP)
                hits = x.new_zeros(())
            elif target_ids is None:
                loss_k, hits = _full_loss(x, w, probs, vocab_map)
            else:
                loss_k, hits = _topk_loss(x, w, w_cand, candidates, target_ids[:, 1 + k : 1 + k + n][sel],
                                          probs / probs.sum(-1, keepdim=True), full_every)
            total = total + decay**k * loss_k
            losses.append(loss_k.detach())
            correct.append(hits)
            count.append(torch.tensor(x.shape[0], device=x.device))
        return {
            "loss": total,
            "step_loss": torch.stack(losses),
            "correct": torch.stack(correct).float(),
            "count": torch.stack(count).float(),
        }


def candidate_set(
    target_ids: torch.Tensor, input_ids: torch.Tensor, valid: torch.Tensor, negatives: int, vocab_size: int,
    seed: int,
) -> torch.Tensor:
    """(C,) ascending distinct int64 ids for a sampled softmax: every top-K id of the batch's target rows
    (target_ids (B, T, K)) and every token (input_ids (B, T): copying from the context is what a draft gets
    right most often) at the `valid` (B, T) positions, and `negatives` ids drawn uniformly with `seed` (a
    resumed run draws the same), which stand for the rest of the vocabulary. Padding is left out, so
    cached and freshly computed features give the same set."""
    neg = torch.randint(0, vocab_size, (negatives,), generator=torch.Generator().manual_seed(seed))
    valid = valid.bool()
    return torch.unique(torch.cat([target_ids[valid].flatten(), input_ids[valid], neg.to(target_ids.device)]))


def _full_loss(x, w, probs, vocab_map):
    """Soft cross-entropy of the full (or top-N) head against the full target distribution; hits (0-dim).
    x: (N, H) normed; probs: (N, V)."""
    logits = F.linear(x, w.to(x.dtype)).float()
    target = probs
    if vocab_map is not None:  # reduced vocabulary: the target renormalised over its rows
        target = probs[:, vocab_map]
        target = target / target.sum(-1, keepdim=True)
    loss = -(target * logits.log_softmax(-1)).sum(-1).mean()
    pred = logits.argmax(-1)
    if vocab_map is not None:
        pred = vocab_map[pred]
    return loss, (pred == probs.argmax(-1)).sum()


def _topk_loss(x, w, w_cand, candidates, ids, probs, full_every):
    """Soft cross-entropy against the target's renormalised top-K, over the candidate rows (sampled softmax)
    or, for every `full_every`-th row and with no candidates, the full head; hits (0-dim).
    x: (N, H) normed; ids, probs: (N, K)."""
    full = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    if candidates is None:
        full[:] = True
    elif full_every:
        full[::full_every] = True
    rows = []
    hits = x.new_zeros((), dtype=torch.long)
    if full.any():
        logits = F.linear(x[full], w.to(x.dtype)).float()
        logp = logits.log_softmax(-1).gather(1, ids[full])
        rows.append(-(probs[full] * logp).sum(-1))
        hits = hits + (logits.argmax(-1) == ids[full, 0]).sum()
    if (~full).any():
        logits = F.linear(x[~full], w_cand.to(x.dtype)).float()
        col = torch.searchsorted(candidates, ids[~full])
        logp = logits.log_softmax(-1).gather(1, col)
        rows.append(-(probs[~full] * logp).sum(-1))
        hits = hits + (candidates[logits.argmax(-1)] == ids[~full, 0]).sum()
    return torch.cat(rows).mean(), hits
