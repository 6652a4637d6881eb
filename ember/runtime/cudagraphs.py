"""CUDA graphs for mode="reduce-overhead": record a compiled graph's launches once, replay them.

    call = CudaGraphRunner(compiled.call, prim_graph, specs)   # the same calling convention

Per input layout (the addresses of pinned inputs, Python scalars, the sizes of inputs with
symbolic sizes; the graph's guards fix the rest) the first call runs the generated wrapper as usual (warm-up: Triton compiles, cuBLAS initialises), the
second records it into a ``torch.cuda.CUDAGraph`` with its own memory pool, and later calls replay
it: one launch for the whole graph instead of one per kernel.

Inputs.  A recording reads every input from a fixed address.  Parameters, module buffers and
outputs of another runner's recordings (a training forward's saved activations, read by the
backward) are "pinned": read where they are, the recording being chosen by their addresses.  Other
inputs are copied into buffers the recording owns; those the graph writes are copied back.  A
pinned input whose address keeps changing is demoted to a copied one.

Outputs live in the recording's pool, and its next replay writes over them.  As under
torch.compile, an output the caller still holds at that point is marked so that reading it raises
an error that says what to do (clone it, or call ``ember.cudagraph_mark_step_begin()``).  Memory
that autograd may still read is never overwritten: a training forward's saved activations until
its backward ran, a backward's gradients while ``p.grad`` holds them (gradient accumulation;
AccumulateGrad keeps its own tensor on our memory).  A recording whose such memory is still
referenced is busy, and the call replays another recording of the same layout (recorded then).

What cannot be recorded runs the plain launches, with the reason under EMBER_LOGS=cudagraphs:
CPU tensor inputs, random numbers drawn on the host, too many layouts, or a recording that
failed (an op that synchronises with the host, for example).
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ember.codegen.wrapper import inputs_share_memory
from ember.debug.logs import log
from ember.graph import Graph, TensorMeta
from ember.symbolic import is_symbolic

# a runner keeps at most this many recordings (sizes under dynamic shapes, busy forwards); each has
# its own memory pool, so beyond it calls run the plain launches
MAX_RECORDINGS = 8
# recordings of one layout: a training forward called again before its backward ran
RECORDINGS_PER_LAYOUT = 3

OVERWRITTEN = ("Error: accessing a tensor output of an ember reduce-overhead (CUDA graph) call that a later "
               "call has overwritten.  Clone the output (out.clone()) if you need it after the next call "
               "of the compiled function.")

# calls by how they ran, for tests and benchmarks: "recorded", "replayed", "plain"
counters: dict[str, int] = {"recorded": 0, "replayed": 0, "plain": 0}

_runners: weakref.WeakSet[CudaGraphRunner] = weakref.WeakSet()
# storage address -> the runner whose recording returned it (its outputs never move)
_pool_outputs: dict[int, weakref.ref] = {}


def reset() -> None:
    """ember.reset(): forget every runner (their recordings go with the compiled functions)."""
    _runners.clear()
    _pool_outputs.clear()
    for name in counters:
        counters[name] = 0


def mark_step_begin() -> None:
    """A new step begins: outputs of earlier calls are dead (reading one raises the error above)."""
    for runner in list(_runners):
        runner.expire_outputs()


@dataclasses.dataclass(eq=False)
class _Recording:
    replay: Callable[[], None]              # the recorded CUDA graph's replay
    buffers: dict[int, torch.Tensor]        # copied input position -> the buffer the graph reads
    copy_back: list[int]                    # copied positions the graph writes
    plan: list[tuple]                       # per output: how to hand it out after a replay
    outputs: list[Any]                      # what the recorded call returned (keeps the pool's outputs)
    watched: list[tuple[torch.Tensor, int]]  # outputs autograd may hold, with our own use count
    returned: list[weakref.ref] = dataclasses.field(default_factory=list)   # handed out last replay


class CudaGraphRunner:
    """The callable of a reduce-overhead CompiledGraph on CUDA (see the module docstring)."""

    def __init__(self, call: Callable[..., tuple], prim_graph: Graph, specs: list[Any]) -> None:
        self.call = call
        extra = prim_graph.extra
        self.boxed = bool(extra.get("boxed_inputs"))
        self.backward = bool(extra.get("backward"))
        # a training forward: its first outputs go to the caller, the others are saved for backward
        self.num_visible = extra.get("cudagraph_visible_outputs")
        self.mutated = {position for position, _ in extra.get("mutated_inputs", [])}
        # arguments the graph writes: when one shares memory with another argument the wrapper
        # runs the torch-level graph eagerly (codegen/wrapper.py _emit_alias_check), so must we
        self.arguments = list(extra.get("_argument_inputs", range(len(prim_graph.placeholders))))
        self.written_arguments = sorted(self.mutated & set(self.arguments))
        self.pinned_by_source = [_is_module_state(p.extra.get("source", "")) for p in prim_graph.placeholders]
        self.symbolic = [position for position, spec in enumerate(specs)
                         if isinstance(spec, TensorMeta) and any(map(is_symbolic, (*spec.shape, *spec.stride,
                                                                                    spec.storage_offset)))]
        # input positions by kind, sorted on the first call: parameters and module state (read in
        # place), other tensors (copied, unless another runner's output), Python scalars
        self.pinned_positions: list[int] | None = None
        self.other_positions: list[int] = []
        self.scalar_positions: list[int] = []
        self.recordings: dict[tuple, list[_Recording]] = {}
        self.warmed_up: set[tuple] = set()
        self.disabled = ""
        if any(getattr(n.target, "__name__", "") == "draw_seed" for n in prim_graph.call_nodes()):
            self._disable("the graph draws random numbers on the host (dropout, rand) once per call")
        _runners.add(self)

    def describe(self) -> str:
        """For ember.explain: whether the graph is replayed as a CUDA graph."""
        if self.disabled:
            return f"no CUDA graph ({self.disabled})"
        count = sum(len(r) for r in self.recordings.values())
        return f"CUDA graph: {count} recorded" if count else "CUDA graph recorded on the 2nd call of each input layout"

    # ------------------------------------------------------------------ calls
    def __call__(self, *arguments: Any) -> tuple:
        if self.boxed:      # one list that the callee empties (a training backward)
            box = arguments[0]
            inputs = tuple(box)
            box.clear()
        else:
            inputs = arguments
        if self.disabled or (self.written_arguments and self._arguments_alias(inputs)):
            return self._plain(inputs)
        key = self._layout_key(inputs)
        if key is None:
            return self._plain(inputs)
        recording = self._free_recording(key)
        if recording is None:
            if key not in self.warmed_up:
                self.warmed_up.add(key)
                return self._plain(inputs)
            recording = self._record(key, inputs)
            if recording is None:
                return self._plain(inputs)
        return self._replay(recording, inputs)

    def _arguments_alias(self, inputs: tuple) -> bool:
        tensors = [p for p in self.arguments if isinstance(inputs[p], torch.Tensor)]
        written = tuple(tensors.index(p) for p in self.written_arguments if p in tensors)
        return len(tensors) > 1 and inputs_share_memory(tuple(inputs[p] for p in tensors), written)

    def _plain(self, inputs: tuple) -> tuple:
        counters["plain"] += 1
        return self.call(list(inputs)) if self.boxed else self.call(*inputs)

    def _replay(self, recording: _Recording, inputs: tuple) -> tuple:
        for position, buffer in recording.buffers.items():
            buffer.copy_(inputs[position])
        self._expire(recording)
        recording.replay()
        counters["replayed"] += 1
        for position in recording.copy_back:
            inputs[position].copy_(recording.buffers[position])
        return self._hand_out(recording, inputs)

    # ------------------------------------------------------------------ layouts
    def _layout_key(self, inputs: tuple) -> tuple | None:
        """What a recording depends on: (addresses of module-state inputs, addresses of other
        runners' outputs or None for inputs to copy, Python scalars, shapes and strides of inputs
        with symbolic sizes).  Static shapes are fixed by the graph's guards."""
        if self.pinned_positions is None and not self._first_call(inputs):
            return None
        pinned = tuple([inputs[p].data_ptr() for p in self.pinned_positions])
        others = tuple([self._pool_address(inputs[p]) for p in self.other_positions])
        scalars = tuple([(type(inputs[p]), inputs[p]) for p in self.scalar_positions])
        layouts = tuple([(tuple(inputs[p].shape), inputs[p].stride(), inputs[p].storage_offset())
                         for p in self.symbolic])
        return pinned, others, scalars, layouts

    def _pool_address(self, value: torch.Tensor) -> int | None:
        """The address of another runner's output (a saved activation: read in place), else None."""
        address = value.untyped_storage().data_ptr()
        owner = _pool_outputs.get(address)
        return value.data_ptr() if owner is not None and owner() not in (None, self) else None

    def _first_call(self, inputs: tuple) -> bool:
        """Sort the inputs once (the graph's guards keep them so)."""
        tensors = []
        for position, value in enumerate(inputs):
            if isinstance(value, torch.Tensor):
                if value.device.type != DEVICE_TYPE:
                    self._disable(f"input {position} is a {value.device.type} tensor")
                    return False
                tensors.append(position)
            elif isinstance(value, (int, float, bool, type(None), torch.dtype, str)):
                self.scalar_positions.append(position)
            else:
                self._disable(f"input {position} is a {type(value).__name__}")
                return False
        self.pinned_positions = [p for p in tensors
                                 if isinstance(inputs[p], torch.nn.Parameter) or self.pinned_by_source[p]]
        self.other_positions = [p for p in tensors if p not in self.pinned_positions]
        return True

    def _free_recording(self, key: tuple) -> _Recording | None:
        for recording in self.recordings.get(key, ()):
            if not _busy(recording):
                return recording
        return None

    # ------------------------------------------------------------------ recording
    def _record(self, key: tuple, inputs: tuple) -> _Recording | None:
        same_key = self.recordings.get(key, [])
        if len(same_key) >= RECORDINGS_PER_LAYOUT:
            log("cudagraphs", f"{len(same_key)} recordings of one layout are all in use: plain launches")
            return None
        if self._demote_moving_inputs(key):
            key = self._layout_key(inputs)
            if key is None:
                return None
        if sum(len(r) for r in self.recordings.values()) >= MAX_RECORDINGS:
            self._disable(f"more than {MAX_RECORDINGS} input layouts (sizes) or concurrent calls")
            return None
        buffers = {position: _empty_like(inputs[position])
                   for position, address in zip(self.other_positions, key[1]) if address is None}
        for position, buffer in buffers.items():
            buffer.copy_(inputs[position])
        static = [buffers.get(position, value) for position, value in enumerate(inputs)]
        device = next(v.device for v in inputs if isinstance(v, torch.Tensor))
        try:
            outputs, replay = capture(device, lambda: self.call(list(static)) if self.boxed else self.call(*static),
                                      static)
        except Exception as exc:  # noqa: BLE001 - a graph that cannot be recorded runs its plain launches
            self._disable(f"recording failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return None
        recording = _Recording(replay, buffers, sorted(p for p in self.mutated if p in buffers),
                               _output_plan(outputs, static, buffers), list(outputs), [])
        pool = [(index, plan[1]) for index, plan in enumerate(recording.plan) if plan[0] == "pool"]
        for _, output in pool:
            _pool_outputs[output.untyped_storage().data_ptr()] = weakref.ref(self)
        if self.backward:       # gradients: p.grad may keep any of them
            recording.watched = _distinct_storages([o for _, o in pool])
        elif self.num_visible is not None:      # saved activations, until the backward ran
            recording.watched = _distinct_storages([o for i, o in pool if i >= self.num_visible])
        del outputs
        self.recordings.setdefault(key, []).append(recording)
        counters["recorded"] += 1
        log("cudagraphs", f"recorded a CUDA graph ({len(buffers)} inputs copied, "
                          f"{len(key[0]) + sum(a is not None for a in key[1])} read in place)")
        return recording

    def _demote_moving_inputs(self, key: tuple) -> bool:
        """A parameter or module-state input at a new address where a recording of the same sizes
        has it at another (a tensor made per call that our guess took for module state): copy it
        from now on, and drop every recording (their keys change shape).  Another runner's outputs
        (saved activations) legitimately move between that runner's recordings: they stay pinned."""
        moved: set[int] = set()
        for other in self.recordings:
            if other[2:] == key[2:]:
                moved.update(p for p, a, b in zip(self.pinned_positions, key[0], other[0]) if a != b)
        if not moved:
            return False
        log("cudagraphs", f"inputs {sorted(moved)} change address between calls: copied from now on")
        self.pinned_positions = [p for p in self.pinned_positions if p not in moved]
        self.other_positions = sorted([*self.other_positions, *moved])
        self.recordings.clear()
        self.warmed_up.clear()
        return True

    # ------------------------------------------------------------------ outputs
    def _hand_out(self, recording: _Recording, inputs: tuple) -> tuple:
        results: list[Any] = []
        made: dict[int, torch.Tensor] = {}
        returned: list[weakref.ref] = []
        limit = 0 if self.backward else len(recording.plan) if self.num_visible is None else self.num_visible
        for index, plan in enumerate(recording.plan):
            kind = plan[0]
            if kind == "pool":
                tensor = plan[1]
                result = made.get(id(tensor))
                if result is None:
                    result = made[id(tensor)] = tensor.detach()
                    if index < limit:
                        returned.append(weakref.ref(result))
            elif kind == "input":
                result = inputs[plan[1]]
            elif kind == "input_view":
                _, position, shape, stride, delta = plan
                result = inputs[position].as_strided(shape, stride, inputs[position].storage_offset() + delta)
            else:
                result = plan[1]
            results.append(result)
        recording.returned = returned
        return tuple(results)

    def _expire(self, recording: _Recording) -> None:
        """Before a replay: what the last one handed out and the caller still holds."""
        for reference in recording.returned:
            tensor = reference()
            if tensor is not None:
                mark_overwritten(tensor)
        recording.returned = []

    def expire_outputs(self) -> None:
        for recordings in self.recordings.values():
            for recording in recordings:
                self._expire(recording)

    def _disable(self, reason: str) -> None:
        if not self.disabled:
            self.disabled = reason
            log("cudagraphs", f"not recorded: {reason}; the graph runs its plain launches")
            self.recordings.clear()


# The seams tests replace to run this module on the CPU (tests/runtime/test_cudagraphs.py emulates
# a recording by running the call again and writing into the recorded outputs):
DEVICE_TYPE = "cuda"        # whose graphs are recorded


def capture(device: torch.device, run: Callable[[], Any], inputs: list[Any]) -> tuple[Any, Callable[[], None]]:
    """Record ``run()``'s launches into a CUDA graph with its own memory pool: (what run
    returned, the graph's replay).  ``inputs``, what run reads, are unchanged: nothing runs."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        with torch.cuda.graph(graph, stream=_capture_stream(), capture_error_mode="thread_local"):
            outputs = run()
    return outputs, graph.replay


def mark_overwritten(tensor: torch.Tensor) -> None:
    """Reading ``tensor`` raises OVERWRITTEN from now on (it lets go of the storage)."""
    torch._C._set_storage_access_error_msg(tensor, OVERWRITTEN)


_capture_streams: dict[int, torch.cuda.Stream] = {}


def _capture_stream() -> torch.cuda.Stream:
    """One side stream per device for every recording: cuBLAS keeps a workspace per stream."""
    device = torch.cuda.current_device()
    if device not in _capture_streams:
        _capture_streams[device] = torch.cuda.Stream(device)
    return _capture_streams[device]


def _is_module_state(source: str) -> bool:
    """A placeholder read from an object's attribute (self.fc.weight, a module buffer): it stays
    where it is between calls (parameters are recognised by their type anyway)."""
    return "." in source


def _empty_like(value: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(value.shape), value.stride(), dtype=value.dtype, device=value.device)


def _output_plan(outputs: Any, static: list[Any], buffers: dict[int, torch.Tensor]) -> list[tuple]:
    """Per output of the recorded call: ("pool", tensor) for the recording's own memory, ("input",
    p) / ("input_view", p, shape, stride, offset delta) for an input or a view of one (handed out
    as the caller's input or a view of it), ("value", v) for a Python value."""
    storages = {v.untyped_storage().data_ptr(): p for p, v in enumerate(static) if isinstance(v, torch.Tensor)}
    plan: list[tuple] = []
    for output in outputs:
        if not isinstance(output, torch.Tensor):
            plan.append(("value", output))
            continue
        position = next((p for p, v in enumerate(static) if v is output), None)
        if position is not None:
            plan.append(("input", position))
            continue
        position = storages.get(output.untyped_storage().data_ptr())
        if position is not None:
            delta = output.storage_offset() - static[position].storage_offset()
            plan.append(("input_view", position, tuple(output.shape), output.stride(), delta))
        else:
            plan.append(("pool", output))
    return plan


def _use_count(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def _distinct_storages(tensors: list[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(tensor.untyped_storage().data_ptr(), tensor)
    return [(tensor, _use_count(tensor)) for tensor in seen.values()]


def _busy(recording: _Recording) -> bool:
    """Autograd still holds memory of this recording (saved activations, a gradient in p.grad)."""
    return any(_use_count(tensor) > count for tensor, count in recording.watched)
