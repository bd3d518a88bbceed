"""py-spy the scheduler of an AR server and of a NANOSPEC server on the same prompts, one server at a
time, both up (``--sleep-on-idle``), ``--reps`` rounds. Writes <out>/<method>_<rep>.txt (py-spy raw
samples, 200 a second) and <out>/res.json ({run: [tokens, wall seconds, tok/s]}); parts.py reads them.
``--counters``: no py-spy; prints the scheduler's page faults, CPU time and context switches per generated
token instead, from /proc/<pid>/stat and /proc/<pid>/status read before and after each round
(docs/results/cpu_costs/plain_cycle_faults).

    .venv/bin/python docs/results/cpu_costs/cycle_spy/spy.py --target smollm2-135m \\
        --draft runs/quick_smol/final --pin-steps 0 --out runs/spy
"""
import argparse
import json
import subprocess
import time
from pathlib import Path

from transformers import AutoTokenizer

from nanospec.bench import specbench as sb
from nanospec.data import load_questions
from nanospec.models import resolve

ap = argparse.ArgumentParser()
ap.add_argument("--target", required=True)
ap.add_argument("--draft", type=Path, required=True)
ap.add_argument("--pin-steps", type=int, help="NANOSPEC's controller pinned at this step count")
ap.add_argument("--spec", default="3/1/4", help="steps/topk/draft tokens")
ap.add_argument("--fixed", action="store_true", help="NANOSPEC_STEPS=fixed (the whole chain every cycle)")
ap.add_argument("--server-args", default="")
ap.add_argument("--questions", default="../shared/data/mt_bench/question.jsonl")
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--counters", action="store_true", help="read /proc counters per token instead of py-spy")
ap.add_argument("--out", type=Path, required=True)
a = ap.parse_args()
a.out.mkdir(parents=True, exist_ok=True)
target = resolve(a.target)
tok = AutoTokenizer.from_pretrained(target)
qs = load_questions(Path(a.questions), per_category=1)
steps, topk, tokens = a.spec.split("/")
spec = ["--speculative-num-steps", steps, "--speculative-eagle-topk", topk, "--speculative-num-draft-tokens", tokens]
methods = sb.make_methods(["ar", "nanospec"], a.draft, None, spec)
if a.pin_steps is not None:
    pin = a.out / "pin.json"
    pin.write_text(json.dumps({"1": {"candidate_steps": [a.pin_steps]}}))
    methods[1].args += ["--speculative-adaptive-config", str(pin)]
if a.fixed:
    methods[1].env["NANOSPEC_STEPS"] = "fixed"
base = sb.base_server_args("cpu", "float32", a.server_args) + ["--sleep-on-idle"]
servers = {m.name: sb.start_server(m, target, base, {}, tok, qs, a.out)[0] for m in methods}


def scheduler_pid(srv) -> int:
    kids = subprocess.run(["pgrep", "-P", str(srv.process.pid)], capture_output=True, text=True).stdout.split()
    for k in kids:
        if "scheduler" in Path(f"/proc/{k}/comm").read_text() + Path(f"/proc/{k}/cmdline").read_text():
            return int(k)
    return int(kids[0])


def counters(pid: int) -> dict:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    st = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return {"minflt": int(f[7]), "majflt": int(f[9]),
            "utime_ms": int(f[11]) * 10, "stime_ms": int(f[12]) * 10,
            "vcsw": int(st["voluntary_ctxt_switches"]), "ivcsw": int(st["nonvoluntary_ctxt_switches"]),
            "rss_mb": int(st["VmRSS"].split()[0]) // 1024}


res = {}
try:
    for rep in range(a.reps):
        for name, srv in servers.items():
            pid = scheduler_pid(srv)
            if a.counters:
                spy, before = None, counters(pid)
            else:
                spy = subprocess.Popen([".venv/bin/py-spy", "record", "-p", str(pid), "-r", "200",
                                        "-f", "raw", "-o", str(a.out / f"{name}_{rep}.txt"), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            t0, n = time.perf_counter(), 0
            for q in qs:
                n += srv.generate(sb.render(tok, q["turns"], []), a.max_new_tokens)["meta_info"]["completion_tokens"]
            wall = time.perf_counter() - t0
            if spy is None:
                after = counters(pid)
                print(name, rep, {k: round((after[k] - before[k]) / n, 2) for k in before}, "per token", flush=True)
            else:
                spy.send_signal(2)
                spy.wait()
            res[f"{name}_{rep}"] = (n, wall, n / wall)
            print(name, rep, n, round(wall, 2), round(n / wall, 2), flush=True)
finally:
    for srv in servers.values():
        srv.stop()
(a.out / "res.json").write_text(json.dumps(res))
