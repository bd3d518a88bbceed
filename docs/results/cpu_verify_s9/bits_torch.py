import torch, sys
sys.path.insert(0, "tests")
from nanospec.cpu import ops_attention
import test_patches_attention as t
ops_attention.NATIVE = False
for H,Hkv,D in [(9,3,64),(4,4,80),(14,2,64),(2,1,8)]:
    g, kc, vc, r2t = t._cache(H, Hkv, D, seed=H + D)
    P, E = 301, 6
    q = torch.randn(E, H, D, generator=g)
    alone = torch.cat([t._decode(q[i:i + 1], kc, vc, r2t, [2], [P + i + 1]) for i in range(E)])
    v = t._extend(q, kc, vc, r2t, [2], [P + E], [E])
    print(H, D, torch.equal(v, alone), (v-alone).abs().max().item())
