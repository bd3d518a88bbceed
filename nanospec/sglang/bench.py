"""Serving benchmark: AR, EAGLE3, EAGLE3 with a static top-N vocabulary and NANOSPEC, side by side.

Starts one SGLang server per system in turn on the same target and draft, sends the first turn of
each question (Spec-Bench / MT-bench jsonl: {"turns": [...]}) one at a time, greedy, and prints
output tokens/s, mean accept length, mean active vocabulary size and the mean draft step time
(SGLang's ``EagleDraftWorker.draft``, timed in the server with ``NANOSPEC_TIME_DRAFT=1``).

    python -m nanospec.sglang.bench --target TARGET --draft EAGLE3_DRAFT \
        --questions ../shared/data/mt_bench/question.jsonl --num-questions 8 --max-new-tokens 64
    # tiny random models with a 32k vocabulary (needs the repository's tests/support):
    python -m nanospec.sglang.bench --make-tiny /tmp/nanospec_tiny --vocab 32768 --hidden 512
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

CPU_ARGS = ["--device", "cpu", "--attention-backend", "intel_amx", "--disable-cuda-graph",
            "--max-running-requests", "4", "--max-total-tokens", "8192", "--mem-fraction-static", "0.3"]
TIMING_RE = re.compile(r"NANOSPEC timing: draft step ([0-9.]+) ms mean over (\d+) calls")


def load_questions(path: str, n: int) -> list[str]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                out.append(q["turns"][0] if "turns" in q else q["prompt"])
            if len(out) >= n:
                break
    return out


def static_topn_draft(draft: Path, out: Path, top_n: int, texts: list[str]) -> Path:
    """An FR-Spec-style copy of an EAGLE-3 draft whose head keeps only ``top_n`` tokens: the most
    frequent in ``texts`` (an optimistic choice: the benchmark's own prompts), then the lowest ids."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(draft)
    weights = load_file(str(draft / "model.safetensors"))
    head = weights["lm_head.weight"]
    counts = torch.zeros(head.shape[0], dtype=torch.long)
    for t in texts:
        ids = torch.tensor(tok(t)["input_ids"], dtype=torch.long)
        counts.index_add_(0, ids[ids < head.shape[0]], torch.ones_like(ids[ids < head.shape[0]]))
    order = sorted(range(head.shape[0]), key=lambda i: (-int(counts[i]), i))
    hot = torch.tensor(sorted(order[:top_n]), dtype=torch.long)
    out.mkdir(parents=True, exist_ok=True)
    for f in draft.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, out / f.name)
    weights["lm_head.weight"] = head[hot].contiguous()
    weights["d2t"] = hot - torch.arange(top_n)
    save_file(weights, str(out / "model.safetensors"))
    cfg = json.loads((draft / "config.json").read_text())
    cfg["draft_vocab_size"] = top_n
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


class Server:
    def __init__(self, target: Path, args: list[str], env: dict, log: Path):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(target), "--host",
               "127.0.0.1", "--port", str(self.port), "--skip-server-warmup", *args]
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **env}, start_new_session=True)
        deadline = time.time() + 900
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited; see {log}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5)
                return
            except OSError:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"server did not start; see {log}")

    def generate(self, text: str, n: int) -> dict:
        body = json.dumps({"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                             "ignore_eos": True}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=900).read())

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def run_system(name, target, args, env, questions, max_new, log_dir) -> dict:
    srv = Server(target, args, env, log_dir / f"{name}.log")
    try:
        srv.generate("warm up", 4)
        tokens, t0, accept, active = 0, time.perf_counter(), [], []
        for q in questions:
            r = srv.generate(q, max_new)
            m = r["meta_info"]
            tokens += m["completion_tokens"]
            if "spec_accept_length" in m:
                accept.append(m["spec_accept_length"])
            if "nanospec_mean_active_vocab" in m:
                active.append(m["nanospec_mean_active_vocab"])
        elapsed = time.perf_counter() - t0
    finally:
        srv.stop()
    timing = TIMING_RE.findall((log_dir / f"{name}.log").read_text(errors="replace"))
    return {"system": name, "tok_s": tokens / elapsed,
            "accept": sum(accept) / len(accept) if accept else 1.0,
            "active": sum(active) / len(active) if active else None,
            "draft_ms": float(timing[-1][0]) if timing else None}


def make_tiny(root: Path, vocab: int, hidden: int) -> tuple[Path, Path]:
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo))
    try:
        from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama
    except ImportError as e:
        raise SystemExit(f"--make-tiny needs the repository checkout (tests/support): {e}") from e
    target = make_tiny_llama(root / "target", vocab_size=vocab, hidden=hidden, heads=8, kv_heads=4,
                             intermediate=2 * hidden)
    return target, make_tiny_eagle3_draft(root / "draft", target)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--make-tiny", type=Path, help="build tiny random target + EAGLE-3 draft here")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of the --make-tiny models")
    ap.add_argument("--questions", default="../shared/data/mt_bench/question.jsonl")
    ap.add_argument("--num-questions", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--static-top-n", type=int, default=2048)
    ap.add_argument("--systems", default="ar,eagle3,eagle3-static,nanospec")
    ap.add_argument("--log-dir", type=Path, default=Path("bench_serve_logs"))
    ap.add_argument("--cpu", action=argparse.BooleanOptionalAction, default=not torch.cuda.is_available())
    ap.add_argument("--extra-args", default="--dtype float32", help="more sglang.launch_server arguments")
    a = ap.parse_args(argv)
    if a.make_tiny:
        a.target, a.draft = make_tiny(a.make_tiny, a.vocab, a.hidden)
    if a.target is None or a.draft is None:
        ap.error("give --target and --draft, or --make-tiny DIR")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    questions = load_questions(a.questions, a.num_questions)
    base = (CPU_ARGS if a.cpu else []) + a.extra_args.split()
    spec = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]
    timed = {"NANOSPEC_TIME_DRAFT": "1"}
    systems = {
        "ar": (base, {}),
        "eagle3": (base + spec + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                  str(a.draft)], timed),
        "eagle3-static": None,
        "nanospec": (base + spec + ["--speculative-algorithm", "NANOSPEC", "--speculative-draft-model-path",
                                    str(a.draft)], timed),
    }
    rows = []
    for name in a.systems.split(","):
        if name == "eagle3-static":
            static = static_topn_draft(Path(a.draft), a.log_dir / f"draft_top{a.static_top_n}",
                                       a.static_top_n, questions)
            args, env = base + spec + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                       str(static)], timed
        else:
            args, env = systems[name]
        print(f"running {name} ...", flush=True)
        rows.append(run_system(name, a.target, args, env, questions, a.max_new_tokens, a.log_dir))
    ref = next((r["draft_ms"] for r in rows if r["system"] == "eagle3" and r["draft_ms"]), None)
    print(f"\n{'system':<15}{'tok/s':>9}{'accept':>9}{'active V':>10}{'draft ms':>10}{'vs EAGLE3':>11}")
    for r in rows:
        active = f"{r['active']:.0f}" if r["active"] is not None else "-"
        draft = f"{r['draft_ms']:.2f}" if r["draft_ms"] is not None else "-"
        ratio = f"{ref / r['draft_ms']:.2f}x" if ref and r["draft_ms"] else "-"
        print(f"{r['system']:<15}{r['tok_s']:>9.1f}{r['accept']:>9.2f}{active:>10}{draft:>10}{ratio:>11}")


if __name__ == "__main__":
    main()
