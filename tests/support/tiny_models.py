"""Tiny, locally built models for tests: a byte-level BPE tokenizer, a random Llama and EAGLE-3 drafts.

The builders live in the product module ``nanospec/bench/tiny.py`` (the serving benchmark's ``--make-tiny``
uses them too) and are re-exported here; what only tests need stays here. Nothing downloads anything.

API (kept stable; other test modules and train/ tests depend on it):

``make_tokenizer``, ``make_tiny_llama``, ``make_tiny_eagle3_draft``, ``make_tiny_eagle_draft`` (and ``BOS``,
``EOS``, ``PAD``, ``CHAT_TEMPLATE``, ``TRAINING_TEXT``)
    From ``nanospec.bench.tiny``; see its docstring for the models they build.

``agree_next_token(token_id, vocab_size) -> int``
    The agreeing target's greedy successor of a token: ``(token_id + 1) % vocab_size``.

``eagle3_reference_step(draft_dir, aux_hidden) -> Tensor``
    A pure-torch single draft step of an agreeing draft (attention ignored), for checking it.

Server helpers live in ``tests/support/sglang_server.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nanospec.bench.tiny import (  # noqa: F401  (re-exported for the test modules)
    BOS,
    CHAT_TEMPLATE,
    EOS,
    PAD,
    TRAINING_TEXT,
    make_tiny_eagle3_draft,
    make_tiny_eagle_draft,
    make_tiny_llama,
    make_tokenizer,
)


def agree_next_token(token_id: int, vocab_size: int) -> int:
    return (int(token_id) + 1) % vocab_size


def eagle3_reference_step(draft_dir, aux_hidden: torch.Tensor) -> torch.Tensor:
    """Unused by SGLang; a tiny pure-torch check that an agreeing draft maps states as documented.

    ``aux_hidden``: [n, n_aux * H] captured target states; returns the draft's greedy tokens for a single
    step ignoring attention (valid for the agreeing draft, whose attention output is zero).
    """
    from safetensors.torch import load_file

    sd = load_file(str(Path(draft_dir) / "model.safetensors"))
    cfg = json.loads((Path(draft_dir) / "config.json").read_text())
    eps = cfg["rms_norm_eps"]

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    h = aux_hidden @ sd["fc.weight"].T
    x = rms(h, sd["midlayer.post_attention_layernorm.weight"])
    gate = torch.nn.functional.silu(x @ sd["midlayer.mlp.gate_proj.weight"].T)
    mlp = (gate * (x @ sd["midlayer.mlp.up_proj.weight"].T)) @ sd["midlayer.mlp.down_proj.weight"].T
    out = rms(h + mlp, sd["norm.weight"])
    return (out @ sd["lm_head.weight"].T).argmax(-1)
