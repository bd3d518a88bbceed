"""Where an EAGLE3 decode cycle goes on the CPU: fallback sgl_kernel ops vs the model forward passes.

Any directory (it builds the tiny models with ``nanospec.testing``)::

    .venv/bin/python -m nanospec.cpu.bench                         # tiny random Llama + EAGLE-3 draft
    .venv/bin/python -m nanospec.cpu.bench --real ~/.cache/nanospec/models/smollm2-135m

For each model it starts a real SGLang server (``--device cpu``, EAGLE3) with
``NANOSPEC_PROFILE_OPS`` set (nanospec/cpu/profiling.py), decodes ``--batch`` concurrent prompts of
``--tokens`` tokens, and reads back per-process totals: ``cycle`` (EAGLEWorkerV2.forward_batch_generation),
``forward`` (every ModelRunner.forward, target and draft; includes the attention ops) and each fallback
op. The report splits a cycle into: fallback ops (attention and the rest), model forward without the
attention ops, and SGLang's own remaining work. ``--real`` takes any Llama-architecture checkpoint
directory; it gets a random EAGLE-3 draft (acceptance is then ~0, which does not change the costs of
one cycle). A real model for this is fetched with ``python -m nanospec.models get smollm2-135m``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nanospec.testing import SGLangServer, make_tiny_eagle3_draft, make_tiny_llama

ATTENTION_OPS = ("op:decode_attention_cpu", "op:extend_attention_cpu")


def profile(target: Path, draft: Path, work: Path, args) -> dict:
    """Serve ``target`` with EAGLE3 + ``draft`` under the profiler; return summed totals over processes."""
    prof_dir = work / "profile"
    server_args = [
        "--dtype", args.dtype,
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(args.steps),
        "--speculative-eagle-topk", str(args.topk),
        "--speculative-num-draft-tokens", str(args.draft_tokens),
    ]  # fmt: skip
    env = {"NANOSPEC_PROFILE_OPS": str(prof_dir)}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    params = {"temperature": 0.0, "max_new_tokens": args.tokens, "ignore_eos": True}
    prompts = [[11 + 7 * i, 23 + i, 5 + 3 * i] for i in range(args.batch)]

    def run(max_new: int) -> list:
        sp = {**params, "max_new_tokens": max_new}
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p: srv.post("/generate", {"input_ids": p, "sampling_params": sp}),
                                 prompts))  # fmt: skip

    with SGLangServer(target, args=server_args, env=env, log_path=work / "server.log") as srv:
        # Warm-up at the measured batch size: SGLang torch.compiles its draft top-k selection
        # (srt/speculative/spec_utils.py) and recompiles when the batch size changes from 1.
        run(16)
        time.sleep(1.0)
        before = _read(prof_dir)
        t0 = time.perf_counter()
        res = run(args.tokens)
        wall = time.perf_counter() - t0
        time.sleep(1.5)  # let the profiler flush
        after = _read(prof_dir)
    totals = {k: {"seconds": after[k]["seconds"] - before.get(k, {}).get("seconds", 0.0),
                  "calls": after[k]["calls"] - before.get(k, {}).get("calls", 0)} for k in after}  # fmt: skip
    accept = sum(r["meta_info"].get("spec_accept_length", 0.0) for r in res) / len(res)
    return {"totals": totals, "wall": wall, "accept_length": accept, "tokens": args.tokens * len(prompts)}


def _read(prof_dir: Path) -> dict:
    out: dict = {}
    for f in prof_dir.glob("*.json"):
        for k, v in json.loads(f.read_text()).items():
            s = out.setdefault(k, {"seconds": 0.0, "calls": 0})
            s["seconds"] += v["seconds"]
            s["calls"] += v["calls"]
    return out


def report(name: str, r: dict) -> dict:
    t = r["totals"]
    cycle = t.get("cycle", {"seconds": 0.0, "calls": 0})
    n = max(cycle["calls"], 1)
    ops = {k: v for k, v in t.items() if k.startswith("op:")}
    ops_s = sum(v["seconds"] for v in ops.values())
    attn_s = sum(ops[k]["seconds"] for k in ATTENTION_OPS if k in ops)
    fwd_s = t.get("forward", {"seconds": 0.0})["seconds"]
    cyc_s = cycle["seconds"] or 1e-9
    summary = {
        "model": name,
        "cycles": cycle["calls"],
        "cycle_ms": 1000 * cyc_s / n,
        "fallback_ops_share": ops_s / cyc_s,
        "fallback_attention_share": attn_s / cyc_s,
        "fallback_other_ops_share": (ops_s - attn_s) / cyc_s,
        "forward_without_fallback_attention_share": (fwd_s - attn_s) / cyc_s,
        "sglang_rest_share": (cyc_s - fwd_s - (ops_s - attn_s)) / cyc_s,
        "accept_length": r["accept_length"],
        "tokens_per_s": r["tokens"] / r["wall"],
    }
    print(f"\n== {name}: {summary['cycles']} EAGLE3 cycles, {summary['cycle_ms']:.2f} ms/cycle, "
          f"accept length {summary['accept_length']:.2f}, {summary['tokens_per_s']:.1f} tok/s")  # fmt: skip
    print(f"   fallback ops (all)           {100 * summary['fallback_ops_share']:6.1f} % of a cycle")
    print(f"     attention (decode/extend)  {100 * summary['fallback_attention_share']:6.1f} %")
    print(f"     tree / verify / KV slots   {100 * summary['fallback_other_ops_share']:6.1f} %")
    fwd = summary["forward_without_fallback_attention_share"]
    print(f"   model forward, rest          {100 * fwd:6.1f} %")
    print(f"   SGLang scheduling, sampling  {100 * summary['sglang_rest_share']:6.1f} %")
    for k, v in sorted(ops.items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"     {k[3:]:40s} {1000 * v['seconds'] / n:8.3f} ms/cycle  {v['calls'] / n:5.1f} calls/cycle")
    return summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--real", type=Path, help="a real (small) Llama-architecture checkpoint directory")
    p.add_argument("--skip-tiny", action="store_true", help="only the --real model")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the server (default: 1)")
    p.add_argument("--json", type=Path, help="also write the summaries here")
    args = p.parse_args(argv)
    summaries = []
    with tempfile.TemporaryDirectory(prefix="nanospec_bench_") as tmp:
        work = Path(tmp)
        if not args.skip_tiny:
            target = make_tiny_llama(work / "tiny", vocab_size=512, seed=1)
            draft = make_tiny_eagle3_draft(work / "tiny_draft", target, seed=2)
            (work / "run_tiny").mkdir()
            summaries.append(report("tiny random Llama (64 hidden, 3 layers)",
                                    profile(target, draft, work / "run_tiny", args)))  # fmt: skip
        if args.real:
            draft = make_tiny_eagle3_draft(work / "real_draft", args.real, seed=2)
            (work / "run_real").mkdir()
            summaries.append(report(str(args.real), profile(args.real, draft, work / "run_real", args)))
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2))


if __name__ == "__main__":
    main()
