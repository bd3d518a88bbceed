"""Tiny random models built locally: a byte-level BPE tokenizer, a random Llama, EAGLE-3 and EAGLE drafts.

Nothing here downloads anything; every artefact is created from code and a built-in text. The serving
benchmark uses them for ``python -m nanospec.bench.specbench --make-tiny DIR`` and the test suite (through
``tests/support/tiny_models.py``) for its servers.

``make_tokenizer(dir, *, vocab_size=512) -> PreTrainedTokenizerFast``
    Trains a byte-level BPE tokenizer (``tokenizers``) on a built-in English text and saves it with
    ``save_pretrained`` into ``dir``. ``len(tokenizer) == vocab_size`` exactly (the BPE vocabulary is
    padded with plain added tokens ``<|extra_N|>`` when the text yields fewer merges). Special tokens:
    ``<|bos|>`` (id 0), ``<|eos|>`` (id 1), ``<|pad|>`` (id 2). A small chat template (``<|user|>`` /
    ``<|assistant|>`` turns, ``add_generation_prompt`` supported) makes ``/v1/chat/completions`` work.

``make_tiny_llama(dir, *, vocab_size=512, hidden=64, layers=3, heads=4, kv_heads=2, intermediate=128,
seed=0, agree=False) -> Path``
    A random ``LlamaForCausalLM`` in float32 saved with safetensors, plus the tokenizer, loadable by
    transformers and SGLang. Weights are drawn with unit-scale logits so that greedy decoding has clear
    margins (no near-ties that float32 round-off could flip). ``layers`` defaults to 3, the least that
    gives an EAGLE-3 draft three distinct target layers to fuse.

    ``agree=True`` builds the "agreeing" target: every attention and MLP output projection is zero, so
    the residual stream is the token embedding; embeddings are Fourier features of the token id (one
    constant coordinate plus cos/sin pairs), and the LM head maps token ``i`` to ``i + 1 (mod V)``.
    Greedy decoding therefore emits ``t+1, t+2, ...`` after a prompt ending in ``t``, with a logit
    margin checked at build time.

``make_tiny_eagle3_draft(dir, target_dir, *, agree=False, seed=0, layer_ids=None) -> Path``
    A full-vocabulary EAGLE-3 draft for the model in ``target_dir``: ``architectures =
    ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size == vocab_size``, one decoder layer (input
    ``2 * hidden``), ``fc`` fusing three target layers (``eagle_config.eagle_aux_hidden_state_layer_ids``,
    by default ``[-1, L//2 - 1, L - 2]``, i.e. the inputs of layers 0, L//2 and L-1), its own ``norm``
    and ``lm_head``; no ``d2t``/``t2d`` maps. Weight names follow SpecForge exports (``midlayer.*``,
    ``fc.weight``, ``norm.weight``, ``lm_head.weight``), which SGLang 0.5.23's
    ``srt/models/llama_eagle3.py`` renames on load. The tokenizer is copied alongside.

    ``agree=True`` (with an ``agree=True`` target) builds a draft whose greedy proposals always equal
    the target's next tokens: ``fc`` selects the first captured layer (the embedding of the current
    token), attention output is zero, and the MLP (gate saturated through the constant coordinate)
    applies the exact linear rotation that maps the Fourier features of token ``a`` to those of
    ``a + 1``; the draft's LM head is the target's. Every draft step thus advances one token, matching
    the target, and SGLang's accept length reaches the maximum.

``make_tiny_eagle_draft(dir, target_dir, *, agree=False, seed=0) -> Path``
    A full-vocabulary EAGLE(-2) draft for the model in ``target_dir``, in the layout of the original
    EAGLE exports that SGLang 0.5.23 serves with ``--speculative-algorithm EAGLE``
    (``srt/models/llama_eagle.py``): ``architectures = ["LlamaForCausalLMEagle"]``, ``fc`` (with bias)
    over ``[token embedding, target last hidden state]`` (``2 * hidden -> hidden``), one decoder layer
    ``layers.0.*`` without ``input_layernorm`` and no final norm. It has no LM head of its own: SGLang
    binds the target's embedding and LM head to the draft (an ``lm_head.weight`` in the checkpoint would
    be skipped), so ``tie_word_embeddings`` is false and a copy of the target's ``embed_tokens.weight``
    is stored only as real exports do. The tokenizer is copied alongside.

    ``agree=True`` (with an ``agree=True`` target) builds a draft whose greedy proposals always equal
    the target's next tokens: ``fc`` keeps the token embedding and drops the target state, and the
    attention and MLP outputs are zero, so the layer passes ``E[t]`` through and the target's LM head
    scores ``t + 1``. Every weight that matters is zero or an identity, so a weight SGLang failed to
    load would almost surely break the agreement (the accept length shows it).

``make_tiny(root, vocab_size, hidden) -> (target_dir, draft_dir)``
    The benchmark's pair: ``make_tiny_llama`` (8 heads, 4 KV heads, MLP width ``2 * hidden``) in
    ``root/target`` and its full-vocabulary EAGLE-3 draft in ``root/draft``, reused when already there.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}<|user|>{{ message['content'] }}\n"
    "{% else %}<|assistant|>{{ message['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# A few paragraphs of plain English (written for this file) to train the BPE merges on.
TRAINING_TEXT = """
Speculative decoding lets a small draft model propose several tokens that a large target model then
checks in one forward pass. When the draft agrees with the target, many tokens are accepted at once and
the answer arrives sooner; when it does not, the target's own choice is kept, so the output is the same
as plain decoding. The draft is cheap because it is small, but its vocabulary head can still be large.
A tokenizer splits text into pieces. Byte-level pieces can spell any string, so nothing is ever unknown.
Frequent pairs of pieces are merged into longer pieces, and the merges are learned from example text.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Write a short story about a robot who learns to paint. Explain how a hash table works and when to use
one. What are the main differences between Python and JavaScript? Give three tips for staying healthy.
Compose an engaging travel blog post about a recent trip to a mountain village, highlighting the food,
the people and the walks. Summarize the following article in two sentences. Translate this sentence
into French. Solve the equation x squared minus four equals zero and explain each step. The answer is
two or minus two. Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14 42.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))
Weather today: sunny in the morning, clouds in the afternoon and light rain in the evening. Tomorrow
will be colder, with wind from the north. Please remember to bring an umbrella and a warm coat.
Once upon a time there was a small town by the sea. Every morning the fishermen went out in their boats
and every evening they came back with their nets full. The children played on the beach and the old
people sat on benches and talked about the weather, the prices in the market and the news of the day.
"""


def _text_corpus() -> list[str]:
    lines = [line for line in TRAINING_TEXT.splitlines() if line.strip()]
    return lines * 4


def make_tokenizer(dir, *, vocab_size: int = 512):
    """Train and save a byte-level BPE tokenizer with exactly ``vocab_size`` tokens; return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError("vocab_size must be at least 300 (256 bytes + specials + some merges)")
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = [BOS, EOS, PAD, "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_text_corpus(), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=4096
    )
    missing = vocab_size - len(hf)
    if missing > 0:
        hf.add_tokens([f"<|extra_{k}|>" for k in range(missing)])
    if len(hf) != vocab_size:
        raise RuntimeError(f"tokenizer has {len(hf)} tokens, wanted {vocab_size}")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out))
    return hf



