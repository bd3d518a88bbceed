# one target forward's products alone (Qwen2.5-0.5B shapes, 24 layers, distinct weights), 1/4/8 rows
import sys, time, torch
from nanospec.cpu import gemv
torch.set_num_threads(2)
H, I, Q, V, NL = 896, 4864, 1152, 151936, 24
if len(sys.argv) > 1 and sys.argv[1] == "smol": H, I, Q, V, NL = 576, 1536, 960, 49152, 30
layers = [(torch.randn(Q, H), torch.randn(Q), torch.randn(H, H), torch.randn(2 * I, H), torch.randn(H, I)) for _ in range(NL)]
head = torch.randn(V, H)
def fwd(m, f):
    x = torch.randn(m, H); xi = torch.randn(m, I)
    for wq, bq, wo, wgu, wd in layers:
        f(x, wq, bq); f(x, wo, None); f(x, wgu, None); f(xi, wd, None)
    f(x, head, None)
def parts(m, f):
    x = torch.randn(m, H); xi = torch.randn(m, I); out = {}
    for name, idx in (("qkv", 0), ("o", 2), ("gu", 3), ("down", 4)):
        a = time.perf_counter()
        for L in layers: f(xi if name == "down" else x, L[idx], L[1] if name == "qkv" else None)
        out[name] = (time.perf_counter() - a) * 1e3
    a = time.perf_counter(); f(x, head, None); out["head"] = (time.perf_counter() - a) * 1e3
    return out
for name, f in (("mkl", torch.nn.functional.linear), ("ker", gemv.linear)):
    for m in (1, 4, 8):
        fwd(m, f); ts = []
        for _ in range(5):
            a = time.perf_counter(); fwd(m, f); ts.append((time.perf_counter() - a) * 1e3)
        ts.sort(); p = parts(m, f)
        print(f"{name} rows={m}: min {ts[0]:.1f} med {ts[2]:.1f} ms | " + " ".join(f"{k}={v:.1f}" for k, v in p.items()), flush=True)
