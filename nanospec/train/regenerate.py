"""python -m nanospec.train.regenerate: training data written by the target itself.

EAGLE trains its drafts on the target's own answers: at serving time the draft continues text the target
wrote, which is far more predictable to it than a human's or another model's reply. This reads a chat
dataset (anything `nanospec.train.data.read_records` reads), renders each conversation's first user turn
(with a leading system turn, if any) as a generation prompt, lets the target answer it greedily through a
batched SGLang server, and writes one pre-tokenized record per answer:

    {"input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer), "source": i}

(`source` is the record's index in the input). The answer keeps its end-of-turn token when the target
stopped by itself. `python -m nanospec.train --data-path OUT.jsonl` trains on it like any other data.

    python -m nanospec.train.regenerate --target-model-path smollm2-135m \
        --data-path sharegpt.json.gz --output runs/regen/smollm2.jsonl --max-records 4000 \
        --max-length 256 --max-minutes 30

The output is appended to and a rerun skips the records already answered, so `--max-minutes` bounds one
part and the next call continues. A server is started for the run (CPU: float32, SGLang's CPU backend)
unless `--url` names a running one.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nanospec.train.data import chat_text, normalize, read_records


def prompt_messages(messages: list[dict]) -> list[dict] | None:
    """The messages before the first assistant turn, if they end with a user turn (else None)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    head = messages[:first]
    return head if head and head[-1]["role"] == "user" else None


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template tokens of `messages` followed by the generation prompt."""
    return tokenizer(chat_text(tokenizer, messages, True), add_special_tokens=False)["input_ids"]


def prompts(tokenizer, source: str, max_records: int | None, max_prompt: int) -> tuple[list, dict]:
    """[(record index, prompt ids)] of the usable records and {reason: count} of the skipped ones."""
    records, _ = read_records(source)
    records = records[:max_records] if max_records is not None else records
    out, skipped = [], {}
    for i, rec in enumerate(records):
        messages, why = normalize(rec)
        head = prompt_messages(messages) if messages is not None else None
        if messages is not None and head is None:
            why = "no user turn before the first reply"
        ids = prompt_ids(tokenizer, head) if head is not None else None
        if ids is not None and len(ids) > max_prompt:
            ids, why = None, f"prompt longer than {max_prompt} tokens"
        if ids is None:
            skipped[why] = skipped.get(why, 0) + 1
        else:
            out.append((i, ids))
    return out, skipped


def done_sources(path: Path) -> set[int]:
    """Record indices already answered in `path` (a cut last line, from a killed run, is dropped)."""
    if not path.exists():
        return set()
    text = path.read_text()
    done, lines = set(), text.splitlines()
    for n, line in enumerate(lines):
        try:
            done.add(int(json.loads(line)["source"]))
        except (ValueError, KeyError, TypeError):
            if n != len(lines) - 1:
                raise ValueError(f"{path}: line {n + 1} is not a regenerated record") from None
    if lines and not text.endswith("\n"):  # the cut line is rewritten
        path.write_text("\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else ""))
    return done


def answer(post, batch: list[tuple[int, list[int]]], max_length: int) -> list[dict]:
    """Greedy answers to one batch of prompts through SGLang's /generate (a list of prompts per call)."""
    payload = {"input_ids": [ids for _, ids in batch],
               "sampling_params": [{"temperature": 0.0, "max_new_tokens": max_length - len(ids)}
                                   for _, ids in batch]}
    outs = post("/generate", payload)
    records = []
    for (src, ids), out in zip(batch, outs, strict=True):
        new = list(out["output_ids"])
        stop = (out.get("meta_info") or {}).get("finish_reason") or {}
        matched = stop.get("matched") if stop.get("type") == "stop" else None
        if isinstance(matched, int) and new[-1:] != [matched]:
            new.append(matched)  # the end-of-turn token: the draft must learn to propose it too
        new = new[: max_length - len(ids)]
        if new:
            records.append({"input_ids": ids + new, "loss_mask": [0] * len(ids) + [1] * len(new),
                            "source": src})
    return records


