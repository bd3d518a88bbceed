"""Which drafts NANOSPEC serves: the start-up check of ``--speculative-draft-model-path`` against the target.

NANOSPEC serves what SGLang 0.5.23's EAGLE worker loads: EAGLE-3 drafts (full or reduced head with
``d2t``, tied or untied, with or without ``eagle_config``) and EAGLE(-2) drafts (with or without
``--speculative-token-map``), stored as one or sharded safetensors or ``pytorch_model.bin``, in any
floating dtype. A draft it cannot serve would otherwise fail inside the scheduler, at model load or at
the first request (an out-of-range ``d2t`` indexes past the head; a hidden size of another target
breaks ``fc``), so ``check_draft`` reads the draft's config and weight shapes (headers only; a
``.bin`` is memory-mapped) in the launching process and raises ``DraftFormatError`` naming the field
and the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from nanospec import draft_format as fmt
from nanospec.draft_format import DraftFormatError

logger = logging.getLogger(__name__)

# The EAGLE draft classes SGLang 0.5.23 registers (sglang/srt/models/*eagle*.py EntryClass);
# tests/test_plugin_drafts.py checks each against SGLang's ModelRegistry.
EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
EAGLE_ARCHS = ("LlamaForCausalLMEagle", "MistralForCausalLMEagle", "MistralLarge3ForCausalLMEagle",
               "Qwen2ForCausalLMEagle")
SGLANG_DEFAULT_AUX = 3  # hidden states an EAGLE-3 draft reads when its config names no layers
INDEX_NAME = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"


@dataclass(frozen=True)
class DraftInfo:
    """What the check found: architecture, EAGLE-3 or not, rows of the draft head (None: the target's
    head is bound), reduced (a ``d2t`` head or a token map), and the weights file(s) read."""

    arch: str
    eagle3: bool
    head_rows: int | None
    reduced: bool
    weights: str

    def describe(self) -> str:
        head = "the target's head" if self.head_rows is None else f"a {self.head_rows}-row head"
        kind = "reduced" if self.reduced else "full-vocabulary"
        return f"{self.arch} ({kind}, {head}; {self.weights})"


@dataclass(frozen=True)
class Checkpoint:
    """A draft directory's weights as stored: the shape of every tensor, where they are (for messages),
    and what reads one tensor: its safetensors file, or the memory-mapped ``pytorch_model.bin`` state."""

    shapes: dict[str, tuple[int, ...]]
    where: str
    files: dict[str, Path]
    state: dict | None

    def find(self, name: str) -> str | None:
        """The checkpoint key for ``name`` (published drafts prefix some keys with ``model.``)."""
        return next((k for k in (name, f"model.{name}") if k in self.shapes), None)

    def read(self, key: str) -> torch.Tensor:
        """One tensor (a small one: ``d2t``)."""
        if self.state is not None:
            return self.state[key]
        from safetensors import safe_open

        with safe_open(str(self.files[key]), "pt") as sf:
            return sf.get_tensor(key)


def read_checkpoint(draft: Path) -> Checkpoint:
    """The weights of the draft directory ``draft``: safetensors headers (one file or an index of
    shards), else a memory-mapped ``pytorch_model.bin``; DraftFormatError naming the file otherwise."""
    from safetensors import safe_open

    files = [draft / fmt.WEIGHTS_NAME] if (draft / fmt.WEIGHTS_NAME).is_file() else []
    if not files and (draft / INDEX_NAME).is_file():
        try:
            weight_map = json.loads((draft / INDEX_NAME).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DraftFormatError(f"{draft / INDEX_NAME}: not a safetensors index ({e})") from e
        files = [draft / name for name in sorted(set(weight_map.values()))]
    if files:
        shapes, where_of = {}, {}
        for f in files:
            try:
                with safe_open(str(f), "pt") as sf:
                    for name in sf.keys():
                        shapes[name] = tuple(sf.get_slice(name).get_shape())
                        where_of[name] = f
            except Exception as e:  # SafetensorError and OSError: not importable by one name
                raise DraftFormatError(f"{f}: not a complete safetensors file ({e})") from e
        where = str(files[0]) if len(files) == 1 else f"{draft / INDEX_NAME} ({len(files)} shards)"
        return Checkpoint(shapes, where, where_of, None)
    if (draft / BIN_NAME).is_file():
        path = draft / BIN_NAME
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:
            raise DraftFormatError(f"{path}: not a readable PyTorch state dict ({e})") from e
        if not isinstance(state, Mapping):
            raise DraftFormatError(f"{path}: not a state dict (a {type(state).__name__})")
        state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        return Checkpoint({k: tuple(v.shape) for k, v in state.items()}, str(path), {}, state)
    raise DraftFormatError(f"{draft}: no weights ({fmt.WEIGHTS_NAME}, {INDEX_NAME} or {BIN_NAME})")


def check_token_map(path: str | Path, vocab_size: int) -> int:
    """Number of hot ids in the ``--speculative-token-map`` file ``path`` (distinct target ids in
    ``[0, vocab_size)``); DraftFormatError naming the flag and the file otherwise."""
    path = Path(path)
    where = f"--speculative-token-map {path}"
    if not path.is_file():
        raise DraftFormatError(f"{where}: no such file")
    try:
        ids = torch.as_tensor(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:
        raise DraftFormatError(f"{where}: not a saved list or tensor of token ids ({e})") from e
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point():
        raise DraftFormatError(f"{where}: expected a non-empty 1-D list of token ids, got shape "
                               f"{tuple(ids.shape)} {ids.dtype}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftFormatError(f"{where}: token ids outside the target vocabulary [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise DraftFormatError(f"{where}: a token id appears twice")
    return int(ids.numel())


def check_draft(draft: str | Path, target_config: Mapping, *, target_name: str = "the target",
                token_map: str | Path | None = None) -> DraftInfo:
    """Check the draft directory ``draft`` for the target whose config is ``target_config`` (see the
    module doc); DraftFormatError naming the field and the file for a draft NANOSPEC cannot serve."""
    draft = Path(draft)
    config = fmt.read_config(draft)
    cfg_file = draft / fmt.CONFIG_NAME
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in EAGLE3_ARCHS + EAGLE_ARCHS:
        raise DraftFormatError(
            f"{cfg_file}: architectures {archs!r} is not an EAGLE draft SGLang's EAGLE worker loads "
            f"(one of {', '.join(EAGLE3_ARCHS + EAGLE_ARCHS)}; SGLang picks the draft's class by this "
            f"field, so an EAGLE draft saved as a plain LlamaForCausalLM needs it renamed)")
    eagle3 = arch in EAGLE3_ARCHS
    fmt.check_target(config, target_config, cfg_file, target_name)
    vocab, hidden = int(target_config["vocab_size"]), int(target_config["hidden_size"])
    ckpt = read_checkpoint(draft)
    shapes, where = ckpt.shapes, ckpt.where

    fc = ckpt.find("fc.weight")
    if fc is None:
        raise DraftFormatError(f"{where}: no fc.weight: not an EAGLE draft's weights")
    n_in = len((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
               or [None] * SGLANG_DEFAULT_AUX) if eagle3 else 2
    if shapes[fc][1] != n_in * hidden:
        raise DraftFormatError(
            f"{where}: fc.weight reads {shapes[fc][1]} features, but {n_in} hidden states of "
            f"{target_name} (hidden_size {hidden}) are {n_in * hidden}: a draft of another target")

    head = ckpt.find(fmt.HEAD)
    head_rows = shapes[head][0] if head is not None else None
    if head is not None and shapes[head][1] != config.get("hidden_size"):
        raise DraftFormatError(f"{where}: lm_head.weight has shape {shapes[head]}, but {cfg_file} gives "
                               f"hidden_size {config.get('hidden_size')}")
    reduced = False
    if eagle3:
        d_vocab = config.get("draft_vocab_size")
        if head is None and d_vocab not in (None, vocab):
            raise DraftFormatError(f"{cfg_file}: draft_vocab_size {d_vocab} but {where} has no "
                                   f"lm_head.weight (SGLang would bind the target's {vocab}-row head)")
        if head is not None and d_vocab not in (None, head_rows):
            raise DraftFormatError(f"{cfg_file}: draft_vocab_size {d_vocab} disagrees with lm_head.weight's "
                                   f"{head_rows} rows in {where}")
        d2t = ckpt.find(fmt.D2T)
        if d2t is not None:
            if shapes[d2t] != (head_rows if head_rows is not None else vocab,):
                raise DraftFormatError(
                    f"{where}: d2t has shape {shapes[d2t]}, but the draft head has "
                    f"{head_rows if head_rows is not None else vocab} rows: d2t needs one entry per row")
            ids = ckpt.read(d2t).long() + torch.arange(shapes[d2t][0])
            if int(ids.min()) < 0 or int(ids.max()) >= vocab:
                raise DraftFormatError(f"{where}: d2t maps rows to target ids outside [0, {vocab})")
            reduced = bool(ids.shape[0] < vocab or not torch.equal(ids, torch.arange(vocab)))
        elif head_rows is not None and head_rows != vocab:
            raise DraftFormatError(f"{where}: lm_head.weight has {head_rows} rows for a {vocab}-token target "
                                   f"and there is no d2t to map them to target ids")
        if token_map is not None:
            logger.warning("NANOSPEC: --speculative-token-map is ignored for an EAGLE-3 draft (SGLang "
                           "reads the draft's own d2t)")
    else:
        head_rows = None  # SGLang binds the target's head to an EAGLE(-2) draft
        if token_map is not None:
            head_rows = check_token_map(token_map, vocab)
            reduced = True
    return DraftInfo(arch, eagle3, head_rows, reduced, where)
