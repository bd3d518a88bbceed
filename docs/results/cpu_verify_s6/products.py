# Ad-hoc product timing of session 6 (docs/cpu.md, "Session 6"). Build the variants first, e.g.
#   gcc -O3 -mavx2 -mfma -mavx512f -ffp-contract=off -fopenmp -shared -fPIC nanospec/cpu/gemv.c -o /tmp/k/g2048.so
# (g0: the same with PREFETCH lines removed), then: python products.py g0,g2048
import ctypes, time, sys, torch
torch.set_num_threads(2)
libs = {n: ctypes.CDLL(f"/tmp/k/{n}.so") for n in sys.argv[1].split(",")}
for l in libs.values(): l.nanospec_linear.argtypes = [ctypes.c_void_p]*4 + [ctypes.c_long]*3
def run(lib, x, w):
    m, k = x.shape; n = w.shape[0]; y = torch.empty(m, n)
    lib.nanospec_linear(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), m, n, k); return y
def t(f, reps):
    f(); ts = []
    for _ in range(reps):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    ts.sort(); return ts[0]*1e3, ts[len(ts)//2]*1e3
shapes = [(4864, 896), (896, 4864), (49152, 576), (151936, 896)]
for n, k in shapes:
    w = torch.randn(n, k); gb = n*k*4/1e9
    reps = 20 if n*k < 1e8 else 7
    for m in (1, 4, 8):
        x = torch.randn(m, k)
        r = {"mkl": t(lambda: torch.nn.functional.linear(x, w), reps)}
        for name, lib in libs.items(): r[name] = t(lambda: run(lib, x, w), reps)
        print(f"[{m},{k}]x{n} " + " ".join(f"{a}={v[0]:.2f}/{v[1]:.2f}({gb/v[0]*1e3:.0f})" for a, v in r.items()), flush=True)