def cpu_server_args(concurrency: int, max_length: int) -> list[str]:
    return ["--device", "cpu", "--dtype", "float32", "--attention-backend", "intel_amx",
            "--skip-server-warmup", "--max-running-requests", str(concurrency),
            "--max-total-tokens", str(concurrency * max_length + 1024)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-model-path", required=True, help="local directory, hub id or model-zoo name")
    ap.add_argument("--data-path", required=True, help="chat records (ShareGPT, role/content, ...)")
    ap.add_argument("--output", required=True, type=Path, help="JSONL to append the records to")
    ap.add_argument("--max-records", type=int, default=None, help="read only the first N raw records")
    ap.add_argument("--max-length", type=int, default=256, help="prompt + answer tokens")
    ap.add_argument("--min-answer", type=int, default=32, help="skip prompts leaving fewer answer tokens")
    ap.add_argument("--concurrency", type=int, default=16, help="prompts in flight")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time")
    ap.add_argument("--url", default=None, help="a running SGLang server (default: start one)")
    ap.add_argument("--server-args", default="", help="more sglang.launch_server arguments")
    a = ap.parse_args(argv)
    if a.max_length <= a.min_answer or a.min_answer < 1 or a.concurrency < 1:
        ap.error("need --max-length > --min-answer >= 1 and --concurrency >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from transformers import AutoTokenizer

    from nanospec.bench.server import Server
    from nanospec.models import resolve

    t0 = time.monotonic()
    # A SIGTERM (kill, timeout) must still stop the server it started: run the `finally` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    target = str(resolve(a.target_model_path))
    tokenizer = AutoTokenizer.from_pretrained(target)
    todo, skipped = prompts(tokenizer, a.data_path, a.max_records, a.max_length - a.min_answer)
    a.output.parent.mkdir(parents=True, exist_ok=True)
    done = done_sources(a.output)
    todo = [(i, ids) for i, ids in todo if i not in done]
    print(f"regenerate: {len(todo)} prompts to answer, {len(done)} already in {a.output}, skipped {skipped}",
          flush=True)
    server = None
    if a.url is None:
        server = Server(target, cpu_server_args(a.concurrency, a.max_length) + a.server_args.split(),
                        log_path=a.output.with_suffix(".server.log")).start()
    client = server
    if client is None:  # only its requests are used: nothing is started or stopped
        client = Server(target)
        client.base_url = a.url.rstrip("/")

    def post(path: str, payload: dict):  # a batch of long answers can take many minutes on a CPU
        return client.post(path, payload, timeout=6 * 3600)

    written = tokens = 0
    # Batches of `concurrency` prompts, two in flight, so the server never waits for the client; when
    # time is up no new batch is sent and the ones in flight are still written.
    batches = [todo[k:k + a.concurrency] for k in range(0, len(todo), a.concurrency)]
    try:
        with ThreadPoolExecutor(2) as pool, a.output.open("a") as f:
            pending = [pool.submit(answer, post, b, a.max_length) for b in batches[:2]]
            nxt, out_of_time = 2, False
            while pending:
                for r in pending.pop(0).result():
                    f.write(json.dumps(r) + "\n")
                    written, tokens = written + 1, tokens + sum(r["loss_mask"])
                f.flush()
                minutes = (time.monotonic() - t0) / 60
                print(f"regenerate: {written} records, {tokens} answer tokens, {minutes:.1f} min", flush=True)
                out_of_time = out_of_time or (a.max_minutes is not None and minutes >= a.max_minutes)
                if nxt < len(batches) and not out_of_time:
                    pending.append(pool.submit(answer, post, batches[nxt], a.max_length))
                    nxt += 1
            if out_of_time and nxt < len(batches):
                print("regenerate: --max-minutes reached; rerun to continue", flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
