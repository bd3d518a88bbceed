"""Train a full-vocabulary EAGLE-3 draft for a target model on chat conversations.

    python -m nanospec.train --target-model-path PATH --data-path PATH --output-dir DIR --max-steps N
    accelerate launch train/eagle3.py --config configs/train/<name>.yaml [--flag value ...]
    python train/eagle3.py ...             # the same; train/eagle3.py is a thin script over this module

The target runs online (frozen, no grad) to give the fused low/mid/high features and its next-token
distribution; the draft is trained with a multi-step training-time test. When training ends,
OUTPUT/final/ is a draft SGLang loads as is:
`--speculative-algorithm EAGLE3 --speculative-draft-model-path OUTPUT/final`.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer

from nanospec import draft_format as fmt
from nanospec.models import resolve as resolve_model
from nanospec.train import config as config_mod
from nanospec.train.config import Options
from nanospec.train.data import batch_indices, collate, holdout_split, load_samples, token_counts
from nanospec.train.evaluate import evaluate
from nanospec.train.export import save_draft
from nanospec.train.model import Eagle3Draft, candidate_set, check_aux_layer_ids, draft_config
from nanospec.train.target import FeatureCache, batch_features, load_target


class Progress:
    """Optimizer steps done and training seconds spent (evaluation excluded); checkpointed with the
    accelerate state so --resume knows where it stopped and the learning curve's time axis continues."""

    def __init__(self):
        self.step = 0
        self.seconds = 0.0

    def state_dict(self) -> dict:
        return {"step": self.step, "seconds": self.seconds}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.seconds = float(state.get("seconds", 0.0))


