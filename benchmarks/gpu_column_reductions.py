"""Block shapes for column reductions on the GPU: BatchNorm's statistics and gradient sums over a
channels-last activation (the reduced N, H, W dims are strided, channels are contiguous).
(GPU tuning evidence, not a test.)

    python benchmarks/gpu_column_reductions.py [--quick] > $OUT/columns.txt

For each ResNet-50 activation shape (batch 64, bf16, channels-last) and each variant of the
column-reduction knobs (``codegen/triton.py`` TUNING: column_xblock / column_rblock /
column_warps / column_few_elements; ``config.column_min_programs``; the split policy's
target_rows), ember compiles the case and times it (CUDA-graph replays, L2 flushed; the
``gpu_kernels.device_time_ms`` clock).  Prints us and the fraction of 3.0 TB/s that the bytes read
(the activation, once) would take.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import ember  # noqa: E402
from ember import config as ember_config  # noqa: E402
from ember.codegen import triton as triton_codegen  # noqa: E402
from ember.lower import split_reductions  # noqa: E402
from gpu_kernels import device_time_ms  # noqa: E402

SHAPES = [(64, 64, 112, 112), (64, 256, 56, 56), (64, 512, 28, 28), (64, 1024, 14, 14), (64, 2048, 7, 7)]
BANDWIDTH = 3.0e12


def bn_stats(x):
    return torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)


def bn_gradient_sums(dy, x):
    g = dy.float()
    return g.sum((0, 2, 3)), (g * x.float()).sum((0, 2, 3))


CASES = {"bn_stats": (bn_stats, 1), "bn_gradient_sums": (bn_gradient_sums, 2)}

VARIANTS = {
    "current": {},
    "x32_r64": {"tuning": {"column_xblock": 32, "column_rblock": 64}},     # Welford's tiles before
    "few_off": {"tuning": {"column_few_elements": 0}},
    "x64_w8": {"min_programs": 0, "tuning": {"column_warps": 8}},
    "x64_r32": {"min_programs": 0, "tuning": {"column_rblock": 32}},
    "r128_w8": {"tuning": {"column_rblock": 128, "column_warps": 8}},
    "rows16k": {"target_rows": 16384},
    "rows64k": {"target_rows": 65536},
}


def apply(variant: dict) -> None:
    triton_codegen.TUNING.clear()
    triton_codegen.TUNING.update(variant.get("tuning", {}))
    ember_config.column_min_programs = variant.get("min_programs", DEFAULT_MIN_PROGRAMS)
    split_reductions.SPLIT_POLICIES["cuda"] = dataclasses.replace(
        DEFAULT_POLICY, target_rows=variant.get("target_rows", DEFAULT_POLICY.target_rows))
    ember.reset()


DEFAULT_MIN_PROGRAMS = ember_config.column_min_programs
DEFAULT_POLICY = split_reductions.SPLIT_POLICIES["cuda"]


def kernel_times_us(fn, calls: int = 20) -> list[float]:
    """Each kernel's GPU time per call, in launch order (torch.profiler; L2 not flushed)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_call = len(kernels) // calls
    return [round(sum(k.device_time for k in kernels[i::per_call]) / calls, 1) for i in range(per_call)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="two shapes")
    args = parser.parse_args()
    shapes = SHAPES[:2] if args.quick else SHAPES
    results = {}
    for case, (fn, arity) in CASES.items():
        for shape in shapes:
            inputs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
                      for _ in range(arity)]
            expected = fn(*inputs)
            eager_us = device_time_ms(lambda: fn(*inputs)) * 1e3
            nbytes = sum(t.numel() * t.element_size() for t in inputs)
            row = {"case": case, "shape": shape, "floor_us": nbytes / BANDWIDTH * 1e6, "eager_us": eager_us}
            for name, variant in VARIANTS.items():
                apply(variant)
                compiled = ember.compile(fn)
                got = compiled(*inputs)
                error = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item() for a, b in zip(got, expected))
                row[name] = round(device_time_ms(lambda: compiled(*inputs)) * 1e3, 1)
                row[name + "_kernels"] = kernel_times_us(lambda: compiled(*inputs))
                if error > 1e-3:
                    row[name + "_error"] = error
            apply({})
            results.setdefault(case, []).append(row)
            print(json.dumps(row), flush=True)
    print("\nus per call (floor = activation bytes at 3 TB/s)")
    for case, rows in results.items():
        print(f"\n{case}")
        print(f"{'variant':14}" + "".join(f"{'x'.join(map(str, r['shape'][1:3])):>12}" for r in rows) + f"{'sum':>10}")
        for name in ["floor_us", "eager_us", *VARIANTS]:
            values = [r[name] for r in rows]
            print(f"{name:14}" + "".join(f"{v:12.1f}" for v in values) + f"{sum(values):10.1f}")
        print("each kernel's us per call (profiler):")
        for name in VARIANTS:
            print(f"{name:14}" + "".join(f"{'+'.join(map(str, r[name + '_kernels'])):>24}" for r in rows))


if __name__ == "__main__":
    main()
