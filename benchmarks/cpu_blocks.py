"""ember vs eager vs Inductor CPU (torch.compile, the comparison peer) on the blocks of issue #13.

    python3 benchmarks/cpu_blocks.py [--quick] [--cases norm,block,block_bf16,model]
                                     [--compilers eager,ember,inductor] [--iters N]

Compilers: eager, ember, inductor; and ember as a host without glibc's libmvec builds it (kernels
built without -DEMBER_USE_LIBMVEC), listed after ember: ember-no-libmvec (its default: loops that
call exp/log/erf/tanh/sigmoid on ember's own vector types, cpp.VECTOR_TYPES, issue #13) and
ember-no-libmvec-scalar (the scalar loops alone, as before those).

Cases (inference, under torch.no_grad(), whole modules through ember.compile / torch.compile):
  norm        layer_norm -> gelu(h) * sigmoid(h) -> RMS norm -> softmax, x [64, 512, 1024] fp32
              ([8, 256, 1024] with --quick); benchmarks/train_cpu.py's PointwiseBlock
  norm_bf16   the same in bf16 (not in the default cases)
  block       a pre-norm transformer block (LayerNorm, causal SDPA attention, GELU MLP, residuals),
              B8 T256 C512 fp32 (B4 T128 C512 with --quick); train_cpu.py's NanoGPTBlock
  block_bf16  the same block with bf16 parameters and input
  model       the bench zoo's nanoGPT (4 layers, d 384, B2 T128; cpu_pointwise.py's nanogpt_model)

Per case: each compiler's cold compile (its first call, with fresh EMBER_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR; torch's lazily imported modules are imported before any of them, see
warm_imports), a check against eager, then the compilers take turns call by call (so
that load from other processes slows them alike) and the median of each is printed with
ember/inductor (below 1: ember is faster), each one's speedup over eager, and each one's max
|result - eager| / max |eager|.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_pointwise import first_call_seconds, nanogpt_model   # noqa: E402
from train_cpu import NanoGPTBlock, PointwiseBlock             # noqa: E402


def make_case(name: str, quick: bool) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], float]:
    """(model, inputs, tolerance of max |ember - eager| / max |eager|)."""
    torch.manual_seed(0)
    if name in ("norm", "norm_bf16"):
        shape = (8, 256, 1024) if quick else (64, 512, 1024)
        model, x = PointwiseBlock(shape[-1]).eval(), torch.randn(shape)
        if name == "norm_bf16":    # a few bf16 ulps of the softmax's largest values (Inductor: 2.9e-2)
            return model.to(torch.bfloat16), (x.to(torch.bfloat16),), 5e-2
        return model, (x,), 1e-4
    if name in ("block", "block_bf16"):
        B, T, C, heads = (4, 128, 512, 8) if quick else (8, 256, 512, 8)
        model, x = NanoGPTBlock(C, heads).eval(), torch.randn(B, T, C)
        if name == "block_bf16":
            return model.to(torch.bfloat16), (x.to(torch.bfloat16),), 2e-2
        return model, (x,), 1e-4
    if name == "model":
        model, inputs = nanogpt_model()
        return model, inputs, 1e-4
    raise ValueError(f"unknown case {name!r}")


def warm_imports() -> None:
    """Import what the first compile in a process would: torch's Python decompositions, which
    meta-tensor shape inference of ops like layer_norm loads on first use (about 2 s here, paid by
    whichever compiler runs first), torch.compile's own modules and ember's.  Cold compiles then measure
    compiling, the same for both compilers, whatever the order of the cases."""
    import torch._dynamo      # noqa: F401
    import torch._inductor.compile_fx   # noqa: F401
    # ember's own compiler modules likewise (they load on its first compile: 0.26 s here, where
    # PYTHONDONTWRITEBYTECODE=1 compiles them from source in every process)
    import ember.backend, ember.capture.cache, ember.capture.frame   # noqa: F401, E401
    import ember.codegen.cpp, ember.codegen.wrapper, ember.runtime.cpp_build   # noqa: F401, E401
    x = torch.empty(2, 8, device="meta")
    torch.nn.functional.layer_norm(x, (8,))
    torch.softmax(x, -1)


def compile_cold(compiler: str, model: torch.nn.Module, inputs) -> tuple[object, float]:
    """The compiled callable and its first call's seconds, with empty kernel caches."""
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-blocks-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-blocks-")
    if compiler == "eager":
        return model, 0.0
    if compiler == "ember":
        import ember
        from ember.runtime import cpp_build
        cpp_build.compile_flags.cache_clear()
        ember.reset()
        compiled = ember.compile(model)
    elif compiler.startswith("ember-no-libmvec"):
        return compile_without_libmvec(model, inputs, vector_types=compiler == "ember-no-libmvec")
    else:
        import torch._dynamo
        torch._dynamo.reset()
        compiled = torch.compile(model)
    return compiled, first_call_seconds(compiled, inputs)


