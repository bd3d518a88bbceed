# per-op profile inside the server: AR decode vs EAGLE3 verify (random draft); ops split by forward scope
import sys, tempfile, time
from pathlib import Path
from nanospec.bench.server import Server
from nanospec.cpu.bench import _read
from nanospec.testing import make_tiny_eagle3_draft
model = Path(sys.argv[1]).expanduser(); ntok = int(sys.argv[2]) if len(sys.argv) > 2 else 4
threads = sys.argv[3] if len(sys.argv) > 3 else "2"
work = Path(tempfile.mkdtemp(prefix="prof_"))
draft = make_tiny_eagle3_draft(work / "draft", model, seed=2)
base = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4", "--skip-server-warmup"] + sys.argv[4:]
prompt = [(17 + 31 * i) % 1000 + 10 for i in range(64)]
for label, extra in [("decode", []), (f"verify{ntok}", ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
        "--speculative-eagle-topk", "1", "--speculative-num-steps", str(ntok - 1), "--speculative-num-draft-tokens", str(ntok)])]:
    prof = work / label
    with Server(model, base + extra, {"NANOSPEC_PROFILE_OPS": str(prof), "OMP_NUM_THREADS": threads, "PYTHONPATH": "/work/main/runs/s8"}, work / f"{label}.log") as s:
        s.generate(prompt, 8, ignore_eos=True); time.sleep(1.5); b = _read(prof)
        s.generate(prompt, 32, ignore_eos=True); time.sleep(1.5); a = _read(prof)
    d = {k: (a[k]["seconds"] - b.get(k, {"seconds": 0})["seconds"], a[k]["calls"] - b.get(k, {"calls": 0})["calls"]) for k in a}
    steps = d.get("cycle", d.get("forward:target:DECODE"))[1]
    print(f"== {label}: {steps} steps")
    for k, (sec, c) in sorted(d.items(), key=lambda kv: (kv[0].split("/")[0] if "/" in kv[0] else "", -kv[1][0])):
        if c: print(f"  {k:50s} {1000*sec/steps:8.2f} ms/step  {c/steps:6.1f} calls/step  {1e6*sec/c:8.1f} us/call")
