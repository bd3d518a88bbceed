"""Tiny, locally built models for tests: a byte-level BPE tokenizer, a random Llama and EAGLE-3 drafts.

The builders live in the product module ``nanospec/testing.py`` (the serving benchmark's ``--make-tiny``
uses them too) and are re-exported here; what only tests need stays here. Nothing downloads anything.

API (kept stable; other test modules and train/ tests depend on it):

``make_tokenizer``, ``make_tiny_llama``, ``make_tiny_eagle3_draft``, ``make_tiny_eagle_draft`` (and ``BOS``,
``EOS``, ``PAD``, ``CHAT_TEMPLATE``, ``TRAINING_TEXT``)
    From ``nanospec.testing``; see its docstring for the models they build.

``agree_next_token(token_id, vocab_size) -> int``
    The agreeing target's greedy successor of a token: ``(token_id + 1) % vocab_size``.

``eagle3_reference_step(draft_dir, aux_hidden) -> Tensor``
    A pure-torch single draft step of an agreeing draft (attention ignored), for checking it.

``make_tiny_cyclic_pair(root, *, vocab_size=512, period=8, target_scale=0.05, target_offset=3.0)
-> (target_dir, draft_dir)`` and ``cycle_next_token(token_id, period) -> int``
    An agreeing pair whose greedy output loops through blocks of ``period`` ids with small margins, so
    sampling penalties and stop conditions change it while the draft still accepts several tokens per
    step (``tests/test_plugin_sampling.py``); the target's greedy successor of a token.

Server helpers live in ``tests/support/sglang_server.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nanospec.testing import (  # noqa: F401  (re-exported for the test modules)
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


def cycle_next_token(token_id: int, period: int) -> int:
    """The cyclic target's greedy successor of a token (``make_tiny_cyclic_pair``): the next id
    inside its block of ``period`` consecutive ids, wrapping at the block's end."""
    base = int(token_id) // period * period
    return base + (int(token_id) - base + 1) % period


def make_tiny_cyclic_pair(root, *, vocab_size: int = 512, period: int = 8, target_scale: float = 0.05,
                          target_offset: float = 3.0) -> tuple[Path, Path]:
    """An agreeing target/EAGLE-3 draft pair whose greedy output *repeats*, for sampling-parameter tests.

    The target is ``make_tiny_llama(agree=True)`` with its LM head rewired so that token ``i`` scores
    highest at ``cycle_next_token(i, period)``: plain greedy decoding loops through the ``period``
    ids of the prompt's last block. ``target_scale`` (instead of the agreeing head's 4.0) leaves a
    margin of about 1.6 logits between the best and the second token, so frequency/presence penalties
    and logit biases change the greedy choice after a repetition or two; ``target_offset`` raises every
    target logit (through the embeddings' constant coordinate), which leaves greedy choices alone but
    makes the logits positive and close in ratio, so a repetition penalty (it divides positive logits)
    changes choices too. ``min_new_tokens`` / ``stop_token_ids`` meet stop tokens: block 0 holds
    ``<|eos|>`` (id 1). The draft is the agreeing EAGLE-3 draft with the
    same rewiring (row ``j`` of its head scores the predecessor of ``j``): from token ``a`` it
    proposes ``cycle(a + 1)``, the target's choice two tokens on everywhere except at a block's last
    id, so most verify steps accept several tokens. Returns ``(target_dir, draft_dir)``.
    """
    from safetensors.torch import load_file, save_file

    from nanospec.testing import _fourier_embeddings

    if vocab_size % period:
        raise ValueError(f"period {period} must divide vocab_size {vocab_size}")
    root = Path(root)
    target = make_tiny_llama(root / "target", vocab_size=vocab_size, agree=True)
    draft = make_tiny_eagle3_draft(root / "draft", target, agree=True)
    ks = torch.tensor(json.loads((target / "nanospec_tiny.json").read_text())["freqs"])
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    emb = _fourier_embeddings(vocab_size, hidden, ks)
    pred = torch.tensor([cycle_next_token(i, period) for i in range(vocab_size)]).argsort()  # σ⁻¹
    rms = (emb[0] ** 2).mean().sqrt().item()  # every embedding's RMS: the final norm divides by it
    for path, scale, offset in ((target, target_scale, target_offset), (draft, 4.0, 0.0)):
        head = emb[pred] * scale
        head[:, 0] = offset * rms  # the normalised constant coordinate is 1 / rms: every logit + offset
        sd = load_file(str(path / "model.safetensors"))
        sd["lm_head.weight"] = head.float().contiguous()
        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (target / "nanospec_tiny.json").write_text(json.dumps(
        {"agree": True, "freqs": ks.tolist(), "cycle": period, "target_scale": target_scale,
         "target_offset": target_offset}))
    return target, draft
