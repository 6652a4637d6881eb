"""Vision models with in-place activations, compiled vs eager, under the bench harness's accuracy rule.

timm EfficientNet-B0 (SiLU(inplace=True)) and torchvision MobileNetV3-Large (Hardswish(inplace=True),
ReLU(inplace=True)) were the models whose compiled outputs were garbage before issue #8.  For each model:
eager, ember and a float32 copy of the same (rounded) weights as the high-precision reference; the run
passes when rel-L2(ember, eager) <= tol, or ember is no worse than twice eager's distance to the reference
(../shared/bench/README.md's rule).  Prints one line per model with the error and eager/ember times.

    python benchmarks/model_accuracy.py --device cuda --dtype bfloat16 --batch 32
    python benchmarks/model_accuracy.py --device cpu --dtype float32 --batch 2 --img 64   # smoke test
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch

import ember


def build(name: str) -> torch.nn.Module:
    if name == "efficientnet_b0":
        import timm
        return timm.create_model("efficientnet_b0", pretrained=False)
    if name == "mobilenet_v3_large":
        import torchvision
        return torchvision.models.mobilenet_v3_large(weights=None)
    if name == "mobilenet_v3_small":
        import torchvision
        return torchvision.models.mobilenet_v3_small(weights=None)
    raise ValueError(name)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def timed_ms(fn, x: torch.Tensor, iters: int) -> float:
    """Median ms per call (CUDA events on the GPU, perf_counter on the CPU)."""
    samples = []
    for _ in range(iters):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(x)
            samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[len(samples) // 2]


def check_model(name: str, device: str, dtype: torch.dtype, batch: int, img: int, iters: int) -> dict:
    torch.manual_seed(0)
    model = build(name).eval()
    reference = copy.deepcopy(model).to(device)           # fp32 copy of the rounded weights, below
    model = model.to(device=device, dtype=dtype)
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    x = torch.randn(batch, 3, img, img, device=device, dtype=dtype)
    compiled = ember.compile(model)
    with torch.no_grad():
        eager_out = model(x)
        t0 = time.perf_counter()
        ember_out = compiled(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        ember_out = compiled(x)
        high = reference(x.float())
        eager_ms = timed_ms(model, x, iters)
        ember_ms = timed_ms(compiled, x, iters)
    tol = 1e-3 if dtype == torch.float32 else 1e-2
    error, eager_vs_hi, ember_vs_hi = rel_l2(ember_out, eager_out), rel_l2(eager_out, high), rel_l2(ember_out, high)
    passed = bool(torch.isfinite(ember_out).all()) and (error <= tol or ember_vs_hi <= max(2 * eager_vs_hi, tol))
    return {"model": name, "device": device, "dtype": str(dtype)[6:], "batch": batch, "status":
            "pass" if passed else "fail_accuracy", "rel_l2": error, "eager_vs_hi": eager_vs_hi,
            "ember_vs_hi": ember_vs_hi, "tol": tol, "eager_ms": eager_ms, "ember_ms": ember_ms,
            "speedup": eager_ms / ember_ms, "compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--img", type=int, default=224)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--models", default="efficientnet_b0,mobilenet_v3_large")
    parser.add_argument("--json", help="append one JSON line per model to this file")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    for name in args.models.split(","):
        try:
            row = check_model(name, args.device, dtype, args.batch, args.img, args.iters)
        except Exception as exc:  # noqa: BLE001 - a report line, not a crash
            row = {"model": name, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
