# variants of the kernel: correctness, bitwise across M, in-cache and streaming (Qwen forward products)
import ctypes, sys, time, torch
torch.set_num_threads(2)
libs = {n: ctypes.CDLL(f"runs/s7/k/{n}.so") for n in sys.argv[1].split(",")}
for l in libs.values(): l.nanospec_linear.argtypes = [ctypes.c_void_p]*4 + [ctypes.c_long]*3
def run(lib, x, w, b=None):
    m, k = x.shape; n = w.shape[0]; y = torch.empty(m, n)
    lib.nanospec_linear(x.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), m, n, k); return y
torch.manual_seed(0)
for name, lib in libs.items():
    for n, k in ((37, 901), (130, 64), (5, 7)):
        w = torch.randn(n, k); b = torch.randn(n); x = torch.randn(13, k)
        ref = (x.double() @ w.double().T + b.double()).float()
        full = run(lib, x, w, b)
        err = (full - ref).abs().max().item()
        same = all(torch.equal(run(lib, x[:m].contiguous(), w, b), full[:m]) for m in range(1, 13))
        same1 = all(torch.equal(run(lib, x[i:i+1].contiguous(), w, b), full[i:i+1]) for i in range(13))
        print(f"{name} {n}x{k}: maxerr {err:.2e} prefix-bitwise {same} row-bitwise {same1}")
if len(sys.argv) > 2 and sys.argv[2] == "check": sys.exit()
H, I, Q, V, NL = 896, 4864, 1152, 151936, 24
layers = [(torch.randn(Q, H), torch.randn(H, H), torch.randn(2 * I, H), torch.randn(H, I)) for _ in range(NL)]
head = torch.randn(V, H)
def fwd(m, lib):
    x = torch.randn(m, H); xi = torch.randn(m, I)
    for wq, wo, wgu, wd in layers:
        run(lib, x, wq); run(lib, x, wo); run(lib, x, wgu); run(lib, xi, wd)
    run(lib, x, head)
for m in (1, 4, 8):
    for name, lib in libs.items():
        fwd(m, lib); ts = []
        for _ in range(5):
            a = time.perf_counter(); fwd(m, lib); ts.append((time.perf_counter() - a) * 1e3)
        ts.sort()
        w = torch.randn(2048, 896); x = torch.randn(m, 896)
        for _ in range(10): run(lib, x, w)
        a = time.perf_counter()
        for _ in range(100): run(lib, x, w)
        ic = (time.perf_counter() - a) / 100
        print(f"rows={m} {name}: qwen fwd min {ts[0]:.1f} med {ts[2]:.1f} ms | in-cache 2048x896 {ic*1e6:.0f} us ({m*2048*896/ic/1e9:.1f} GMAC/s)", flush=True)
