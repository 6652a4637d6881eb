"""Training graphs: a compiled forward and a compiled backward inside a torch.autograd.Function.

    compiled = compile_training(graph, prim_graph, specs, options)   # a CompiledGraph, kind "autograd"
    outputs = compiled(*inputs)         # outputs carry grad_fn; .backward() runs compiled kernels

prim graph -> joint graph (joint.py) -> min-cut partition (partition.py) -> the forward is
compiled now, the backward on its first use (both by ``backend.compile_prim_graph``, from
metadata); on CUDA the backward starts compiling in a thread as soon as the forward is
scheduled (``BackgroundBackward``), so both halves' kernels build together.  The forward
returns its outputs plus the saved values; ``_CompiledFunction`` keeps the saved tensors with
``ctx.save_for_backward`` (so ``retain_graph``, the "backward twice" error and the check that no
saved tensor was modified in place behave as in eager).  Its
backward reads them, lets ctx drop them (``ctx.maybe_clear_saved_tensors``: unless autograd
keeps the graph for another backward) and hands them with the incoming gradients to the compiled
backward in one list, which that program empties and whose tensors it drops after their last
readers: saved activations are freed while the backward runs, as eager frees them.

Outputs that eager returns as an input itself or as a view of an input or of another output
(graph.extra["output_aliases"] / ["output_sources"]) are made *outside* the Function, with
autograd recording the view, exactly as eager does.

``create_graph=True`` (double backward) re-runs the torch-level graph eagerly from the
original inputs and differentiates that; a graph that draws random numbers raises instead.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ember.api import CompileOptions
from ember.autodiff.joint import Joint, build_joint
from ember.autodiff.partition import Partition, partition
from ember.graph import Graph, Node, TensorMeta
from ember.prims import primitives as P
from ember.symbolic import STORAGE_OFFSET, is_symbolic


class EagerAutograd(Exception):
    """The graph is exact only when run op by op under eager autograd (the reason says why)."""


def compile_training(graph: Graph, prim_graph: Graph, specs: list, options: CompileOptions) -> Any:
    from ember.backend import CompiledGraph, compile_prim_graph
    for placeholder, spec in zip(prim_graph.placeholders, specs):   # the specs say what requires grad
        if isinstance(placeholder.meta, TensorMeta) and isinstance(spec, TensorMeta):
            placeholder.meta = dataclasses.replace(placeholder.meta, requires_grad=spec.requires_grad)
    _check_supported(prim_graph)
    joint = build_joint(prim_graph)
    if not joint.tangents:       # nothing the user gets back depends on what requires grad
        return compile_prim_graph(prim_graph, specs, options)
    parts = partition(joint)
    forward_graph = _forward_graph(parts, joint)
    # a CUDA-graph runner hands out the first outputs to the caller; the rest are saved for backward
    forward_graph.extra["cudagraph_visible_outputs"] = len(prim_graph.outputs)
    forward_graph.extra["free_layout_outputs"] = _free_layout_outputs(parts, len(prim_graph.outputs))
    symbolic = any(isinstance(spec, TensorMeta) and any(map(is_symbolic, (*spec.shape, spec.storage_offset)))
                   for spec in specs)
    early: list[BackgroundBackward] = []

    def start_backward(sched: Any) -> None:
        """The forward is scheduled: the saved values' layouts are known, so the backward can start
        compiling in a thread while the forward's kernels build (module docstring)."""
        _adopt_saved_layouts(parts, sched, len(prim_graph.outputs))
        saved = [p.meta for p in parts.backward.placeholders[:len(parts.saved)]]
        if all(isinstance(m, TensorMeta) for m in saved):
            early.append(BackgroundBackward(parts.backward, saved, options))

    background = not symbolic and _compiles_backward_early(specs, options)
    forward = compile_prim_graph(forward_graph, specs, options, after_schedule=start_backward if background else None)
    if not background:
        _adopt_saved_layouts(parts, forward.schedule, len(prim_graph.outputs))
    step = TrainingStep(forward, parts, joint, prim_graph, graph, options, early[0] if early else None)
    if symbolic:
        # size symbols: the backward compiles now, while guards may still be added (they are
        # frozen once the forward's guards are built); its failure makes the graph static
        step.compile_backward()
    return CompiledGraph(step, "autograd", forward.source, forward.kernel_count, forward.extern_count,
                         forward.schedule)


