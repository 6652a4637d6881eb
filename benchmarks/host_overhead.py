"""Host time per cached call of zoo models (not a test).

    python3 benchmarks/host_overhead.py [--models llama_small,gpt2,resnet50] [--size tiny]

For each model (eval, no_grad, CPU, eager backend) after the cache is warm:

* guards:  bind + the entry's guard-and-fetch function (placeholder values out)
* host:    a full cached call (bind, guards, fetch, call, rebuild the output) with the
           compiled graph replaced by a stub returning its precomputed outputs: everything
           ember adds around the graph per call, measured directly (subtracting two noisy
           multi-millisecond timings would drown it)
* graph:   the compiled graph (eager backend) alone on pre-fetched placeholder values
* eager:   the plain model

Numbers are the best of many short loops of thread CPU time, in microseconds.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from ember.capture import compile_function  # noqa: E402
from zoo_capture import DEFAULT_ZOO, call, eager_backend, import_torchvision_tolerantly, load_zoo  # noqa: E402


def best_us(fn, repeats: int, rounds: int = 100) -> float:
    """Best of many short loops of this thread's CPU time: the shared machine is busy, and
    CPU time does not count the time the thread waits for a core."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(repeats):
            fn()
        best = min(best, (time.thread_time() - start) / repeats * 1e6)
    return best


def measure(zoo: Any, name: str, size: str, repeats: int) -> dict:
    spec = zoo.MODELS[name]
    missing = spec.missing()
    if missing:
        return {"name": name, "status": "unavailable: " + ",".join(missing)}
    bench = spec.build(batch_size=spec.tiny_bs if size == "tiny" else spec.infer_bs,
                       seq_len=(spec.tiny_seq if size == "tiny" else spec.seq_len) if spec.seq_len else None,
                       size=size, device="cpu")
    model = bench.model.eval()
    inputs = bench.example_inputs
    with torch.no_grad():
        captured = compile_function(model, backend=eager_backend)
        call(captured, inputs)
        events = len(captured.events)
        call(captured, inputs)
        if len(captured.events) != events or len(captured.entries) != 1 or captured.entries[0].compiled is None:
            return {"name": name, "status": "not a single cached graph"}
        entry = captured.entries[0]
        fspec = captured.spec
        G = fspec.globals
        args, kwargs = (((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {}))
        placeholders = entry.guard(fspec.bind(args, kwargs), G)
        assert type(placeholders) is tuple
        compiled = entry.compiled
        outputs = compiled(*placeholders)
        guard_us = best_us(lambda: entry.guard(fspec.bind(args, kwargs), G), repeats)
        stub = lambda *values: outputs  # noqa: E731
        entry.compiled, entry._call = stub, stub    # CacheEntry.run calls _call
        try:
            host_us = best_us(lambda: call(captured, inputs), repeats)
        finally:
            entry.compiled = compiled
            entry.__post_init__()
        graph_us = best_us(lambda: compiled(*placeholders), 3, rounds=5)
        eager_us = best_us(lambda: call(model, inputs), 3, rounds=5)
    return {"name": name, "status": "ok", "guards": len(entry.guard_texts), "placeholders": len(placeholders),
            "guard_us": guard_us, "host_us": host_us, "graph_us": graph_us, "eager_us": eager_us}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama_small,gpt2,resnet50")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--zoo", default=DEFAULT_ZOO)
    parser.add_argument("--repeats", type=int, default=20)
    options = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier graph timings; host time is single-threaded anyway
    import_torchvision_tolerantly()
    zoo = load_zoo(options.zoo)
    header = (f"{'model':<14} {'guards':>6} {'inputs':>6} {'guard_us':>9} {'host_us':>9} {'graph_us':>9} "
              f"{'eager_us':>9}")
    print(header)
    print("-" * len(header))
    for name in options.models.split(","):
        row = measure(zoo, name, options.size, options.repeats)
        if row["status"] != "ok":
            print(f"{name:<14} {row['status']}")
            continue
        print(f"{name:<14} {row['guards']:>6} {row['placeholders']:>6} {row['guard_us']:>9.1f} {row['host_us']:>9.1f} "
              f"{row['graph_us']:>9.1f} {row['eager_us']:>9.1f}")


if __name__ == "__main__":
    main()
