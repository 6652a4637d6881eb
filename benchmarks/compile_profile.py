"""Where does ember's cold GPU compile time go?  Runs on a machine without a GPU (not a test).

    python3 benchmarks/compile_profile.py --models gpt2,bert_base [--size full] [--workers 16]

For each zoo model (eval, no_grad, bf16, CPU tensors of the real shapes) the graph is captured and
taken through every compile stage of the CUDA path: prims, lowering + scheduling, Triton source,
then every kernel is compiled for an H100 (sm_90) without a GPU.  Prints seconds per stage, the
kernel count and how many distinct kernels there are.  Absolute seconds depend on this machine's
cores; the split between the stages is what to read.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from zoo_capture import import_torchvision_tolerantly, load_zoo  # noqa: E402

import ember  # noqa: E402
from ember import backend  # noqa: E402
from ember.codegen import triton as triton_codegen  # noqa: E402
from ember.runtime import triton_build  # noqa: E402


def profile_graph(graph, example_inputs, workers: int, report: dict) -> None:
    from triton.backends.compiler import GPUTarget
    t0 = time.perf_counter()
    prim_graph = backend.to_prim_graph(graph)
    t1 = time.perf_counter()
    sched = backend.lower_and_schedule(prim_graph, example_inputs)
    t2 = time.perf_counter()
    source, kernels = triton_codegen.generate_triton(sched, interpret=False)
    t3 = time.perf_counter()
    module = triton_build.load_module(source, interpret=False)
    target = GPUTarget("cuda", 90, 32)
    distinct = [k for k in kernels if k.source.startswith("@triton.jit")]   # the others are aliases
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda k: triton_build._compile(getattr(module, k.name), k, k.aligned, target), distinct))
    t4 = time.perf_counter()
    report.update(prims=t1 - t0, schedule=t2 - t1, triton_source=t3 - t2, triton_compile=t4 - t3,
                  kernels=len(kernels), distinct_bodies=len(distinct), prim_nodes=len(list(prim_graph.call_nodes())))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,bert_base")
    parser.add_argument("--size", default="full")
    parser.add_argument("--zoo", default=os.path.join(HERE, "..", "..", "shared", "bench", "models.py"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch", type=int, default=1, help="1 keeps the CPU eager runs short; kernels are alike")
    parser.add_argument("--channels-last", action="store_true", help="lay out conv graphs as on CUDA")
    args = parser.parse_args()
    import_torchvision_tolerantly()
    if args.channels_last:
        from ember.lower import lowering
        lowering.CHANNELS_LAST_DEVICES = {"cpu", "cuda"}
    zoo = load_zoo(args.zoo)
    os.environ.setdefault("TRITON_CACHE_DIR", f"/tmp/ember-compile-profile-{os.getpid()}")  # cold
    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        bench = spec.build(batch_size=args.batch, seq_len=spec.seq_len or 512, size=args.size, device="cpu")
        model = bench.model.to(torch.bfloat16).eval()
        inputs = bench.example_inputs
        cast = lambda t: t.to(torch.bfloat16) if torch.is_tensor(t) and t.is_floating_point() else t  # noqa: E731
        report: dict = {}

        def timing_backend(graph, example_inputs):
            report["capture"] = time.perf_counter() - start
            profile_graph(graph, example_inputs, args.workers, report)
            return graph.as_callable()
        ember.reset()
        compiled = ember.compile(model, backend=timing_backend)
        start = time.perf_counter()
        with torch.no_grad():
            if isinstance(inputs, dict):
                compiled(**{k: cast(v) for k, v in inputs.items()})
            else:
                compiled(*[cast(v) for v in inputs])
        total = time.perf_counter() - start
        stages = ("capture", "prims", "schedule", "triton_source", "triton_compile")
        backend_s = sum(report.get(s, 0.0) for s in stages)
        print(f"{name}: first call {total:.1f} s (eager run of the graph {total - backend_s:.1f} s), " +
              ", ".join(f"{s} {report.get(s, 0):.2f} s" for s in stages) +
              f"; {report.get('prim_nodes')} prim nodes, {report.get('kernels')} kernels, "
              f"{report.get('distinct_bodies')} distinct (compiled)", flush=True)


if __name__ == "__main__":
    main()