def _compiles_backward_early(specs: list, options: CompileOptions) -> bool:
    """``config.compile_backward_early``: "cuda" (CUDA graphs whose kernels Triton builds: the
    thread's lowering runs while the forward waits for its kernels), "always", or "never"."""
    from ember import config
    from ember.codegen.triton import interpret_requested
    when = config.compile_backward_early
    if when == "cuda":
        return any(isinstance(s, TensorMeta) and s.device.type == "cuda" for s in specs) and not interpret_requested()
    return when == "always"


class BackgroundBackward:
    """The backward compiling in a thread from the moment the forward is scheduled (its kernels then
    build in the worker processes beside the forward's: ResNet-50's first training step on the
    H200 spent 3.4 s compiling a backward only after its forward had compiled and run).  The first
    backward call waits for it; its failure is raised there, as a lazy compile's would be."""

    def __init__(self, backward_graph: Graph, saved_specs: list, options: CompileOptions) -> None:
        import contextvars
        self._result: Any = None
        self._error: BaseException | None = None
        specs = _backward_specs(backward_graph, saved_specs)
        context = contextvars.copy_context()      # the compiling thread's settings (interpret mode)
        self._thread = threading.Thread(target=context.run, args=(self._compile, backward_graph, specs, options),
                                        name="ember-backward-compile", daemon=True)
        self._thread.start()

    def _compile(self, backward_graph: Graph, specs: list, options: CompileOptions) -> None:
        import contextlib

        from ember.backend import compile_prim_graph
        # a new thread's current CUDA device is 0: kernels load, and launch on the streams of, the
        # device their tensors are on (as in autograd's device thread, where a lazy compile ran)
        device = next((s.device for s in specs if isinstance(s, TensorMeta) and s.device.type == "cuda"), None)
        try:
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                self._result = compile_prim_graph(backward_graph, specs, options)
        except BaseException as exc:  # noqa: BLE001 - raised again at the first backward
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def _backward_specs(backward_graph: Graph, saved_specs: list) -> list:
    """The backward's input specs (the saved values', then the tangents'); marks the graph as a
    backward that takes one list it empties (see _CompiledFunction.backward)."""
    backward_graph.extra["boxed_inputs"] = True
    backward_graph.extra["backward"] = True     # the scheduler's memory rules
    return saved_specs + [p.meta for p in backward_graph.placeholders[len(saved_specs):]]


def _check_supported(prim_graph: Graph) -> None:
    extra = prim_graph.extra
    if "grad_unsafe" in extra:
        raise EagerAutograd(extra["grad_unsafe"])
    placeholders = prim_graph.placeholders
    arguments = set(extra.get("_argument_inputs", range(len(placeholders))))
    for position, _ in extra.get("mutated_inputs", []):
        meta = placeholders[position].meta
        if isinstance(meta, TensorMeta) and meta.requires_grad:
            raise EagerAutograd(f"an in-place update of {placeholders[position].name}, which requires grad")
        if position in arguments:
            # aliasing between arguments is checked by the inference wrapper only
            raise EagerAutograd(f"an in-place update of the argument {placeholders[position].name}")


def _free_layout_outputs(parts: Partition, first_saved: int) -> frozenset[int]:
    """The forward outputs saved for the backward that may keep the layout the forward computes
    them in: all but those the backward reads through their storage (as_strided)."""
    placeholders = parts.backward.placeholders
    return frozenset(first_saved + k for k in range(len(parts.saved))
                     if not any(user.target is P.as_strided for user in placeholders[k].users))


