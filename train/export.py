"""Write (and read back) an EAGLE-3 draft directory SGLang loads with --speculative-algorithm EAGLE3.

Full head: config.json with draft_vocab_size == vocab_size and model.safetensors with no d2t/t2d. Tied head:
draft_vocab_size null and no lm_head (SGLang binds the target's head). Static top-N: the head keeps the rows
of the N most frequent training tokens (EOS forced in), plus `d2t` (draft id -> target id minus draft id,
SGLang's format) and `t2d` (target-vocabulary membership mask), as FR-Spec-style heads ship.

    python -m train.export --checkpoint RUN/checkpoints/step_1000 --output DIR [--top-n 32000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from train.model import Eagle3Draft

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def top_ids(counts: torch.Tensor, n: int, eos_ids: list[int]) -> torch.Tensor:
    """(n,) ascending target ids: the n most frequent tokens, EOS ids forced in (displacing the rarest)."""
    if not 0 < n <= counts.numel():
        raise ValueError(f"top-N size {n} must be in 1..{counts.numel()}")
    score = counts.double().clone()
    score[torch.tensor(eos_ids, dtype=torch.long)] = float("inf")
    return torch.sort(torch.topk(score, n, sorted=True).indices).values


def eos_list(cfg: LlamaConfig) -> list[int]:
    eos = cfg.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def save_draft(
    model: Eagle3Draft,
    out: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    top_n: int | None = None,
    counts: torch.Tensor | None = None,
    head_weight: torch.Tensor | None = None,
) -> Path:
    """Write config.json + model.safetensors. `counts` (V,) are needed for top_n; `head_weight` (V, H) for a
    top-N export of a tied draft."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig.from_dict(model.cfg.to_dict())
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    if top_n is not None:
        if counts is None:
            raise ValueError("a top-N export needs token counts")
        ids = top_ids(counts, top_n, eos_list(cfg))
        head = state["lm_head.weight"] if "lm_head.weight" in state else head_weight
        if head is None:
            raise ValueError("a top-N export of a tied draft needs the target's head weight")
        state["lm_head.weight"] = head.detach().to("cpu", dtype)[ids].contiguous()
        state["d2t"] = ids - torch.arange(top_n)
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        state["t2d"] = t2d
        cfg.draft_vocab_size = top_n
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    d = cfg.to_dict()
    d["architectures"] = ["LlamaForCausalLMEagle3"]
    d["dtype"] = d["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    return out


def load_draft(path: str | Path) -> tuple[Eagle3Draft, torch.Tensor | None]:
    """An exported draft (float32) and its vocab map (N,) draft id -> target id (None: full or tied head)."""
    path = Path(path)
    cfg = LlamaConfig.from_pretrained(str(path))
    for key in ("draft_vocab_size", "eagle_config", "target_hidden_size"):
        if not hasattr(cfg, key):
            raise ValueError(f"{path}/config.json: not an EAGLE-3 draft (no {key})")
    state = load_file(str(path / "model.safetensors"))
    d2t = state.pop("d2t", None)
    state.pop("t2d", None)
    model = Eagle3Draft(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    vocab_map = None if d2t is None else d2t.long() + torch.arange(d2t.numel())
    return model, vocab_map


def load_checkpoint(checkpoint: str | Path) -> Eagle3Draft:
    """The draft in an accelerate checkpoint of train/eagle3.py (its run directory holds the config)."""
    checkpoint = Path(checkpoint)
    cfg_path = checkpoint.parent.parent / "draft_config.json"
    if not cfg_path.exists():
        raise ValueError(f"{cfg_path} not found: is {checkpoint} a checkpoint of train/eagle3.py?")
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
        # The run directory holds the counts: the parent of final/, the grandparent of checkpoints/step_N/.
        near = [d / "token_counts.safetensors" for d in (src.parent, src.parent.parent)]
        found = next((c for c in near if c.exists()), near[0])
        counts_path = Path(a.token_counts) if a.token_counts else found
        if not counts_path.exists():
            raise SystemExit(f"{counts_path} not found: pass --token-counts")
        counts = load_file(str(counts_path))["counts"]
        if model.lm_head is None:
            if not a.target_model_path:
                raise SystemExit("tied-head draft: pass --target-model-path for the head rows")
            from nanospec.models import resolve
            from train.target import load_target

            head = (
                load_target(resolve(a.target_model_path), torch.float32, torch.device("cpu"))
                .get_output_embeddings()
                .weight
            )
    out = save_draft(model, a.output, DTYPES[a.dtype], a.top_n, counts, head)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