def pick_dtype(name: str) -> torch.dtype:
    """bf16 where the accelerator has it, else float32 (CPU training stays exact and simple)."""
    if name == "auto":
        return (
            torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
        )
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if name not in dtypes:
        raise ValueError(f"dtype must be auto or one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up to 1, then cosine decay to min_ratio at `total`."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def open_metrics(path: Path, step: int):
    """The JSONL metrics file for appending, without rows past `step` (logged after the last checkpoint)."""
    rows = path.read_text().splitlines() if path.exists() else []
    kept = [r for r in rows if r.strip() and json.loads(r)["step"] <= step]
    path.write_text("".join(r + "\n" for r in kept))
    return open(path, "a")  # noqa: SIM115


def checkpoints(run: Path) -> list[Path]:
    found = [p for p in (run / "checkpoints").glob("step_*") if p.name.split("_")[1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def save_checkpoint(accelerator: Accelerator, run: Path, step: int, keep: int) -> None:
    accelerator.save_state(str(run / "checkpoints" / f"step_{step}"))
    if accelerator.is_main_process:
        for old in checkpoints(run)[: -max(1, keep)]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def stop_reason(opts: Options, step: int, out_of_time: bool) -> str | None:
    """Why training stops after optimizer step ``step``, or None to go on.

    "done": the schedule's max_steps are reached (checkpoint, export); "interrupted": stop_at_step, a
    simulated interruption (checkpoint, no export: --resume continues); "out_of_time": max_minutes ran
    out (checkpoint, and export what was learnt)."""
    if step >= opts.max_steps:
        return "done"
    if opts.stop_at_step is not None and step >= opts.stop_at_step:
        return "interrupted"
    if out_of_time:
        return "out_of_time"
    return None


def init_from(model: Eagle3Draft, path: str, target_config, aux_ids: list[int]) -> None:
    """Load an exported draft's weights into `model` (fine-tuning). The draft must be this target's and
    have this run's shape (head kind, capture layers); a mismatch is an error naming both."""
    try:
        draft_cfg, state = fmt.load_draft_dir(path, target_config)
    except fmt.DraftFormatError as e:
        raise SystemExit(f"--init-draft: {e}") from None
    got = (draft_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if list(got or []) != list(aux_ids):
        raise SystemExit(f"--init-draft {path}: captures layers {got}, this run {list(aux_ids)}")
    state = {k: v.float() for k, v in state.items() if k not in (fmt.D2T, fmt.T2D)}
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in state.items()}
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()))[:4]
        raise SystemExit(f"--init-draft {path}: weights differ from this run's draft (tie_head, vocabulary): "
                         f"{diff}")
    model.load_state_dict(state)


def main(argv: list[str] | None = None) -> Path:
    # -- options: defaults < YAML < flags; bad ones stop here with the argparse error (exit code 2) ----------
    try:
        opts = config_mod.load(argv)
        dtype = pick_dtype(opts.dtype)
    except ValueError as e:
        config_mod.parser().error(str(e))
    # A model-zoo name (e.g. smollm2-135m) becomes its local directory, fetched on first use.
    opts = replace(opts, target_model_path=resolve_model(opts.target_model_path))
    if opts.aux_layer_ids:
        # Before any data or weights are read: ids SGLang would capture differently fail the run now,
        # not the server at its first request.
        layers = getattr(AutoConfig.from_pretrained(opts.target_model_path), "num_hidden_layers", None)
        try:
            check_aux_layer_ids(opts.aux_layer_ids, layers)
        except ValueError as e:
            config_mod.parser().error(str(e))
    if opts.init_draft:  # before data and weights are read, as for the layer ids
        try:
            fmt.check_draft_dir(opts.init_draft)
        except fmt.DraftFormatError as e:
            raise SystemExit(f"--init-draft: {e}") from None
    run = Path(opts.output_dir)
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "no")
    accelerator = Accelerator(mixed_precision=precision)
    main_proc = accelerator.is_main_process
    torch.manual_seed(opts.seed)

    # -- data: tokenized conversations with their assistant-only loss masks ----------------------------
    tokenizer = AutoTokenizer.from_pretrained(opts.target_model_path)
    # Read and render once; the held-out part is the same split nanospec.train.evaluate --holdout reads.
    data = (opts.data_path, opts.max_length, opts.data_split, opts.max_records)
    usable, stats = load_samples(tokenizer, *data)
    samples, held_out = holdout_split(usable, opts.eval_holdout)
    accelerator.print(f"data: {stats.summary()}" + (" (file was truncated)" if stats.truncated_file else ""))
    if not samples:
        raise SystemExit("no usable training conversations")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # -- models: the frozen target and the draft (its head a copy of the target's, or the target's own) --
    target = load_target(opts.target_model_path, dtype, accelerator.device)
    aux_layer_ids = list(opts.aux_layer_ids) if opts.aux_layer_ids is not None else None
    cfg = draft_config(target.config, aux_layer_ids, opts.tie_head)
    aux_ids = cfg.eagle_config["eagle_aux_hidden_state_layer_ids"]
    embed_w = target.get_input_embeddings().weight
    head_w = target.get_output_embeddings().weight
    model = Eagle3Draft(cfg)
    if model.lm_head is not None and opts.head_init == "target":
        model.lm_head.weight.data.copy_(head_w.float())
    if opts.init_draft and not (opts.resume and checkpoints(run)):
        init_from(model, opts.init_draft, target.config, aux_ids)
    if main_proc:
        run.mkdir(parents=True, exist_ok=True)
        (run / "draft_config.json").write_text(cfg.to_json_string())
        (run / "train_config.json").write_text(json.dumps(asdict(opts), indent=2) + "\n")
        counts = token_counts(samples, cfg.vocab_size)
        save_file({"counts": counts}, str(run / "token_counts.safetensors"))

    # -- optimizer, schedule, and --resume from the latest checkpoint -----------------------------------
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(opts.warmup_steps, opts.max_steps, opts.min_lr_ratio)
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    progress = Progress()
    accelerator.register_for_checkpointing(scheduler, progress)
    if opts.resume and checkpoints(run):
        latest = checkpoints(run)[-1]
        accelerator.load_state(str(latest))
        accelerator.print(f"resumed from {latest} at step {progress.step}")
    elif checkpoints(run):
        raise SystemExit(f"{run} already holds checkpoints: pass --resume to continue, or a new --output-dir")

    # -- logging: metrics.jsonl (+ eval.jsonl), TensorBoard, progress bar -----------------------------
    cache = FeatureCache(opts.hidden_cache_dir, aux_ids, opts.target_topk) if opts.hidden_cache_dir else None
    bs, world, rank = opts.batch_size, accelerator.num_processes, accelerator.process_index
    k_steps = opts.ttt_steps
    writer = None
    if main_proc:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run / "tensorboard"))
    metrics_file = open_metrics(run / "metrics.jsonl", progress.step) if main_proc else None
    eval_file = open_metrics(run / "eval.jsonl", progress.step) if main_proc and opts.eval_every else None
    bar = tqdm(total=opts.max_steps, initial=progress.step, disable=not main_proc, desc="train")

    # -- the training loop: one optimizer step per iteration until a stop reason ---------------------------
    t0 = time.time()
    stop = "done" if progress.step >= opts.max_steps else None  # a resumed run may have finished already
    while stop is None:
        step, step_t0 = progress.step, time.time()
        sums = torch.zeros(3, k_steps, device=accelerator.device)  # loss*count, correct, count
        total_loss = torch.zeros((), device=accelerator.device)
        for micro in range(opts.grad_accum):
            # The batch is a pure function of the seed and the step: resuming replays the same order.
            index = step * opts.grad_accum + micro
            picked = batch_indices(len(samples), bs * world, index, opts.seed)[rank * bs : (rank + 1) * bs]
            batch = {
                k: v.to(accelerator.device) for k, v in collate([samples[i] for i in picked], pad_id).items()
            }
            with torch.no_grad():
                aux, t_ids, t_probs = batch_features(
                    target, batch["input_ids"], batch["attention_mask"], aux_ids, cache, opts.target_topk
                )
            candidates = None
            if opts.sampled_softmax:
                candidates = candidate_set(
                    t_ids,
                    batch["input_ids"],
                    batch["attention_mask"],
                    opts.sampled_softmax,
                    cfg.vocab_size,
                    seed=opts.seed * 1_000_003 + index,
                )
            embeds = F.embedding(batch["input_ids"], embed_w)
            mask = batch["loss_mask"] * batch["attention_mask"]
            sync = micro == opts.grad_accum - 1
            with accelerator.no_sync(model) if not sync else nullcontext(), accelerator.autocast():
                out = model(
                    aux,
                    embeds,
                    t_probs,
                    mask,
                    k_steps,
                    opts.ttt_decay,
                    head_weight=head_w if opts.tie_head else None,
                    target_ids=t_ids,
                    candidates=candidates,
                    full_every=opts.full_vocab_every,
                )
                accelerator.backward(out["loss"] / opts.grad_accum)
            total_loss += out["loss"].detach() / opts.grad_accum
            sums += torch.stack([out["step_loss"] * out["count"], out["correct"], out["count"]])
        grad_norm = accelerator.clip_grad_norm_(params, opts.max_grad_norm) if opts.max_grad_norm else None
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        progress.seconds += time.time() - step_t0
        sums = accelerator.reduce(sums, "sum")
        total_loss = accelerator.reduce(total_loss, "mean")

        # metrics of this step
        if progress.step % opts.log_every == 0 or progress.step == opts.max_steps:
            counts_k = sums[2].clamp(min=1)
            row = {
                "step": progress.step,
                "loss": round(total_loss.item(), 5),
                "lr": scheduler.get_last_lr()[0],
                "tokens": int(sums[2, 0].item()),
                "elapsed_s": round(time.time() - t0, 2),
                "train_s": round(progress.seconds, 2),
            }
            if grad_norm is not None:
                row["grad_norm"] = float(grad_norm)
            for k in range(k_steps):
                row[f"loss_{k + 1}"] = round((sums[0, k] / counts_k[k]).item(), 5)
                row[f"acc_{k + 1}"] = round((sums[1, k] / counts_k[k]).item(), 5)
            if main_proc:
                metrics_file.write(json.dumps(row) + "\n")
                metrics_file.flush()
                for key, value in row.items():
                    if key != "step":
                        writer.add_scalar(f"train/{key}", value, progress.step)
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc1=f"{row['acc_1']:.3f}")
        bar.update(1)

        # held-out scores every eval_every steps and at the end (not counted in train_s)
        last_step = progress.step == opts.max_steps
        if opts.eval_every and (progress.step % opts.eval_every == 0 or last_step):
            if main_proc:
                draft = accelerator.unwrap_model(model)
                scores = evaluate(draft, target, held_out, k_steps, None, bs, pad_id)
                draft.train()
                row = {"step": progress.step, "train_s": round(progress.seconds, 2), **scores}
                eval_file.write(json.dumps(row) + "\n")
                eval_file.flush()
                for key, value in scores.items():
                    writer.add_scalar(f"eval/{key}", value, progress.step)
                bar.write(f"step {progress.step}: held-out accept-length estimate "
                          f"{scores['accept_length_estimate']:.3f} after {progress.seconds / 60:.1f} min")
            accelerator.wait_for_everyone()

        # stop? (every process agrees: out of time on one is out of time on all); checkpoint
        out_of_time = opts.max_minutes is not None and time.time() - t0 > 60 * opts.max_minutes
        out_of_time = accelerator.reduce(torch.tensor(float(out_of_time), device=accelerator.device), "sum")
        stop = stop_reason(opts, progress.step, bool(out_of_time > 0))
        if stop is not None or (opts.save_every and progress.step % opts.save_every == 0):
            save_checkpoint(accelerator, run, progress.step, opts.keep_checkpoints)
        if stop in ("interrupted", "out_of_time"):
            accelerator.print(f"stopped at step {progress.step} of {opts.max_steps}; resume with --resume")
    bar.close()
    if main_proc:
        metrics_file.close()
        writer.close()
        if eval_file:
            eval_file.close()

    # -- export: final/ (and final_topN/) unless interrupted --------------------------------------------
    final = run / "final"
    if stop != "interrupted" and main_proc:
        draft = accelerator.unwrap_model(model)
        save_draft(draft, final)
        counts = load_file(str(run / "token_counts.safetensors"))["counts"]
        for n in opts.export_top_n or ():
            save_draft(draft, run / f"final_top{n}", top_n=n, counts=counts, head_weight=head_w)
        accelerator.print(f"draft written to {final}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return final


if __name__ == "__main__":
    main()
