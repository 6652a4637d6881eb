"""Max pooling's generated gradient against eager's on the GPU, one window (GPU diagnosis, not a test).

    python benchmarks/gpu_max_pool_check.py
"""
import torch
import torch.nn.functional as F

import ember

for config in [(3, (1, 2), 0, 2, False), (3, 2, 1, 1, False)]:
    k, s, p, d, c = config

    def fn(x):
        return F.max_pool2d(x, k, s, p, d, ceil_mode=c)
    torch.manual_seed(1)
    x = torch.randn(2, 3, 9, 8, device="cuda")
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    oe, oc = fn(xe), ember.compile(fn, options={"fallback": "error"})(xc)
    g = torch.randn_like(oe)
    (ge,) = torch.autograd.grad(oe, xe, g)
    (gc,) = torch.autograd.grad(oc, xc, g)
    diff = (ge - gc).abs()
    print(config, "values equal", torch.equal(oe, oc), "grad max diff", diff.max().item(),
          "mismatches", int((diff > 0).sum()), "of", diff.numel(), flush=True)
