"""Where a reduce-overhead training step of a zoo model spends its host and GPU time, against eager,
ember and Inductor's reduce-overhead (GPU diagnosis, not a test; the harness in .bench).

    PYTHONPATH=. python benchmarks/gpu_ro_step_phases.py mlp4 eager,ember,ember-ro,inductor-ro

Per variant: the step's median (CUDA events around each step, as run.py), host time of each phase
(cudagraph_mark_step_begin, zero_grad, forward, loss, backward), and for ember-ro the CUDA-graph
counters and torch.profiler's host and device tables over 10 steps.
"""
from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".bench"), HERE]

from zoo_train_setup import phased_step, zoo_training

import ember
from ember.runtime import cudagraphs


def run(label: str, name: str) -> None:
    model, bench, args, kwargs = zoo_training(name)
    if label == "eager":
        fn, mark = model, (lambda: None)
    elif label == "ember":
        fn, mark = ember.compile(model), (lambda: None)
    elif label == "ember-ro":
        fn, mark = ember.compile(model, mode="reduce-overhead"), ember.cudagraph_mark_step_begin
    else:
        fn, mark = torch.compile(model, mode="reduce-overhead"), torch.compiler.cudagraph_mark_step_begin
    step, phases = phased_step(model, fn, bench, args, kwargs, mark)

    for _ in range(30):
        step()
    torch.cuda.synchronize()
    events = []
    for _ in range(300):        # as run.py times a step: CUDA events around it, no sync between
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(True)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = sum(e.self_device_time_total for e in kernels) / 10 / 1e3
    print(f"== {name} {label}: step median {times[150]:.3f} ms p10 {times[30]:.3f}; GPU kernels {gpu:.3f} ms/step; "
          f"host per phase us (mark, zero_grad, forward, loss, backward) {[round(p / 300) for p in phases.values()]}",
          flush=True)
    if label == "ember-ro":
        print("   cudagraph counters", dict(cudagraphs.counters), flush=True)
        print(avg.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60), flush=True)
        print(avg.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60), flush=True)


def main() -> None:
    for name in sys.argv[1].split(","):
        for label in sys.argv[2].split(","):
            try:
                run(label, name)
            except Exception as exc:  # noqa: BLE001 - one variant failing should not hide the others
                print("FAILED", name, label, type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    main()