def compile_without_libmvec(model: torch.nn.Module, inputs, vector_types: bool) -> tuple[object, float]:
    """ember's kernels as a host without libmvec builds them, on its vector types (cpp.VECTOR_TYPES'
    default) or not.  No ember.reset(): it would make the compilers compiled before recompile on
    their next call, in this one's settings (an entry of its own through a backend of its own)."""
    import functools

    import ember
    from ember.backend import compile_graph
    from ember.codegen import cpp
    from ember.runtime import cpp_build
    probed, saved = cpp_build.compile_flags, cpp.VECTOR_TYPES
    probed.cache_clear()
    flags = tuple(flag for flag in probed() if flag != "-DEMBER_USE_LIBMVEC")
    cpp_build.compile_flags = functools.lru_cache(None)(lambda: flags)
    cpp.VECTOR_TYPES = saved if vector_types else False
    try:
        backend = lambda graph, example_inputs: compile_graph(graph, example_inputs, None)  # noqa: E731
        compiled = ember.compile(model, backend=backend)
        return compiled, first_call_seconds(compiled, inputs)     # (the kernels are built on it)
    finally:
        cpp_build.compile_flags, cpp.VECTOR_TYPES = probed, saved


def time_interleaved(fns: dict[str, object], inputs, iters: int) -> dict[str, float]:
    """Median ms per call of each function, the functions taking turns call by call."""
    for fn in fns.values():
        for _ in range(2):
            fn(*inputs)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(*inputs)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def run_case(name: str, compilers: list[str], quick: bool, iters: int) -> None:
    model, inputs, tolerance = make_case(name, quick)
    shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in inputs)
    expected = model(*inputs)
    fns, cold, errors = {}, {}, {}
    for compiler in compilers:
        fns[compiler], cold[compiler] = compile_cold(compiler, model, inputs)
        out = fns[compiler](*inputs)
        error = ((out.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
        assert error <= tolerance, f"{name}: {compiler} differs from eager (relative error {error:.2e})"
        errors[compiler] = error
    ms = time_interleaved(fns, inputs, iters)
    eager = ms.get("eager")
    cells = []
    for compiler in compilers:
        speedup = f" ({eager / ms[compiler]:.2f}x)" if eager else ""
        cells.append(f"{ms[compiler]:.2f}{speedup}")
    ratio = f"{ms['ember'] / ms['inductor']:.2f}" if "ember" in ms and "inductor" in ms else "-"
    compile_cells = " / ".join(f"{cold[c]:.1f}" for c in compilers if c != "eager")
    error_cells = " / ".join(f"{errors[c]:.1e}" for c in compilers if c != "eager")
    print(f"| {name} [{shapes}] | {' | '.join(cells)} | {ratio} | {compile_cells} | {error_cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer iterations")
    parser.add_argument("--cases", default="norm,block,block_bf16,model")
    parser.add_argument("--compilers", default="eager,ember,inductor")
    parser.add_argument("--iters", type=int, default=0, help="timed calls per compiler (default 30, quick 10)")
    args = parser.parse_args()
    compilers = args.compilers.split(",")
    iters = args.iters or (10 if args.quick else 30)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {iters} interleaved calls each, "
          f"load average {os.getloadavg()[0]:.2f}")
    timed = " | ".join(f"{c} ms" + (" (vs eager)" if c != "eager" and "eager" in compilers else "")
                       for c in compilers)
    cold = " / ".join(f"{c}" for c in compilers if c != "eager")
    print(f"| case | {timed} | ember/inductor | cold compile s ({cold}) | max error vs eager ({cold}) |")
    print("|---|" + "---|" * len(compilers) + "---|---|---|")
    warm_imports()
    with torch.no_grad():
        for case in args.cases.split(","):
            run_case(case, compilers, args.quick, iters)


if __name__ == "__main__":
    main()
