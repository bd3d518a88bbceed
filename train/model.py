"""The EAGLE-3 draft: fused target features, one decoder layer, full-vocabulary head, training-time test.

Parameter names follow the checkpoint layout SGLang's `LlamaForCausalLMEagle3` reads (`fc`, `midlayer.*`,
`norm`, `lm_head`), so export is a plain state-dict save. The token embedding is not a parameter here: it
is the target's (frozen) and SGLang shares it at load time, so callers pass embeddings in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """SGLang's default capture for EAGLE-3, in `eagle_aux_hidden_state_layer_ids` convention, layer order.

    With no ids configured SGLang captures the residual stream entering layers [2, L//2, L-3] by default;
    configured ids are shifted by one (id i means "output of layer i" = input of layer i+1; -1 is the
    embedding output), so the same points are [1, L//2-1, L-4], which the draft config then records
    explicitly (sorted: SGLang concatenates captured states in layer order). For 4-6 layers SGLang's default
    names a layer twice (L=4: [2, 2, 1]) and captures fewer states than its draft expects; three evenly
    spaced layers (-1 .. L-2) stand in there.
    """
    if num_layers < 3:
        raise ValueError(f"EAGLE-3 default aux layers need a target with >= 3 layers, got {num_layers}")
    ids = sorted({1, num_layers // 2 - 1, num_layers - 4})
    if len(ids) < 3:
        top = num_layers - 2
        ids = [-1, (top - 1) // 2, top]
    return ids


def check_aux_layer_ids(ids, num_layers: int | None = None) -> list[int]:
    """``ids`` if SGLang's EAGLE-3 target captures exactly those states in that order, else ValueError
    naming the offending ids.

    SGLang (`set_eagle3_layers_to_capture`, then the decoder loop) captures the input of layer i+1 for each
    configured id i, once per layer, in layer order, and only for layers that exist. So duplicates collapse
    (the draft's `fc`, sized for len(ids) states, then gets fewer and the server dies at the first request),
    a decreasing order swaps the features the draft was trained on, and an id outside -1..L-2 is never
    captured. ``num_layers`` None checks everything but the range (before the target's config is read).
    """
    ids = list(ids)
    if not ids:
        raise ValueError("aux_layer_ids is empty: EAGLE-3 fuses at least one target layer")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise ValueError(f"aux_layer_ids must be integers, got {bad}")
    if num_layers is not None:
        bad = [i for i in ids if not -1 <= i <= num_layers - 2]
        if bad:
            raise ValueError(
                f"aux_layer_ids {bad} out of range for a target with {num_layers} layers "
                f"(-1..{num_layers - 2}: id i is the input of layer i+1)"
            )
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(
            f"aux_layer_ids {ids} name layer id(s) {dup} more than once: SGLang captures each layer once, "
            f"so the draft would expect {len(ids)} states and get {len(set(ids))}"
        )
    if ids != sorted(ids):
        raise ValueError(
            f"aux_layer_ids {ids} are not in increasing order: SGLang concatenates the captured states in "
            f"layer order ({sorted(ids)}), so the draft would be served other features than it was trained on"
        )
    return ids


def draft_config(target: PretrainedConfig, aux_layer_ids: list[int] | None, tie_head: bool) -> LlamaConfig:
    """Draft config (the exported config.json) derived from the target's config.

    Attention/MLP shapes, RoPE and norm epsilon are the target's; one layer; the head covers the full target
    vocabulary (`draft_vocab_size == vocab_size`), or is absent (`draft_vocab_size = None`) when tied, which
    makes SGLang bind the target's LM head to the draft.
    """
    num_layers = target.num_hidden_layers
    ids = check_aux_layer_ids(aux_layer_ids or default_aux_layer_ids(num_layers), num_layers)
    heads = target.num_attention_heads
    head_dim = getattr(target, "head_dim", None) or target.hidden_size // heads
    rope = dict(getattr(target, "rope_parameters", None) or {})
    if not rope:
        rope = {"rope_type": "default", "rope_theta": getattr(target, "rope_theta", 10000.0)}
    cfg = LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        hidden_act=getattr(target, "hidden_act", "silu"),
        max_position_embeddings=target.max_position_embeddings,
        rms_norm_eps=getattr(target, "rms_norm_eps", 1e-6),
        rope_parameters=rope,
        tie_word_embeddings=False,
        bos_token_id=getattr(target, "bos_token_id", None),
        eos_token_id=getattr(target, "eos_token_id", None),
        pad_token_id=getattr(target, "pad_token_id", None),
    )
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    cfg.draft_vocab_size = None if tie_head else target.vocab_size
    cfg.target_hidden_size = target.hidden_size
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    return cfg


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
        target_logits: torch.Tensor,
        loss_mask: torch.Tensor,
        num_steps: int = 7,
        decay: float = 0.8,
        head_weight: torch.Tensor | None = None,
        vocab_map: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Training-time test over `num_steps` draft steps, against the target's next-token distribution.

        aux: (B, T, n_aux*H_t) target features at positions 0..T-1; embeds: (B, T, H) embeddings of the input
        tokens x_0..x_{T-1}; target_logits: (B, T, V) target logits (row t = distribution of x_{t+1});
        loss_mask: (B, T) 1 where token x_t counts (assistant tokens, not padding).
        Step k at position i reads x_{i+1+k} and predicts x_{i+2+k}, whose distribution is target row i+1+k.
        vocab_map: (N,) target id of each draft-vocabulary row, for a reduced (top-N) head; accuracy then maps
        the draft's choice back to a target id, so a token outside the head is a miss.
        Returns loss (scalar, decay-weighted sum over steps) and per-step `loss`, `correct`, `count` (K,).
        """
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
            logits = self.logits(hidden[:, :n][sel], head_weight).float()
            target = target_logits[:, 1 + k : 1 + k + n][sel].float()
            if vocab_map is not None:
                target = target[:, vocab_map]  # reduced draft vocabulary: compare on its tokens only
            if logits.shape[0] == 0:
                loss_k = hidden.sum() * 0.0  # keeps every parameter in the graph (DDP)
            else:
                loss_k = -(target.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
            total = total + decay**k * loss_k
            losses.append(loss_k.detach())
            pred = logits.argmax(-1)
            truth = target_logits[:, 1 + k : 1 + k + n][sel].argmax(-1)
            if vocab_map is not None:
                pred = vocab_map[pred]
            correct.append((pred == truth).sum())
            count.append(torch.tensor(logits.shape[0], device=logits.device))
        return {
            "loss": total,
            "step_loss": torch.stack(losses),
            "correct": torch.stack(correct).float(),
            "count": torch.stack(count).float(),
        }
