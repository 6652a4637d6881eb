"""Cold compile time with ``dynamic=True`` against ``dynamic=False``, per stage, on the CPU.

    python benchmarks/dynamic_compile_time.py                        # tiny zoo models, cpp and triton
    python benchmarks/dynamic_compile_time.py --models llama_small --backends triton --repeat 5
    python benchmarks/dynamic_compile_time.py --models llama_small --profile dynamic --backends triton

For each public zoo model whose dependencies are installed (``../shared/bench/models.py``; float32,
eval, ``torch.no_grad``) the model is compiled with ``ember.compile(model, dynamic=...)`` after
``ember.reset()`` and called once, in one process, the two settings interleaved and repeated.  The
first call's host time is split by stage:

  capture   bytecode capture, guards (the cache miss's time less the backend's)
  prims     backend.to_prim_graph (decompositions, functionalization, shapes)
  lower     lower_graph + split_reductions (loop IR)
  schedule  scheduler (fusion, buffer plan)
  codegen   kernel source: generate_triton / generate_cpp
  wrapper   the host program's source and its exec
  build     g++ or Triton's (interpreter) module load: reported apart, not in ``host``

``--backends triton`` runs the Triton generator on the CPU (``cpu_backend="triton"`` with
TRITON_INTERPRET=1): the Python side of the GPU's codegen.  Kernels are built in a fresh
EMBER_CACHE_DIR (the g++ builds are cold the first time, cached by source after).  Medians of
``--repeat`` runs; ``ratio`` is dynamic over static of ``host`` (every stage but build).
``--profile dynamic|static`` prints cProfile's top functions of one more compile of that kind.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import io
import os
import pstats
import re
import statistics
import sys
import tempfile
import time

if "--sm90" not in sys.argv:   # under TRITON_INTERPRET at import, triton.language's own jit functions (tl.sum)
    os.environ.setdefault("TRITON_INTERPRET", "1")    # are interpreter functions: no GPU compile works
os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-dyn-compile-"))

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import ember  # noqa: E402
from ember import backend  # noqa: E402
from ember.codegen import cpp as cpp_codegen, triton as triton_codegen, wrapper  # noqa: E402
from ember.capture.cache import CapturedFunction  # noqa: E402
from ember.runtime import cpp_build, triton_build  # noqa: E402

STAGES = ("capture", "prims", "lower", "schedule", "codegen", "wrapper")
DEFAULT_MODELS = "llama_small,gpt2,bert_base,nanogpt,mlp4,pointwise"

_times: dict[str, float] = {}
_profiler: list[cProfile.Profile] = []     # profiles the cache miss (capture and compile), not the run


def _timed(stage: str, module, name: str) -> None:
    """Wrap ``module.name`` so that its time adds to ``_times[stage]`` (outermost call only)."""
    original = getattr(module, name)
    if getattr(original, "_timed_stage", None):
        return

    def timed(*args, **kwargs):
        profile = _profiler and stage == "capture_and_backend"
        if profile:
            _profiler[0].enable()
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _times[stage] = _times.get(stage, 0.0) + time.perf_counter() - start
            if profile:
                _profiler[0].disable()
    timed._timed_stage = stage
    setattr(module, name, timed)


def install_timers() -> None:
    _timed("capture_and_backend", CapturedFunction, "_compile_or_give_up")
    _timed("backend", backend, "compile_from_specs")
    _timed("prims", backend, "to_prim_graph")
    _timed("lower", backend, "lower_graph")
    _timed("lower", backend, "split_reductions")
    _timed("schedule", backend, "schedule")
    _timed("codegen", triton_codegen, "generate_triton")
    _timed("codegen", cpp_codegen, "generate_cpp")
    _timed("build", triton_build, "build")
    _timed("build", cpp_build, "build")
    _timed("build", cpp_build, "load")
    _timed("wrapper", wrapper, "generate_wrapper")
    _timed("wrapper", wrapper, "compile_wrapper")


def install_sm90() -> None:
    """Triton kernels generated for a GPU and each distinct one compiled for an H100 (sm_90, no GPU
    needed), one at a time: ``gpu_build``.  The interpreter never runs (it patches triton.language
    for good): the compiled graphs run eagerly instead."""
    from triton.backends.compiler import GPUTarget

    def build_kernels(sched, interpret=None):
        if not sched.kernels:
            return {}, ""
        source, kernels = triton_codegen.generate_triton(sched, interpret=False)    # timed: codegen
        start = time.perf_counter()
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-dyn-triton-")   # cold
        module = triton_build.load_module(source, interpret=False)
        target = GPUTarget("cuda", 90, 32)
        for kernel in kernels:
            if kernel.source.startswith("@triton.jit"):      # the others are aliases
                one = time.perf_counter()
                triton_build._compile(getattr(module, kernel.name), kernel, kernel.aligned, target)
                _kernel_times.append((time.perf_counter() - one, kernel.name, kernel.config, kernel.source))
        _times["gpu_build"] = _times.get("gpu_build", 0.0) + time.perf_counter() - start
        return {k.name: (None, k.arguments) for k in kernels}, source
    triton_codegen.build_kernels = build_kernels
    compile_from_specs = backend.compile_from_specs

    def run_eagerly(graph, specs, options):
        compiled = compile_from_specs(graph, specs, options)
        compiled.call = graph.as_callable()
        return compiled
    backend.compile_from_specs = run_eagerly


def install_dump(directory: str) -> None:
    """Write each compile's guards and generated source (wrapper and kernels) under ``directory``
    (to compare two versions of the compiler: the same guards and kernels; run with
    PYTHONHASHSEED=0, the wrapper's ``del`` lists follow set order)."""
    os.makedirs(directory, exist_ok=True)
    original = CapturedFunction._add_entry

    def add_entry(self, *args, **kwargs):
        entry, inputs = original(self, *args, **kwargs)
        name = _dump_name[0]
        source = getattr(entry.compiled, "source", "")
        # the kernels' cache paths hold a hash of their source: the same text either way
        text = "# ---- guards\n" + "\n".join(entry.guard_texts) + "\n" + source
        with open(os.path.join(directory, name + ".txt"), "w") as f:
            text = text.replace(os.environ["EMBER_CACHE_DIR"], "$EMBER_CACHE_DIR")
            f.write(re.sub(r" at 0x[0-9a-f]+", " at 0x?", text))    # object addresses
        return entry, inputs
    CapturedFunction._add_entry = add_entry


_dump_name = ["graph"]
_kernel_times: list[tuple] = []      # --sm90: (seconds, name, config, source) of each GPU kernel compile


def load_zoo(path: str):
    spec = importlib.util.spec_from_file_location("ember_bench_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def compile_once(model, inputs, dynamic: bool, cpu_backend: str) -> dict[str, float]:
    """One cold compile (after ember.reset()) and call; seconds per stage."""
    ember.reset()
    _times.clear()
    _kernel_times.clear()
    options = {"cpu_backend": cpu_backend} if cpu_backend != "cpp" else None
    compiled = ember.compile(model, dynamic=dynamic, options=options)
    with torch.no_grad():
        call(compiled, inputs)
    report = dict(_times)
    # capture: the miss's capture, compile and guard building, less the backend
    report["capture"] = report.get("capture_and_backend", 0.0) - report.get("backend", 0.0)
    report["host"] = sum(report.get(s, 0.0) for s in STAGES)
    report["gpu_kernels"] = list(_kernel_times)
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--backends", default="cpp,triton", help="cpp, triton (Triton's interpreter)")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--batch", type=int, default=None, help="default: the zoo's tiny_bs")
    parser.add_argument("--seq", type=int, default=None, help="default: the zoo's tiny_seq")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", choices=["dynamic", "static"], default=None)
    parser.add_argument("--profile-top", type=int, default=40)
    parser.add_argument("--sm90", action="store_true",
                        help="triton: also compile every distinct kernel for an H100 (reported as gpu_build)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--dump", default=None, help="write guards and generated source of each compile here")
    parser.add_argument("--zoo", default=os.path.join(HERE, "..", "..", "shared", "bench", "models.py"))
    args = parser.parse_args()
    zoo = load_zoo(args.zoo)
    if args.sm90:
        install_sm90()
    install_timers()
    if args.dump:
        install_dump(args.dump)
    torch.manual_seed(0)
    rows = []
    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        if spec.missing():
            print(f"{name}: skipped (missing {', '.join(spec.missing())})", flush=True)
            continue
        batch = args.batch or spec.tiny_bs
        seq = args.seq or spec.tiny_seq or 32
        bench = spec.build(batch_size=batch, seq_len=seq if spec.seq_len else None, size=args.size, device="cpu") \
            if spec.seq_len else spec.build(batch_size=batch, size=args.size, device="cpu")
        dtype = getattr(torch, args.dtype)
        model = bench.model.to(dtype).eval()
        inputs = bench.example_inputs
        cast = lambda t: t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t  # noqa: E731
        inputs = {k: cast(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(map(cast, inputs))
        for cpu_backend in args.backends.split(","):
            _dump_name[0] = "warmup"
            for dynamic in (False, True):      # lazy imports (sympy's, ~0.15 s, on the first symbolic
                compile_once(model, inputs, dynamic, cpu_backend)   # compile of a process), g++ probes
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for rep in range(args.repeat):
                order = (False, True) if rep % 2 == 0 else (True, False)
                for dynamic in order:
                    _dump_name[0] = f"{name}-{cpu_backend}-{'dynamic' if dynamic else 'static'}"
                    runs[dynamic].append(compile_once(model, inputs, dynamic, cpu_backend))
            med = {d: {k: statistics.median(r.get(k, 0.0) for r in rs) for k in (*STAGES, "host", "build", "gpu_build")}
                   for d, rs in runs.items()}
            if args.sm90:
                for dynamic in (False, True):
                    kernels = runs[dynamic][-1]["gpu_kernels"]
                    print(f"{name} {'dynamic' if dynamic else 'static'}: {len(kernels)} distinct GPU kernels, "
                          f"slowest: " + ", ".join(f"{k[1]} {k[0]:.2f} s ({k[2].kind} {k[2].xblock}x{k[2].rblock})"
                                                   for k in sorted(kernels, key=lambda k: -k[0])[:6]))
            for dynamic in (False, True):
                m = med[dynamic]
                print(f"{name:12s} {cpu_backend:6s} {'dynamic' if dynamic else 'static ':7s} "
                      + " ".join(f"{s} {m[s]:6.3f}" for s in STAGES)
                      + f" | host {m['host']:6.3f} build {m['build']:6.3f}"
                      + (f" gpu_build {m['gpu_build']:6.3f}" if args.sm90 else ""), flush=True)
            ratio = med[True]["host"] / med[False]["host"]
            print(f"{name:12s} {cpu_backend:6s} ratio dynamic/static host {ratio:.2f} "
                  + " ".join(f"{s} {med[True][s] / med[False][s]:.2f}" if med[False][s] > 0 else f"{s} -"
                             for s in STAGES), flush=True)
            rows.append((name, cpu_backend, med[False]["host"], med[True]["host"], ratio))
            if args.profile:
                profiler = cProfile.Profile()
                _profiler.append(profiler)
                compile_once(model, inputs, args.profile == "dynamic", cpu_backend)
                _profiler.clear()
                out = io.StringIO()
                stats = pstats.Stats(profiler, stream=out)
                stats.sort_stats("cumulative").print_stats(args.profile_top)
                stats.sort_stats("tottime").print_stats(args.profile_top)
                print(out.getvalue())
    if rows:
        print("\nmodel        backend static_s dynamic_s ratio")
        for name, cpu_backend, s, d, r in rows:
            print(f"{name:12s} {cpu_backend:7s} {s:8.3f} {d:9.3f} {r:5.2f}")
        for cpu_backend in args.backends.split(","):
            ratios = [r for _, b, _, _, r in rows if b == cpu_backend]
            total_s = sum(s for _, b, s, _, _ in rows if b == cpu_backend)
            total_d = sum(d for _, b, _, d, _ in rows if b == cpu_backend)
            if ratios:
                geo = statistics.geometric_mean(ratios)
                print(f"{cpu_backend}: geomean ratio {geo:.2f}, total {total_d:.2f} / {total_s:.2f} s = "
                      f"{total_d / total_s:.2f}")


if __name__ == "__main__":
    main()
