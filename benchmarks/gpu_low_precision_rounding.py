"""bf16/fp16 ops with Python numbers on CUDA, ember against eager bit for bit (a check, not a test:
CI has no GPU; tests/prims/test_low_precision_scalar_ops.py is its CPU twin).

    PYTHONPATH=. python benchmarks/gpu_low_precision_rounding.py       # prints DIFF lines, then done

Eager's CUDA kernels round differently from its CPU kernels in places (threshold and softshrink
round their number to x's dtype, logit computes in float, round(x, decimals) rounds each step),
and ember's decompositions follow each device.  Session 28, one H200: no DIFF line.
"""
import torch, ember, torch.nn.functional as F, warnings, sys
warnings.simplefilter("ignore")
dev = "cuda"
torch.manual_seed(0)
vals = torch.cat([torch.tensor([-7.0, -2.0, -1.0, -1/3, -0.1001, -0.1, -0.05, -0.0, 0.0, 1e-3, 0.05, 0.0996, 0.1, 0.1001, 1/3, 0.5, 1.0, 2.0, 3.0, 7.0, 100.0]), torch.randn(235) * 3])
S = [0.1, 1/3, -0.7]
ops = {
 "add_alpha_t": lambda x, s: torch.add(x, x.flip(0), alpha=s), "sub_alpha_n": lambda x, s: torch.sub(x, 1.7, alpha=s),
 "rdiv": lambda x, s: s / x, "trunc_div": lambda x, s: torch.div(x, s, rounding_mode="trunc"), "glu": lambda x, s: F.glu(torch.cat([x, x * s]), 0),
 "logit": lambda x, s: torch.logit(torch.sigmoid(x), abs(s) / 10), "xlogy": lambda x, s: torch.xlogy(x, abs(s)),
 "atan2_full": lambda x, s: torch.atan2(x, torch.full_like(x, s)), "rsqrt": lambda x, s: torch.rsqrt(x.abs() + s * s),
 "round_2": lambda x, s: torch.round(x * s, decimals=2), "round_-1": lambda x, s: torch.round(x * s * 100, decimals=-1),
 "rfloordiv": lambda x, s: s // x, "rms_norm": lambda x, s: F.rms_norm(x.reshape(4, 64) * s, (64,)),
 "threshold": lambda x, s: F.threshold(x, s, 5.0), "softshrink": lambda x, s: F.softshrink(x, abs(s)),
 "hardtanh": lambda x, s: F.hardtanh(x, -abs(s), abs(s)), "relu6": lambda x, s: F.relu6(x),
}
for dt in (torch.bfloat16, torch.float16):
    x = vals.to(dt).to(dev)
    for name, f in ops.items():
        for s in S:
            e = f(x, s)
            try:
                a = ember.compile(lambda x: f(x, s), options={"fallback": "error"})(x)
            except Exception as exc:
                print("ERROR", dt, name, s, str(exc)[:120], flush=True); continue
            n = (torch.nan_to_num(e.double(), 1e30) != torch.nan_to_num(a.double(), 1e30)).sum().item()
            if n:
                print("DIFF", dt, name, s, f"{n}/{e.numel()}", flush=True)
        # gradients where the forward rule changed
        if name in ("threshold", "softshrink", "hardtanh"):
            pass
    for name in ("threshold", "softshrink", "hardtanh", "relu6"):
        f = ops[name]
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        f(xe, 0.1).float().sum().backward(); ember.compile(lambda x: f(x, 0.1))(xc).float().sum().backward()
        n = (xe.grad != xc.grad).sum().item()
        if n: print("GRAD DIFF", dt, name, n, flush=True)
print("done", flush=True)
