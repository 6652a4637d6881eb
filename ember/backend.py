"""The "ember" backend: prim graph -> loop IR -> fused kernels -> host program.

    compiled = compile_graph(graph, example_inputs)     # a CompiledGraph
    compiled(*inputs) -> tuple of outputs;  compiled.kind, .stats, .source, .schedule

compile_from_specs is the same from input metadata alone (TensorMeta, or a scalar's type).

CPU tensors go to the C++ generator (codegen/cpp.py), CUDA tensors to
codegen/triton.py.  Any internal failure raises CompileError naming the stage
and op; ember.api.resolve_backend decides whether the graph then runs eagerly
(the default, with a warning) or the error reaches the user.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ember.api import CompileOptions
from ember.debug.logs import enabled, log
from ember.errors import CompileError
from ember.graph import Graph, TensorMeta
from ember import config
from ember.lower.lowering import lower_graph
from ember.lower.split_reductions import split_reductions
from ember.lower.scheduler import Schedule, schedule
from ember.prims.functionalize import RunEagerly
from ember.prims.primitives import is_prim
from ember.runtime.gc_pause import full_collections_deferred
from ember.symbolic import STORAGE_OFFSET, is_symbolic


# What the compiler needs to know of one graph input: a tensor's metadata, or the Python type
# of a runtime scalar (int, float, bool).
InputSpec = TensorMeta | type


@dataclasses.dataclass(eq=False)
class CompiledGraph:
    """What the backend returns: the callable, and what it is made of.

    ``kind`` is "kernels" (fused kernels and Externs), "autograd" (a compiled forward whose
    backward is compiled on first use; ember/autodiff/) or "eager" (the graph run op by op, for
    ``eager_reason``)."""

    call: Callable[..., tuple]
    kind: str
    source: str = ""
    kernel_count: int = 0
    extern_count: int = 0
    schedule: Schedule | None = None
    compile_seconds: float = 0.0
    eager_reason: str = ""

    def __call__(self, *inputs: Any) -> tuple:
        return self.call(*inputs)

    @property
    def stats(self) -> dict[str, int]:
        return {"kernel_count": self.kernel_count, "extern_count": self.extern_count}


def input_specs(example_inputs: Sequence[Any]) -> list[InputSpec]:
    """The metadata of real inputs (what ``compile_from_specs`` needs)."""
    return [TensorMeta.of(x) if isinstance(x, torch.Tensor) else type(x) for x in example_inputs]


def compile_graph(graph: Graph, example_inputs: list, options: CompileOptions | dict | None = None
                  ) -> CompiledGraph:
    """Compile a torch-level (or prim-level) graph for the devices of its example inputs.

    Failures raise CompileError; whether to run the graph eagerly instead is decided by the
    caller (ember.api.resolve_backend), not here."""
    specs = [placeholder.extra.get("symbolic_meta", spec)    # dynamic shapes: sizes as symbols
             for placeholder, spec in zip(graph.placeholders, input_specs(example_inputs))]
    return compile_from_specs(graph, specs, CompileOptions.from_options(options))


# graphs this large get tens of kernels: worth compiling them in worker processes (whose start
# competes with a small graph's whole compile for the CPU)
WORKERS_MIN_NODES = 150


@full_collections_deferred()
def compile_from_specs(graph: Graph, specs: list[InputSpec], options: CompileOptions) -> CompiledGraph:
    """The backend entry: from input metadata, never real values (so that a joint graph's halves
    compile alike).  Training graphs (grad mode on, an input requiring grad) go to autodiff."""
    start = time.perf_counter()
    if _device_of(specs).type == "cuda" and len(graph.nodes) >= WORKERS_MIN_NODES:
        from ember.runtime import triton_build
        if not triton_build.interpreted():
            triton_build.start_compile_workers()     # up by the time the kernels are generated
    elif _device_of(specs).type == "cpu" and options.cpu_backend != "triton":
        from ember.runtime import cpp_build
        cpp_build.prefetch_compile_flags()           # probed by the time the kernels are built
    try:
        prim_graph = to_prim_graph(graph, specs)
        _check_dynamic_support(prim_graph, specs)
        if options.mode == "reduce-overhead":
            _seeds_for_cuda_graphs(prim_graph, specs)
        if needs_autodiff(specs):
            from ember.autodiff.training import EagerAutograd, compile_training
            try:
                compiled = compile_training(graph, prim_graph, specs, options)
            except EagerAutograd as exc:
                return eager_graph(graph, str(exc))
        else:
            compiled = compile_prim_graph(prim_graph, specs, options)
    except RunEagerly as exc:     # exact only when run eagerly (overlapping writes, eager's own errors)
        return eager_graph(graph, str(exc))
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"internal error: {type(exc).__name__}: {exc}", stage="backend") from exc
    compiled.compile_seconds = time.perf_counter() - start
    return compiled


# Externs whose CUDA graphs compile with static sizes under dynamic shapes: training graphs always,
# inference graphs when EMBER_DYNAMIC_CONV_CUDA=0 (session 8's illegal memory access with symbolic
# conv nets was gone in session 9; the knob stays for A/B runs).
_STATIC_ON_CUDA = ("conv", "pool")


def _check_dynamic_support(prim_graph: Graph, specs: list[InputSpec]) -> None:
    symbolic = any(isinstance(s, TensorMeta) and any(is_symbolic(v) for v in (*s.shape, s.storage_offset))
                   for s in specs)
    if not symbolic or _device_of(specs).type != "cuda":
        return
    # conv nets' training steps with symbolic sizes take more GPU time than static on the H100
    # (session 15, benchmarks/gpu_train_profile.py --dynamic: resnet50 1.14x, convnext_tiny 1.34x,
    # mobilenet_v3 1.37x; 1.9-2.0x before bias-gradient reductions split at symbolic batches).  Left:
    # convnext's depthwise convolution_backward runs ATen's native kernel in 2 calls a step (4 ms)
    # where static calls cuDNN, and slower Triton reductions; until then: static sizes
    if config.dynamic_conv_cuda and not needs_autodiff(specs):
        return
    for node in prim_graph.call_nodes():
        name = getattr(node.target, "__name__", "")
        if not is_prim(node.target) and any(word in name for word in _STATIC_ON_CUDA):
            raise CompileError(f"symbolic sizes with {name} on CUDA are not supported yet"
                               + (" in training graphs" if config.dynamic_conv_cuda else ""), stage="backend")


def needs_autodiff(specs: list[InputSpec]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(s, TensorMeta) and s.requires_grad for s in specs)


def eager_graph(graph: Graph, reason: str) -> CompiledGraph:
    fn = graph.as_callable()
    return CompiledGraph(fn, "eager", f"# eager: {reason}\n" + getattr(fn, "__ember_source__", ""),
                         eager_reason=reason)


def _device_of(specs: list[InputSpec]) -> torch.device:
    devices = {s.device.type for s in specs if isinstance(s, TensorMeta)}
    if "cuda" in devices:
        return torch.device("cuda")
    return torch.device("cpu")


def to_prim_graph(graph: Graph, specs: list[InputSpec] | None = None) -> Graph:
    """Decompose to primitives (prims/), unless the graph already is prim-level.  ``specs``
    replace the placeholders' metadata (symbolic sizes)."""
    from ember.prims.primitives import is_prim
    if all(is_prim(n.target) for n in graph.call_nodes()):
        return graph          # already prim-level (hand-built graphs in tests)
    try:
        from ember.prims import to_primitives
    except ImportError:
        return graph          # no decompositions: every torch op becomes an Extern
    try:
        return to_primitives(graph, specs)
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"decomposition failed: {type(exc).__name__}: {exc}", stage="prims") from exc


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    """Name the stage of an internal failure (the fallback warning and CompileError show it)."""
    try:
        yield
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"internal error: {type(exc).__name__}: {exc}", stage=name) from exc


