# does an idle --sleep-on-idle server beside a decoding one slow it? A/B/A in one decode server
import sys, tempfile, time, contextlib
from pathlib import Path
from nanospec.bench.server import Server
from nanospec.cpu.bench import _read
from nanospec.testing import make_tiny_eagle3_draft
model = Path(sys.argv[1]).expanduser(); work = Path(tempfile.mkdtemp(prefix="ab_"))
draft = make_tiny_eagle3_draft(work / "draft", model, seed=2)
base = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4", "--max-total-tokens", "4096", "--skip-server-warmup", "--sleep-on-idle"]
prompt = [(17 + 31 * i) % 1000 + 10 for i in range(64)]
key = "forward:target:DECODE"
def gens(s, prof, n=5):
    ms = []
    for _ in range(n):
        time.sleep(1.0); b = _read(prof)[key]
        s.generate(prompt, 24, ignore_eos=True); time.sleep(1.5); a = _read(prof)[key]
        ms.append(round(1000 * (a["seconds"] - b["seconds"]) / (a["calls"] - b["calls"]), 2))
    return ms
prof = work / "pd"
with Server(model, base, {"OMP_NUM_THREADS": "2", "NANOSPEC_PROFILE_OPS": str(prof)}, work / "d.log") as d:
    d.generate(prompt, 8, ignore_eos=True)
    for rnd in range(2):
        print("alone", gens(d, prof), flush=True)
        with contextlib.ExitStack() as st:
            for n in (4, 8):
                v = st.enter_context(Server(model, base + ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
                    "--speculative-eagle-topk", "1", "--speculative-num-steps", str(n - 1), "--speculative-num-draft-tokens", str(n)],
                    {"OMP_NUM_THREADS": "2", "NANOSPEC_PROFILE_OPS": str(work / f"pv{n}{rnd}")}, work / f"v{n}.log"))
                v.generate(prompt, 8, ignore_eos=True)
            print("beside 2 idle servers", gens(d, prof), flush=True)
