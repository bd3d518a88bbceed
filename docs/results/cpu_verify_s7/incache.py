import time, torch, sys
from nanospec.cpu import gemv
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
for n, k in ((256, 896), (2048, 896), (256, 4864)):
    w = torch.randn(n, k)
    for m in (1, 4, 6, 8):
        x = torch.randn(m, k); reps = 200
        for _ in range(20): gemv.linear(x, w, None)
        a = time.perf_counter()
        for _ in range(reps): gemv.linear(x, w, None)
        dt = (time.perf_counter() - a) / reps
        print(f"{n}x{k} rows={m}: {dt*1e6:.1f} us  {n*k*4/dt/1e9:.1f} GB/s of w  {m*n*k/dt/1e9:.1f} GMAC/s")