def _adopt_saved_layouts(parts: Partition, sched: Any, first_saved: int) -> None:
    """The backward reads each saved tensor in the layout the compiled forward gives it.  A
    channels-last convolution's output was copied to eager's NCHW for the backward, whose cuDNN
    calls converted it back (ResNet-50: 5 ms of a 52 ms training step)."""
    if sched is None:
        return
    outputs = sched.program.outputs
    for k, placeholder in enumerate(parts.backward.placeholders[:len(parts.saved)]):
        out, meta = outputs[first_saved + k], placeholder.meta
        if isinstance(out, str) and isinstance(meta, TensorMeta):
            plan = sched.buffers[out]
            if tuple(plan.stride) != tuple(meta.stride) or plan.storage_offset != meta.storage_offset:
                placeholder.meta = dataclasses.replace(meta, stride=tuple(plan.stride),
                                                       storage_offset=plan.storage_offset)


def _forward_graph(parts: Partition, joint: Joint) -> Graph:
    """The forward as the wrapper generator reads it: every output returned (the Function sorts
    them), write-backs kept, output aliasing left to the Function's caller."""
    forward = parts.forward
    extra = {k: v for k, v in forward.extra.items()
             if k not in ("output_aliases", "output_sources", "_torch_graph", "_argument_inputs",
                          "num_user_outputs")}
    extra["num_user_outputs"] = len(forward.outputs)
    forward.extra = extra
    return forward


@dataclasses.dataclass
class _Layout:
    """Where each forward output goes."""

    returned: list[int]             # forward output positions the Function returns
    non_differentiable: list[int]   # of those, the ones autograd must not differentiate
    tangent_slots: list[int]        # for each tangent: its index among the returned outputs
    num_forward_outputs: int
    num_user_outputs: int
    grad_inputs: list[int]          # placeholder positions that get gradients, in order
    grad_sources: list[frozenset[int]]  # for each of those: the tangents that reach it
    num_inputs: int
    constants: dict[int, Any]       # outputs that are Python values
    alias_metas: dict[int, TensorMeta]  # outputs that eager returns as views of inputs: their layout
    # per-call fast paths (a host-bound step pays every Python statement here, twice a step):
    # the user's outputs are the first ones returned, as they are (no constants, aliases or views)
    plain_outputs: bool
    # the Function returns forward outputs 0..k-1: a slice, not a generator
    returned_prefix: bool
    # every input is a tensor: the weak references for double backward made by map(), in C
    tensor_inputs: bool
    # one differentiable output: a non-None incoming gradient reaches every input it depends on
    single_tangent: bool


