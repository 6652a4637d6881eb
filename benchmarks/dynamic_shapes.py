"""Dynamic shapes: compiles over a sweep of sizes, correctness, and the speed of the symbolic code.

For each case the function is compiled with ``dynamic=None`` (automatic dynamic) and called over a
sweep of sizes; every result is compared with eager.  Then, at a few sizes, the dynamic entry's
time per call is compared with a compile specialised to that size (``dynamic=False``), in one
process, interleaved.  Prints one line per case and size; ``--json`` writes them too.

    python benchmarks/dynamic_shapes.py                     # CPU (C++ kernels)
    python benchmarks/dynamic_shapes.py --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import ember


def pointwise(x, bias):
    return F.gelu(x * 1.5 + bias).sigmoid() * x


def softmax(x):
    return torch.softmax(x * 0.125, dim=-1)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias) * 2


def rms_norm(x, weight):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight


def mlp(x, w1, w2):
    return F.gelu(x @ w1) @ w2


CASES = {
    # name: (function, inputs for n rows)
    "pointwise": (pointwise, lambda n, d, t: (torch.randn(n, 4096, device=d, dtype=t),
                                              torch.randn(4096, device=d, dtype=t))),
    "softmax": (softmax, lambda n, d, t: (torch.randn(8, n, 1024, device=d, dtype=t),)),
    "layer_norm": (layer_norm, lambda n, d, t: (torch.randn(n, 1024, device=d, dtype=t),
                                                torch.randn(1024, device=d, dtype=t),
                                                torch.randn(1024, device=d, dtype=t))),
    "rms_norm": (rms_norm, lambda n, d, t: (torch.randn(n, 2048, device=d, dtype=t),
                                            torch.randn(2048, device=d, dtype=t))),
    "mlp": (mlp, lambda n, d, t: (torch.randn(n, 1024, device=d, dtype=t),
                                  torch.randn(1024, 4096, device=d, dtype=t) * 0.03,
                                  torch.randn(4096, 1024, device=d, dtype=t) * 0.03)),
}
SWEEP = [64, 96, 128, 257, 512, 1000, 2048, 3001, 4096]
TIMED = [128, 1000, 4096]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call(fn, args, device: str, seconds: float = 0.3) -> float:
    for _ in range(3):
        fn(*args)
    sync(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(*args)
        count += 1
    sync(device)
    return (time.perf_counter() - start) / count


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device, dtype = args.device, getattr(torch, args.dtype)
    rows = []
    for name in args.cases.split(","):
        fn, make = CASES[name]
        torch.manual_seed(0)
        dynamic = ember.compile(fn)
        compile_seconds, correct = [], True
        for n in SWEEP:
            inputs = make(n, device, dtype)
            started = time.perf_counter()
            got = dynamic(*inputs)
            sync(device)
            compile_seconds.append(time.perf_counter() - started)
            correct &= close(got, fn(*inputs), dtype)
        compiles = len(dynamic._ember_captured.events)
        print(f"{name}: {compiles} compiles over {len(SWEEP)} sizes, all equal to eager: {correct}; "
              f"first call {compile_seconds[0]:.2f}s, the dynamic compile {compile_seconds[1]:.2f}s")
        for n in TIMED:
            inputs = make(n, device, dtype)
            static = ember.compile(fn, dynamic=False)
            started = time.perf_counter()
            static(*inputs)
            sync(device)
            static_compile = time.perf_counter() - started
            times = {"eager": [], "static": [], "dynamic": []}
            for _ in range(3):     # interleaved: these machines are noisy
                times["eager"].append(per_call(fn, inputs, device))
                times["static"].append(per_call(static, inputs, device))
                times["dynamic"].append(per_call(dynamic, inputs, device))
            best = {k: min(v) for k, v in times.items()}
            row = {"case": name, "n": n, "device": device, "dtype": args.dtype, "compiles": compiles,
                   "correct": bool(correct), "eager_us": best["eager"] * 1e6, "static_us": best["static"] * 1e6,
                   "dynamic_us": best["dynamic"] * 1e6, "dynamic_over_static": best["dynamic"] / best["static"],
                   "static_compile_s": static_compile, "dynamic_compile_s": compile_seconds[1]}
            rows.append(row)
            print(f"  n={n}: eager {row['eager_us']:.1f} us, static {row['static_us']:.1f} us, dynamic "
                  f"{row['dynamic_us']:.1f} us: dynamic/static {row['dynamic_over_static']:.3f}")
    if args.json:
        with open(args.json, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
