"""What is alive at the peak of one training step, eager against ember (the GPU machine).

    python3 benchmarks/gpu_peak_memory.py --bench .bench --models nanogpt[,gpt2] [--out DIR]

Builds each zoo model as ``run.py --mode train --dtype bfloat16`` does and runs its step (zero_grad
with set_to_none, forward, the zoo's loss, backward; the step's output stays referenced until the
backward ends, as in the harness).  After two warm-up steps, one step is recorded with the CUDA
caching allocator's history (``torch.cuda.memory._record_memory_history``).  Replaying the
allocation events gives the step's peak of allocated bytes and the allocations alive at it, each
charged to the innermost Python frame outside torch (a line of the model, of the zoo's loss, or
of ember's generated wrapper).  Printed per model and compiler: the peak (also as
``torch.cuda.max_memory_allocated`` saw it), the bytes allocated before the step, and the live
allocations at the peak grouped by frame, largest first.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

MB = 2 ** 20


def frame_of(frames: list[dict]) -> str:
    """The innermost frame that is not torch's own (frames are innermost first)."""
    for frame in frames:
        name = frame.get("filename", "")
        if "/torch/" in name or name.startswith("<frozen") or "/contextlib.py" in name:
            continue
        return f"{os.path.basename(name)}:{frame.get('line')} {frame.get('name')}"
    return "?"


def replay(events: list[dict], base: int) -> tuple[int, list[tuple[int, str]]]:
    """(peak allocated bytes, [(bytes, frame)] alive at the peak) from the history's events."""
    live: dict[int, tuple[int, str]] = {}
    current = peak = base
    at_peak: list[tuple[int, str]] = []
    for event in events:
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = (event["size"], frame_of(event.get("frames", [])))
            current += event["size"]
            if current > peak:
                peak, at_peak = current, list(live.values())
        elif action == "free_requested" and event["addr"] in live:
            current -= live.pop(event["addr"])[0]
        elif action == "free_requested":
            current -= event["size"]        # allocated before the recording began
    return peak, at_peak


def measure(step, label: str, lines: list[str]) -> None:
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=500000)
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats_peak = torch.cuda.max_memory_allocated()
    events = snapshot["device_traces"][torch.cuda.current_device()]
    peak, at_peak = replay(events, base)
    lines.append(f"## {label}: peak {peak / MB:.1f} MB (max_memory_allocated {stats_peak / MB:.1f}), "
                 f"before the step {base / MB:.1f} MB, {len(events)} events")
    grouped: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for size, frame in at_peak:
        grouped[frame] += size
        counts[frame] += 1
    for frame, size in grouped.most_common(25):
        lines.append(f"  {size / MB:9.1f} MB  {counts[frame]:4d}x  {frame}")
    lines.append(f"  alive at the peak, allocated in the step: {sum(grouped.values()) / MB:.1f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="nanogpt")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    import models as zoo
    import run as harness   # the harness's own input casting and calling convention  # the harness's zoo (.bench/models.py)

    import ember
    lines: list[str] = []
    device = torch.device("cuda")
    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        torch.manual_seed(0)
        bench = spec.build(batch_size=spec.train_bs, seq_len=spec.seq_len, size="full", device=device)
        model = bench.model.to(device=device, dtype=torch.bfloat16).train()
        inputs = harness.cast_inputs(bench.example_inputs, "cuda", torch.bfloat16)

        def step(callable_model) -> None:
            model.zero_grad(set_to_none=True)
            out = harness.call(callable_model, inputs)
            bench.loss_fn(out).backward()
            del out

        measure(lambda: step(model), f"{name} eager", lines)
        compiled = ember.compile(model)
        measure(lambda: step(compiled), f"{name} ember", lines)
        del compiled, model, bench
        ember.reset()
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "peak_memory.txt"), "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
