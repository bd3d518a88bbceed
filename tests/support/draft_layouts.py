"""Tiny drafts in the layouts published EAGLE drafts use, generated from the agreeing tiny pair.

``make_target(dir, arch)``: the agreeing tiny target (token i -> i + 1) as a Llama-3.x, Qwen2.5 or Qwen3
architecture. The agreeing construction zeroes every attention and MLP output, so the architectures
differ only in what SGLang loads and runs (Qwen2's q/k/v biases, Qwen3's q/k norms), never in the answer.

``rewrite(src, out, ...)``: the EAGLE-3 draft directory ``src`` (``make_tiny_eagle3_draft``) in another
published layout: a reduced head (``draft_vocab_size`` < ``vocab_size`` with ``d2t``/``t2d``, as
SpecForge and EAGLE export), a tied head (no ``lm_head.weight``: SGLang binds the target's), no
``eagle_config`` (SGLang's default capture layers), bf16 weights, sharded safetensors with an index,
or ``pytorch_model.bin``.

``save_token_map(path, ids)``: an FR-Spec style token map for ``--speculative-token-map``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from nanospec import draft_format as fmt
from nanospec.testing import make_tiny_llama

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")
ARCHS = ("llama", "qwen2", "qwen3")


def make_target(dir, arch: str, *, vocab_size: int = 512) -> Path:
    """The agreeing tiny target of ``make_tiny_llama(agree=True)`` as ``arch`` (see ``ARCHS``)."""
    out = Path(dir)
    if arch == "llama":
        return make_tiny_llama(out, vocab_size=vocab_size, agree=True)
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; one of {ARCHS}")
    from safetensors.torch import load_file
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    base = make_tiny_llama(out.parent / f"{out.name}_llama", vocab_size=vocab_size, agree=True)
    lcfg = json.loads((base / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
            "bos_token_id", "eos_token_id", "pad_token_id")
    fields = {k: lcfg[k] for k in keys if k in lcfg}
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    config = config_cls(**fields, tie_word_embeddings=False, torch_dtype="float32")
    model = model_cls(config).float()
    state = load_file(str(base / "model.safetensors"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in state:
                p.copy_(state[name])
            elif name.endswith("_norm.weight"):  # Qwen3's q_norm / k_norm
                p.fill_(1.0)
            elif name.endswith(".bias"):  # Qwen2's q/k/v biases
                p.zero_()
            else:
                raise RuntimeError(f"{arch} parameter {name} has no Llama counterpart")
        logits = model(torch.arange(vocab_size)[None, :]).logits[0]
    if not torch.equal(logits.argmax(-1), (torch.arange(vocab_size) + 1) % vocab_size):
        raise RuntimeError(f"the {arch} target does not map i -> i + 1")
    model.save_pretrained(str(out), safe_serialization=True)
    for name in (*TOKENIZER_FILES, "nanospec_tiny.json", "generation_config.json"):
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    return out


def rewrite(src, out, *, keep: torch.Tensor | None = None, tied: bool = False, eagle_config: bool = True,
            dtype: torch.dtype = torch.float32, storage: str = "safetensors") -> Path:
    """Write the draft ``src`` to ``out`` in another layout.

    keep: ascending target ids [n] int64 the head keeps (a reduced head with ``d2t``/``t2d``);
    tied: drop ``lm_head.weight`` (``draft_vocab_size`` None); eagle_config: keep the capture layers;
    dtype: of the floating weights; storage: "safetensors", "sharded" (two files and an index) or "bin".
    """
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    config = json.loads((src / fmt.CONFIG_NAME).read_text())
    state = load_file(str(src / fmt.WEIGHTS_NAME))
    if keep is not None:
        state, config = fmt.reduce_head(state, config, keep)
    if tied:
        state.pop(fmt.HEAD)
        config["draft_vocab_size"] = None
    if not eagle_config:
        config.pop("eagle_config")
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    if storage == "safetensors":
        save_file(state, str(out / fmt.WEIGHTS_NAME), metadata={"format": "pt"})
    elif storage == "sharded":
        names = sorted(state)
        shards = [names[: len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for i, part in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: state[k] for k in part}, str(out / file), metadata={"format": "pt"})
            weight_map.update({k: file for k in part})
        total = sum(t.numel() * t.element_size() for t in state.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    elif storage == "bin":
        torch.save(state, out / "pytorch_model.bin")
    else:
        raise ValueError(f"unknown storage {storage!r}")
    (out / fmt.CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def save_token_map(path, ids: torch.Tensor) -> Path:
    """``torch.save`` of the hot target ids [n] int64, the file ``--speculative-token-map`` reads."""
    path = Path(path)
    torch.save(ids.long().clone(), path)
    return path
