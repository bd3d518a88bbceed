"""Training options: built-in defaults < YAML file (--config) < command-line flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

# name: (type, default, help). YAML keys use the same names (dashes or underscores).
OPTIONS: dict[str, tuple[type, object, str]] = {
    "target_model_path": (str, None, "target model: local directory or hub id (required)"),
    "data_path": (
        str,
        None,
        "ShareGPT-style .json/.jsonl(.gz), a datasets-readable path, or a hub id (required)",
    ),
    "output_dir": (str, None, "run directory: checkpoints/, metrics.jsonl, tensorboard/, final/ (required)"),
    "data_split": (str, "train", "split to read when data_path is a datasets source"),
    "max_records": (int, None, "read only the first N raw records"),
    "eval_holdout": (int, 0, "last N usable records are held out for train.evaluate"),
    "max_length": (int, 2048, "tokens per conversation (longer ones are cut)"),
    "aux_layer_ids": (str, None, "comma-separated target layer ids to fuse (default: SGLang's low/mid/high)"),
    "tie_head": (bool, False, "use the target's LM head as the draft head, frozen (SGLang shares it)"),
    "head_init": (str, "target", "initial draft head: 'target' (copy of the target's head) or 'random'"),
    "ttt_steps": (int, 7, "training-time-test steps"),
    "ttt_decay": (float, 0.8, "loss weight of TTT step k is decay**k"),
    "batch_size": (int, 1, "conversations per process per micro-batch"),
    "grad_accum": (int, 1, "micro-batches per optimizer step"),
    "max_steps": (int, 1000, "optimizer steps"),
    "lr": (float, 1e-4, "peak learning rate (AdamW)"),
    "weight_decay": (float, 0.0, "AdamW weight decay"),
    "warmup_steps": (int, None, "linear warm-up steps (default: 2%% of max_steps)"),
    "min_lr_ratio": (float, 0.1, "cosine decay ends at lr * min_lr_ratio"),
    "max_grad_norm": (float, 0.5, "gradient clipping (0 disables)"),
    "dtype": (
        str,
        "auto",
        "target and autocast dtype: auto (bf16 on GPUs that have it, else float32), "
        "bfloat16, float16, float32",
    ),
    "seed": (int, 0, "initialisation and data-order seed"),
    "hidden_cache_dir": (str, None, "cache target features here and reuse them (offline training)"),
    "save_every": (int, 500, "checkpoint every N steps (0: only at the end)"),
    "keep_checkpoints": (int, 2, "checkpoints kept on disk"),
    "log_every": (int, 1, "metrics every N steps"),
    "resume": (bool, False, "continue from the latest checkpoint in output_dir"),
    "stop_at_step": (int, None, "checkpoint and stop after this step (schedule still follows max_steps)"),
    "max_minutes": (float, None, "checkpoint, export and stop after this much wall time"),
    "export_top_n": (str, None, "also export static top-N heads, e.g. '32000' or '8000,32000'"),
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Train a full-vocabulary EAGLE-3 draft for a target model.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", help="YAML file of options; flags override its keys")
    for name, (typ, default, text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        shown = f"{text} [default: {default}]"
        if typ is bool:
            p.add_argument(flag, nargs="?", const=True, type=_bool, help=shown)
        else:
            p.add_argument(flag, type=typ, help=shown)
    return p


def load(argv: list[str] | None = None) -> dict:
    """Resolved options as a dict; raises ValueError naming unknown YAML keys or missing required ones."""
    args = vars(parser().parse_args(argv))
    opts = {name: spec[1] for name, spec in OPTIONS.items()}
    config = args.pop("config", None)
    if config:
        loaded = yaml.safe_load(Path(config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{config}: expected a mapping of option: value")
        for key, value in loaded.items():
            name = key.replace("-", "_")
            if name not in OPTIONS:
                raise ValueError(f"{config}: unknown option {key!r}")
            opts[name] = value
    opts.update(args)
    for name in ("aux_layer_ids", "export_top_n"):
        value = opts[name]
        if isinstance(value, str):
            try:
                opts[name] = [int(v) for v in value.split(",") if v.strip()]
            except ValueError:
                raise ValueError(f"{name} must be comma-separated integers, got {value!r}") from None
        elif isinstance(value, int):
            opts[name] = [value]
    if opts["aux_layer_ids"] is not None:
        from train.model import check_aux_layer_ids

        # Duplicates and order need no model; the range is checked once the target's config is read.
        check_aux_layer_ids(opts["aux_layer_ids"])
    missing = [n for n in ("target_model_path", "data_path", "output_dir") if not opts[n]]
    if missing:
        raise ValueError(
            "missing required option(s): " + ", ".join("--" + m.replace("_", "-") for m in missing)
        )
    if opts["head_init"] not in ("target", "random"):
        raise ValueError(f"head_init must be 'target' or 'random', got {opts['head_init']!r}")
    if opts["warmup_steps"] is None:
        opts["warmup_steps"] = max(1, opts["max_steps"] // 50)
    return opts
