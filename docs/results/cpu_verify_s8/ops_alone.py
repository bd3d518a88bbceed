# per-call cost of SmolLM2 ops alone at 1 and 4 rows (2 threads), weights cycled like a forward
import time, torch, sys
from nanospec.cpu import ops_layers, gemv
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
H, I, L = 576, 1536, 30
Ws = [[torch.randn(960, H), torch.randn(H, H), torch.randn(2 * I, H), torch.randn(H, I)] for _ in range(L)]
head = torch.randn(49152, H)
cache = torch.randn(8192, 64); nw = torch.ones(H)
def step(T):
    x = torch.randn(T, H); pos = torch.arange(100, 100 + T)
    res = x.clone()
    t = {"lin": 0.0, "norm": 0.0, "rope": 0.0}
    for l in range(L):
        a = time.perf_counter(); h, res = ops_layers.rms_norm(x, nw, 1e-5, res); b = time.perf_counter(); t["norm"] += b - a
        qkv = gemv.linear(h, Ws[l][0], None); c = time.perf_counter(); t["lin"] += c - b
        q, k = qkv[:, :576], qkv[:, 576:768]
        q, k = ops_layers.rope(pos, q, k, cache, 64, 64, True); d = time.perf_counter(); t["rope"] += d - c
        o = gemv.linear(q.contiguous(), Ws[l][1], None); e = time.perf_counter()
        h, res = ops_layers.rms_norm(o, nw, 1e-5, res); f = time.perf_counter(); t["norm"] += f - e
        gu = gemv.linear(h, Ws[l][2], None)
        x = gemv.linear(gu[:, :I].contiguous(), Ws[l][3], None); g = time.perf_counter(); t["lin"] += g - f + e - d
    a = time.perf_counter(); gemv.linear(x, head, None); t["head"] = time.perf_counter() - a
    return t
for T in (1, 4, 8, 1, 4):
    runs = [step(T) for _ in range(8)]
    best = {k: min(r[k] for r in runs) * 1e3 for k in runs[0]}
    print(T, {k: round(v, 2) for k, v in best.items()}, "per call us: norm %.1f rope %.1f lin %.1f" % (best["norm"] * 1e3 / 60, best["rope"] * 1e3 / 30, best["lin"] * 1e3 / 120))
