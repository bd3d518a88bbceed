"""Conversation data: ShareGPT-style records -> chat-template tokens with an assistant-only loss mask.

Accepted records: `{"conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}` or the same with
`role`/`content` (a `messages` key is accepted too). Sources: a local .json (one list; a truncated file yields
its complete records and a warning), .jsonl (optionally .gz), any other local file or directory `datasets`
reads, or a hub dataset id.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}

# Used only when the tokenizer ships no chat template (ChatML, as Qwen and SmolLM2 use).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Stats:
    """What loading and rendering kept and dropped, for the log."""

    records: int = 0
    truncated_file: bool = False
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        kept = self.records - sum(self.skipped.values())
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        return f"{kept} of {self.records} records kept; skipped: {why}"


def _open_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        try:
            return f.read()
        except EOFError:  # truncated gzip stream: use what decompressed
            log.warning("%s: gzip stream ends early", path)
            return ""


def _parse_json_list(text: str, source: str, stats: Stats) -> list:
    """A JSON list, or the complete leading records of a list cut off mid-way."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        pass
    else:
        if isinstance(data, dict):  # {"train": [...]} style
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise ValueError(f"{source}: a JSON object must hold exactly one list of records")
            data = lists[0]
        if not isinstance(data, list):
            raise ValueError(f"{source}: expected a JSON list of records, got {type(data).__name__}")
        return data
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if text[pos : pos + 1] != "[":
        raise ValueError(f"{source}: not valid JSON and not a JSON list")
    pos += 1
    records = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        records.append(obj)
    stats.truncated_file = True
    log.warning(
        "%s: JSON is truncated at byte %d of %d; using the %d complete records before the cut",
        source,
        pos,
        len(text),
        len(records),
    )
    return records


def _parse_jsonl(text: str, source: str, stats: Stats) -> list:
    records = []
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                stats.truncated_file = True
                log.warning("%s: last line is incomplete (truncated file); dropped", source)
            else:
                records.append(None)  # counted as malformed
    return records


def read_records(source: str, split: str = "train") -> tuple[list, Stats]:
    """Raw records from a local path or a hub dataset id (see module doc)."""
    stats = Stats()
    path = Path(source)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if path.is_file() and name.endswith(".json"):
        records = _parse_json_list(_open_text(path), source, stats)
    elif path.is_file() and name.endswith(".jsonl"):
        records = _parse_jsonl(_open_text(path), source, stats)
    else:
        import datasets

        if path.exists():
            if path.is_dir() and (path / "dataset_info.json").exists():
                ds = datasets.load_from_disk(str(path))
            else:
                ds = datasets.load_dataset(str(path), split=split)
        else:
            ds = datasets.load_dataset(source, split=split)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
        records = list(ds)
    stats.records = len(records)
    return records, stats


def normalize(record) -> tuple[list[dict] | None, str | None]:
    """One record -> ([{"role", "content"}], None) or (None, reason it is malformed)."""
    if not isinstance(record, dict):
        return None, "not an object"
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list) or not turns:
        return None, "no conversation list"
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None, "turn is not an object"
        role = turn.get("from", turn.get("role"))
        content = turn.get("value", turn.get("content"))
        if role not in ROLES:
            return None, "unknown role"
        if not isinstance(content, str):
            return None, "content is not a string"
        messages.append({"role": ROLES[role], "content": content})
    while messages and messages[0]["role"] == "assistant":  # the prompt of a leading reply is missing
        messages.pop(0)
    if not any(m["role"] == "assistant" for m in messages):
        return None, "no assistant turn"
    return messages, None


def render(tokenizer, messages: list[dict], max_length: int) -> tuple[list[int], list[int]] | None:
    """Chat-template tokens and a loss mask that is 1 exactly on assistant-written tokens.

    An assistant span runs from the end of the generation prompt to the end of the turn, including the
    end-of-turn token (the draft must predict it) but not the template's trailing whitespace. Returns None
    when the template renders a prefix of the conversation inconsistently (spans cannot be located).
    """

    def text_of(msgs, gen=False):
        return tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen, chat_template=tokenizer.chat_template or CHATML
        )

    full = text_of(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, through = text_of(messages[:i], gen=True), text_of(messages[: i + 1])
        if not (full.startswith(through) and through.startswith(start)):
            return None
        spans.append((len(start), len(through.rstrip())))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"][:max_length], enc["offset_mapping"][:max_length]
    mask = [int(any(a < e and b > s for s, e in spans)) for a, b in offsets]
    return ids, mask


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]


def load_samples(
    tokenizer,
    source: str,
    max_length: int,
    split: str = "train",
    max_records: int | None = None,
    holdout: int = 0,
    part: str = "train",
) -> tuple[list[Sample], Stats]:
    """Tokenized samples of one part ("train" or "eval") of a data source.

    The last `holdout` usable records are the eval part, so training and `train.evaluate` agree on the split
    without sharing state. `max_records` caps the raw records read (first ones).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("a fast tokenizer is required (character offsets locate assistant tokens)")
    records, stats = read_records(source, split)
    if max_records is not None:
        records = records[:max_records]
        stats.records = len(records)
    samples = []
    for rec in records:
        messages, why = normalize(rec)
        if messages is None:
            stats.skipped[why] += 1
            continue
        try:
            out = render(tokenizer, messages, max_length)
        except Exception as e:  # chat templates raise on conversations they reject (role order, ...)
            stats.skipped[f"template error ({type(e).__name__})"] += 1
            continue
        if out is None:
            stats.skipped["template renders prefixes inconsistently"] += 1
        elif sum(out[1][2:]) == 0:  # the first two tokens are never predicted by the draft
            stats.skipped["no assistant token within max_length"] += 1
        else:
            samples.append(Sample(*out))
    if holdout:
        if holdout >= len(samples):
            raise ValueError(f"holdout {holdout} leaves no training samples (only {len(samples)} usable)")
        samples = samples[-holdout:] if part == "eval" else samples[:-holdout]
    return samples, stats


def token_counts(samples: list[Sample], vocab_size: int) -> torch.Tensor:
    """(V,) int64 count of each token among loss-masked (assistant) tokens: what the draft must predict."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for s in samples:
        ids = torch.tensor([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m], dtype=torch.int64)
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def batch_indices(n: int, batch: int, step: int, seed: int) -> list[int]:
    """Sample indices of global batch `step`: epochs of seeded permutations, so the order is a pure function
    of (seed, step) and a resumed run sees exactly the batches an uninterrupted one would."""
    per_epoch = n // batch
    if per_epoch == 0:
        raise ValueError(f"global batch {batch} is larger than the dataset ({n} samples)")
    epoch, offset = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    return perm[offset * batch : (offset + 1) * batch].tolist()


def collate(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, T) input_ids, attention_mask and loss_mask."""
    t = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), t), pad_id, dtype=torch.long)
    att = torch.zeros((len(samples), t), dtype=torch.long)
    mask = torch.zeros((len(samples), t), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n], att[i, :n], mask[i, :n] = torch.tensor(s.input_ids), 1, torch.tensor(s.loss_mask)
    return {"input_ids": ids, "attention_mask": att, "loss_mask": mask}


def epochs_for(steps: int, n: int, batch: int) -> float:
    return steps / max(1, n // batch) if n else math.inf
