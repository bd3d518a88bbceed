import time, torch
from nanospec.cpu import ops_attention as oa
torch.set_num_threads(2)
H, Hkv, D, pool = 9, 3, 64, 4096
kb, vb = torch.randn(pool, Hkv, D), torch.randn(pool, Hkv, D)
r2t = torch.arange(pool, dtype=torch.int32).view(1, -1).repeat(4, 1)[:, :2048].contiguous()
def t(f, n=2000):
    for _ in range(50): f()
    best = 1e9
    for _ in range(5):
        a = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - a) / n)
    return best * 1e6
L = 100
q1 = torch.randn(1, H, D); o1 = torch.empty(1, H, D); k1 = torch.randn(1, Hkv, D); v1 = torch.randn(1, Hkv, D)
loc = torch.tensor([L - 1]); logits = torch.empty(1, H, 8, D + 1)
rpi = torch.tensor([0]); sl = torch.tensor([L])
print("decode us", t(lambda: oa.decode_attention_cpu(q1, kb, vb, 1.0, 1.0, o1, k1, v1, loc, logits, r2t, rpi, sl, 0.125, 0.0)))
for E in (4, 8):
    q = torch.randn(E, H, D); o = torch.empty(E, H, D); k = torch.randn(E, Hkv, D); v = torch.randn(E, Hkv, D)
    mask = torch.ones(E, E, dtype=torch.bool).tril()
    args = (q, k, v, o, kb, vb, 1.0, 1.0, r2t, rpi, sl, torch.tensor([E]), torch.tensor([0]), E, 0.125, 0.0)
    print(E, "extend tree-mask us", t(lambda: oa.extend_attention_cpu(*args, custom_mask=mask)),
          "causal us", t(lambda: oa.extend_attention_cpu(*args)), "no kv us", t(lambda: oa.extend_attention_cpu(q, None, None, *args[3:], custom_mask=mask)))
