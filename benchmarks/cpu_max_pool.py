"""CPU max pooling, eager vs ember: ResNet's stem pooling (3x3, stride 2, padding 1) after a ReLU,
forward and forward + backward (not a test).

    EMBER_GENERATED_MAX_POOL=cpu python benchmarks/cpu_max_pool.py [--shape 16,64,112,112] [--iters 20]
                                                                   [--channels-last]

(without EMBER_GENERATED_MAX_POOL, ember runs eager's kernel: config.generated_max_pool_devices).

Prints the median time of each (eager and ember take turns, step by step) and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import ember


def stem_pool(x):
    return F.max_pool2d(torch.relu(x), 3, 2, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="16,64,112,112")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--channels-last", action="store_true")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    torch.manual_seed(0)
    x = torch.randn(shape)
    if args.channels_last:
        x = x.to(memory_format=torch.channels_last)
    compiled = ember.compile(stem_pool)
    for label, train in (("forward", False), ("forward + backward", True)):
        times: dict[str, list[float]] = {"eager": [], "ember": []}
        for i in range(args.iters + 3):
            for name, fn in (("eager", stem_pool), ("ember", compiled)):
                inp = x.clone().requires_grad_(train)
                start = time.perf_counter()
                if train:
                    out = fn(inp)
                    out.backward(torch.ones_like(out))
                else:
                    with torch.no_grad():
                        fn(inp)
                if i >= 3:
                    times[name].append(time.perf_counter() - start)
        eager, ours = (statistics.median(times[n]) * 1e3 for n in ("eager", "ember"))
        print(f"{label}: eager {eager:.2f} ms, ember {ours:.2f} ms, {eager / ours:.2f}x")


if __name__ == "__main__":
    main()
