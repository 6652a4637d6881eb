"""GPU benchmark of ember's Triton backend: memory-bound fused kernels, host overhead, compile time.

    python benchmarks/gpu_kernels.py --out DIR            # everything (needs a CUDA GPU)
    python benchmarks/gpu_kernels.py --compile-only DIR   # one compile, printed as JSON (cold/warm probe)

Device times are medians of CUDA-graph replays with the L2 flushed before each
replay (so 4 MiB problems are not timed out of L2 and launch gaps are excluded);
bandwidth fraction = ideal bytes (inputs read once + outputs written once) /
time / measured device-to-device copy bandwidth.  Host overhead = wall time per
call of the compiled function on tiny tensors (launch-bound).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ember.backend import compile_graph
from ember.codegen import triton as triton_codegen
from ember.lower.builder import PrimGraphBuilder
from ember.runtime import triton_build

COLS = 4096


# ------------------------------------------------------------------ timing
_flush = None


def device_time_ms(fn, iters: int = 50) -> float:
    """Median device time of fn() captured in a CUDA graph, L2 flushed before each replay."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(iters):
        _flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(results: list) -> float:
    """Bytes/ms of device-to-device copies (read + write counted); the best of a few ways is the ceiling."""
    best = 0.0
    for mib in (64, 1024):
        src = torch.randn(mib * 1024 * 1024 // 4, device="cuda")
        dst = torch.empty_like(src)
        nbytes = 2 * src.numel() * 4
        for label, fn in (("copy_", lambda: dst.copy_(src)), ("mul_out", lambda: torch.mul(src, 1.0, out=dst))):
            ms = device_time_ms(fn, iters=20)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            fn()
            start.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            ms_stream = start.elapsed_time(end) / 10
            row = {"copy": label, "MiB": mib, "graph_TBps": nbytes / ms / 1e9, "stream_TBps": nbytes / ms_stream / 1e9}
            results.append(row)
            print(json.dumps(row), flush=True)
            best = max(best, nbytes / ms, nbytes / ms_stream)
        del src, dst
    return best


# ------------------------------------------------------------------ problems
def pointwise10_graph(x, w):
    b = PrimGraphBuilder()
    xi, wi = b.input("x", x), b.input("w", w)
    shape = tuple(x.shape)
    y = b.mul(xi, 1.5)
    y = b.add(y, 0.25)
    y = b.maximum(y, 0.0)
    y = b.sub(y, xi)
    y = b.mul(y, y)
    y = b.add(y, 1.0)
    y = b.sqrt(y)
    y = b.mul(y, b.broadcast(wi, shape, (1,)))
    y = b.sub(y, 0.5)
    y = b.mul(y, 0.1)
    return b.build([y])


def pointwise10_torch(x, w):
    y = torch.clamp_min(x * 1.5 + 0.25, 0.0) - x
    return (torch.sqrt(y * y + 1.0) * w - 0.5) * 0.1


def softmax_graph(x, w):
    b = PrimGraphBuilder()
    xi = b.input("x", x)
    b.input("w", w)
    shape = tuple(x.shape)
    xf = b.cast(xi, torch.float32) if x.dtype != torch.float32 else xi
    m = b.broadcast(b.amax(xf, (1,)), shape, (0,))
    e = b.exp(b.sub(xf, m))
    y = b.div(e, b.broadcast(b.sum(e, (1,)), shape, (0,)))
    return b.build([b.cast(y, x.dtype) if x.dtype != torch.float32 else y])


def softmax_torch(x, w):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def layer_norm_graph(x, w):
    b = PrimGraphBuilder()
    xi, wi = b.input("x", x), b.input("w", w)
    shape = tuple(x.shape)
    xf = b.cast(xi, torch.float32) if x.dtype != torch.float32 else xi
    vm = b.var_mean(xf, (1,))
    rstd = b.rsqrt(b.add(b.getitem(vm, 0), 1e-5))
    y = b.mul(b.sub(xf, b.broadcast(b.getitem(vm, 1), shape, (0,))), b.broadcast(rstd, shape, (0,)))
    y = b.add(b.mul(y, b.broadcast(wi, shape, (1,))), b.broadcast(wi, shape, (1,)))
    return b.build([b.cast(y, x.dtype) if x.dtype != torch.float32 else y])


def layer_norm_torch(x, w):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, w, 1e-5)


def rms_norm_graph(x, w):
    b = PrimGraphBuilder()
    xi, wi = b.input("x", x), b.input("w", w)
    shape = tuple(x.shape)
    xf = b.cast(xi, torch.float32) if x.dtype != torch.float32 else xi
    ms = b.div(b.sum(b.mul(xf, xf), (1,)), float(shape[1]))
    r = b.rsqrt(b.add(ms, 1e-6))
    y = b.mul(b.mul(xf, b.broadcast(r, shape, (0,))), b.broadcast(b.cast(wi, torch.float32), shape, (1,)))
    return b.build([b.cast(y, x.dtype) if x.dtype != torch.float32 else y])


