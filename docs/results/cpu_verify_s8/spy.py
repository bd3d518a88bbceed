# py-spy of the scheduler during AR decode or EAGLE3 verify-4 (random draft); collapsed stacks to OUT
import subprocess, sys, tempfile, threading, time
from pathlib import Path
from nanospec.bench.server import Server
from nanospec.testing import make_tiny_eagle3_draft
model = Path(sys.argv[1]).expanduser(); mode = sys.argv[2]; out = sys.argv[3]
ntok = int(sys.argv[4]) if len(sys.argv) > 4 else 4
work = Path(tempfile.mkdtemp(prefix="spy_"))
draft = make_tiny_eagle3_draft(work / "draft", model, seed=2)
base = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4", "--skip-server-warmup"]
if mode == "verify":
    base += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
             "--speculative-eagle-topk", "1", "--speculative-num-steps", str(ntok - 1), "--speculative-num-draft-tokens", str(ntok)]
base += sys.argv[5:]
prompt = [(17 + 31 * i) % 1000 + 10 for i in range(64)]
with Server(model, base, {"OMP_NUM_THREADS": "2"}, work / "s.log") as s:
    s.generate(prompt, 8, ignore_eos=True)
    t = threading.Thread(target=lambda: s.generate(prompt, 600, ignore_eos=True)); t.start()
    time.sleep(2)
    pid = subprocess.run("pgrep -f 'sglang::scheduler'", shell=True, capture_output=True, text=True).stdout.split()[0]
    subprocess.run(f"{Path(sys.executable).parent}/py-spy record -p {pid} -d 12 -r 250 -f raw -o {out} --nonblocking", shell=True)
    t.join()
