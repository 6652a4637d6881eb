"""bf16/fp16 ops with Python numbers on CUDA, ember against eager bit for bit (a check, not a test:
CI has no GPU; tests/prims/test_low_precision_scalar_ops.py is its CPU twin).

    PYTHONPATH=. python benchmarks/gpu_low_precision_rounding.py       # prints DIFF lines, then done

Eager's CUDA kernels round differently from its CPU kernels in places (threshold and softshrink
round their number to x's dtype, logit computes in float, round(x, decimals) rounds each step),
and ember's decompositions follow each device.  Session 28, one H200: no DIFF line.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

import ember

VALUES = [-7.0, -2.0, -1.0, -1 / 3, -0.1001, -0.1, -0.05, -0.0, 0.0, 1e-3, 0.05, 0.0996, 0.1, 0.1001, 1 / 3, 0.5,
          1.0, 2.0, 3.0, 7.0, 100.0]
NUMBERS = [0.1, 1 / 3, -0.7]
OPS = {
    "add_alpha_t": lambda x, s: torch.add(x, x.flip(0), alpha=s), "sub_alpha_n": lambda x, s: torch.sub(x, 1.7, alpha=s),
    "rdiv": lambda x, s: s / x, "trunc_div": lambda x, s: torch.div(x, s, rounding_mode="trunc"),
    "glu": lambda x, s: F.glu(torch.cat([x, x * s]), 0), "logit": lambda x, s: torch.logit(torch.sigmoid(x), abs(s) / 10),
    "xlogy": lambda x, s: torch.xlogy(x, abs(s)), "atan2_full": lambda x, s: torch.atan2(x, torch.full_like(x, s)),
    "rsqrt": lambda x, s: torch.rsqrt(x.abs() + s * s), "round_2": lambda x, s: torch.round(x * s, decimals=2),
    "round_-1": lambda x, s: torch.round(x * s * 100, decimals=-1), "rfloordiv": lambda x, s: s // x,
    "rms_norm": lambda x, s: F.rms_norm(x.reshape(4, 64) * s, (64,)), "threshold": lambda x, s: F.threshold(x, s, 5.0),
    "softshrink": lambda x, s: F.softshrink(x, abs(s)), "hardtanh": lambda x, s: F.hardtanh(x, -abs(s), abs(s)),
    "relu6": lambda x, s: F.relu6(x),
}
GRADIENTS = ("threshold", "softshrink", "hardtanh", "relu6")


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((torch.nan_to_num(a.double(), 1e30) != torch.nan_to_num(b.double(), 1e30)).sum())


def main() -> None:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    values = torch.cat([torch.tensor(VALUES), torch.randn(256 - len(VALUES)) * 3])
    for dtype in (torch.bfloat16, torch.float16):
        x = values.to(dtype).cuda()
        for name, fn in OPS.items():
            for number in NUMBERS:
                def op(x, fn=fn, number=number):
                    return fn(x, number)
                n = differing(ember.compile(op, options={"fallback": "error"})(x), op(x))
                if n:
                    print("DIFF", dtype, name, number, f"{n}/{x.numel()}", flush=True)
        for name in GRADIENTS:
            def op(x, fn=OPS[name]):
                return fn(x, 0.1)
            eager, compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
            op(eager).float().sum().backward()
            ember.compile(op)(compiled).float().sum().backward()
            n = differing(compiled.grad, eager.grad)
            if n:
                print("GRAD DIFF", dtype, name, n, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
