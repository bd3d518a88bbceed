# kernel variants in the real server, side by side (bench_verify.measure), verify of N tokens + decode
import sys, tempfile, statistics
from pathlib import Path
from nanospec.cpu import bench_verify as bv
from nanospec.testing import make_tiny_eagle3_draft
model = Path(sys.argv[1]).expanduser(); runs = sys.argv[2].split(","); variants = sys.argv[3:]
site = {"PYTHONPATH": "/work/main/runs/s8"}
for v in variants:
    name, defs = v.split("=", 1) if "=" in v else (v, "")
    bv.PATHS[name] = {**bv.PATHS["new"], **site, "NANOSPEC_GEMV_SRC": "/work/main/runs/s8/gemv_var.c", "NANOSPEC_GEMV_DEFS": defs}
names = [v.split("=", 1)[0] for v in variants]
class A: repeats = 6; tokens = 24; prompt_tokens = 64; threads = 2
work = Path(tempfile.mkdtemp(prefix="var_"))
draft = make_tiny_eagle3_draft(work / "draft", model, seed=2)
res = bv.measure(model, draft, [(n, r) for r in runs for n in names], work, A)
for k, ms in res.items(): print(k, "min %.2f median %.2f" % (min(ms), statistics.median(ms)), [round(x, 1) for x in ms])
