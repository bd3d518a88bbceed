"""Write (and read back) an EAGLE-3 draft directory SGLang loads with --speculative-algorithm EAGLE3.

Full head: config.json with draft_vocab_size == vocab_size and model.safetensors with no d2t/t2d. Tied head:
draft_vocab_size null and no lm_head (SGLang binds the target's head). Static top-N: the head keeps the rows
of the N most frequent training tokens (EOS forced in), plus `d2t` (draft id -> target id minus draft id,
SGLang's format) and `t2d` (target-vocabulary membership mask), as FR-Spec-style heads ship.

    python -m nanospec.train.export --checkpoint RUN/checkpoints/step_1000 --output DIR [--top-n 32000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from nanospec import draft_format as fmt
from nanospec.train.model import Eagle3Draft

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def save_draft(
    model: Eagle3Draft,
    out: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    top_n: int | None = None,
    counts: torch.Tensor | None = None,
    head_weight: torch.Tensor | None = None,
) -> Path:
    """Write config.json + model.safetensors (`nanospec.draft_format`). `counts` (V,) are needed for top_n;
    `head_weight` (V, H) for a top-N export of a tied draft."""
    cfg = LlamaConfig.from_dict(model.cfg.to_dict()).to_dict()
    cfg["architectures"] = [fmt.ARCHITECTURE]
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    if top_n is not None:
        if counts is None:
            raise ValueError("a top-N export needs token counts")
        state, cfg = fmt.reduce_head(state, cfg, fmt.top_ids(counts, top_n, fmt.eos_ids(cfg)), head_weight)
    return fmt.save_draft_dir(out, state, cfg, dtype=dtype)


def load_draft(path: str | Path, target=None) -> tuple[Eagle3Draft, torch.Tensor | None]:
    """An exported draft (float32) and its vocab map (N,) draft id -> target id (None: full or tied head).
    `target` (a model directory or its config) checks that the draft is this target's."""
    path = Path(path)
    _, state = fmt.load_draft_dir(path, target)
    cfg = LlamaConfig.from_pretrained(str(path))
    d2t = state.pop(fmt.D2T, None)
    state.pop(fmt.T2D, None)
    model = Eagle3Draft(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    vocab_map = None if d2t is None else fmt.target_ids(d2t)
    return model, vocab_map


def load_checkpoint(checkpoint: str | Path) -> Eagle3Draft:
    """The draft in an accelerate checkpoint of nanospec.train (its run directory holds the config)."""
    checkpoint = Path(checkpoint)
    cfg_path = checkpoint.parent.parent / "draft_config.json"
    if not cfg_path.exists():
        raise ValueError(f"{cfg_path} not found: is {checkpoint} a checkpoint of nanospec.train?")
    model = Eagle3Draft(LlamaConfig.from_dict(json.loads(cfg_path.read_text())))
    weights = checkpoint / "model.safetensors"
    if not weights.exists():
        raise ValueError(f"{weights} not found")
    model.load_state_dict(load_file(str(weights)))
    return model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint dir (RUN/checkpoints/step_N) or exported dir"
    )
    p.add_argument("--output", required=True, help="directory to write")
    p.add_argument("--top-n", type=int, help="static top-N head instead of the full vocabulary")
    p.add_argument("--token-counts", help="token_counts.safetensors (default: the run directory's)")
    p.add_argument("--target-model-path", help="target, for a top-N export of a tied-head draft")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    a = p.parse_args(argv)
    src = Path(a.checkpoint)
    model = load_draft(src)[0] if (src / "config.json").exists() else load_checkpoint(src)
    counts = head = None
    if a.top_n is not None:
        counts_path = Path(a.token_counts) if a.token_counts else fmt.find_token_counts(src)
        if counts_path is None or not counts_path.exists():
            where = counts_path or f"{src.parent / fmt.TOKEN_COUNTS_NAME} (nor in {src.parent.parent})"
            raise SystemExit(f"{where} not found: pass --token-counts")
        counts = fmt.load_token_counts(counts_path)
        if model.lm_head is None:
            if not a.target_model_path:
                raise SystemExit("tied-head draft: pass --target-model-path for the head rows")
            from nanospec.models import resolve
            from nanospec.train.target import load_target

            head = (
                load_target(resolve(a.target_model_path), torch.float32, torch.device("cpu"))
                .get_output_embeddings()
                .weight
            )
    out = save_draft(model, a.output, DTYPES[a.dtype], a.top_n, counts, head)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
