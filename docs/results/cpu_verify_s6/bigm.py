import time, torch
from nanospec.cpu import gemv
torch.set_num_threads(2)
def t(f, reps=5):
    f(); ts = []
    for _ in range(reps):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return min(ts) * 1e3
for n, k in [(9728, 896), (896, 4864), (3072, 576), (576, 1536)]:
    w = torch.randn(n, k)
    for m in (16, 32, 64, 128, 256):
        x = torch.randn(m, k)
        print(f"[{m},{k}]x{n} mkl {t(lambda: torch.nn.functional.linear(x, w)):.2f} kernel {t(lambda: gemv.linear(x, w, None)):.2f}", flush=True)
