import time, torch, statistics
from nanospec.cpu import ops_attention
torch.set_num_threads(2)
H,Hkv,D=14,2,64
pool=16384
kc,vc=torch.randn(pool,Hkv,D),torch.randn(pool,Hkv,D)
r2t=torch.arange(pool,dtype=torch.int32).view(4,-1).contiguous()
def run(E,Ltot,native,n=50):
    ops_attention.NATIVE=native
    q=torch.randn(E,H,D); kn=torch.randn(E,Hkv,D); vn=torch.randn(E,Hkv,D)
    o=torch.empty(E,H,D)
    rpi=torch.tensor([1]); seq=torch.tensor([Ltot]); ext=torch.tensor([E],dtype=torch.int32); st=torch.tensor([0],dtype=torch.int32)
    loc=torch.tensor([4096+Ltot-1])
    ts=[]
    for _ in range(n):
        t0=time.perf_counter()
        if E==1:
            ops_attention.decode_attention_cpu(q,kc,vc,1.0,1.0,o,kn,vn,loc,None,r2t,rpi,seq,0.125,0.0,False,0)
        else:
            ops_attention.extend_attention_cpu(q,kn,vn,o,kc,vc,1.0,1.0,r2t,rpi,seq,ext,st,E,0.125,0.0,False,0,None,None,None,True)
        ts.append(time.perf_counter()-t0)
    return min(ts)*1e6, statistics.median(ts)*1e6
for E in (1,4,8):
    for Ltot in (1000,4000):
        a=run(E,Ltot,False); b=run(E,Ltot,True)
        print(f"Qwen-shaped E={E} L={Ltot}: torch min {a[0]:.0f} med {a[1]:.0f} us | native min {b[0]:.0f} med {b[1]:.0f} us")