def rms_norm_torch(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


PROBLEMS = {"pointwise10": (pointwise10_graph, pointwise10_torch), "softmax": (softmax_graph, softmax_torch),
            "layer_norm": (layer_norm_graph, layer_norm_torch), "rms_norm": (rms_norm_graph, rms_norm_torch)}


def ideal_bytes(x, w, out) -> int:
    return x.numel() * x.element_size() + w.numel() * w.element_size() + out.numel() * out.element_size()


def rel_error(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ------------------------------------------------------------------ sections
def bench_kernels(bandwidth: float, with_inductor: bool, results: list) -> None:
    for mib in (4, 64):
        for dtype in (torch.float32, torch.bfloat16):
            rows = mib * 1024 * 1024 // (COLS * dtype.itemsize)
            x = torch.randn(rows, COLS, device="cuda").to(dtype)
            w = torch.randn(COLS, device="cuda").to(dtype)
            for name, (make_graph, torch_fn) in PROBLEMS.items():
                graph = make_graph(x, w)
                compiled = compile_graph(graph, [x, w])
                out = compiled(x, w)[0]
                ref = torch_fn(x.double() if dtype == torch.float32 else x.float(), w.double() if dtype == torch.float32 else w.float())
                err = rel_error(out, ref)
                nbytes = ideal_bytes(x, w, out)
                row = {"problem": name, "dtype": str(dtype).replace("torch.", ""), "MiB": mib, "shape": list(x.shape),
                       "kernels": compiled.stats["kernel_count"], "rel_err": err, "bytes": nbytes}
                row["ember_ms"] = device_time_ms(lambda: compiled(x, w))
                row["eager_ms"] = device_time_ms(lambda: torch_fn(x, w))
                if with_inductor:
                    fn = torch.compile(torch_fn, dynamic=False)
                    fn(x, w)
                    row["inductor_ms"] = device_time_ms(lambda: fn(x, w))
                for key in ("ember", "eager", "inductor"):
                    if f"{key}_ms" in row:
                        row[f"{key}_frac"] = nbytes / row[f"{key}_ms"] / bandwidth
                row["header"] = [ln.strip() for ln in compiled.source.splitlines() if "# persistent" in ln
                                 or "# looped" in ln or "# pointwise" in ln][:3]
                results.append(row)
                print(json.dumps(row), flush=True)


def bench_variants(bandwidth: float, results: list) -> None:
    """Block-size variants of the 64 MiB fp32/bf16 problems (tuning evidence)."""
    variants = {
        "pointwise10": [{"pointwise_block": 512}, {"pointwise_block": 1024}, {"pointwise_block": 2048},
                        {"pointwise_block": 2048, "pointwise_warps": 4}, {"pointwise_block": 4096}],
        "softmax": [{}, {"persistent_limit": 2048, "looped_rblock": 2048}, {"reduction_elements": 8192}],
        "rms_norm": [{}, {"persistent_limit": 2048, "looped_rblock": 1024}],
    }
    for dtype in (torch.float32, torch.bfloat16):
        rows = 64 * 1024 * 1024 // (COLS * dtype.itemsize)
        x = torch.randn(rows, COLS, device="cuda").to(dtype)
        w = torch.randn(COLS, device="cuda").to(dtype)
        for name, tunings in variants.items():
            for tuning in tunings:
                triton_codegen.TUNING.clear()
                triton_codegen.TUNING.update(tuning)
                compiled = compile_graph(PROBLEMS[name][0](x, w), [x, w])
                out = compiled(x, w)[0]
                ms = device_time_ms(lambda: compiled(x, w))
                row = {"variant": name, "dtype": str(dtype).replace("torch.", ""), "tuning": tuning, "ms": ms,
                       "frac": ideal_bytes(x, w, out) / ms / bandwidth}
                results.append(row)
                print(json.dumps(row), flush=True)
    triton_codegen.TUNING.clear()


def host_overhead_graph(k: int):
    b = PrimGraphBuilder()
    inputs = [torch.randn(i + 1, 64, device="cuda") for i in range(k)]
    nodes = [b.input(f"x{i}", v) for i, v in enumerate(inputs)]
    outs = [b.mul(b.exp(n), 2.0) for n in nodes]     # different sizes: one kernel each
    return b.build(outs), inputs


def bench_host_overhead(results: list, with_inductor: bool) -> None:
    for k in (1, 2, 4, 8, 16):
        graph, inputs = host_overhead_graph(k)
        compiled = compile_graph(graph, inputs)
        assert compiled.stats["kernel_count"] == k, compiled.stats
        eager = lambda *xs: tuple(torch.exp(x) * 2.0 for x in xs)
        fns = {"ember": compiled, "eager": eager}
        if with_inductor:
            fns["inductor"] = torch.compile(eager, dynamic=False)
        row = {"host_kernels": k}
        for key, fn in fns.items():
            for _ in range(20):
                fn(*inputs)
            torch.cuda.synchronize()
            n = max(10, 400 // k)                      # stay below the launch queue's depth: pure host time
            samples = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(n):
                    fn(*inputs)
                samples.append((time.perf_counter() - start) / n)
                torch.cuda.synchronize()
            row[f"{key}_host_us"] = min(samples) * 1e6
        # one bare launcher call (what a kernel costs the host, allocations excluded)
        launchers, _ = triton_codegen.build_kernels(compiled.schedule)
        launcher = launchers[compiled.schedule.kernels[0].name]
        if launcher is not None:
            fn, args = launcher
            tensors = [inputs[0], torch.empty_like(inputs[0])]
            if getattr(fn, "takes_pointers", False):
                tensors = [t.data_ptr() for t in tensors]
            start = time.perf_counter()
            for _ in range(200):
                fn(*tensors)
            row["launcher_us"] = (time.perf_counter() - start) / 200 * 1e6
            torch.cuda.synchronize()
        results.append(row)
        print(json.dumps(row), flush=True)


def host_chain_graph(steps: int):
    """x -> (column sums -> normalize) * steps: 2 kernels per step, the sums are intermediates."""
    x = torch.rand(64, 64, device="cuda") + 0.5
    b = PrimGraphBuilder()
    v = b.input("x", x)
    for _ in range(steps):
        v = b.div(v, b.broadcast(b.sum(v, (0,)), (64, 64), (1,)))
    return b.build([v]), [x]


def bench_host_intermediates(results: list) -> None:
    """Host time of graphs with intermediates: fresh allocations per call vs kept across calls."""
    from ember.codegen import wrapper
    saved = set(wrapper.PERSISTENT_DEVICES)
    try:
        for steps in (1, 4, 8):
            row = {"host_chain_steps": steps}
            for label, devices in (("fresh", set()), ("kept", {"cuda"})):
                wrapper.PERSISTENT_DEVICES.clear()
                wrapper.PERSISTENT_DEVICES.update(devices)
                graph, inputs = host_chain_graph(steps)
                compiled = compile_graph(graph, inputs)
                row["kernels"] = compiled.stats["kernel_count"]
                for _ in range(20):
                    compiled(*inputs)
                torch.cuda.synchronize()
                samples = []
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(100):
                        compiled(*inputs)
                    samples.append((time.perf_counter() - start) / 100)
                    torch.cuda.synchronize()
                row[f"ember_{label}_host_us"] = min(samples) * 1e6
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        wrapper.PERSISTENT_DEVICES.clear()
        wrapper.PERSISTENT_DEVICES.update(saved)


def compile_probe() -> dict:
    """Compile a graph of several kernels (fresh process): seconds, kernels, Triton compile seconds."""
    x = torch.randn(512, COLS, device="cuda")
    w = torch.randn(COLS, device="cuda")
    b = PrimGraphBuilder()
    xi, wi = b.input("x", x), b.input("w", w)
    outs = []
    for i in range(8):                                 # 8 distinct kernels (different reshapes + ops)
        v = b.reshape(xi, (512 * (2 ** (i % 4)), COLS // (2 ** (i % 4))))
        v = b.mul(b.exp(v), float(i + 1)) if i < 4 else b.sum(b.sin(v), (1,))
        outs.append(v)
    graph = b.build(outs)
    start = time.perf_counter()
    compiled = compile_graph(graph, [x, w])
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    return {"compile_s": total, "kernels": compiled.stats["kernel_count"],
            "triton_compile_s": triton_build.stats["compile_seconds"]}


def bench_compile(results: list) -> None:
    cache = tempfile.mkdtemp(prefix="ember-gpu-compile-")
    env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(cache, "ember"), TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    for label in ("cold", "warm"):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--compile-only"], env=env,
                             capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
        row = {"compile": label, **(json.loads(line) if line.startswith("{") else {"error": line})}
        results.append(row)
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--sections", default="kernels,variants,host,compile")
    args = parser.parse_args()
    if args.compile_only:
        print(json.dumps(compile_probe()))
        return
    import triton
    results: list = [{"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                      "date": time.strftime("%Y-%m-%d")}]
    bandwidth = copy_bandwidth(results)
    results.append({"copy_TBps": bandwidth / 1e9})
    print(json.dumps(results), flush=True)
    sections = args.sections.split(",")
    try:
        if "compile" in sections:
            bench_compile(results)
        if "kernels" in sections:
            bench_kernels(bandwidth, not args.no_inductor, results)
        if "host" in sections:
            bench_host_overhead(results, not args.no_inductor)
            bench_host_intermediates(results)
        if "variants" in sections:
            bench_variants(bandwidth, results)
    finally:
        with open(os.path.join(args.out, "gpu_kernels.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