@full_collections_deferred()
def compile_prim_graph(prim_graph: Graph, specs: list[InputSpec], options: CompileOptions,
                       after_schedule: Callable[[Schedule], None] | None = None) -> CompiledGraph:
    """Loop IR, fused kernels and the host program for a prim-level graph.  ``after_schedule`` is
    called with the Schedule before the kernels are generated (a training forward starts its
    backward's compile there)."""
    if enabled("prim_graph"):
        log("prim_graph", str(prim_graph))
    with _stage("lower"):
        program = lower_graph(prim_graph, specs)
        if config.split_reductions:
            program = split_reductions(program, _device_of(specs).type)
        device = _device_of(specs)
        sched = schedule(program, row_arrays=not _uses_triton(device, options))
    if after_schedule is not None:
        after_schedule(sched)
    with _stage("codegen"):
        compiled = _generate(prim_graph, sched, specs, options)
    if options.mode == "reduce-overhead":
        _use_cuda_graphs(compiled, prim_graph, specs)
    return compiled


def _uses_triton(device: torch.device, options: CompileOptions) -> bool:
    return device.type == "cuda" or options.cpu_backend == "triton"


def _cuda_graph_device(specs: list[InputSpec]) -> torch.device | None:
    """The device whose launches mode="reduce-overhead" records, if the graph runs on one."""
    from ember.runtime import cudagraphs
    return next((s.device for s in specs if isinstance(s, TensorMeta) and s.device.type == cudagraphs.DEVICE_TYPE),
                None)