def _fourier_layout(vocab_size: int, hidden: int, seed: int):
    """Frequencies for the agreeing models' embeddings: ``m`` distinct integers in [1, V/2)."""
    m = (hidden - 1) // 2
    if m < 4:
        raise ValueError("hidden too small for the agreeing construction")
    g = torch.Generator().manual_seed(10_000 + seed)
    best = None
    for _ in range(16):  # pick the frequency set with the widest margin among a few random draws
        ks = torch.randperm(vocab_size // 2 - 1, generator=g)[:m] + 1
        d = torch.arange(1, vocab_size, dtype=torch.float64)
        score = torch.cos(2 * math.pi * ks.double()[None, :] * d[:, None] / vocab_size).sum(1).max().item()
        if best is None or score < best[1]:
            best = (ks, score)
    ks, worst = best
    if worst > m - 2.0:
        raise RuntimeError("could not find frequencies with a clear margin")
    return ks


def _fourier_embeddings(vocab_size: int, hidden: int, ks: torch.Tensor) -> torch.Tensor:
    """``E[i] = [1, cos(2 pi k_1 i / V), sin(...), ..., 0...]``: equal norm for every token."""
    m = ks.numel()
    i = torch.arange(vocab_size, dtype=torch.float64)
    ang = 2 * math.pi * ks.double()[None, :] * i[:, None] / vocab_size  # [V, m]
    e = torch.zeros(vocab_size, hidden, dtype=torch.float64)
    e[:, 0] = 1.0
    e[:, 1 : 1 + 2 * m : 2] = torch.cos(ang)
    e[:, 2 : 2 + 2 * m : 2] = torch.sin(ang)
    return e


def _shift_head(emb: torch.Tensor, scale: float) -> torch.Tensor:
    """LM head whose row ``j`` is the content of ``emb[j - 1]``: token ``i`` scores highest at ``i + 1``."""
    head = torch.roll(emb, shifts=1, dims=0).clone()
    head[:, 0] = 0.0
    return head * scale


def _rotation(hidden: int, ks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Linear map ``P`` with ``P @ E[i] == E[i + 1]`` for the Fourier embeddings."""
    p = torch.eye(hidden, dtype=torch.float64)
    for j, k in enumerate(ks.tolist()):
        t = 2 * math.pi * k / vocab_size
        a, b = 1 + 2 * j, 2 + 2 * j
        p[a, a], p[a, b] = math.cos(t), -math.sin(t)
        p[b, a], p[b, b] = math.sin(t), math.cos(t)
    return p


def make_tiny_llama(
    dir,
    *,
    vocab_size: int = 512,
    hidden: int = 64,
    layers: int = 3,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    agree: bool = False,
) -> Path:
    """Create and save a random float32 Llama (+ tokenizer) in ``dir``; return the path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out, vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # Linear [out, in]: unit-variance outputs; lm_head gives logits of std ~3
                std = (3.0 if "lm_head" in name else 1.0) / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=g) * std)
        if agree:
            ks = _fourier_layout(vocab_size, hidden, seed)
            emb = _fourier_embeddings(vocab_size, hidden, ks)
            model.model.embed_tokens.weight.copy_(emb.float())
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.model.norm.weight.fill_(1.0)
            model.lm_head.weight.copy_(_shift_head(emb, 4.0).float())
            logits = model(torch.arange(vocab_size)[None, :]).logits[0]
            expect = (torch.arange(vocab_size) + 1) % vocab_size
            if not torch.equal(logits.argmax(-1), expect):
                raise RuntimeError("agreeing target does not map i -> i + 1")
    model.save_pretrained(str(out), safe_serialization=True)
    if agree:
        (out / "nanospec_tiny.json").write_text(json.dumps({"agree": True, "freqs": ks.tolist()}))
    return out


