"""The frozen target: loading, EAGLE-3 feature capture, and an optional on-disk feature cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def load_target(path: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A causal LM from a local directory or hub id, frozen, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.requires_grad_(False).eval().to(device)
    return model


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: expected a decoder-only model with .model.layers")
    return layers


@torch.no_grad()
def features(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, aux_layer_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the target once and capture what SGLang hands an EAGLE-3 draft.

    input_ids, attention_mask: (B, T). Returns aux (B, T, n_aux*H): the residual stream entering layer id+1
    for each id (SGLang's capture point), concatenated in id order; and last (B, T, H): the final normed
    hidden state, from which `target_logits` gives the target's logits.
    """
    layers = decoder_layers(model)
    captured: dict[int, torch.Tensor] = {}

    def grab(index: int):
        def hook(_module, args, kwargs):
            captured[index] = args[0] if args else kwargs["hidden_states"]

        return hook

    wanted = sorted({i + 1 for i in aux_layer_ids})
    handles = [layers[i].register_forward_pre_hook(grab(i), with_kwargs=True) for i in wanted]
    try:
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        last = out.last_hidden_state
    finally:
        for h in handles:
            h.remove()
    aux = torch.cat([captured[i + 1] for i in aux_layer_ids], dim=-1)
    return aux, last


def target_logits(model: torch.nn.Module, last: torch.Tensor) -> torch.Tensor:
    """(B, T, H) final hidden -> (B, T, V) target logits."""
    head = model.get_output_embeddings()
    return head(last.to(head.weight.dtype))


def target_dist(
    model: torch.nn.Module, last: torch.Tensor, topk: int | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The target's next-token distribution from its final hidden state `last` (B, T, H).

    topk None: (None, probs (B, T, V) float32). Else (ids (B, T, K) int64, probs (B, T, K) float32): the K
    most likely tokens, most likely first, and their probabilities (not renormalised; the loss does that).
    """
    probs = target_logits(model, last).float().softmax(-1)
    if topk is None:
        return None, probs
    top = probs.topk(topk, dim=-1)
    return top.indices, top.values


class FeatureCache:
    """Per-sample target features on disk, so a second run (or epoch) skips the target forward.

    Each file holds the captured states (`aux`) and the target's distribution: its top-K ids and
    probabilities (`topk_ids`, `topk_probs`), or with no K the final hidden state (`last`), from which the
    head gives the full distribution. Files are keyed by a hash of the token ids, the capture layers and K,
    so a changed tokenizer, length limit, layer choice or K never reads stale features.
    """

    def __init__(self, directory: str, aux_layer_ids: list[int], topk: int | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.topk = topk
        self.salt = (",".join(map(str, aux_layer_ids)) + ("" if topk is None else f";top{topk}")).encode()

    def path(self, ids: list[int]) -> Path:
        digest = hashlib.sha1(self.salt + torch.tensor(ids, dtype=torch.int64).numpy().tobytes()).hexdigest()
        return self.dir / f"{digest}.safetensors"

    def get(self, ids: list[int]) -> dict[str, torch.Tensor] | None:
        """The tensors `put` stored for this sample, or None."""
        p = self.path(ids)
        return load_file(str(p)) if p.exists() else None

    def put(self, ids: list[int], tensors: dict[str, torch.Tensor]) -> None:
        """tensors: name -> (T, ...) for one unpadded sample (written whole or not at all)."""
        p = self.path(ids)
        tmp = p.with_suffix(".tmp")
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp))
        tmp.replace(p)


def batch_features(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    aux_layer_ids: list[int],
    cache: FeatureCache | None,
    topk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """aux (B, T, n_aux*H) and the target distribution (`target_dist`: ids or None, probs) for a right-padded
    batch, through the cache when given (the cache's K must be `topk`)."""
    if cache is None:
        aux, last = features(model, input_ids, attention_mask, aux_layer_ids)
        return (aux, *target_dist(model, last, topk))
    if cache.topk != topk:
        raise ValueError(f"feature cache keeps top-{cache.topk}, asked for top-{topk}")
    lengths = attention_mask.sum(1).tolist()
    rows = [input_ids[b, :n].tolist() for b, n in enumerate(lengths)]
    hits = [cache.get(r) for r in rows]
    if any(h is None for h in hits):
        aux, last = features(model, input_ids, attention_mask, aux_layer_ids)
        t_ids, t_probs = target_dist(model, last, topk)
        for b, (r, h) in enumerate(zip(rows, hits, strict=True)):
            if h is None:
                n = len(r)
                kept = {"aux": aux[b, :n]}
                kept.update({"last": last[b, :n]} if topk is None else
                            {"topk_ids": t_ids[b, :n], "topk_probs": t_probs[b, :n]})
                cache.put(r, kept)
        return aux, t_ids, t_probs
    b, t = input_ids.shape
    padded = {}
    for name in hits[0]:
        ref = hits[0][name]
        out = ref.new_zeros(b, t, *ref.shape[1:])
        for i, h in enumerate(hits):
            out[i, : h[name].shape[0]] = h[name]
        padded[name] = out.to(input_ids.device)
    if topk is None:
        return (padded["aux"], *target_dist(model, padded["last"], None))
    return padded["aux"], padded["topk_ids"], padded["topk_probs"]
