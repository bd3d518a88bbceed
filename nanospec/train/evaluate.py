"""Per-step draft accuracy on held-out conversations: the acceptance proxy EAGLE reports.

    python -m nanospec.train.evaluate --draft RUN/final --target-model-path PATH --data-path PATH \\
        [--holdout N]

For every assistant position the draft runs the training-time test (its own hidden states, the true tokens
as inputs) and step k is correct when its top-1 equals the target's top-1. `acc_k` is the step-k accuracy;
`chain_k` the share of positions whose first k steps are all correct, so `1 + sum(chain_k)` estimates the
accept length of greedy chain drafting.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from nanospec.train.data import Sample, collate
from nanospec.train.model import Eagle3Draft
from nanospec.train.target import features, target_logits


@torch.no_grad()
def evaluate(
    draft: Eagle3Draft,
    target: torch.nn.Module,
    samples: list[Sample],
    steps: int,
    vocab_map: torch.Tensor | None = None,
    batch_size: int = 1,
    pad_id: int = 0,
) -> dict:
    """Per-step accuracy (acc_1..acc_K), chain accuracy (chain_1..chain_K) and the accept-length estimate."""
    device = next(target.parameters()).device
    draft = draft.to(device).eval()
    aux_ids = draft.cfg.eagle_config["eagle_aux_hidden_state_layer_ids"]
    embed_w = target.get_input_embeddings().weight
    head_w = target.get_output_embeddings().weight if draft.lm_head is None else None
    correct = torch.zeros(steps)
    chain = torch.zeros(steps)
    count = 0
    for start in range(0, len(samples), batch_size):
        batch = {k: v.to(device) for k, v in collate(samples[start : start + batch_size], pad_id).items()}
        aux, last = features(target, batch["input_ids"], batch["attention_mask"], aux_ids)
        t_logits = target_logits(target, last).float()
        embeds = F.embedding(batch["input_ids"], embed_w).float()
        hits = _position_hits(draft, aux.float(), embeds, t_logits, steps, head_w, vocab_map)
        # Positions whose step-1 label is an assistant token and whose step-K label is still in the sequence.
        n = max(hits.shape[1] + 1 - steps, 0)
        att = batch["attention_mask"]
        mask = (
            batch["loss_mask"][:, 2 : 2 + n] * att[:, 2 : 2 + n] * att[:, 1 + steps : 1 + steps + n]
        ).bool()
        hits = hits[:, :n][mask]  # (N, K)
        correct += hits.float().sum(0)
        chain += hits.long().cumprod(1).float().sum(0)
        count += hits.shape[0]
    n = max(count, 1)
    out = {"positions": count}
    out.update({f"acc_{k + 1}": round((correct[k] / n).item(), 5) for k in range(steps)})
    out.update({f"chain_{k + 1}": round((chain[k] / n).item(), 5) for k in range(steps)})
    out["accept_length_estimate"] = round(1 + (chain / n).sum().item(), 4)
    return out


def _position_hits(draft, aux, embeds, t_logits, steps, head_w, vocab_map) -> torch.Tensor:
    """(B, T-2, K) bool: draft step k at position i matches the target's top-1 (False past the sequence)."""
    b, t, _ = embeds.shape
    pos = torch.arange(t, device=embeds.device).expand(b, t)
    hidden, cache = draft.fc(aux), []
    hits = torch.zeros(b, max(t - 2, 0), steps, dtype=torch.bool, device=embeds.device)
    for k in range(steps):
        shifted = torch.zeros_like(embeds)
        if t - 1 - k > 0:
            shifted[:, : t - 1 - k] = embeds[:, 1 + k :]
        hidden = draft.step(hidden, shifted, pos + k, cache, k)
        n = t - 2 - k
        if n <= 0:
            break
        pred = draft.logits(hidden[:, :n], head_w).argmax(-1)
        if vocab_map is not None:
            pred = vocab_map.to(pred.device)[pred]
        hits[:, :n, k] = pred == t_logits[:, 1 + k : 1 + k + n].argmax(-1)
    return hits


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--draft", required=True, help="exported draft directory (config.json + model.safetensors)"
    )
    p.add_argument("--target-model-path", required=True)
    p.add_argument("--data-path", required=True)
    p.add_argument("--data-split", default="train")
    p.add_argument(
        "--holdout",
        type=int,
        default=None,
        help="evaluate the last N usable records (use the run's eval_holdout); default: all records",
    )
    p.add_argument("--max-records", type=int, default=None, help="as in training (the split must match)")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--output", help="also write the result as JSON here")
    a = p.parse_args(argv)

    from transformers import AutoTokenizer

    from nanospec.models import resolve
    from nanospec.train.data import load_samples
    from nanospec.train.export import load_draft
    from nanospec.train.target import load_target

    a.target_model_path = resolve(a.target_model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(a.target_model_path)
    samples, stats = load_samples(
        tokenizer, a.data_path, a.max_length, a.data_split, a.max_records, a.holdout or 0, "eval"
    )
    if not samples:
        raise SystemExit("no usable conversations to evaluate")
    target = load_target(a.target_model_path, getattr(torch, a.dtype), device)
    draft, vocab_map = load_draft(a.draft)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    result = evaluate(draft, target, samples, a.steps, vocab_map, a.batch_size, pad)
    result["conversations"] = len(samples)
    print(json.dumps(result, indent=2))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
