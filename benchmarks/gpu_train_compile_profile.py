"""Where does the cold compile of a zoo model's training step go?  (GPU diagnosis, not a test.)

    python benchmarks/gpu_train_compile_profile.py --bench .bench --models vit_base_patch16_224 [--rows 25] [--no-profile]

For each model (harness train batch, bf16, model.train()): the first step (forward + backward, which
compiles both) under cProfile, with empty kernel caches.  Prints the first step's seconds, Triton's
own compile seconds and kernel count (runtime/triton_build.stats), and the functions with the most
cumulative and own time.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="vit_base_patch16_224")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--no-profile", action="store_true", help="time only (cProfile slows the Python stages)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton_cold_"))
    os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember_cold_"))
    for name in args.models.split(","):
        profile_first_step(name, 0 if args.no_profile else args.rows)


def profile_first_step(name: str, rows: int) -> None:
    from zoo_train_setup import zoo_training

    import ember
    from ember.runtime import triton_build

    model, bench, call_args, call_kwargs = zoo_training(name)
    compiled = ember.compile(model)
    before = dict(triton_build.stats)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    if rows:
        profiler.enable()
    bench.loss_fn(compiled(*call_args, **call_kwargs)).backward()
    torch.cuda.synchronize()
    profiler.disable()
    seconds = time.perf_counter() - start
    triton_seconds = triton_build.stats["compile_seconds"] - before.get("compile_seconds", 0)
    kernels = triton_build.stats["kernels_compiled"] - before.get("kernels_compiled", 0)
    print(f"==== {name}: first step {seconds:.1f} s; Triton compile {triton_seconds:.1f} s wall "
          f"for {kernels} distinct kernels")
    for order in ("cumulative", "tottime") if rows else ():
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
        print(f"---- by {order}\n" + text.getvalue().split("\n", 6)[-1], flush=True)


if __name__ == "__main__":
    main()
