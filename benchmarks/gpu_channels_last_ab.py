"""A/B: conv graphs channels-last (lowering.CHANNELS_LAST_DEVICES) or not, same process (GPU, not a test).

    python benchmarks/gpu_channels_last_ab.py --bench .bench --models mobilenet_v3_large,resnet50

Per model (bf16 inference, zoo batch size): eager, ember NCHW and ember channels-last, each timed
in alternating rounds (median ms per call, CUDA-synchronized wall time), plus host time per call
(no sync) to tell launch-bound from GPU-bound.
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch


def wall_ms(fn, iters=30, sync=True):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
        if sync:
            torch.cuda.synchronize()
    host = (time.perf_counter() - start) * 1e3 / iters
    torch.cuda.synchronize()
    return host


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="mobilenet_v3_large,resnet50")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    import models as zoo

    import ember
    from ember.lower import lowering
    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        bench = spec.build(batch_size=spec.infer_bs, seq_len=spec.seq_len or 512, size="full", device="cuda")
        model = bench.model.to(torch.bfloat16).eval()
        x = [v.to(torch.bfloat16) if v.is_floating_point() else v for v in bench.example_inputs]
        variants = {"eager": model}
        for label, devices in (("ember NCHW", set()), ("ember channels-last", {"cuda"})):
            lowering.CHANNELS_LAST_DEVICES = devices
            compiled = ember.compile(copy.deepcopy(model))       # its own capture cache
            with torch.no_grad():
                start = time.perf_counter()
                compiled(*x)
                torch.cuda.synchronize()
                print(f"{name} {label}: first call {time.perf_counter() - start:.1f} s", flush=True)
            variants[label] = compiled
        results = {k: [] for k in variants}
        host = {k: [] for k in variants}
        with torch.no_grad():
            for _ in range(5):
                for label, fn in variants.items():
                    results[label].append(wall_ms(lambda: fn(*x)))
                    host[label].append(wall_ms(lambda: fn(*x), iters=10, sync=False))
        for label in variants:
            print(f"{name} {label}: {statistics.median(results[label]):.3f} ms per call "
                  f"(rounds {[round(v, 2) for v in results[label]]}), host {statistics.median(host[label]):.3f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
