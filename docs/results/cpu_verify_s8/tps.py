# wall ms per generated token, AR (and EAGLE3 random-draft cycles), with and without the op profiler
import sys, tempfile, time
from pathlib import Path
from nanospec.bench.server import Server
from nanospec.testing import make_tiny_eagle3_draft
model = Path(sys.argv[1]).expanduser(); work = Path(tempfile.mkdtemp(prefix="tps_"))
draft = make_tiny_eagle3_draft(work / "draft", model, seed=2)
base = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4", "--skip-server-warmup"]
prompt = [(17 + 31 * i) % 1000 + 10 for i in range(64)]
for label, extra in [("decode", []), ("verify4", ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
        "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"])]:
    for prof in (False, True):
        env = {"OMP_NUM_THREADS": "2", **({"NANOSPEC_PROFILE_OPS": str(work / f"p{label}")} if prof else {})}
        with Server(model, base + extra + sys.argv[2:], env, work / f"{label}.log") as s:
            s.generate(prompt, 8, ignore_eos=True)
            ts = []
            for _ in range(3):
                t0 = time.perf_counter(); s.generate(prompt, 8, ignore_eos=True); t1 = time.perf_counter()
                s.generate(prompt, 72, ignore_eos=True); t2 = time.perf_counter()
                ts.append(1000 * ((t2 - t1) - (t1 - t0)) / 64)
            print(label, "profiler" if prof else "plain", "ms per token (64 tokens, prefill removed):", [round(t, 2) for t in ts], flush=True)
