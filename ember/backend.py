"""The "ember" backend: prim graph -> loop IR -> fused kernels -> host program.

    compiled = compile_graph(graph, example_inputs)
    compiled(*inputs) -> tuple of outputs;  compiled.stats, compiled.source

CPU tensors go to the C++ generator (codegen/cpp.py), CUDA tensors to
codegen/triton.py.  Any internal failure raises CompileError naming the stage
and op; ember.api.resolve_backend decides whether the graph then runs eagerly
(the default, with a warning) or the error reaches the user.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from ember.api import CompileOptions
from ember.debug.logs import enabled, log
from ember.errors import CompileError
from ember.graph import Graph, TensorMeta
from ember.lower.lowering import lower_graph
from ember.lower.scheduler import Schedule, schedule
from ember.prims.functionalize import RunEagerly


def compile_graph(graph: Graph, example_inputs: list, options: CompileOptions | dict | None = None
                  ) -> Callable[..., tuple]:
    """Compile a torch-level (or prim-level) graph for the devices of its example inputs.

    Failures raise CompileError; whether to run the graph eagerly instead is decided by the
    caller (ember.api.resolve_backend), not here."""
    settings = CompileOptions.from_options(options)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        # no autodiff yet: the eager graph keeps gradients correct
        return _eager(graph, "inputs require grad")
    try:
        return _compile(graph, example_inputs, settings)
    except RunEagerly as exc:     # exact only when run eagerly (overlapping writes, eager's own errors)
        return _eager(graph, str(exc))
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"internal error: {type(exc).__name__}: {exc}", stage="backend") from exc


def _eager(graph: Graph, reason: str) -> Callable[..., tuple]:
    fn = graph.as_callable()
    fn.stats = {"kernel_count": 0, "extern_count": 0}
    fn.source = f"# eager: {reason}\n" + getattr(fn, "__ember_source__", "")
    return fn


def _device_of(example_inputs: list) -> torch.device:
    devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if "cuda" in devices:
        return torch.device("cuda")
    return torch.device("cpu")


def to_prim_graph(graph: Graph) -> Graph:
    """Decompose to primitives (prims/), unless the graph already is prim-level."""
    from ember.prims.primitives import is_prim
    if all(is_prim(n.target) for n in graph.call_nodes()):
        return graph          # already prim-level (hand-built graphs in tests)
    try:
        from ember.prims import to_primitives
    except ImportError:
        return graph          # no decompositions: every torch op becomes an Extern
    try:
        return to_primitives(graph)
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"decomposition failed: {type(exc).__name__}: {exc}", stage="prims") from exc


def lower_and_schedule(graph: Graph, example_inputs: list) -> Schedule:
    program = lower_graph(graph, example_inputs)
    return schedule(program)


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    """Name the stage of an internal failure (the fallback warning and CompileError show it)."""
    try:
        yield
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"internal error: {type(exc).__name__}: {exc}", stage=name) from exc


def _compile(graph: Graph, example_inputs: list, options: CompileOptions) -> Callable[..., tuple]:
    start = time.perf_counter()
    prim_graph = to_prim_graph(graph)
    if enabled("prim_graph"):
        log("prim_graph", str(prim_graph))
    with _stage("lower"):
        sched = lower_and_schedule(prim_graph, example_inputs)
    with _stage("codegen"):
        return _generate(prim_graph, sched, example_inputs, options, start)


def _generate(prim_graph: Graph, sched: Schedule, example_inputs: list, options: CompileOptions,
              start: float) -> Callable[..., tuple]:
    device = _device_of(example_inputs)
    use_triton = device.type == "cuda" or options.cpu_backend == "triton"
    if use_triton:
        try:
            from ember.codegen import triton as triton_codegen
        except ImportError as exc:
            raise CompileError("the Triton code generator is not available", stage="codegen",
                               hint="ember.codegen.triton is not importable") from exc
        # CPU tensors can only run in Triton's interpreter; CUDA tensors use it when TRITON_INTERPRET is set
        interpret = device.type != "cuda" or triton_codegen.interpret_requested()
        launchers, kernel_source = triton_codegen.build_kernels(sched, interpret)
    else:
        launchers, kernel_source = _build_cpp(sched)
    from ember.codegen.wrapper import compile_wrapper, generate_wrapper
    extra = dict(prim_graph.extra)
    extra["_input_is_tensor"] = [isinstance(x, torch.Tensor) for x in example_inputs]
    extra["_input_on_host"] = [isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in example_inputs]
    extra["_output_metas"] = [o.meta if hasattr(o, "meta") and isinstance(o.meta, TensorMeta) else None
                              for o in prim_graph.outputs]
    param_names = [p.name for p in prim_graph.placeholders]
    wrapper_source, globals_ = generate_wrapper(sched, param_names, launchers, extra, device.type)
    call = compile_wrapper(wrapper_source, globals_)
    source = f"# ---- wrapper\n{wrapper_source}\n# ---- kernels\n{kernel_source}"
    if enabled("output_code"):
        log("output_code", source)

    compiled = call          # the generated host function itself: no extra Python frame per call
    compiled.stats = {"kernel_count": len(sched.kernels), "extern_count": len(sched.externs)}
    compiled.source = source
    compiled.schedule = sched
    compiled.compile_seconds = time.perf_counter() - start
    return compiled


def _build_cpp(sched: Schedule) -> tuple[dict[str, tuple[Callable, list[str]]], str]:
    from ember.codegen.cpp import checks_indices, generate_cpp, kernel_arguments
    from ember.runtime import cpp_build
    if not sched.kernels:
        return {}, ""
    source = generate_cpp(sched)
    so_path = cpp_build.build(source)
    lib = cpp_build.load(so_path)
    launchers = {}
    for kernel in sched.kernels:
        args = kernel_arguments(kernel)
        checked = checks_indices(kernel)
        launch = cpp_build.load_function(lib, kernel.name, len(args) + checked)
        if checked:
            launch = cpp_build.index_checked(launch)
        launchers[kernel.name] = (launch, args)
    return launchers, f"// {so_path}\n{source}"