class TrainingStep:
    """The callable of an autograd CompiledGraph."""

    def __init__(self, forward: Any, parts: Partition, joint: Joint, prim_graph: Graph, torch_graph: Graph,
                 options: CompileOptions, early_backward: BackgroundBackward | None = None) -> None:
        self.forward = forward.call
        # reduce-overhead (runtime/cudagraphs.py): keeps the forward's recording busy until the
        # backward, and marks the views of its outputs made here (_apply_output_aliases)
        self.hold_until_backward = getattr(forward.call, "hold_until_backward", None)
        if self.hold_until_backward is not None:
            from ember.runtime.cudagraphs import hand_out_views
            self.hand_out_views = hand_out_views
        self._early_backward = early_backward
        self.backward_graph = parts.backward
        self.options = options
        self.extra = prim_graph.extra
        self.torch_graph = torch_graph
        self.has_random = any(n.target is P.philox_rand for n in prim_graph.call_nodes())
        self.layout = _layout(prim_graph, joint)
        backward_placeholders = parts.backward.placeholders
        self.saved_metas = [p.meta for p in backward_placeholders[:len(parts.saved)]]
        self.tangent_metas = [p.meta for p in backward_placeholders[len(parts.saved):]]
        self.num_saved = len(parts.saved)
        self.saves_tensors_only = all(isinstance(m, TensorMeta) for m in self.saved_metas)
        self.device = next((p.meta.device.type for p in prim_graph.placeholders
                            if isinstance(p.meta, TensorMeta)), "cpu")
        # dynamic shapes: where each size symbol is read in the forward's inputs (the metas the
        # backward side reads at run time are made concrete from them: ``_concrete``)
        from ember.backend import size_symbols
        self.size_symbols = size_symbols([p.meta for p in prim_graph.placeholders])
        # outputs made as views by the Function's caller: their sizes are read per call
        self.sized_views = bool(self.size_symbols) and (bool(self.extra.get("output_aliases")) or any(
            source[0] in ("input_view", "view") for source in self.extra.get("output_sources", {}).values()))
        self._concrete_metas: dict[tuple, tuple[list, list, list]] = {}   # sizes -> backward_metas()
        self._backward: Any = None
        self.backward_compiled: Any = None      # the backward's CompiledGraph, once built
        self._lock = threading.Lock()
        self._eager: Any = None

    def __call__(self, *inputs: Any) -> tuple:
        returned = _CompiledFunction.apply(self, *inputs)
        layout = self.layout
        if layout.plain_outputs:
            return returned[:layout.num_user_outputs]
        results: list[Any] = [None] * layout.num_forward_outputs
        for position, value in zip(layout.returned, returned):
            results[position] = value
        for position, value in layout.constants.items():
            results[position] = value
        numbers = self.size_numbers(inputs) if self.sized_views else None
        _apply_output_aliases(results, inputs, self.extra, layout.alias_metas, numbers)
        if self.hold_until_backward is not None:    # reduce-overhead: views of replayed memory
            self.hand_out_views([r for r in results if not any(r is v for v in returned)])
        return tuple(results[:layout.num_user_outputs])

    def size_numbers(self, inputs: Sequence[Any]) -> dict[str, int]:
        """The value of each size symbol in this call (read from the forward's inputs)."""
        return {symbol: (inputs[position].storage_offset() if dim == STORAGE_OFFSET else inputs[position].shape[dim])
                for symbol, (position, dim) in self.size_symbols.items()}

    def backward_metas(self, numbers: dict[str, int] | None) -> tuple[list, list, list]:
        """The saved values' and the tangents' metas at this call's sizes, and the saved values'
        strides (None for non-tensors); evaluating the size expressions (sympy) costs ~50 us a
        tensor, so each set of sizes is evaluated once."""
        key = tuple(numbers.values()) if numbers else ()
        metas = self._concrete_metas.get(key)
        if metas is None:
            if len(self._concrete_metas) >= 64:     # sizes that keep changing: keep the table small
                self._concrete_metas.clear()
            saved = [_concrete(m, numbers) for m in self.saved_metas]
            metas = (saved, [_concrete(m, numbers) for m in self.tangent_metas],
                     [tuple(m.stride) if isinstance(m, TensorMeta) else None for m in saved])
            self._concrete_metas[key] = metas
        return metas

    # ------------------------------------------------------------- backward
    def backward(self, saved: list[Any]) -> Any:
        """The compiled backward, built on first use from the saved values' metadata.  It takes
        one list, the saved values then the tangents, and empties it (``boxed_inputs``)."""
        if self._backward is None:
            with self._lock:
                if self._backward is None:
                    try:
                        self.compile_backward([s if isinstance(s, TensorMeta) else type(v)
                                               for s, v in zip(self.saved_metas, saved)])
                    except Exception as exc:  # noqa: BLE001 - the forward already ran: never fail the step
                        self._backward = self._uncompiled_backward(exc)
        return self._backward

    def compile_backward(self, saved_specs: list | None = None) -> None:
        """Compile the backward from the saved values' metadata (or their types, for Python
        values: ``saved_specs``, known at the first backward).  Raises CompileError."""
        from ember.backend import compile_prim_graph
        from ember.errors import CompileError
        if self._early_backward is not None:
            early, self._early_backward = self._early_backward, None
            self.backward_compiled = early.result()
            self._backward = self.backward_compiled.call
            return
        if saved_specs is None:
            if not all(isinstance(s, TensorMeta) for s in self.saved_metas):
                raise CompileError("the backward saves a Python value: compiled at its first call", stage="autodiff")
            saved_specs = list(self.saved_metas)
        specs = _backward_specs(self.backward_graph, saved_specs)
        self.backward_compiled = compile_prim_graph(self.backward_graph, specs, self.options)
        self._backward = self.backward_compiled.call

    def _uncompiled_backward(self, exc: Exception) -> Any:
        """The backward graph run op by op (each primitive's reference implementation), after its
        compilation failed: the same gradients, slower.  fallback="error" and fullgraph raise."""
        from ember.api import _fallback_message, _first_source_line, _warn_at_user_line
        from ember.errors import CompileError
        error = exc if isinstance(exc, CompileError) else CompileError(
            f"internal error: {type(exc).__name__}: {exc}", stage="backend")
        if self.options.fallback == "error" or self.options.fullgraph:
            raise error from (None if error is exc else exc)
        _warn_at_user_line(_fallback_message("ember", error, self.torch_graph, "this graph's backward"),
                           error.source_line or _first_source_line(self.torch_graph))
        uncompiled = self.backward_graph.as_callable()

        def call_boxed(arguments: list) -> Any:
            return uncompiled(*arguments)
        return call_boxed

    def eager_graph(self) -> Any:
        if self._eager is None:
            self._eager = self.torch_graph.as_callable()
        return self._eager


