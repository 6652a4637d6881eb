"""Where does the host spend a compiled training step?  (GPU diagnosis, not a test.)

    python benchmarks/gpu_host_profile.py --bench .bench --models resnet50 --out $OUT

For each model (harness train batch, bf16): the step's wall time against its GPU time (CUDA
events around the step vs the sum of kernel times from torch.profiler), then cProfile of 5
steps (top functions by own time), ember then eager.  --inductor adds torch.compile's host and
wall time per step (no cProfile: its frames are Dynamo's); --aten adds torch.profiler's CPU
table of each variant's step (host time per aten op and CUDA runtime call: a synchronizing op shows
as cudaStreamSynchronize / cudaMemcpyAsync rows)."""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--out", default="/tmp/ember_host_profile")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--aten", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        profile_model(name, args)


def profile_model(name: str, args: argparse.Namespace) -> None:
    from zoo_train_setup import zoo_training

    import ember
    model, bench, call_args, call_kwargs = zoo_training(name)

    def step(fn):
        model.zero_grad(set_to_none=True)
        bench.loss_fn(fn(*call_args, **call_kwargs)).backward()

    compiled = ember.compile(model)
    variants = [("ember", compiled), ("eager", model)]
    if args.inductor:
        variants.append(("inductor", torch.compile(model)))
    for label, fn in variants:
        for _ in range(3):
            step(fn)
        torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(5):
            step(fn)
        host = (time.perf_counter() - start) / 5 * 1e3     # launches only: the GPU may lag behind
        cpu = (time.process_time() - cpu_start) / 5 * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / 5 * 1e3
        # process CPU time (every thread: CUDA backward runs on autograd's device thread) leaves out
        # the time spent waiting for a core (the hosts are shared)
        best_cpu = min(_cpu_ms(step, fn) for _ in range(5))
        print(f"==== {name} {label}: host {host:.1f} ms per step (until the last launch), wall {wall:.1f} ms, "
              f"process CPU {cpu:.1f} ms (best of 5 single steps {best_cpu:.1f} ms)", flush=True)
        if label != "inductor":
            _cprofile(step, fn, args)
        if args.aten:
            _aten_table(name, label, step, fn, args)


def _cprofile(step, fn, args: argparse.Namespace) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        step(fn)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.rows)
    print(text.getvalue())


def _aten_table(name: str, label: str, step, fn, args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step(fn)
        torch.cuda.synchronize()
    print(f"==== {name} {label}: host time per op over 5 steps (torch.profiler, CPU)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


def _cpu_ms(step, fn) -> float:
    start = time.process_time()
    step(fn)
    return (time.process_time() - start) * 1e3


if __name__ == "__main__":
    main()
