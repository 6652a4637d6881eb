"""Where a CPU training step of benchmarks/train_cpu.py's nanoGPT block spends its time, eager
against ember: torch.profiler self time of the matmuls and attention (the same kernels in both) and
of everything else (eager's ATen ops; ember's generated kernels show as its autograd Function's
self time).  A diagnosis, not a test.

    python benchmarks/cpu_block_profile.py [--size full|small]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from train_cpu import make_block  # noqa: E402

import ember  # noqa: E402

HEAVY = {"aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul",
         "aten::_scaled_dot_product_flash_attention_for_cpu",
         "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="full", choices=["full", "small"])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    model, x, grad = make_block("nanogpt", args.size)
    x.requires_grad_(True)

    def step(fn):
        for p in model.parameters():
            p.grad = None
        x.grad = None
        fn(x).backward(grad)
    compiled = ember.compile(model)
    for fn in (model, compiled):
        for _ in range(2):
            step(fn)
    for name, fn in (("eager", model), ("ember", compiled)):
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step(fn)
            times.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step(fn)
        events = prof.key_averages()
        per_step = lambda e: e.self_cpu_time_total / args.steps / 1000  # noqa: E731
        heavy = sum(per_step(e) for e in events if e.key in HEAVY)
        rest = sum(per_step(e) for e in events if e.key not in HEAVY)
        print(f"== {name}: best step {min(times) * 1000:.1f} ms; matmuls and attention {heavy:.1f} ms, "
              f"the rest {rest:.1f} ms (profiled self time per step)")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
            print(f"   {e.key[:60]:60s} {per_step(e):8.2f} ms  x{e.count // args.steps}")


if __name__ == "__main__":
    main()
