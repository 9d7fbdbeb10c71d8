import numpy as np, netcl.autograd as ag, netcl.core as nc
import netcl.nn.functional as F
from netcl.profiler import profile
from netcl.runtime import synchronize
dev = nc.get_device()
for b, h, s, causal in [(8, 8, 1024, True), (8, 8, 1024, False)]:
    rng = np.random.default_rng(0)
    q, k, v = (ag.tensor(rng.standard_normal((b, h, s, 64)).astype(np.float32), requires_grad=True, device=dev) for _ in range(3))
    g = ag.tensor(np.ones((b, h, s, 64), np.float32), device=dev).value
    def step():
        with ag.Tape() as tape:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        tape.backward(o, grad=g)
    step(); synchronize(dev)
    with profile() as prof:
        for _ in range(3): step()
        synchronize(dev)
    print(f"b{b} h{h} s{s} causal={causal}")
    print(prof.key_averages().table(sort_by="device_time", row_limit=6))
