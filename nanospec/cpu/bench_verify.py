"""What a decode step and a target-verify cost on the CPU, old linear path against the new one.

Run with the NanoSpec environment (it builds random EAGLE-3 drafts with ``nanospec.testing``)::

    .venv/bin/python -m nanospec.cpu.bench_verify --model ~/.cache/nanospec/models/smollm2-135m \\
        --model ~/.cache/nanospec/models/qwen2.5-coder-0.5b

For each model and each ``NANOSPEC_CPU_LINEAR`` back end (``mkl``: SGLang's own ``F.linear`` and
``torch.matmul``; ``onednn``: prepacked weights, nanospec/cpu/ops_linear.py) it starts three real SGLang
servers in turn, ``--device cpu``, float32, one request at a time: plain decoding (the target's
DECODE forward), and EAGLE3 with a chain of 4 and of 8 draft tokens (the target's TARGET_VERIFY
forward over 4 and 8 tokens). The target's forward passes are timed inside the server
(``NANOSPEC_PROFILE_OPS``, nanospec/cpu/profiling.py); each of ``--repeats`` generations gives one mean
per forward, and the table shows min / median over them, the verify / decode ratios and the decode
speed-up of ``onednn`` over ``mkl``. The drafts are random (acceptance ~1), which does not change what
one verify costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from nanospec.bench.server import Server
from nanospec.cpu.bench import _read
from nanospec.testing import make_tiny_eagle3_draft

BACKENDS = ("mkl", "onednn")
# (label, extra server arguments, forward timed)
RUNS = (
    ("decode", [], "forward:target:DECODE"),
    ("verify4", ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"],
     "forward:target:TARGET_VERIFY"),
    ("verify8", ["--speculative-num-steps", "7", "--speculative-num-draft-tokens", "8"],
     "forward:target:TARGET_VERIFY"),
)


def measure(model: Path, draft: Path, backend: str, label: str, extra: list[str], key: str, work: Path,
            args) -> list[float]:
    """Mean ms of the ``key`` forward in each of ``args.repeats`` generations of one server."""
    prof = work / f"prof_{backend}_{label}"
    server_args = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4",
                   "--skip-server-warmup"]
    if extra:
        server_args += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
                        "--speculative-eagle-topk", "1", *extra]
    env = {"NANOSPEC_PROFILE_OPS": str(prof), "NANOSPEC_CPU_LINEAR": backend,
           "OMP_NUM_THREADS": str(args.threads)}
    prompt = [(17 + 31 * i) % 1000 + 10 for i in range(args.prompt_tokens)]
    means = []
    with Server(model, server_args, env, work / f"{backend}_{label}.log") as srv:
        srv.generate(prompt, 8, ignore_eos=True)
        for _ in range(args.repeats):
            time.sleep(1.0)  # the profiler flushes twice a second
            before = _read(prof).get(key, {"seconds": 0.0, "calls": 0})
            srv.generate(prompt, args.tokens, ignore_eos=True)
            time.sleep(1.5)
            after = _read(prof)[key]
            calls = after["calls"] - before["calls"]
            means.append(1000 * (after["seconds"] - before["seconds"]) / max(calls, 1))
    return means


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, action="append", required=True, help="a Llama/Qwen2 checkpoint dir")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--runs", default=",".join(r[0] for r in RUNS), help="subset of decode,verify4,verify8")
    p.add_argument("--tokens", type=int, default=24, help="new tokens per timed generation")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the servers")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="nanospec_bench_verify_") as tmp:
        work = Path(tmp)
        for m, model in enumerate(args.model):
            draft = make_tiny_eagle3_draft(work / f"draft{m}", model, seed=2)
            for backend in args.backends.split(","):
                row = {"model": model.name, "backend": backend}
                for label, extra, key in (r for r in RUNS if r[0] in args.runs.split(",")):
                    ms = measure(model, draft, backend, label, extra, key, work, args)
                    row[label] = {"min": min(ms), "median": statistics.median(ms), "runs": ms}
                    print(f"{model.name} {backend} {label}: min {min(ms):.2f} ms, median "
                          f"{statistics.median(ms):.2f} ms", flush=True)
                results.append(row)
    print("\n| model | linear | decode ms | verify 4 ms | verify 8 ms | v4 / decode | v8 / decode |")
    print("|---|---|---|---|---|---|---|")
    for r in (r for r in results if all(k in r for k in ("decode", "verify4", "verify8"))):
        d, v4, v8 = (r[k]["median"] for k in ("decode", "verify4", "verify8"))
        print(f"| {r['model']} | {r['backend']} | {d:.2f} | {v4:.2f} | {v8:.2f} | {v4 / d:.2f} "
              f"| {v8 / d:.2f} |")
    for model in {r["model"] for r in results}:
        by = {r["backend"]: r for r in results if r["model"] == model}
        if set(BACKENDS) <= set(by) and all("decode" in r for r in by.values()):
            speed = by["mkl"]["decode"]["median"] / by["onednn"]["decode"]["median"]
            print(f"{model}: decode step onednn vs mkl {speed:.2f}x faster")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