def _layout(prim_graph: Graph, joint: Joint) -> _Layout:
    extra = prim_graph.extra
    outputs = list(prim_graph.outputs)
    mutated = {o for _, o in extra.get("mutated_inputs", [])}
    replaced = set(extra.get("output_aliases", {})) | \
        {i for i, s in extra.get("output_sources", {}).items() if s[0] in ("input", "input_view", "output")}
    returned = [i for i, v in enumerate(outputs) if isinstance(v, Node) and i not in mutated and i not in replaced]
    differentiable = set(joint.differentiable_outputs)
    num_user_outputs = extra.get("num_user_outputs", len(outputs))
    returned_prefix = returned == list(range(len(returned)))
    return _Layout(
        returned=returned,
        non_differentiable=[i for i in returned if i not in differentiable],
        tangent_slots=[returned.index(i) for i in joint.differentiable_outputs],
        num_forward_outputs=len(outputs),
        num_user_outputs=num_user_outputs,
        grad_inputs=joint.grad_inputs,
        grad_sources=joint.grad_sources,
        num_inputs=len(joint.primals),
        constants={i: v for i, v in enumerate(outputs) if not isinstance(v, Node)},
        alias_metas={i: outputs[i].meta for i in extra.get("output_aliases", {})
                     if isinstance(outputs[i], Node) and isinstance(outputs[i].meta, TensorMeta)},
        plain_outputs=returned_prefix and len(returned) >= num_user_outputs and not extra.get("output_aliases")
        and not extra.get("output_sources") and not extra.get("detached_outputs"),
        returned_prefix=returned_prefix,
        tensor_inputs=all(isinstance(p.meta, TensorMeta) for p in prim_graph.placeholders),
        single_tangent=len(joint.differentiable_outputs) == 1,
    )


def _apply_output_aliases(results: list[Any], inputs: tuple, extra: dict, alias_metas: dict,
                          numbers: dict[str, int] | None) -> None:
    """Outputs that eager returns as an input, a view of an input or of another output (the
    same rules as codegen/wrapper.py ``_apply_output_sources``), made with autograd on; symbolic
    view sizes are evaluated at this call's ``numbers``."""
    def at(sizes: Sequence[Any]) -> tuple:
        return _at_sizes(sizes, numbers) if numbers else tuple(sizes)

    for index, position in extra.get("output_aliases", {}).items():
        meta = _concrete(alias_metas.get(index), numbers)
        if meta is not None:
            results[index] = inputs[position].as_strided(meta.shape, meta.stride, meta.storage_offset)
    sources = extra.get("output_sources", {})
    for index in sorted(sources):
        source = sources[index]
        if source[0] == "input":
            results[index] = inputs[source[1]]
        elif source[0] == "input_view":
            _, position, shape, stride, offset = source
            results[index] = inputs[position].as_strided(at(shape), at(stride), at((offset,))[0])
    for index in sorted(sources):
        source = sources[index]
        if source[0] == "view":
            _, base, shape, stride, offset = source
            results[index] = results[base].as_strided(at(shape), at(stride),
                                                      results[base].storage_offset() + at((offset,))[0])
    for index in extra.get("detached_outputs", ()):
        if index in sources and sources[index][0] in ("input_view", "view"):
            results[index] = results[index].detach()
    for index in sorted(sources):
        if sources[index][0] == "output":
            results[index] = results[sources[index][1]]


