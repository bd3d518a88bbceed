"""What a decode step and a target-verify cost on the CPU, SGLang's own path against NanoSpec's.

Run with the NanoSpec environment (it builds random EAGLE-3 drafts with ``nanospec.testing``)::

    .venv/bin/python -m nanospec.cpu.bench_verify --model ~/.cache/nanospec/models/smollm2-135m \\
        --model ~/.cache/nanospec/models/qwen2.5-coder-0.5b

Paths (``--paths``): ``old`` is SGLang's own float32 CPU path (``NANOSPEC_CPU_LINEAR=mkl``: ``F.linear`` and
``torch.matmul``; ``NANOSPEC_CPU_LAYERS=sglang``: its RMSNorm and rotary ``forward_native``, and the
fallback's general padded attention on all threads), ``linear`` only the prepacked oneDNN linear layers
(nanospec/cpu/ops_linear.py), ``onednn`` that with nanospec/cpu/ops_layers.py and the one-request attention
paths of nanospec/cpu/ops_attention.py, ``gemv`` those with linear layers on NanoSpec's kernel
(nanospec/cpu/gemv.py; ``NANOSPEC_CPU_ATTENTION=torch``), ``new`` the defaults (that, with
decode and verify attention in NanoSpec's kernel, nanospec/cpu/attention.c, which also stores the new K/V
of a verify). Runs: plain decoding (the target's DECODE
forward) and EAGLE3 with a chain of 4 and of 8 draft tokens (the target's TARGET_VERIFY forward over 4 and
8 tokens), each one real SGLang server, ``--device cpu``, float32.

The servers of one path (one per run) are up side by side and take turns, one generation each, for
``--repeats`` rounds, so that a verify and the decode step it is divided by are measured minutes apart at
most, not in separate runs: the project's hosts drift by a third within seconds. They run with
``--sleep-on-idle`` (an idle SGLang scheduler otherwise spins on a core; with it, it polls its socket).
The decode servers of all paths then take turns the same way, for the speed-up over the first path
(``old`` by default). The target's forward passes are timed inside the servers (``NANOSPEC_PROFILE_OPS``,
nanospec/cpu/profiling.py); each generation gives one mean per forward, and the table shows min / median
over them, the verify / decode ratios and the decode speed-up of each path over the first. The drafts are
random (acceptance ~1), which does not change what one verify costs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from nanospec.bench.server import Server
from nanospec.cpu import ops_attention, ops_layers, ops_linear
from nanospec.cpu.bench import _read
from nanospec.testing import make_tiny_eagle3_draft

_TORCH = {ops_attention.ENV: "torch"}
PATHS = {
    "old": {ops_linear.ENV: "mkl", ops_layers.ENV: "sglang", **_TORCH},
    "linear": {ops_linear.ENV: "onednn", ops_layers.ENV: "sglang", **_TORCH},
    "onednn": {ops_linear.ENV: "onednn", ops_layers.ENV: "fused", **_TORCH},
    "gemv": {ops_linear.ENV: "gemv", ops_layers.ENV: "fused", **_TORCH},
    "new": {ops_linear.ENV: "gemv", ops_layers.ENV: "fused", ops_attention.ENV: "native"},
}
# (label, extra server arguments, forward timed)
RUNS = (
    ("decode", [], "forward:target:DECODE"),
    ("verify4", ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"],
     "forward:target:TARGET_VERIFY"),
    ("verify8", ["--speculative-num-steps", "7", "--speculative-num-draft-tokens", "8"],
     "forward:target:TARGET_VERIFY"),
)


def measure(model: Path, draft: Path, servers: list[tuple[str, str]], work: Path, args) -> dict:
    """{(path, run): mean ms of the run's timed forward in each of ``args.repeats`` generations}: one server
    per (path, run), all up at once, one generation each in turn per round."""
    prompt = [(17 + 31 * i) % 1000 + 10 for i in range(args.prompt_tokens)]
    runs = {label: (extra, key) for label, extra, key in RUNS}
    means: dict[tuple[str, str], list[float]] = {s: [] for s in servers}
    with contextlib.ExitStack() as stack:
        live = {}
        for path, label in servers:
            extra, key = runs[label]
            server_args = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4",
                           "--max-total-tokens", "4096", "--skip-server-warmup", "--sleep-on-idle"]
            if extra:
                server_args += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                str(draft), "--speculative-eagle-topk", "1", *extra]
            prof = Path(tempfile.mkdtemp(prefix=f"prof_{path}_{label}_", dir=work))  # a decode runs twice
            env = {"NANOSPEC_PROFILE_OPS": str(prof), **PATHS[path], "OMP_NUM_THREADS": str(args.threads)}
            srv = stack.enter_context(Server(model, server_args, env, work / f"{prof.name}.log"))
            srv.generate(prompt, 8, ignore_eos=True)
            live[path, label] = (srv, prof, key)
        for _ in range(args.repeats):
            for name, (srv, prof, key) in live.items():
                time.sleep(1.0)  # the profiler flushes twice a second
                before = _read(prof).get(key, {"seconds": 0.0, "calls": 0})
                srv.generate(prompt, args.tokens, ignore_eos=True)
                time.sleep(1.5)
                after = _read(prof)[key]
                calls = after["calls"] - before["calls"]
                means[name].append(1000 * (after["seconds"] - before["seconds"]) / max(calls, 1))
    return means


def _stats(ms: list[float]) -> dict:
    return {"min": min(ms), "median": statistics.median(ms), "runs": ms}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, action="append", required=True, help="a Llama/Qwen2 checkpoint dir")
    p.add_argument("--paths", default="old,new", help=f"subset of {','.join(PATHS)}")
    p.add_argument("--runs", default=",".join(r[0] for r in RUNS), help="subset of decode,verify4,verify8")
    p.add_argument("--tokens", type=int, default=24, help="new tokens per timed generation")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the servers")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    bad = [x for x in paths if x not in PATHS]
    if bad or not paths:
        p.error(f"--paths: unknown {bad}, choose from {list(PATHS)}")
    labels = [r[0] for r in RUNS if r[0] in args.runs.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="nanospec_bench_verify_") as tmp:
        work = Path(tmp)
        for m, model in enumerate(args.model):
            draft = make_tiny_eagle3_draft(work / f"draft{m}", model, seed=2)
            rows = {path: {"model": model.name, "path": path} for path in paths}
            for path in paths:  # the ratios: this path's runs side by side
                for (_, label), ms in measure(model, draft, [(path, x) for x in labels], work, args).items():
                    rows[path][label] = _stats(ms)
                    print(f"{model.name} {path} {label}: min {min(ms):.2f} ms, median "
                          f"{statistics.median(ms):.2f} ms", flush=True)
            if "decode" in labels and len(paths) > 1:  # the speed-up: decodes side by side
                decodes = measure(model, draft, [(p, "decode") for p in paths], work, args)
                for (path, _), ms in decodes.items():
                    rows[path]["decode_vs_paths"] = _stats(ms)
                    print(f"{model.name} {path} decode (beside the other paths'): min {min(ms):.2f} ms, "
                          f"median {statistics.median(ms):.2f} ms", flush=True)
            results += rows.values()
    print("\n| model | path | decode ms | verify 4 ms | verify 8 ms | v4 / decode | v8 / decode |")
    print("|---|---|---|---|---|---|---|")
    for r in (r for r in results if all(k in r for k in ("decode", "verify4", "verify8"))):
        d, v4, v8 = (r[k]["median"] for k in ("decode", "verify4", "verify8"))
        print(f"| {r['model']} | {r['path']} | {d:.2f} | {v4:.2f} | {v8:.2f} | {v4 / d:.2f} "
              f"| {v8 / d:.2f} |")
    for r in results:
        base = next((o for o in results if o["model"] == r["model"] and o["path"] == paths[0]), None)
        if r["path"] != paths[0] and base is not None and "decode_vs_paths" in r:
            speed = base["decode_vs_paths"]["median"] / r["decode_vs_paths"]["median"]
            print(f"{r['model']}: decode step {r['path']} vs {paths[0]} {speed:.2f}x faster "
                  "(medians, side by side)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
