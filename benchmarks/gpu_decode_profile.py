"""Why is a decode step slower under dynamic shapes than static?  (GPU diagnosis, not a test.)

    cd benchmarks && python gpu_decode_profile.py --out $OUT

The decode loop's model (``decode_loop.py``) at one cache length, compiled three ways: eager,
``dynamic=False`` and ``dynamic=True`` (the entry automatic dynamic makes).  For each: per-token wall
time, host time per call (launch only, measured while the GPU keeps up: a sync after every call),
GPU time per call and kernel count (torch.profiler), then the top kernels by GPU time and the top
Python functions by own time (cProfile), so the difference shows as host or as kernels."""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

import ember
from decode_loop import Decoder, empty_caches


def host_and_wall(fn, args, calls: int = 200) -> tuple[float, float]:
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    host = 0.0
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        host += time.perf_counter() - start
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return host / calls * 1e6, (time.perf_counter() - start) / calls * 1e6


def gpu_profile(fn, args, calls: int = 20) -> tuple[float, int, list[tuple[str, float, int]]]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name[:90], []).append(event.device_time_total if hasattr(event, "device_time_total")
                                                          else event.cuda_time_total)
    total = sum(sum(v) for v in kernels.values()) / calls
    count = sum(len(v) for v in kernels.values()) // calls
    top = sorted(((name, sum(v) / calls, len(v) // calls) for name, v in kernels.items()), key=lambda r: -r[1])
    return total, count, top


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", type=int, default=116)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="/tmp/ember_decode_profile")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = Decoder().to("cuda", dtype).eval()
    dim = model.blocks[0].qkv.in_features
    x = torch.randn(1, 1, dim, device="cuda", dtype=dtype)
    report = io.StringIO()
    with torch.no_grad():
        dynamic = ember.compile(model)                   # automatic dynamic: static, then symbolic
        for length in (args.cache - 2, args.cache - 1):
            dynamic(x, empty_caches(model, length, "cuda", dtype))
        caches = empty_caches(model, args.cache, "cuda", dtype)
        static = ember.compile(model, dynamic=False)
        static(x, caches)
        variants = {"eager": model, "static": static, "dynamic": dynamic}
        rows = {}
        for name, fn in variants.items():
            host, wall = host_and_wall(fn, (x, caches))
            gpu, count, top = gpu_profile(fn, (x, caches))
            rows[name] = (host, wall, gpu, count)
            print(f"{name:8s} wall {wall:8.1f} us/token  host {host:8.1f}  gpu {gpu:8.1f}  kernels {count}", file=report)
            for kernel, us, n in top[:12]:
                print(f"      {us:8.1f} us  x{n:3d}  {kernel}", file=report)
        print("dynamic/static: wall %.3f host %.3f gpu %.3f" % tuple(
            rows["dynamic"][i] / rows["static"][i] for i in range(3)), file=report)
        for name in ("static", "dynamic"):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(100):
                variants[name](x, caches)
            torch.cuda.synchronize()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
            print(f"==== cProfile {name} (100 calls)\n" + text.getvalue(), file=report)
    print(report.getvalue())
    with open(os.path.join(args.out, "decode_profile.txt"), "w") as handle:
        handle.write(report.getvalue())


if __name__ == "__main__":
    main()
