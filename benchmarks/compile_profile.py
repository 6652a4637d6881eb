"""Where does ember's cold GPU compile time go?  Runs on a machine without a GPU (not a test).

    python3 benchmarks/compile_profile.py --models gpt2,bert_base [--size full] [--workers 16]
    python3 benchmarks/compile_profile.py --train --models gpt2 [--no-triton-compile] [--dump DIR]

For each zoo model (bf16, CPU tensors of the real shapes, batch 1) the graph is captured and
taken through every compile stage of the CUDA path: prims, lowering + scheduling, Triton source,
then every kernel is compiled for an H100 (sm_90) without a GPU.  Prints seconds per stage, the
kernel count and how many distinct kernels there are.  Absolute seconds depend on this machine's
cores; the split between the stages is what to read.

``--train`` (model.train(), grad on): the captured graph goes through autodiff as
``autodiff/training.py`` runs it (joint graph, partition, the forward and then the backward
compiled from metadata); the stages of both halves are added up.  The tensors are on the CPU with
the CUDA path's device policies switched on for them (``cuda_policies_on_cpu``).  The wrapper (host
program) is not generated: it needs the built kernels.  ``--dump DIR`` writes each graph's Triton
source (to check that a change leaves the generated code byte-identical).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from zoo_capture import import_torchvision_tolerantly, load_zoo  # noqa: E402

import ember  # noqa: E402
from ember import backend  # noqa: E402
from ember.api import CompileOptions  # noqa: E402
from ember.codegen import triton as triton_codegen  # noqa: E402
from ember.lower.lowering import lower_graph  # noqa: E402
from ember.lower.scheduler import schedule  # noqa: E402
from ember.lower.split_reductions import split_reductions  # noqa: E402
from ember.runtime import triton_build  # noqa: E402

class GraphProfiled(Exception):
    """Raised by the timing backend once the stages are timed: the graph need not run."""


STAGES = ("capture", "prims", "autodiff", "lower", "schedule", "triton_source", "triton_compile")


class StageClock:
    """Seconds per stage, added up over the graphs of one model (a training step has two)."""

    def __init__(self, report: dict) -> None:
        self.report = report

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.report[name] = self.report.get(name, 0.0) + time.perf_counter() - start

    def count(self, name: str, n: int) -> None:
        self.report[name] = self.report.get(name, 0) + n


def cuda_policies_on_cpu() -> None:
    """The CUDA path's device policies (fused attention and its backward, matmul padding,
    channels-last convolutions) for the CPU tensors this machine has: the meta device cannot
    stand in for CUDA tensors (prims copies and probes some values).  Other CPU-only rules (the
    CPU's own attention decomposition, extern layout probes) still apply."""
    from ember.autodiff import extern_rules
    from ember.lower import lowering
    from ember.prims.decompositions import attention
    for devices in (attention.FUSED_TRAINING_DEVICES, extern_rules.ATEN_ATTENTION_BACKWARD_DEVICES,
                    extern_rules.FUSED_BACKWARD_DEVICES, lowering.PAD_MATMUL_DEVICES,
                    lowering.FUSED_ATTENTION_DEVICES):
        devices.add("cpu")


def compile_cuda_stages(prim_graph, specs, clock: StageClock, args, dump_name: str) -> object:
    """compile_prim_graph's stages for CUDA, without a GPU: lowering, scheduling, Triton source and
    (unless --no-triton-compile) every distinct kernel compiled for sm_90."""
    with clock.stage("lower"):
        program = lower_graph(prim_graph, specs)
        if ember.config.split_reductions:
            program = split_reductions(program, "cuda")
    with clock.stage("schedule"):
        sched = schedule(program)
    with clock.stage("triton_source"):
        source, kernels = triton_codegen.generate_triton(sched, interpret=False)
    distinct = [k for k in kernels if k.source.startswith("@triton.jit")]   # the others are aliases
    clock.count("kernels", len(kernels))
    clock.count("distinct_bodies", len(distinct))
    clock.count("prim_nodes", len(list(prim_graph.call_nodes())))
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        with open(os.path.join(args.dump, f"{dump_name}.py"), "w") as f:
            f.write(source)
    if not args.no_triton_compile:
        from triton.backends.compiler import GPUTarget
        with clock.stage("triton_compile"):
            module = triton_build.load_module(source, interpret=False)
            target = GPUTarget("cuda", 90, 32)
            with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
                list(pool.map(lambda k: triton_build._compile(getattr(module, k.name), k, k.aligned, target),
                              distinct))
    return backend.CompiledGraph(lambda *inputs: None, "kernels", source, len(sched.kernels), len(sched.externs),
                                 sched)


def profile_inference(graph, example_inputs, clock: StageClock, args, name: str) -> None:
    specs = backend.input_specs(example_inputs)
    with clock.stage("prims"):
        prim_graph = backend.to_prim_graph(graph, specs)
    compile_cuda_stages(prim_graph, specs, clock, args, f"{name}-inference")


def profile_training(graph, example_inputs, clock: StageClock, args, name: str) -> None:
    """autodiff/training.py's compile_training and the backward's compile, with backend's
    compile_prim_graph replaced by the CUDA stages above (the time outside them is autodiff's)."""
    from ember.autodiff import training
    specs = [placeholder.extra.get("symbolic_meta", spec)
             for placeholder, spec in zip(graph.placeholders, backend.input_specs(example_inputs))]
    with clock.stage("prims"):
        prim_graph = backend.to_prim_graph(graph, specs)
    halves = iter(("forward", "backward"))
    inner = {"seconds": 0.0}

    def cuda_stages(prim_graph, specs, options):
        start = time.perf_counter()
        try:
            return compile_cuda_stages(prim_graph, specs, clock, args, f"{name}-{next(halves)}")
        finally:
            inner["seconds"] += time.perf_counter() - start
    original = backend.compile_prim_graph
    backend.compile_prim_graph = cuda_stages
    try:
        start = time.perf_counter()
        compiled = training.compile_training(graph, prim_graph, specs, CompileOptions.from_options(None))
        if compiled.kind == "autograd":
            compiled.call.compile_backward()
        clock.report["autodiff"] = time.perf_counter() - start - inner["seconds"]
    finally:
        backend.compile_prim_graph = original


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,bert_base")
    parser.add_argument("--size", default="full")
    parser.add_argument("--zoo", default=os.path.join(HERE, "..", "..", "shared", "bench", "models.py"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch", type=int, default=1, help="1 keeps the CPU eager runs short; kernels are alike")
    parser.add_argument("--channels-last", action="store_true", help="lay out conv graphs as on CUDA")
    parser.add_argument("--train", action="store_true", help="the training step's forward and backward graphs")
    parser.add_argument("--no-triton-compile", action="store_true", help="stop after the Triton source")
    parser.add_argument("--run-graph", action="store_true", help="run the graph eagerly after timing it "
                        "(the model's first call then completes; by default it stops at the backend)")
    parser.add_argument("--dump", help="write each graph's Triton source into this directory")
    parser.add_argument("--profile", help="write a cProfile of the backend stages to this file")
    args = parser.parse_args()
    import_torchvision_tolerantly()
    cuda_policies_on_cpu()
    if args.channels_last:
        from ember.lower import lowering
        lowering.CHANNELS_LAST_DEVICES = {"cpu", "cuda"}
    zoo = load_zoo(args.zoo)
    os.environ.setdefault("TRITON_CACHE_DIR", f"/tmp/ember-compile-profile-{os.getpid()}")  # cold
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        torch.manual_seed(0)
        bench = spec.build(batch_size=args.batch, seq_len=spec.seq_len or 512, size=args.size, device="cpu")
        model = bench.model.to(torch.bfloat16)
        model = model.train() if args.train else model.eval()
        inputs = bench.example_inputs
        cast = lambda t: t.to(torch.bfloat16) if torch.is_tensor(t) and t.is_floating_point() else t  # noqa: E731
        report: dict = {}
        clock = StageClock(report)

        def timing_backend(graph, example_inputs):
            report["capture"] = time.perf_counter() - start
            if profiler:
                profiler.enable()
            try:
                (profile_training if args.train else profile_inference)(graph, example_inputs, clock, args, name)
            finally:
                if profiler:
                    profiler.disable()
            if args.run_graph:
                return graph.as_callable()
            raise GraphProfiled

        ember.reset()
        compiled = ember.compile(model, backend=timing_backend, options={"fallback": "error"})
        start = time.perf_counter()
        stopped = None
        with torch.enable_grad() if args.train else torch.no_grad():
            try:
                if isinstance(inputs, dict):
                    compiled(**{k: cast(v) for k, v in inputs.items()})
                else:
                    compiled(*[cast(v) for v in inputs])
            except ember.CompileError as error:
                stopped = error
        total = time.perf_counter() - start
        if "triton_source" not in report:
            raise RuntimeError(f"{name}: the backend stopped before the end") from stopped
        backend_s = sum(report.get(s, 0.0) for s in STAGES)
        print(f"{name}{' train' if args.train else ''}: first call {total:.1f} s (eager run of the graph "
              f"{total - backend_s:.1f} s), " + ", ".join(f"{s} {report.get(s, 0):.2f} s" for s in STAGES) +
              f"; {report.get('prim_nodes')} prim nodes, {report.get('kernels')} kernels, "
              f"{report.get('distinct_bodies')} distinct", flush=True)
    if profiler:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
