"""Micro-timing of a cache hit's guard check for a 10-input function (not a test).

    python3 benchmarks/guard_overhead.py

Prints microseconds per guard check (binder + generated guard function) and per
full cached call with the eager backend.
"""
from __future__ import annotations

import time

import torch

from ember.capture import compile_function


def ten_inputs(a, b, c, d, e, f, g, h, i, j):
    return a + b + c + d + e + f + g + h + i + j


def per_call_us(fn, repeats: int = 2000, rounds: int = 30) -> float:
    """Best of many short loops of this thread's CPU time (the machine is shared)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(repeats):
            fn()
        best = min(best, (time.thread_time() - start) / repeats * 1e6)
    return best


def main() -> None:
    inputs = [torch.randn(4, 4) for _ in range(10)]
    captured = compile_function(ten_inputs, backend=lambda graph, example_inputs: graph.as_callable())
    captured(*inputs)
    entry = captured.entries[0]
    spec = captured.spec
    G = spec.globals

    def guard_only():
        return entry.guard(spec.bind(inputs, {}), G)

    assert type(guard_only()) is tuple
    guard_us = per_call_us(guard_only)
    call_us = per_call_us(lambda: captured(*inputs), repeats=500)
    eager_us = per_call_us(lambda: ten_inputs(*inputs), repeats=500)
    print(f"guard check (bind + guards), 10 tensor inputs: {guard_us:.2f} us")
    print(f"cached call, eager backend:                     {call_us:.2f} us  (plain eager {eager_us:.2f} us)")
    print(f"{len(entry.guard_texts)} guards; generated source:\n{entry.guard_source}")


if __name__ == "__main__":
    main()
