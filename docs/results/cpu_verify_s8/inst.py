# same server config started several times: does a server instance's speed differ, or the time?
import sys, tempfile, time
from pathlib import Path
from nanospec.bench.server import Server
from nanospec.cpu.bench import _read
model = Path(sys.argv[1]).expanduser(); n = int(sys.argv[2]); work = Path(tempfile.mkdtemp(prefix="inst_"))
base = ["--device", "cpu", "--dtype", "float32", "--max-running-requests", "4", "--skip-server-warmup"]
prompt = [(17 + 31 * i) % 1000 + 10 for i in range(64)]
key = "forward:target:DECODE"
for i in range(n):
    prof = work / f"p{i}"
    with Server(model, base, {"OMP_NUM_THREADS": "2", "NANOSPEC_PROFILE_OPS": str(prof)}, work / f"{i}.log") as s:
        s.generate(prompt, 8, ignore_eos=True)
        ms = []
        for _ in range(4):
            time.sleep(1.0); b = _read(prof)[key]
            s.generate(prompt, 24, ignore_eos=True); time.sleep(1.5); a = _read(prof)[key]
            ms.append(1000 * (a["seconds"] - b["seconds"]) / (a["calls"] - b["calls"]))
    print(f"instance {i} at {time.strftime('%H:%M:%S')}: decode ms", [round(x, 2) for x in ms], flush=True)
