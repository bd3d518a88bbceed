"""The EAGLE-3 draft directory SGLang 0.5.23 loads with ``--speculative-algorithm EAGLE3`` (and NANOSPEC).

One place for the format that ``train/`` exports, the benchmarks prune to a static top-N head, and the test
fixtures (``nanospec/testing.py``) build. Engine-independent: torch, safetensors and json only
(transformers only for ``draft_config``, which returns a ``LlamaConfig``).

A draft directory holds

* ``config.json``: a one-layer Llama config with the target's attention/MLP/RoPE settings and norm epsilon
  (``draft_config_dict``), ``architectures: ["LlamaForCausalLMEagle3"]``, ``vocab_size`` (the target's),
  ``draft_vocab_size`` (rows of the head: ``vocab_size`` for a full head, N for a static top-N head, null
  for a head tied to the target's, which SGLang then binds), ``target_hidden_size`` and
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the target layers whose states ``fc`` fuses);
* ``model.safetensors``: ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight`` (absent when
  tied; names in ``weight_shapes``) and, for a reduced head, ``d2t`` (draft id -> target id minus draft
  id: SGLang adds ``arange`` back) and ``t2d`` (bool membership mask over the target vocabulary).

``save_draft_dir`` writes one (weights first, config last: a directory with a config is complete),
``load_draft_dir`` / ``check_draft_dir`` read one back and raise ``DraftFormatError`` naming the file for a
missing directory or file, a truncated or corrupt safetensors file, a config that is not EAGLE-3's, or a
draft made for another target (vocabulary or hidden size). ``top_ids`` is the one top-N rule
(forced ids first, then the most counted, ties to the lowest id) and ``static_top_n`` the FR-Spec-style
pruning of a full-vocabulary draft directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import LlamaConfig

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKEN_COUNTS_NAME = "token_counts.safetensors"
HEAD = "lm_head.weight"
D2T, T2D = "d2t", "t2d"
EAGLE3_KEYS = ("draft_vocab_size", "eagle_config", "target_hidden_size")


class DraftFormatError(ValueError):
    """A draft directory that cannot be used: the message names the file and what is wrong."""


# -- capture layers ------------------------------------------------------------------------------------

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


# -- config ----------------------------------------------------------------------------------------------

def _getter(cfg: Mapping | Any):
    """``get(key, default)`` over a config dict or a transformers config object."""
    if isinstance(cfg, Mapping):
        return lambda key, default=None: cfg[key] if cfg.get(key) is not None else default
    return lambda key, default=None: v if (v := getattr(cfg, key, None)) is not None else default


def one_layer_fields(target: Mapping | Any) -> dict:
    """The Llama settings of a one-layer draft for ``target`` (a config dict or object): its attention and
    MLP shapes, activation, RoPE, norm epsilon and special tokens; a head of its own (not tied)."""
    get = _getter(target)
    heads = get("num_attention_heads")
    rope = dict(get("rope_parameters") or {})
    if not rope:
        rope = {"rope_type": "default", "rope_theta": get("rope_theta", 10000.0)}
    return {
        "vocab_size": get("vocab_size"),
        "hidden_size": get("hidden_size"),
        "intermediate_size": get("intermediate_size"),
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": get("num_key_value_heads") or heads,
        "head_dim": get("head_dim") or get("hidden_size") // heads,
        "hidden_act": get("hidden_act", "silu"),
        "max_position_embeddings": get("max_position_embeddings"),
        "rms_norm_eps": get("rms_norm_eps", 1e-6),
        "rope_parameters": rope,
        "tie_word_embeddings": False,
        "bos_token_id": get("bos_token_id"),
        "eos_token_id": get("eos_token_id"),
        "pad_token_id": get("pad_token_id"),
    }


def eagle3_fields(target_hidden_size: int, aux_layer_ids: list[int], draft_vocab_size: int | None) -> dict:
    """The EAGLE-3 entries of a draft config (SGLang's ``LlamaForCausalLMEagle3`` reads them)."""
    return {
        "architectures": [ARCHITECTURE],
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target_hidden_size,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    }


def _aux_ids(target: Mapping | Any, aux_layer_ids: list[int] | None) -> list[int]:
    num_layers = _getter(target)("num_hidden_layers")
    return check_aux_layer_ids(aux_layer_ids or default_aux_layer_ids(num_layers), num_layers)


def draft_config_dict(target: Mapping | Any, aux_layer_ids: list[int] | None, tie_head: bool) -> dict:
    """config.json of a full-vocabulary (or, ``tie_head``, tied) EAGLE-3 draft for ``target`` as a plain
    dict: ``one_layer_fields``, ``model_type`` and ``eagle3_fields`` (default capture layers when
    ``aux_layer_ids`` is None, checked either way)."""
    get = _getter(target)
    ids = _aux_ids(target, aux_layer_ids)
    return {**one_layer_fields(target), "model_type": "llama",
            **eagle3_fields(get("hidden_size"), ids, None if tie_head else get("vocab_size"))}


def draft_config(target, aux_layer_ids: list[int] | None, tie_head: bool) -> LlamaConfig:
    """Draft config (the exported config.json) derived from the target's config, as a ``LlamaConfig``.

    Attention/MLP shapes, RoPE and norm epsilon are the target's; one layer; the head covers the full target
    vocabulary (`draft_vocab_size == vocab_size`), or is absent (`draft_vocab_size = None`) when tied, which
    makes SGLang bind the target's LM head to the draft.
    """
    from transformers import LlamaConfig

    ids = _aux_ids(target, aux_layer_ids)
    cfg = LlamaConfig(**one_layer_fields(target))
    tie = None if tie_head else target.vocab_size
    for key, value in eagle3_fields(target.hidden_size, ids, tie).items():
        setattr(cfg, key, value)
    return cfg


def config_dict(cfg: Mapping | Any) -> dict:
    """A config as a plain dict (transformers configs through ``to_dict``)."""
    return dict(cfg) if isinstance(cfg, Mapping) else cfg.to_dict()


def eos_ids(cfg: Mapping | Any) -> list[int]:
    """The config's ``eos_token_id`` as a list (it may be an int, a list or absent)."""
    eos = _getter(cfg)("eos_token_id")
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def weight_shapes(cfg: Mapping | Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every float weight of an EAGLE-3 draft with config ``cfg`` (no ``d2t``/``t2d``)."""
    get = _getter(cfg)
    h, inter, nh = get("hidden_size"), get("intermediate_size"), get("num_attention_heads")
    nkv, hd = get("num_key_value_heads") or nh, get("head_dim") or h // nh
    n_aux = len(get("eagle_config")["eagle_aux_hidden_state_layer_ids"])
    shapes = {
        "fc.weight": (h, n_aux * get("target_hidden_size", h)),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (nkv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, nh * hd),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
    }
    if get("draft_vocab_size") is not None:
        shapes[HEAD] = (get("draft_vocab_size"), h)
    return shapes


# -- static top-N heads ------------------------------------------------------------------------------------

def top_ids(counts: torch.Tensor, n: int, forced: Iterable[int] = ()) -> torch.Tensor:
    """(n,) ascending ids: the ``forced`` ids (EOS) first, then the most counted, ties (and never-counted
    ids) to the lowest id. Forced ids outside the vocabulary are ignored."""
    if not 0 < n <= counts.numel():
        raise ValueError(f"top-N size {n} must be in 1..{counts.numel()}")
    score = counts.double().clone()
    score[[i for i in forced if 0 <= i < counts.numel()]] = float("inf")
    # A stable sort keeps equal scores in id order, so ties go to the lowest ids.
    order = torch.sort(score, descending=True, stable=True).indices[:n]
    return torch.sort(order).values


def vocab_maps(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's maps of a head over the ascending target ids ``ids``: ``d2t`` (n,) int64 = id minus draft
    id, ``t2d`` (vocab_size,) bool membership."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """(n,) int64 target id of each draft-vocabulary row, from ``d2t`` (SGLang's ``hot_token_id``)."""
    return d2t.long() + torch.arange(d2t.numel())


def reduce_head(state: dict, config: dict, ids: torch.Tensor, head_weight: torch.Tensor | None = None
                ) -> tuple[dict, dict]:
    """(state, config) of the draft whose head keeps the rows ``ids`` (ascending target ids) of its own
    head, or of ``head_weight`` (V, H) for a tied draft, plus ``d2t``/``t2d``; ``draft_vocab_size = n``."""
    head = state.get(HEAD, head_weight)
    if head is None:
        raise ValueError("a top-N export of a tied draft needs the target's head weight")
    dtype = state["fc.weight"].dtype if "fc.weight" in state else head.dtype
    d2t, t2d = vocab_maps(ids, config["vocab_size"])
    state = {**state, HEAD: head.detach().to("cpu", dtype)[ids].contiguous(), D2T: d2t, T2D: t2d}
    return state, {**config, "draft_vocab_size": int(ids.numel())}


def static_top_n(src: str | Path, out: str | Path, n: int, counts: torch.Tensor) -> Path:
    """FR-Spec-style copy of the full-vocabulary draft directory ``src`` in ``out`` whose head keeps the
    ``top_ids(counts, n, EOS)`` rows; every other file of ``src`` (tokenizer) is copied alongside."""
    src = Path(src)
    config, state = load_draft_dir(src)
    if D2T in state or config.get("draft_vocab_size") != config.get("vocab_size") or HEAD not in state:
        raise DraftFormatError(f"{src / WEIGHTS_NAME}: not a full-vocabulary draft (the head has "
                               f"{config.get('draft_vocab_size')} of {config.get('vocab_size')} rows)")
    if counts.numel() != config["vocab_size"]:
        raise DraftFormatError(f"token counts over {counts.numel()} ids for a draft of vocab_size "
                               f"{config['vocab_size']} ({src / CONFIG_NAME})")
    state, config = reduce_head(state, config, top_ids(counts, n, eos_ids(config)))
    extra = [f for f in sorted(src.iterdir()) if f.is_file() and f.name not in (CONFIG_NAME, WEIGHTS_NAME)]
    return save_draft_dir(out, state, config, extra_files=extra)


# -- the directory -----------------------------------------------------------------------------------------

def save_draft_dir(out: str | Path, state: Mapping[str, torch.Tensor], config: Mapping, *,
                   dtype: torch.dtype | None = None, extra_files: Iterable[Path] = ()) -> Path:
    """Write ``out``: the ``extra_files`` (tokenizer), ``model.safetensors`` (floating tensors in ``dtype``
    when given, which config ``dtype``/``torch_dtype`` then name) and ``config.json`` (sorted keys) last."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in extra_files:
        if Path(f).is_file():
            shutil.copy(f, out / Path(f).name)
    from safetensors.torch import save_file

    config = dict(config)
    tensors = {}
    for name, t in state.items():
        t = t.detach().to("cpu")
        tensors[name] = (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous()
    if dtype is not None:
        config["dtype"] = config["torch_dtype"] = str(dtype).removeprefix("torch.")
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def read_config(path: str | Path) -> dict:
    """``path``/config.json (or the file ``path``) as a dict; DraftFormatError naming it otherwise."""
    path = Path(path)
    file = path / CONFIG_NAME if path.is_dir() else path
    if not path.exists():
        raise DraftFormatError(f"{path}: no such directory")
    if not file.is_file():
        raise DraftFormatError(f"{file} not found: {path} is not a model directory")
    try:
        cfg = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise DraftFormatError(f"{file}: not a readable JSON config ({e})") from e
    if not isinstance(cfg, dict):
        raise DraftFormatError(f"{file}: not a JSON object")
    return cfg


def check_target(config: Mapping, target_config: Mapping | Any, where: str | Path = "draft config.json",
                 target_name: str | Path = "the target") -> None:
    """DraftFormatError naming ``where`` when the draft ``config`` was made for another target than
    ``target_config``: another vocabulary size or another hidden size (what ``fc`` reads)."""
    get = _getter(target_config)
    want_v, want_h = get("vocab_size"), get("hidden_size")
    have_v, have_h = config.get("vocab_size"), config.get("target_hidden_size", config.get("hidden_size"))
    if want_v is not None and have_v is not None and have_v != want_v:
        raise DraftFormatError(f"{where}: the draft is for a vocabulary of {have_v} tokens, but "
                               f"{target_name} has vocab_size {want_v}: a draft of another target")
    if want_h is not None and have_h is not None and have_h != want_h:
        raise DraftFormatError(f"{where}: the draft reads target hidden states of size {have_h}, but "
                               f"{target_name} has hidden_size {want_h}: a draft of another target")


def _bad_weights(weights: Path, e: Exception) -> DraftFormatError:
    return DraftFormatError(f"{weights}: not a complete safetensors file (truncated or corrupt): {e}")


def check_draft_dir(path: str | Path, target: str | Path | Mapping | Any | None = None) -> dict:
    """The draft's config after checking, without reading the weights, that ``path`` holds a config and a
    complete safetensors file, and (``target``: a model directory or its config) that it fits the target.
    DraftFormatError naming the file otherwise."""
    path = Path(path)
    config = read_config(path)
    if target is not None:
        name = target if isinstance(target, str | Path) else "the target"
        tcfg = read_config(target) if isinstance(target, str | Path) else target
        check_target(config, tcfg, path / CONFIG_NAME, name)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise DraftFormatError(f"{weights} not found")
    from safetensors import safe_open

    try:
        with safe_open(str(weights), "pt"):
            pass
    except Exception as e:  # SafetensorError: not importable by name across safetensors versions
        raise _bad_weights(weights, e) from e
    return config


def load_draft_dir(path: str | Path, target: str | Path | Mapping | Any | None = None
                   ) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, tensors) of the EAGLE-3 draft in ``path``, checked as ``check_draft_dir`` does, and
    that the config is EAGLE-3's and every weight is there with the shape the config gives."""
    path = Path(path)
    config = check_draft_dir(path, target)
    missing = [k for k in EAGLE3_KEYS if k not in config]
    if missing:
        raise DraftFormatError(f"{path / CONFIG_NAME}: not an EAGLE-3 draft (no {', '.join(missing)})")
    from safetensors.torch import load_file

    weights = path / WEIGHTS_NAME
    try:
        state = load_file(str(weights))
    except Exception as e:
        raise _bad_weights(weights, e) from e
    for name, shape in weight_shapes(config).items():
        if name not in state:
            raise DraftFormatError(f"{weights}: no {name}")
        if tuple(state[name].shape) != shape:
            raise DraftFormatError(f"{weights}: {name} has shape {tuple(state[name].shape)}, the config "
                                   f"({path / CONFIG_NAME}) gives {shape}")
    return config, state


def find_token_counts(draft: str | Path) -> Path | None:
    """The training token counts of a draft: ``token_counts.safetensors`` in its run directory (the parent
    of RUN/final, the grandparent of RUN/checkpoints/step_N), or None."""
    draft = Path(draft)
    near = [d / TOKEN_COUNTS_NAME for d in (draft.parent, draft.parent.parent)]
    return next((c for c in near if c.is_file()), None)


def load_token_counts(path: str | Path) -> torch.Tensor:
    """(V,) int64 counts of a ``token_counts.safetensors`` file (key ``counts``)."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))["counts"]
    except Exception as e:
        raise DraftFormatError(f"{path}: not a token_counts.safetensors file ({e})") from e
