# kernel variants side by side: bitwise vs shipped, and a model forward's products at 1/4/8 rows
import ctypes, sys, time, torch
from nanospec.cpu import gemv
torch.set_num_threads(2)
names = sys.argv[1].split(","); model = sys.argv[2] if len(sys.argv) > 2 else "smol"
libs = {n: ctypes.CDLL(f"runs/s8/k/{n}.so") for n in names}
for l in libs.values(): l.nanospec_linear.argtypes = [ctypes.c_void_p]*4 + [ctypes.c_long]*3
def run(lib, x, w, b=None):
    m, k = x.shape; n = w.shape[0]; y = torch.empty(m, n)
    lib.nanospec_linear(x.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), m, n, k); return y
torch.manual_seed(0)
for n, k in ((37, 901), (130, 64), (5, 7), (576, 576)):
    w = torch.randn(n, k); b = torch.randn(n); x = torch.randn(13, k)
    ref = gemv.linear(x, w, b)
    for name, lib in libs.items():
        ok = all(torch.equal(run(lib, x[:m].contiguous(), w, b), ref[:m]) for m in range(1, 14))
        if not ok: print("NOT BITWISE", name, n, k)
if model == "smol": H, I, Q, V, NL = 576, 1536, 960, 49152, 30
else: H, I, Q, V, NL = 896, 4864, 1152, 151936, 24
layers = [(torch.randn(Q, H), torch.randn(H, H), torch.randn(2 * I, H), torch.randn(H, I)) for _ in range(NL)]
head = torch.randn(V, H)
def fwd(m, lib):
    x = torch.randn(m, H); xi = torch.randn(m, I)
    for wq, wo, wgu, wd in layers:
        run(lib, x, wq); run(lib, x, wo); run(lib, x, wgu); run(lib, xi, wd)
    run(lib, x, head)
res = {}
for rep in range(int(__import__("os").environ.get("REPS", "2"))):
    for m in (1, 4, 8):
        for name, lib in libs.items():
            fwd(m, lib); ts = []
            for _ in range(5):
                a = time.perf_counter(); fwd(m, lib); ts.append((time.perf_counter() - a) * 1e3)
            res.setdefault((m, name), []).extend(ts)
for m in (1, 4, 8):
    print(" ".join(f"{name}: {min(res[m, name]):.1f}/{sorted(res[m, name])[len(res[m, name])//2]:.1f}" for name in names), f" <- rows={m} {model} fwd min/med ms", flush=True)
