"""Test fixtures that ship with the product: tiny random models built locally and the SGLang server launcher
with the tests' CPU defaults.

Nothing here downloads anything; every artefact is created from code and a built-in text. The test suite
uses them through ``tests/support/`` (which adds what only tests need); the serving benchmark's
``python -m nanospec.bench.specbench --make-tiny DIR``, the CPU op benchmarks (``nanospec.cpu.bench``,
``nanospec.cpu.bench_verify``) and ``scripts/load_check.py`` use them directly, which is why they live in
the package rather than in ``tests/`` (an installed NanoSpec has no ``tests``).

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
    by default the trainer's, ``nanospec.draft_format.default_aux_layer_ids``: ``[-1, 0, 1]`` for the
    3-layer default target), its own ``norm`` and ``lm_head``; no ``d2t``/``t2d`` maps. Config and
    directory are ``nanospec.draft_format``'s, as ``train/`` exports them; weight names follow SpecForge
    exports (``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``), which SGLang 0.5.23's
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

``SGLangServer(model_path, *, args=(), env=None, log_path=None, port=None, device="cpu",
startup_timeout=600.0)``
    ``nanospec.bench.server.Server`` (start, stop, readiness, requests, log: see its docstring), with
    the tests' defaults: with ``device="cpu"`` it adds ``--device cpu``, ``--skip-server-warmup`` and
    ``--sleep-on-idle`` (unless given in ``args``; an idle SGLang scheduler otherwise spins on a core)
    and ``OMP_NUM_THREADS=1`` (unless set in the environment or ``env``).
    Nothing else: the installed ``nanospec.cpu`` start-up hook sets ``SGLANG_USE_CPU_ENGINE=1`` and a CPU
    default for ``--max-total-tokens`` (docs/cpu.md), so the server runs exactly as a user's would. The
    log is appended to, never truncated; ``generate`` has ``ignore_eos`` on by default.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from nanospec import draft_format as fmt
from nanospec.bench.server import Server

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
    config = {**fmt.draft_config_dict(tcfg, layer_ids, tie_head=False), "torch_dtype": "float32"}
    n_aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])

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
    # Not tied (one_layer_fields): tied, the draft's lm_head would be its embedding module, to which
    # SGLang could not bind the target's embedding and LM head (two tensors) separately.
    config = {**fmt.one_layer_fields(tcfg), "architectures": ["LlamaForCausalLMEagle"], "model_type": "llama",
              "torch_dtype": "float32"}
    return _save_draft(out, target_dir, sd, config)


def _shapes(tcfg: dict) -> tuple[int, int, int, int, int]:
    """(hidden, intermediate, heads, kv heads, head dim) of a target config, which its drafts share."""
    hidden, nh = tcfg["hidden_size"], tcfg["num_attention_heads"]
    return (hidden, tcfg["intermediate_size"], nh, tcfg.get("num_key_value_heads", nh),
            tcfg.get("head_dim") or hidden // nh)


def _save_draft(out: Path, target_dir: Path, sd: dict, config: dict) -> Path:
    """Write a draft directory (``draft_format.save_draft_dir``): the target's tokenizer, float32 ``sd`` as
    model.safetensors, ``config``."""
    tokenizer = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
    return fmt.save_draft_dir(out, {k: v.float() for k, v in sd.items()}, config,
                              extra_files=[target_dir / name for name in tokenizer])


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


# -- the SGLang server launcher of the tests -----------------------------------------------------------

CPU_DEFAULTS: dict[str, str] = {}
# --sleep-on-idle: an idle scheduler otherwise spins a core; a test module keeps several servers up
# at once, and on a 2-core host the idle ones starve the one at work (a start-up past 300 s).
CPU_FLAGS = ("--skip-server-warmup", "--sleep-on-idle")


class SGLangServer(Server):
    """``Server`` with the tests' CPU defaults (module docstring)."""

    def __init__(self, model_path, *, args=(), env: dict | None = None, log_path=None,
                 port: int | None = None, device: str = "cpu", startup_timeout: float = 600.0) -> None:
        super().__init__(model_path, args, env, log_path, startup_timeout, port=port, append_log=True)
        self.device = device

    def launch_args(self) -> list[str]:
        extra = []
        if self.device == "cpu":
            if "--device" not in self.args:
                extra += ["--device", "cpu"]
            for flag, value in CPU_DEFAULTS.items():
                if flag not in self.args:
                    extra += [flag, value]
            extra += [flag for flag in CPU_FLAGS if flag not in self.args]
        return extra + self.args

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.device == "cpu" and "OMP_NUM_THREADS" not in self.env:
            # Tiny test models: one OpenMP thread avoids spin-wait collapse on a busy 2-core host.
            env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def stop(self, grace: float = 15.0) -> None:
        super().stop(grace)

    def generate(self, prompt, max_new_tokens: int = 32, **sampling) -> dict:
        sampling.setdefault("ignore_eos", True)
        return super().generate(prompt, max_new_tokens, timeout=300.0, **sampling)
