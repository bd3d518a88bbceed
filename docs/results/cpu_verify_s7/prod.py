# products alone: MKL F.linear vs the kernel, 2 threads, distinct weights cycled (none in cache)
import time, torch
from nanospec.cpu import gemv
torch.set_num_threads(2)
assert gemv.available()
def t(f, reps=5):
    f(); ts=[]
    for _ in range(reps):
        a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
    ts.sort(); return ts[0]*1e3, ts[len(ts)//2]*1e3
s=torch.randn(int(1.1e8)); a=time.perf_counter(); s.sum(); s.sum(); print("sum GB/s", 2*s.numel()*4/1e9/(time.perf_counter()-a))
for n,k,c in [(4864,896,8),(896,4864,8),(49152,576,2),(151936,896,1)]:
    ws=[torch.randn(n,k) for _ in range(c)]; gb=n*k*4/1e9*c
    for m in (1,4,8):
        x=torch.randn(m,k)
        r={}
        r["mkl"]=t(lambda: [torch.nn.functional.linear(x,w) for w in ws])
        r["ker"]=t(lambda: [gemv.linear(x,w,None) for w in ws])
        print(f"[{m},{k}]x{n} x{c} "+" ".join(f"{a}={v[0]:.2f}/{v[1]:.2f}ms({gb/v[0]*1e3:.0f}GB/s)" for a,v in r.items()),flush=True)
