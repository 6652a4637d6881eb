"""Where does a zoo model's training step spend its time and memory under ember vs eager?
(GPU diagnosis, not a test.)

    python benchmarks/gpu_train_profile.py --bench .bench --models resnet50,bert_base --out $OUT

For each model (the harness's train batch, bf16, model.train(), the harness's fp32 loss):
  * what ember compiled: each graph's kind (kernels / autograd / eager and why), kernel counts;
  * memory: allocated after the forward (what is kept for the backward) and the step's peak,
    eager vs ember; saved-tensor copies made because a saved layout differs from the compiled one;
  * a torch.profiler table of the top CUDA kernels of 3 steps, eager and ember, and GPU time per
    step by kind (generated, matmul, attention, ...: compare with --inductor);
  * each generated kernel's time against its bytes at 3 TB/s, by gap (benchmarks/kernel_floor.py);
  * ember's generated code ($OUT/<model>_code.txt); on a compile error, the traceback and the
    failing kernel module.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_floor import category_times, floor_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--out", default="/tmp/ember_train_profile")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, default=22)
    parser.add_argument("--inductor", action="store_true", help="also profile torch.compile's step")
    parser.add_argument("--options", default="{}", help='ember.compile options as JSON, e.g. {"fallback": "error"}')
    parser.add_argument("--dynamic", action="store_true",
                        help="compile with dynamic=True, conv training graphs included (CUDA compiles them "
                             "static otherwise): what makes symbolic sizes slower")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        try:
            profile_model(name, args)
        except Exception:
            print(f"==== {name}: FAILED\n{traceback.format_exc()}", flush=True)
            _copy_failed_kernels(traceback.format_exc(), os.path.join(args.out, f"{name}_failed_kernels"))


def profile_model(name: str, args: argparse.Namespace) -> None:
    from zoo_train_setup import zoo_training

    import ember
    from ember import backend
    from ember.autodiff import training
    from ember.debug import logs

    model, bench, call_args, call_kwargs = zoo_training(name, getattr(torch, args.dtype))

    def step(fn):
        model.zero_grad(set_to_none=True)
        loss = bench.loss_fn(fn(*call_args, **call_kwargs))
        loss.backward()

    # what ember compiles, and the saved-tensor copies it makes at backward time
    graphs: list[str] = []
    compile_from_specs = backend.compile_from_specs

    def recording(graph, specs, options):
        compiled = compile_from_specs(graph, specs, options)
        graphs.append(f"{compiled.kind}: {compiled.kernel_count} kernels, {compiled.extern_count} externs"
                      + (f" ({compiled.eager_reason})" if compiled.eager_reason else ""))
        return compiled
    backend.compile_from_specs = recording
    copies = {"count": 0, "bytes": 0}
    in_layout = training._in_layout

    def counting(value, meta):
        result = in_layout(value, meta)
        if result is not value:
            copies["count"] += 1
            copies["bytes"] += result.numel() * result.element_size()
        return result
    training._in_layout = counting

    if args.dynamic:
        backend._check_dynamic_support = lambda *_: None
    compiled = ember.compile(model, options=json.loads(args.options), dynamic=True if args.dynamic else None)
    with open(os.path.join(args.out, f"{name}_code.txt"), "w") as code_file:
        logs.set_logs("output_code")
        real_stderr, sys.stderr = sys.stderr, code_file
        start = time.perf_counter()
        try:
            step(compiled)
            torch.cuda.synchronize()
        finally:
            sys.stderr = real_stderr
            logs.set_logs("")
    print(f"==== {name}: first ember step (compile) {time.perf_counter() - start:.1f} s; graphs: {graphs}")
    copies.update(count=0, bytes=0)

    runs = [("eager", model), ("ember", compiled)]
    if args.inductor:
        start = time.perf_counter()
        inductor = torch.compile(model)
        step(inductor)
        torch.cuda.synchronize()
        print(f"==== {name}: first inductor step (compile) {time.perf_counter() - start:.1f} s")
        runs.append(("inductor", inductor))
    for label, fn in runs:
        for _ in range(3):
            step(fn)
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(*call_args, **call_kwargs)
        kept = torch.cuda.memory_allocated() - base
        loss = bench.loss_fn(out)
        del out
        loss.backward()
        del loss
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        times = []
        for _ in range(5):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            step(fn)
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step(fn)
            torch.cuda.synchronize()
        print(f"---- {name} {label}: step {sorted(times)[2]:.2f} ms; kept after forward {kept / 2**20:.0f} MB; "
              f"peak over the step {peak / 2**20:.0f} MB"
              + (f"; saved-layout copies per step {copies['count']} ({copies['bytes'] / 2**20:.0f} MB)"
                 if label == "ember" else ""))
        copies.update(count=0, bytes=0)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=100))
        times = _kernel_times_us(prof, steps=3)
        print(f"---- {name} {label}: GPU us per step by kind: "
              + ", ".join(f"{kind} {us:.0f}" for kind, us in sorted(category_times(times).items())))
        if label == "ember":
            with open(os.path.join(args.out, f"{name}_code.txt")) as code_file:
                print(floor_table(code_file.read(), times, rows=args.rows))
    backend.compile_from_specs = compile_from_specs
    training._in_layout = in_layout


def _kernel_times_us(prof, steps: int) -> dict[str, float]:
    """GPU time per step of each kernel name (torch.profiler sums a name over its launches)."""
    times = {}
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None)
        if device_us is None:
            device_us = event.cuda_time_total
        # the profile records CUDA activity only: every event is a kernel, copy or fill
        if device_us:
            times[event.key] = device_us / steps
    return times


def _copy_failed_kernels(text: str, destination: str) -> None:
    """The kernel modules a Triton compile error names (the kernel cache keeps the source)."""
    from ember import config
    root = os.path.join(config.kernel_cache_dir(), "triton")
    if not os.path.isdir(root):
        return
    newest = sorted((os.path.getmtime(os.path.join(d, f)), os.path.join(d, f))
                    for d, _, files in os.walk(root) for f in files if f.endswith(".py"))[-3:]
    os.makedirs(destination, exist_ok=True)
    for _, path in newest:
        shutil.copy(path, destination)


if __name__ == "__main__":
    main()
