"""Training options: built-in defaults < YAML file (--config) < command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml


def _opt(flag_type: type, default, help_text: str):
    """A training option: its command-line type (also what a YAML value means), default and help."""
    return field(default=default, metadata={"type": flag_type, "help": help_text})


@dataclass(frozen=True)
class Options:
    """Every training option; YAML keys and flags use the same names (dashes or underscores in YAML,
    ``--dashes`` on the command line). ``load`` resolves them: built-in defaults < YAML < flags; then
    ``aux_layer_ids`` and ``export_top_n`` are tuples of ints and ``warmup_steps`` is set."""

    target_model_path: str | None = _opt(str, None, "target model: local directory or hub id (required)")
    data_path: str | None = _opt(
        str,
        None,
        "ShareGPT-style .json/.jsonl(.gz), a datasets-readable path, or a hub id (required)",
    )
    output_dir: str | None = _opt(
        str,
        None,
        "run directory: checkpoints/, metrics.jsonl, tensorboard/, final/ (required)",
    )
    data_split: str = _opt(str, "train", "split to read when data_path is a datasets source")
    max_records: int | None = _opt(int, None, "read only the first N raw records")
    eval_holdout: int = _opt(int, 0, "last N usable records are held out for nanospec.train.evaluate")
    max_length: int = _opt(int, 2048, "tokens per conversation (longer ones are cut)")
    aux_layer_ids: tuple[int, ...] | None = _opt(
        str,
        None,
        "comma-separated target layer ids to fuse (default: SGLang's low/mid/high)",
    )
    tie_head: bool = _opt(
        bool,
        False,
        "use the target's LM head as the draft head, frozen (SGLang shares it)",
    )
    head_init: str = _opt(
        str,
        "target",
        "initial draft head: 'target' (copy of the target's head) or 'random'",
    )
    init_draft: str | None = _opt(
        str,
        None,
        "start from this exported draft's weights (a directory of nanospec.train.export; fine-tuning)",
    )
    ttt_steps: int = _opt(int, 7, "training-time-test steps")
    ttt_decay: float = _opt(float, 0.8, "loss weight of TTT step k is decay**k")
    batch_size: int = _opt(int, 1, "conversations per process per micro-batch")
    grad_accum: int = _opt(int, 1, "micro-batches per optimizer step")
    max_steps: int = _opt(int, 1000, "optimizer steps")
    lr: float = _opt(float, 1e-4, "peak learning rate (AdamW)")
    weight_decay: float = _opt(float, 0.0, "AdamW weight decay")
    warmup_steps: int | None = _opt(int, None, "linear warm-up steps (default: 2%% of max_steps)")
    min_lr_ratio: float = _opt(float, 0.1, "cosine decay ends at lr * min_lr_ratio")
    max_grad_norm: float = _opt(float, 0.5, "gradient clipping (0 disables)")
    dtype: str = _opt(
        str,
        "auto",
        "target and autocast dtype: auto (bf16 on GPUs that have it, else float32), "
        "bfloat16, float16, float32",
    )
    seed: int = _opt(int, 0, "initialisation and data-order seed")
    hidden_cache_dir: str | None = _opt(
        str,
        None,
        "cache target features here and reuse them (offline training)",
    )
    target_topk: int | None = _opt(
        int,
        None,
        "keep only the target's top-K next-token probabilities (renormalised), also in the feature cache "
        "(default: the full distribution)",
    )
    sampled_softmax: int = _opt(
        int,
        0,
        "> 0: the draft's softmax runs over the batch's candidates (the target's top-K ids, the batch's "
        "tokens and this many random negatives) instead of all V head rows; needs target_topk",
    )
    full_vocab_every: int = _opt(
        int,
        8,
        "with sampled_softmax, every N-th scored position keeps the full softmax",
    )
    eval_every: int = _opt(int, 0, "score the eval_holdout conversations every N steps, into eval.jsonl")
    save_every: int = _opt(int, 500, "checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = _opt(int, 2, "checkpoints kept on disk")
    log_every: int = _opt(int, 1, "metrics every N steps")
    resume: bool = _opt(bool, False, "continue from the latest checkpoint in output_dir")
    stop_at_step: int | None = _opt(
        int,
        None,
        "checkpoint and stop after this step (schedule still follows max_steps)",
    )
    max_minutes: float | None = _opt(float, None, "checkpoint, export and stop after this much wall time")
    export_top_n: tuple[int, ...] | None = _opt(
        str,
        None,
        "also export static top-N heads, e.g. '32000' or '8000,32000'",
    )


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
    for f in fields(Options):
        flag = "--" + f.name.replace("_", "-")
        shown = f"{f.metadata['help']} [default: {f.default}]"
        if f.metadata["type"] is bool:
            p.add_argument(flag, nargs="?", const=True, type=_bool, help=shown)
        else:
            p.add_argument(flag, type=f.metadata["type"], help=shown)
    return p


def _int_list(name: str, value) -> tuple[int, ...] | None:
    """'8000,32000', 8000 or [8000, 32000] (flag or YAML) -> (8000, 32000)."""
    if isinstance(value, str):
        try:
            return tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"{name} must be comma-separated integers, got {value!r}") from None
    if isinstance(value, int):
        return (value,)
    return None if value is None else tuple(value)


def load(argv: list[str] | None = None) -> Options:
    """The resolved options; raises ValueError naming unknown YAML keys, missing required options or a
    combination that cannot work."""
    args = vars(parser().parse_args(argv))
    opts = {f.name: f.default for f in fields(Options)}
    config = args.pop("config", None)
    if config:
        loaded = yaml.safe_load(Path(config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{config}: expected a mapping of option: value")
        for key, value in loaded.items():
            name = key.replace("-", "_")
            if name not in opts:
                raise ValueError(f"{config}: unknown option {key!r}")
            opts[name] = value
    opts.update(args)
    for name in ("aux_layer_ids", "export_top_n"):
        opts[name] = _int_list(name, opts[name])
    if opts["aux_layer_ids"] is not None:
        from nanospec.draft_format import check_aux_layer_ids

        # Duplicates and order need no model; the range is checked once the target's config is read.
        check_aux_layer_ids(opts["aux_layer_ids"])
    missing = [n for n in ("target_model_path", "data_path", "output_dir") if not opts[n]]
    if missing:
        raise ValueError(
            "missing required option(s): " + ", ".join("--" + m.replace("_", "-") for m in missing)
        )
    if opts["head_init"] not in ("target", "random"):
        raise ValueError(f"head_init must be 'target' or 'random', got {opts['head_init']!r}")
    if opts["sampled_softmax"] and not opts["target_topk"]:
        raise ValueError("sampled_softmax needs target_topk (the candidates hold the target's top-K)")
    if opts["eval_every"] and not opts["eval_holdout"]:
        raise ValueError("eval_every needs eval_holdout (the conversations it scores)")
    if opts["warmup_steps"] is None:
        opts["warmup_steps"] = max(1, opts["max_steps"] // 50)
    return Options(**opts)
