"""Why is a host-bound training step slower under ember than in eager?  (GPU diagnosis, not a test.)

    PYTHONPATH=. python benchmarks/gpu_step_phases.py --bench .bench --models mlp4

For each model (the harness's train batch, bf16) and each of eager and ember:
  * host time of each phase of a step (zero_grad, forward, loss, backward), with the GPU drained
    before the step, so a phase that waits for the GPU shows as a long phase;
  * the caching allocator's device mallocs and frees, allocation retries and stream syncs over 50
    steps (a cudaFree synchronizes the device);
  * the garbage collections during those steps, by generation;
  * CUDA calls that synchronize (torch.cuda.set_sync_debug_mode("warn") over a few steps);
  * the Python threads alive after compilation (a busy thread takes the GIL from the step);
  * with --profile-forward, cProfile of ember's forward calls alone.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="mlp4")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--profile-forward", action="store_true", help="cProfile ember's forward calls")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    for name in args.models.split(","):
        diagnose(name, args.steps, args.profile_forward)


def diagnose(name: str, steps: int, profile_forward: bool) -> None:
    from zoo_train_setup import phased_step, zoo_training

    import ember
    model, bench, call_args, call_kwargs = zoo_training(name)
    variants = [("eager", model), ("ember", ember.compile(model))]
    for label, fn in variants:
        step, phases = phased_step(model, fn, bench, call_args, call_kwargs)
        for _ in range(5):
            step(False)
        torch.cuda.synchronize()
        for _ in range(steps):        # drained GPU before each step: a phase that waits shows
            step(True)
            torch.cuda.synchronize()
        drained = {k: v / steps for k, v in phases.items()}
        phases.update(dict.fromkeys(phases, 0.0))
        before = torch.cuda.memory_stats()
        collections: list[tuple[int, float]] = []
        gc_started = [0.0]

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                gc_started[0] = time.perf_counter()
            else:
                collections.append((info["generation"], (time.perf_counter() - gc_started[0]) * 1e6))
        gc.callbacks.append(on_gc)
        start = time.perf_counter()
        for _ in range(steps):        # back to back, as the harness times them (but with gc on)
            step(True)
        host = (time.perf_counter() - start) / steps * 1e6
        gc.callbacks.remove(on_gc)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps * 1e6
        after = torch.cuda.memory_stats()
        pipelined = {k: v / steps for k, v in phases.items()}
        counts = {k: after.get(k, 0) - before.get(k, 0)
                  for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams",
                            "num_ooms")}
        print(f"==== {name} {label}: back-to-back host {host:.0f} us/step, wall {wall:.0f} us/step")
        print("  phases, GPU drained first (us):", {k: round(v) for k, v in drained.items()})
        print("  phases, back to back (us):     ", {k: round(v) for k, v in pipelined.items()})
        print(f"  allocator over {steps} steps:", counts)
        by_generation: dict[int, list[float]] = {}
        for generation, us in collections:
            by_generation.setdefault(generation, []).append(us)
        print(f"  garbage collections over {steps} steps (count, mean us):",
              {g: (len(v), round(sum(v) / len(v))) for g, v in sorted(by_generation.items())},
              f"gc objects {len(gc.get_objects())}, thresholds {gc.get_threshold()}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(3):
                    step(False)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        syncs = sorted({str(w.message)[:160] for w in caught})
        print(f"  synchronizing calls in 3 steps: {len(caught)}", *syncs, sep="\n    ")
        print("  threads:", [t.name for t in threading.enumerate()], flush=True)
        if label == "ember" and profile_forward:
            _profile_forward(fn, call_args, call_kwargs)


def _profile_forward(fn, call_args, call_kwargs) -> None:
    """cProfile of 200 compiled forward calls (grad mode on, outputs dropped), own time first."""
    import cProfile
    import io
    import pstats
    for _ in range(10):
        fn(*call_args, **call_kwargs)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        fn(*call_args, **call_kwargs)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(28)
    print(text.getvalue(), flush=True)


if __name__ == "__main__":
    main()
