"""When does each part of a cold training compile happen?  (GPU diagnosis, not a test.)

    python benchmarks/gpu_compile_timeline.py --bench .bench --models nanogpt,gpt2 [--out DIR]

For each zoo model, in a fresh process with empty kernel caches (as the harness's `compile_s`):
the first training step (forward, the harness's loss, backward) with a timeline of ember's
compile phases, each as [start, end] seconds from the step's start: capture, every
backend compile (forward, backward), their lowering and scheduling, Triton source, the kernel
builds and how long they waited for the worker processes, the workers' start-up, the forward's
first run, the backward call.  Wraps ember's functions from outside; changes nothing.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="nanogpt")
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script (C++ kernels)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.bench, args.child, args.device)
        return
    lines = []
    for name in args.models.split(","):
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton_cold_"),
                   EMBER_CACHE_DIR=tempfile.mkdtemp(prefix="ember_cold_"))
        done = subprocess.run([sys.executable, __file__, "--bench", args.bench, "--device", args.device,
                               "--child", name], env=env,
                              capture_output=True, text=True)
        sys.stderr.write(done.stderr[-3000:])
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                lines.append(line)
                report(json.loads(line))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "compile_timeline.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")


def report(result: dict) -> None:
    print(f"==== {result['model']}: first step {result['step_s']:.2f} s")
    for name, start, end in sorted(result["events"], key=lambda e: e[1]):
        print(f"  {start:7.2f} -> {end:7.2f}  ({end - start:6.2f} s)  {name}")


def child(bench: str, name: str, device: str) -> None:
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.abspath(bench))
    import torch
    from zoo_train_setup import zoo_training

    import ember
    from ember import backend
    from ember.autodiff import training
    from ember.capture import cache
    from ember.runtime import triton_build

    events: list[tuple[str, float, float]] = []
    origin = [time.perf_counter()]
    lock = threading.Lock()

    def timed(owner: object, attribute: str, label: object) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def wrapper(*args: object, **kwargs: object) -> object:
            start = time.perf_counter() - origin[0]
            try:
                return original(*args, **kwargs)
            finally:
                text = label(*args) if callable(label) else label
                with lock:
                    events.append((text, start, time.perf_counter() - origin[0]))
        setattr(owner, attribute, wrapper)

    def graph_size(graph: object, *rest: object) -> str:
        return f"backend compile ({len(graph.nodes)} nodes)"

    timed(cache.CapturedFunction, "_capture_with", "capture + compile (whole miss)")
    timed(backend, "compile_from_specs", graph_size)
    timed(backend, "to_prim_graph", "prims")
    timed(training, "build_joint", "autodiff: joint graph")
    timed(training, "partition", "autodiff: partition")
    timed(backend, "lower_graph", "lower")
    timed(backend, "schedule", "schedule")
    timed(backend, "_generate", "codegen + kernel build + wrapper")
    timed(triton_build, "build", lambda source, kernels, *rest: f"triton build ({len(kernels)} kernels)")
    timed(triton_build, "_precompile_in_processes",
          lambda source, kernels, *rest: f"  worker precompile ({len(kernels)} kernels)")
    timed(training.TrainingStep, "compile_backward", "backward compile (first backward call)")

    ready_at: list[float] = []
    original_start = triton_build.start_compile_workers

    def start_workers() -> None:
        started = time.perf_counter() - origin[0]
        original_start()
        pool = triton_build._process_pool
        if pool is not None:
            probe = pool.submit(time.time)
            probe.add_done_callback(lambda _: ready_at.append(time.perf_counter() - origin[0]))
            events.append(("workers started", started, started))
    triton_build.start_compile_workers = start_workers

    size = "full" if device == "cuda" else "tiny"
    model, bench, call_args, call_kwargs = zoo_training(name, device=device, size=size)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    compiled = ember.compile(model)
    sync()
    origin[0] = time.perf_counter()
    out = compiled(*call_args, **call_kwargs)
    sync()
    forward_done = time.perf_counter() - origin[0]
    loss = bench.loss_fn(out)
    backward_start = time.perf_counter() - origin[0]
    loss.backward()
    sync()
    step = time.perf_counter() - origin[0]
    events.append(("forward call (compile + first run)", 0.0, forward_done))
    events.append(("backward call (compile + first run)", backward_start, step))
    if ready_at:
        events.append(("first worker task done (a worker is up)", ready_at[0], ready_at[0]))
    print(json.dumps({"model": name, "step_s": step, "events": events,
                      "kernels": triton_build.stats.get("kernels_compiled"),
                      "triton_s": triton_build.stats.get("compile_seconds")}))


if __name__ == "__main__":
    main()