class _CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, step: TrainingStep, *inputs: Any) -> tuple:
        layout = step.layout
        results = step.forward(*inputs)
        saved = results[layout.num_forward_outputs:]
        ctx.step = step
        if step.hold_until_backward is not None:   # reduce-overhead: its recording waits for us
            ctx.recording = step.hold_until_backward(ctx)
        ctx.set_materialize_grads(False)    # an output nobody differentiated: None, see backward
        if step.saves_tensors_only:
            ctx.save_for_backward(*saved)
            ctx.saved_others = ()
        else:
            ctx.save_for_backward(*[s for s in saved if isinstance(s, torch.Tensor)])
            ctx.saved_others = [(i, s) for i, s in enumerate(saved) if not isinstance(s, torch.Tensor)]
        ctx.input_refs = list(map(weakref.ref, inputs)) if layout.tensor_inputs else list(map(_reference, inputs))
        ctx.size_numbers = step.size_numbers(inputs) if step.size_symbols else None
        if layout.returned_prefix:
            returned = tuple(results[:len(layout.returned)])
        else:
            returned = tuple(results[i] for i in layout.returned)
        if layout.non_differentiable:
            non_differentiable = [results[i] for i in layout.non_differentiable if isinstance(results[i], torch.Tensor)]
            if non_differentiable:
                ctx.mark_non_differentiable(*non_differentiable)
        return returned

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        step: TrainingStep = ctx.step
        layout = step.layout
        if step.hold_until_backward is not None and ctx.recording is not None:
            ctx.recording.pending = None
        tangents = [grads[slot] for slot in layout.tangent_slots]
        if all(t is None for t in tangents):
            return (None,) * (layout.num_inputs + 1)
        if torch.is_grad_enabled():     # create_graph=True: differentiate the eager graph instead
            return (None, *_double_backward(ctx, grads))
        saved = list(ctx.saved_tensors)     # raises if one was modified in place, or already freed
        for index, value in ctx.saved_others:
            saved.insert(index, value)
        backward = step.backward(saved)
        # ctx lets go of the saved tensors unless autograd will call backward again (retain_graph,
        # create_graph): from here the list below is their only holder, and the compiled backward
        # empties it and drops each one after its last reader, as eager frees them layer by layer
        ctx.maybe_clear_saved_tensors()
        saved_metas, tangent_metas, saved_strides = step.backward_metas(ctx.size_numbers)
        # strides compared inline first: a function call per saved value was 1.2 ms of a
        # ResNet-50 step's host time (486 values)
        arguments = [value if stride is not None and isinstance(value, torch.Tensor) and value.stride() == stride
                     else _in_layout(value, meta)
                     for value, meta, stride in zip(saved, saved_metas, saved_strides)]
        del saved
        arguments += [_tangent(value, meta) for value, meta in zip(tangents, tangent_metas)]
        del tangents
        if torch.is_autocast_enabled(step.device):     # the graph holds its casts already
            with torch.autocast(step.device, enabled=False):
                input_grads = backward(arguments)
        else:
            input_grads = backward(arguments)
        return (None, *_input_grads(layout, input_grads, grads))


def _tangent(value: torch.Tensor | None, meta: TensorMeta) -> torch.Tensor:
    """A tangent for the compiled backward: zeros for an output autograd did not differentiate."""
    if value is None:
        return torch.zeros(meta.shape, dtype=meta.dtype, device=meta.device)
    return value.contiguous()


