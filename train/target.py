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
        last = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    finally:
        for h in handles:
            h.remove()
    aux = torch.cat([captured[i + 1] for i in aux_layer_ids], dim=-1)
    return aux, last


def target_logits(model: torch.nn.Module, last: torch.Tensor) -> torch.Tensor:
    """(B, T, H) final hidden -> (B, T, V) target logits."""
    head = model.get_output_embeddings()
    return head(last.to(head.weight.dtype))


class FeatureCache:
    """Per-sample target features on disk, so a second run (or epoch) skips the target forward.

    Files are keyed by a hash of the token ids and the capture layers, so a changed tokenizer, length limit or
    layer choice never reads stale features.
    """

    def __init__(self, directory: str, aux_layer_ids: list[int]):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.salt = ",".join(map(str, aux_layer_ids)).encode()

    def path(self, ids: list[int]) -> Path:
        digest = hashlib.sha1(self.salt + torch.tensor(ids, dtype=torch.int64).numpy().tobytes()).hexdigest()
        return self.dir / f"{digest}.safetensors"

    def get(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        p = self.path(ids)
        if not p.exists():
            return None
        d = load_file(str(p))
        return d["aux"], d["last"]

    def put(self, ids: list[int], aux: torch.Tensor, last: torch.Tensor) -> None:
        """aux: (T, n_aux*H), last: (T, H) for one unpadded sample."""
        p = self.path(ids)
        tmp = p.with_suffix(".tmp")
        save_file({"aux": aux.contiguous().cpu(), "last": last.contiguous().cpu()}, str(tmp))
        tmp.replace(p)


def batch_features(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    aux_layer_ids: list[int],
    cache: FeatureCache | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features for a right-padded batch, through the cache when given. Shapes as in `features`."""
    if cache is None:
        return features(model, input_ids, attention_mask, aux_layer_ids)
    lengths = attention_mask.sum(1).tolist()
    rows = [input_ids[b, :n].tolist() for b, n in enumerate(lengths)]
    hits = [cache.get(r) for r in rows]
    if any(h is None for h in hits):
        aux, last = features(model, input_ids, attention_mask, aux_layer_ids)
        for b, (r, h) in enumerate(zip(rows, hits, strict=True)):
            if h is None:
                cache.put(r, aux[b, : len(r)], last[b, : len(r)])
        return aux, last
    b, t = input_ids.shape
    aux = hits[0][0].new_zeros(b, t, hits[0][0].shape[-1])
    last = hits[0][1].new_zeros(b, t, hits[0][1].shape[-1])
    for i, (a, h) in enumerate(hits):
        aux[i, : a.shape[0]], last[i, : h.shape[0]] = a, h
    return aux.to(input_ids.device), last.to(input_ids.device)