def make_tiny_eagle3_draft(
    dir,
    target_dir,
    *,
    agree: bool = False,
    seed: int = 0,
    layer_ids: list[int] | None = None,
) -> Path:
    """Create and save a full-vocabulary EAGLE-3 draft for the model in ``target_dir``; return the path."""

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    target_dir = Path(target_dir)
    tcfg = json.loads((target_dir / "config.json").read_text())
    V = tcfg["vocab_size"]
    H, inter, nh, nkv, hd = _shapes(tcfg)
    L = tcfg["num_hidden_layers"]
    if layer_ids is None:
        if L < 3:
            raise ValueError("the target needs at least 3 layers for a 3-layer EAGLE-3 fusion")
        layer_ids = [-1, L // 2 - 1, L - 2]
    n_aux = len(layer_ids)

    g = torch.Generator().manual_seed(20_000 + seed)

    def lin(o, i, scale=1.0):
        return torch.randn(o, i, generator=g) * (scale / math.sqrt(i))

    sd = {
        "fc.weight": lin(H, n_aux * H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": lin(nh * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": lin(nkv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": lin(nkv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": lin(H, nh * hd),
        "midlayer.mlp.gate_proj.weight": lin(inter, H),
        "midlayer.mlp.up_proj.weight": lin(inter, H),
        "midlayer.mlp.down_proj.weight": lin(H, inter),
        "norm.weight": torch.ones(H),
        "lm_head.weight": lin(V, H, 3.0),
    }
    if agree:
        meta_path = target_dir / "nanospec_tiny.json"
        if not meta_path.exists():
            raise ValueError("agree=True needs a target made with make_tiny_llama(..., agree=True)")
        ks = torch.tensor(json.loads(meta_path.read_text())["freqs"])
        if inter < H:
            raise ValueError("agreeing draft needs intermediate >= hidden")
        emb = _fourier_embeddings(V, H, ks)
        s = 1.0 / math.sqrt((emb[0] ** 2).mean().item())  # RMSNorm scale of every embedding
        gate_pre = 30.0  # silu(30) == 30 to float32 precision
        fc = torch.zeros(H, n_aux * H, dtype=torch.float64)
        fc[:, :H] = torch.eye(H)  # keep the first captured layer: the current token's embedding
        gate = torch.zeros(inter, H, dtype=torch.float64)
        gate[:, 0] = gate_pre / s  # the normalised constant coordinate equals s
        up = torch.zeros(inter, H, dtype=torch.float64)
        up[:H, :H] = torch.eye(H)
        silu = gate_pre / (1 + math.exp(-gate_pre))
        down = torch.zeros(H, inter, dtype=torch.float64)
        down[:, :H] = (_rotation(H, ks, V) - torch.eye(H, dtype=torch.float64)) / (s * silu)
        sd.update(
            {
                "fc.weight": fc,
                "midlayer.self_attn.o_proj.weight": torch.zeros(H, nh * hd),
                "midlayer.mlp.gate_proj.weight": gate,
                "midlayer.mlp.up_proj.weight": up,
                "midlayer.mlp.down_proj.weight": down,
                "lm_head.weight": _shift_head(emb, 4.0),
            }
        )
    config = {
        **_one_layer_config(tcfg, "LlamaForCausalLMEagle3"),
        "draft_vocab_size": V,
        "target_hidden_size": H,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    }
    return _save_draft(out, target_dir, sd, config)


def make_tiny_eagle_draft(dir, target_dir, *, agree: bool = False, seed: int = 0) -> Path:
    """Create and save a full-vocabulary EAGLE(-2) draft for the model in ``target_dir``; return the path."""
    from safetensors.torch import load_file

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    target_dir = Path(target_dir)
    tcfg = json.loads((target_dir / "config.json").read_text())
    H, inter, nh, nkv, hd = _shapes(tcfg)
    # SGLang overwrites the draft's embedding with the target's; the copy only mirrors real exports.
    embed = load_file(str(target_dir / "model.safetensors"))["model.embed_tokens.weight"]

    g = torch.Generator().manual_seed(30_000 + seed)

    def lin(o, i):
        return torch.randn(o, i, generator=g) / math.sqrt(i)

    # Names as in EAGLE exports: no "model." prefix (llama_eagle.py adds it on load), layer 0
    # without input_layernorm (the fc output feeds attention directly), no final norm, no lm_head.
    sd = {
        "embed_tokens.weight": embed,
        "fc.weight": lin(H, 2 * H),
        "fc.bias": torch.zeros(H),
        "layers.0.post_attention_layernorm.weight": torch.ones(H),
        "layers.0.self_attn.q_proj.weight": lin(nh * hd, H),
        "layers.0.self_attn.k_proj.weight": lin(nkv * hd, H),
        "layers.0.self_attn.v_proj.weight": lin(nkv * hd, H),
        "layers.0.self_attn.o_proj.weight": lin(H, nh * hd),
        "layers.0.mlp.gate_proj.weight": lin(inter, H),
        "layers.0.mlp.up_proj.weight": lin(inter, H),
        "layers.0.mlp.down_proj.weight": lin(H, inter),
    }
    if agree:
        if not (target_dir / "nanospec_tiny.json").exists():
            raise ValueError("agree=True needs a target made with make_tiny_llama(..., agree=True)")
        # The draft reads [E[t], h] and must score t + 1 through the target's shift head, which is
        # exactly what the head does with E[t] itself: pass the embedding through unchanged.
        fc = torch.zeros(H, 2 * H)
        fc[:, :H] = torch.eye(H)
        sd.update({
            "fc.weight": fc,
            "layers.0.self_attn.o_proj.weight": torch.zeros(H, nh * hd),
            "layers.0.mlp.down_proj.weight": torch.zeros(H, inter),
        })
    # Not tied (see _one_layer_config): tied, the draft's lm_head would be its embedding module, to which
    # SGLang could not bind the target's embedding and LM head (two tensors) separately.
    return _save_draft(out, target_dir, sd, _one_layer_config(tcfg, "LlamaForCausalLMEagle"))


def _shapes(tcfg: dict) -> tuple[int, int, int, int, int]:
    """(hidden, intermediate, heads, kv heads, head dim) of a target config, which its drafts share."""
    hidden, nh = tcfg["hidden_size"], tcfg["num_attention_heads"]
    return (hidden, tcfg["intermediate_size"], nh, tcfg.get("num_key_value_heads", nh),
            tcfg.get("head_dim") or hidden // nh)


def _one_layer_config(tcfg: dict, architecture: str) -> dict:
    """config.json fields of a one-layer Llama draft that SGLang loads as ``architecture``, with the
    target's (config ``tcfg``) shapes, RoPE, norm epsilon and special tokens; its own head, not tied."""
    hidden, inter, nh, nkv, hd = _shapes(tcfg)
    rope = tcfg.get("rope_parameters") or {}
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": tcfg.get("max_position_embeddings", 4096),
        "rms_norm_eps": tcfg.get("rms_norm_eps", 1e-6),
        "rope_theta": rope.get("rope_theta", tcfg.get("rope_theta", 10000.0)),
        "vocab_size": tcfg["vocab_size"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": tcfg.get("bos_token_id"),
        "eos_token_id": tcfg.get("eos_token_id"),
    }


def _save_draft(out: Path, target_dir: Path, sd: dict, config: dict) -> Path:
    """Write a draft directory: float32 ``sd`` as model.safetensors, ``config``, the target's tokenizer."""
    from safetensors.torch import save_file

    sd = {k: v.float().contiguous() for k, v in sd.items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, out / name)
    return out


def _built(target: Path, draft: Path, vocab_size: int, hidden: int) -> bool:
    """Whether ``target`` and ``draft`` hold a finished pair of this size (the draft is written last)."""
    try:
        cfg = json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (cfg.get("vocab_size"), cfg.get("hidden_size")) == (vocab_size, hidden) and all(
        (d / f).is_file() for d in (target, draft) for f in ("config.json", "model.safetensors"))


def make_tiny(root, vocab_size: int, hidden: int) -> tuple[Path, Path]:
    """A random target (3 layers, 8 heads, 4 KV heads, MLP ``2 * hidden``) and its EAGLE-3 draft in ``root``.

    Reused when ``root`` already holds a pair of this vocabulary and hidden size: a 128k-token tokenizer
    takes a while to build and the weights are random anyway.
    """
    root = Path(root)
    target, draft = root / "target", root / "draft"
    if not _built(target, draft, vocab_size, hidden):
        make_tiny_llama(target, vocab_size=vocab_size, hidden=hidden, heads=8, kv_heads=4,
                        intermediate=2 * hidden)
        make_tiny_eagle3_draft(draft, target)
    return target, draft