def _input_grads(layout: _Layout, input_grads: Any, grads: tuple) -> list[Any]:
    """The Function's gradients, in input order: None where eager's would be, for inputs not
    requiring grad and for inputs reached only from outputs that got no gradient."""
    result: list[Any] = [None] * layout.num_inputs
    if layout.single_tangent and grads[layout.tangent_slots[0]] is not None:
        for position, grad, sources in zip(layout.grad_inputs, input_grads, layout.grad_sources):
            if sources:
                result[position] = grad
        return result
    for position, grad, sources in zip(layout.grad_inputs, input_grads, layout.grad_sources):
        if any(grads[layout.tangent_slots[k]] is not None for k in sources):
            result[position] = grad
    return result


def _reference(value: Any) -> Any:
    return weakref.ref(value) if isinstance(value, torch.Tensor) else (lambda: value)


def _concrete(meta: Any, numbers: dict[str, int] | None) -> Any:
    """A TensorMeta with symbolic sizes and strides evaluated at this call's sizes."""
    if not numbers or not isinstance(meta, TensorMeta):
        return meta
    if not any(map(is_symbolic, (*meta.shape, *meta.stride, meta.storage_offset))):
        return meta
    return dataclasses.replace(meta, shape=_at_sizes(meta.shape, numbers), stride=_at_sizes(meta.stride, numbers),
                               storage_offset=_at_sizes((meta.storage_offset,), numbers)[0])


def _at_sizes(sizes: Sequence[Any], numbers: dict[str, int]) -> tuple[int, ...]:
    """Sizes (ints or SymInts) as ints at this call's values of the size symbols."""
    return tuple(int(v.expr.xreplace({symbol: numbers[symbol.name] for symbol in v.expr.free_symbols}))
                 if is_symbolic(v) else v for v in sizes)


def _in_layout(value: Any, meta: Any) -> Any:
    """A saved tensor in the layout the backward was compiled for (a copy only if it differs)."""
    if not isinstance(value, torch.Tensor) or not isinstance(meta, TensorMeta):
        return value
    strides = value.stride()
    if strides == tuple(meta.stride) or value.numel() <= 1 or \
            all(size == 1 or a == b for size, a, b in zip(meta.shape, strides, meta.stride)):
        return value        # strides of size-1 dims never enter an address (a pooled (N, C, 1, 1))
    copy = torch.empty_strided(meta.shape, meta.stride, dtype=value.dtype, device=value.device)
    return copy.copy_(value)


def _double_backward(ctx: Any, grads: tuple) -> list[Any]:
    """Gradients that are themselves differentiable: the torch-level graph re-run eagerly from
    the original inputs, then differentiated by autograd (create_graph=True)."""
    step: TrainingStep = ctx.step
    layout = step.layout
    if step.has_random:
        raise RuntimeError("ember: create_graph=True through a compiled graph that draws random numbers "
                           "(dropout, rand) is not supported: the eager re-run would draw other numbers. "
                           "Compile the function with backend='eager', or differentiate it once.")
    inputs = [ref() for ref in ctx.input_refs]
    if any(ref() is None for ref in ctx.input_refs if isinstance(ref, weakref.ref)):
        raise RuntimeError("ember: create_graph=True needs the inputs of the compiled graph, and one of "
                           "them was freed; keep the inputs alive or compile with backend='eager'")
    hidden = [p for p in layout.returned if p >= layout.num_user_outputs]
    if any(layout.returned[slot] in hidden for slot in layout.tangent_slots):
        raise RuntimeError("ember: create_graph=True through a compiled graph returning views of an "
                           "intermediate is not supported; compile it with backend='eager'")
    written = {p for p, _ in step.extra.get("mutated_inputs", [])}
    replay = [x.clone() if i in written and isinstance(x, torch.Tensor) else x for i, x in enumerate(inputs)]
    with torch.enable_grad():
        outputs = step.eager_graph()(*replay)
        pairs = [(outputs[layout.returned[slot]], grads[slot]) for slot in layout.tangent_slots
                 if grads[slot] is not None]
        wanted = [replay[p] for p in layout.grad_inputs]
        input_grads = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                          create_graph=True, allow_unused=True)
    return _input_grads(layout, input_grads, grads)
