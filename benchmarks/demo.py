"""Compile one nanoGPT transformer block with ember; print eager vs compiled time and the error.

    python3 benchmarks/demo.py [--iters 20] [--device cpu|cuda] [--backend ember]

Small enough for a 2-core CPU (well under 2 minutes); larger sizes on CUDA.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # ember without `pip install -e`, and the shared fixtures
from models import make_gpt_block

import ember


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], iters: int, device: str) -> float:
    times = []
    for _ in range(iters):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--backend", default="ember", help=f"one of {ember.list_backends()}")
    args = parser.parse_args()

    if args.device == "cuda":
        sizes = {"batch": 16, "seq": 512, "n_embd": 768, "n_head": 12}
    else:
        sizes = {"batch": 8, "seq": 64, "n_embd": 128, "n_head": 4}
    model, inputs = make_gpt_block(**sizes)
    model = model.to(args.device).eval()
    inputs = tuple(t.to(args.device) for t in inputs)
    print(f"ember demo: nanoGPT block {sizes} on {args.device}, backend={args.backend!r}, torch {torch.__version__}")

    with torch.no_grad():
        report = ember.explain_with(backend=args.backend)(model, *inputs)
        print(report)
        compiled = ember.compile(model, backend=args.backend)
        start = time.perf_counter()
        out = compiled(*inputs)
        synchronize(args.device)
        print(f"first compiled call (capture + compile + run): {time.perf_counter() - start:.2f} s")
        expected = model(*inputs)
        for _ in range(3):  # warm-up
            model(*inputs)
            compiled(*inputs)
        eager_ms = median_ms(lambda: model(*inputs), args.iters, args.device)
        compiled_ms = median_ms(lambda: compiled(*inputs), args.iters, args.device)

    max_abs = (out.double() - expected.double()).abs().max().item()
    print(f"eager    {eager_ms:8.3f} ms  (median of {args.iters})")
    print(f"compiled {compiled_ms:8.3f} ms  (median of {args.iters})  speedup {eager_ms / compiled_ms:.2f}x")
    print(f"max abs error {max_abs:.2e}")
    return 0 if max_abs < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