def _seeds_for_cuda_graphs(prim_graph: Graph, specs: list[InputSpec]) -> None:
    """A recorded seed would be replayed forever: draw it on the device (see draw_seed_on)."""
    device = _cuda_graph_device(specs)
    if device is not None:
        from ember.prims.decompositions.random import seeds_on_device
        seeds_on_device(prim_graph, device)


def _use_cuda_graphs(compiled: CompiledGraph, prim_graph: Graph, specs: list[InputSpec]) -> None:
    """mode="reduce-overhead": the kernels are replayed as a CUDA graph (runtime/cudagraphs.py)."""
    if _cuda_graph_device(specs) is None:
        return
    from ember.codegen.triton import interpret_requested
    from ember.runtime.cudagraphs import CudaGraphRunner
    if _device_of(specs).type == "cuda" and interpret_requested():
        log("cudagraphs", "not recorded: TRITON_INTERPRET runs the kernels on the host")
        return
    compiled.call = CudaGraphRunner(compiled.call, prim_graph, specs)


def _generate(prim_graph: Graph, sched: Schedule, specs: list[InputSpec], options: CompileOptions) -> CompiledGraph:
    device = _device_of(specs)
    use_triton = _uses_triton(device, options)
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
    extra["_input_is_tensor"] = [isinstance(s, TensorMeta) for s in specs]
    extra["_input_on_host"] = [isinstance(s, TensorMeta) and s.device.type == "cpu" for s in specs]
    extra["_size_symbols"] = size_symbols(specs)
    extra["_output_metas"] = [o.meta if hasattr(o, "meta") and isinstance(o.meta, TensorMeta) else None
                              for o in prim_graph.outputs]
    param_names = [p.name for p in prim_graph.placeholders]
    wrapper_source, globals_ = generate_wrapper(sched, param_names, launchers, extra, device.type)
    _check_sizes_readable(wrapper_source, extra["_size_symbols"], param_names)
    call = compile_wrapper(wrapper_source, globals_)
    source = f"# ---- wrapper\n{wrapper_source}\n# ---- kernels\n{kernel_source}"
    if enabled("output_code"):
        log("output_code", source)
    return CompiledGraph(call, "kernels", source, len(sched.kernels), len(sched.externs), sched)


def _check_sizes_readable(wrapper_source: str, readable: dict, param_names: list[str]) -> None:
    """Every size symbol the wrapper uses must be read from an input's shape: a backward graph
    whose inputs hold a symbol only inside a product (``s0*s1``) cannot compute ``s0``."""
    code = COMMENT.sub("", wrapper_source)     # comments name user files (``# extern at s1.py:3``)
    missing = sorted(set(SIZE_SYMBOL.findall(code)) - set(readable) - set(param_names))
    if missing:
        raise CompileError(f"size symbol(s) {', '.join(missing)} are not the size of any input of this graph",
                           stage="backend")


SIZE_SYMBOL = re.compile(r"\bs\d+\b")    # how ember/symbolic.py names size symbols
COMMENT = re.compile(r"#[^\n]*")


def size_symbols(specs: list[InputSpec]) -> dict[str, tuple[int, int | str]]:
    """Each size symbol of symbolic input specs -> (input position, dim or STORAGE_OFFSET) it is read from."""
    found: dict[str, tuple[int, int | str]] = {}
    for position, spec in enumerate(specs):
        if not isinstance(spec, TensorMeta):
            continue
        for dim, size in [*enumerate(spec.shape), (STORAGE_OFFSET, spec.storage_offset)]:
            if is_symbolic(size) and size.expr.is_Symbol:
                found.setdefault(str(size.expr), (position, dim))
    return found


def _build_cpp(sched: Schedule) -> tuple[dict[str, tuple[Callable, list[str]]], str]:
    from ember.codegen.cpp import checks_indices, generate_cpp, kernel_arguments
    from ember.runtime import cpp_build
    if not sched.kernels:
        return {}, ""
    size_args: dict[str, list[str]] = {}
    source = generate_cpp(sched, size_args)
    so_path = cpp_build.build(source)
    lib = cpp_build.load(so_path)
    launchers = {}
    for kernel in sched.kernels:
        args = kernel_arguments(kernel)
        checked = checks_indices(kernel)
        sizes = size_args.get(kernel.name, [])
        launch = cpp_build.load_function(lib, kernel.name, len(args), len(sizes), checked)
        if checked:
            launch = cpp_build.index_checked(launch)
        if sizes:
            launch = cpp_build.with_size_arguments(launch, sizes)
        launchers[kernel.name] = (launch, args)
    return launchers, f"// {so_path}\n{source}"
