"""CUDA graphs for mode="reduce-overhead": record a compiled graph's launches once, replay them.

    call = CudaGraphRunner(compiled.call, prim_graph, specs)   # the same calling convention

Per input layout (the addresses of pinned inputs, Python scalars, the sizes of inputs with
symbolic sizes; the graph's guards fix the rest) the first call runs the generated wrapper as usual
(warm-up: Triton compiles, cuBLAS initialises), the second records it into a ``torch.cuda.CUDAGraph``,
and later calls replay it: one launch for the whole graph instead of one per kernel.

Memory.  Every recording on a device allocates from one memory pool, so that the intermediates of
one recording reuse the memory another's intermediates used: a training backward's temporaries
take the forward's, the graphs on either side of a graph break share theirs, and so do the
recordings of each size under dynamic shapes.  A recording keeps its outputs allocated, so no
later recording is placed over them; what a later recording may take is the rest of the pool, its
*scratch* (memory free when it was recorded).  A replay writes its scratch, so before a recording replays, the outputs of later recordings that
lie in its scratch must be dead: those it handed to the caller are marked overwritten (the graph
after a graph break: calling the function again overwrites what it returned, as when one graph
replays again), and while autograd holds one (a gradient in ``p.grad``, a forward's saved
activations) the recording is busy, as it is for its own (below).

Inputs.  A recording reads every input from a fixed address, and the input's address is part of
the layout that chooses the recording.  So a tensor input is read where it is (parameters, module
buffers, a training forward's saved activations read by the backward, an input tensor the caller
passes again, a backward's incoming gradient that the allocator puts at one address every step),
until a call of the same sizes passes it at another address: from then on it is copied into a
buffer the recording owns (copied back when the graph writes it).  This runner's own outputs fed
back as inputs are always copied, since a replay writes over them.  Outputs of another runner's
recordings stay read in place wherever they are.

Outputs live in the recording's pool, and its next replay writes over them.  As under
torch.compile, an output the caller still holds at that point is marked so that reading it raises
an error that says what to do (clone it, or call ``ember.cudagraph_mark_step_begin()``).  The mark
is per tensor object: the outputs we hand out and the views ember makes of them are marked (see
hand_out_views); a view the caller made of an output and kept is not, as under torch.compile.  Memory
that autograd may still read is never overwritten: a training forward's saved activations until
its backward ran, a backward's gradients while ``p.grad`` holds them (gradient accumulation;
AccumulateGrad keeps its own tensor on our memory).  A recording whose such memory is still
referenced is busy, and the call replays another recording of the same layout (recorded then).
So is a training forward until its call's backward ran (two forwards before one backward), and a
recording while the caller holds outputs lying in its scratch of a later recording (graphs warm up
at different calls around a graph break) that are a training forward's awaiting that backward, or
any forward's when the recording is a training backward: a step's outputs stay readable after
loss.backward(), as in eager.

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

# every recording on a device allocates from one pool (False: each from its own, as before; for A/B
# measurements, benchmarks/gpu_cudagraph_pool.py)
SHARE_POOL = True
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
# every live recording, for the scratch bookkeeping of the shared pool
_recordings: weakref.WeakSet[_Recording] = weakref.WeakSet()
# device index -> the memory pool its recordings share
_pools: dict[int, Any] = {}
# storage address -> the runner whose recording returned it (its outputs never move)
_pool_outputs: dict[int, weakref.ref] = {}
# storage address -> the recording that returned it (for views of its outputs made elsewhere)
_pool_recordings: dict[int, weakref.ref] = {}


def reset() -> None:
    """ember.reset(): forget every runner (their recordings go with the compiled functions)."""
    _runners.clear()
    _recordings.clear()
    _pools.clear()
    _pool_outputs.clear()
    _pool_recordings.clear()
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
    outputs: list[torch.Tensor]             # the recorded call's outputs in the pool (keeps them allocated)
    watched: list[tuple[torch.UntypedStorage, int]]  # outputs autograd may hold, with our own use count
    returned: list[weakref.ref] = dataclasses.field(default_factory=list)   # handed out last replay
    # the pool memory its replay may write besides its outputs (address ranges), and what later
    # recordings keep there: outputs autograd may hold, with our own use count (busy while held),
    # and the recordings whose returned outputs may lie there (held strongly: one its runner dropped
    # may still have handed-out outputs), with their storage addresses (expired before a replay)
    scratch: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    hazards: list[tuple[torch.UntypedStorage, int]] = dataclasses.field(default_factory=list)
    overlapped: list[tuple[_Recording, frozenset[int]]] = dataclasses.field(default_factory=list)
    # every output is in the pool and none repeats: hand out ``outputs`` as they are (per call)
    distinct_pool_outputs: bool = False
    # later recordings whose handed-out outputs lie in its scratch and keep it busy while the caller
    # holds one: for a training backward, any forward's (the step's outputs, read after
    # loss.backward()); for any recording, a training forward's while that call's backward is
    # pending (two forwards, then one backward: the loss saved the first one's outputs)
    protected: list[tuple[_Recording, frozenset[int]]] = dataclasses.field(default_factory=list)
    backward: bool = False
    training_forward: bool = False
    # a training forward's: the autograd ctx of its last replay, until that call's backward runs
    pending: weakref.ref | None = None


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
        self.copied: set[int] = set()      # other positions seen at several addresses: copied
        self.scalar_positions: list[int] = []
        self.recordings: dict[tuple, list[_Recording]] = {}
        self.warmed_up: set[tuple] = set()
        self.disabled = ""
        self.last_replayed: _Recording | None = None    # this call's recording, for hold_until_backward
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
        self.last_replayed = None
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
                moved = self._moving_inputs(key, inputs)
                if not moved:
                    self.warmed_up.add(key)
                    return self._plain(inputs)
                # an input seen at another address in a call of the same layout: copy it from now
                # on (the layout's kernels and libraries are warm: record at once)
                self._demote(moved)
                key = self._layout_key(inputs)
                self.warmed_up.add(key)
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
        results = self.call(list(inputs)) if self.boxed else self.call(*inputs)
        hand_out_views(results)     # an output viewing an input that a recording returned
        return results

    def _replay(self, recording: _Recording, inputs: tuple) -> tuple:
        for position, buffer in recording.buffers.items():
            buffer.copy_(inputs[position])
        _expire(recording)
        for later, addresses in recording.overlapped:
            if later.returned:
                _expire(later, addresses)
        recording.replay()
        counters["replayed"] += 1
        self.last_replayed = recording
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
        others = tuple([self._read_in_place(inputs[p], p) for p in self.other_positions])
        scalars = tuple([(type(inputs[p]), inputs[p]) for p in self.scalar_positions])
        layouts = tuple([(tuple(inputs[p].shape), inputs[p].stride(), inputs[p].storage_offset())
                         for p in self.symbolic])
        return pinned, others, scalars, layouts

    def _read_in_place(self, value: torch.Tensor, position: int) -> int | None:
        """The address a recording reads this input at, or None for an input copied into a buffer
        the recording owns: another runner's output (a saved activation) is read in place; so is
        any other tensor until it is seen at another address (``copied``), unless it is this
        runner's own output, which a replay writes over (state fed back as an input)."""
        owner = _pool_owner(value)
        if owner is None:
            return None if position in self.copied else value.data_ptr()
        return value.data_ptr() if owner() not in (None, self) else None

    def _owned_by_another_runner(self, value: torch.Tensor) -> bool:
        owner = _pool_owner(value)
        return owner is not None and owner() not in (None, self)

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
        moved = self._moving_inputs(key, inputs)
        if moved:
            self._demote(moved)
            key = self._layout_key(inputs)
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
        plan = _output_plan(outputs, static, buffers)
        recording = _Recording(replay, buffers, sorted(p for p in self.mutated if p in buffers), plan,
                               [entry[1] for entry in plan if entry[0] == "pool"], [])
        pool = [(index, entry[1]) for index, entry in enumerate(plan) if entry[0] == "pool"]
        recording.distinct_pool_outputs = len(pool) == len(plan) == len({id(t) for _, t in pool})
        recording.backward = self.backward
        recording.training_forward = self.num_visible is not None
        for _, output in pool:
            _pool_outputs[output.untyped_storage().data_ptr()] = weakref.ref(self)
            _pool_recordings[output.untyped_storage().data_ptr()] = weakref.ref(recording)
        if self.backward:       # gradients: p.grad may keep any of them
            recording.watched = _distinct_storages([o for _, o in pool])
        elif self.num_visible is not None:      # saved activations, until the backward ran
            recording.watched = _distinct_storages([o for i, o in pool if i >= self.num_visible])
        del outputs
        _share_pool(recording, [o for _, o in pool], device)
        self.recordings.setdefault(key, []).append(recording)
        counters["recorded"] += 1
        log("cudagraphs", f"recorded a CUDA graph ({len(buffers)} inputs copied, "
                          f"{len(key[0]) + sum(a is not None for a in key[1])} read in place)")
        return recording

    def _moving_inputs(self, key: tuple, inputs: tuple) -> set[int]:
        """Inputs read in place whose address differs from a recorded or warmed-up call of the same
        scalars and sizes: a tensor made per call (a new batch; a parameter-like attribute our
        guess took for module state).  Another runner's outputs (saved activations) legitimately
        move between that runner's recordings: they stay read in place."""
        moved: set[int] = set()
        for other in (*self.recordings, *self.warmed_up):
            if other[2:] != key[2:]:
                continue
            moved.update(p for p, a, b in zip(self.pinned_positions, key[0], other[0]) if a != b)
            moved.update(p for p, a, b in zip(self.other_positions, key[1], other[1])
                         if a != b and a is not None and b is not None
                         and not self._owned_by_another_runner(inputs[p]))
        return moved

    def _demote(self, moved: set[int]) -> None:
        """Copy the ``moved`` inputs from now on; every recording is dropped (their keys change)."""
        log("cudagraphs", f"inputs {sorted(moved)} change address between calls: copied from now on")
        self.pinned_positions = [p for p in self.pinned_positions if p not in moved]
        self.other_positions = sorted({*self.other_positions, *moved})
        self.copied |= moved
        self.recordings.clear()
        self.warmed_up.clear()

    # ------------------------------------------------------------------ outputs
    def _hand_out(self, recording: _Recording, inputs: tuple) -> tuple:
        if recording.distinct_pool_outputs:     # the common case, per call: no plan to walk
            results = [tensor.detach() for tensor in recording.outputs]
            recording.returned = list(map(weakref.ref, results[:self._returned_limit(recording)]))
            return tuple(results)
        results: list[Any] = []
        made: dict[int, torch.Tensor] = {}
        returned: list[weakref.ref] = []
        limit = self._returned_limit(recording)
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
                hand_out_views([result])
            else:
                result = plan[1]
            results.append(result)
        recording.returned = returned
        return tuple(results)

    def _returned_limit(self, recording: _Recording) -> int:
        """Outputs 0..limit-1 go to the caller, who may keep them across calls (a backward's go to
        autograd, a training forward's saved activations to its ctx: busy, not expired)."""
        return 0 if self.backward else len(recording.plan) if self.num_visible is None else self.num_visible

    def expire_outputs(self) -> None:
        for recordings in self.recordings.values():
            for recording in recordings:
                _expire(recording)
                recording.pending = None

    def hold_until_backward(self, ctx: Any) -> _Recording | None:
        """A training forward's call: its recording stays busy until ``ctx``'s backward ran (the
        caller then clears ``pending``) or autograd dropped ctx.  Two forwards before one backward
        must not overwrite the first one's outputs, which the loss may have saved."""
        recording = self.last_replayed
        if recording is not None:
            recording.pending = weakref.ref(ctx)
        return recording

    def _disable(self, reason: str) -> None:
        if not self.disabled:
            self.disabled = reason
            log("cudagraphs", f"not recorded: {reason}; the graph runs its plain launches")
            self.recordings.clear()


# The seams tests replace to run this module on the CPU (tests/runtime/test_cudagraphs.py emulates
# a recording by running the call again and writing into the recorded outputs):
DEVICE_TYPE = "cuda"        # whose graphs are recorded


def capture(device: torch.device, run: Callable[[], Any], inputs: list[Any]) -> tuple[Any, Callable[[], None]]:
    """Record ``run()``'s launches into a CUDA graph that allocates from the device's shared pool:
    (what run returned, the graph's replay).  ``inputs``, what run reads, are unchanged: nothing
    runs."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        pool = _pool() if SHARE_POOL else None
        with torch.cuda.graph(graph, pool=pool, stream=_capture_stream(), capture_error_mode="thread_local"):
            outputs = run()
    return outputs, graph.replay


def pool_segments(device: torch.device) -> list[tuple[int, int]]:
    """The address ranges of the device's shared pool, or [] before its first recording; the
    whole address space when the allocator's snapshot does not name the pool (every later output
    then counts as lying in each earlier recording's scratch: more recordings, never a wrong one)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not SHARE_POOL or index not in _pools:
        return []
    handle = tuple(_pools[index])
    segments = [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()
                if s.get("device") == index and tuple(s.get("segment_pool_id", ())) == handle]
    if not segments:
        log("cudagraphs", "the allocator's snapshot shows no segment of the shared pool: scratch is all memory")
        return [(0, 1 << 64)]
    return segments


def _pool() -> Any:
    device = torch.cuda.current_device()
    if device not in _pools:
        _pools[device] = torch.cuda.graph_pool_handle()
    return _pools[device]


def _share_pool(recording: _Recording, pool_outputs: list[torch.Tensor], device: torch.device) -> None:
    """The shared pool's bookkeeping for a new recording (module docstring): its outputs that
    lie in an earlier recording's scratch are listed there, and its own scratch is the pool less
    every recording's outputs."""
    for earlier in list(_recordings):
        inside = [t for t in pool_outputs if _overlaps(*_extent(t), earlier.scratch)]
        if inside:
            addresses = frozenset(t.untyped_storage().data_ptr() for t in inside)
            earlier.hazards.extend(w for w in recording.watched if w[0].data_ptr() in addresses)
            earlier.overlapped.append((recording, addresses))
            if recording.training_forward or (earlier.backward and not recording.backward):
                earlier.protected.append((recording, addresses))
    _recordings.add(recording)
    outputs = sorted(_extent(t) for r in _recordings for t in r.outputs)
    recording.scratch = _subtract(pool_segments(device), outputs)


def _pool_owner(value: torch.Tensor) -> weakref.ref | None:
    """The runner whose recording returned ``value``'s memory (a weak reference), or None."""
    # the storage's address is the tensor's at offset 0 (untyped_storage() makes an object per call)
    return _pool_outputs.get(value.data_ptr() if value.storage_offset() == 0 else value.untyped_storage().data_ptr())


def _extent(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _overlaps(start: int, end: int, ranges: list[tuple[int, int]]) -> bool:
    return any(start < stop and low < end for low, stop in ranges)


def _subtract(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` less the (sorted) ``holes``."""
    left: list[tuple[int, int]] = []
    for start, end in ranges:
        for low, high in holes:
            if high <= start or low >= end:
                continue
            if low > start:
                left.append((start, low))
            start = max(start, high)
        if start < end:
            left.append((start, end))
    return left


def hand_out_views(tensors: Any) -> None:
    """Views of a recording's outputs made outside its hand-out (a training step's outputs that
    alias another output, an output viewing an input that another recording returned): reading
    one after that recording's next replay raises as for its own outputs (the error is set per
    tensor object, not per memory), and while held they keep a recording busy as its outputs do."""
    if not _pool_recordings:        # nothing recorded yet (a runner that only runs plain launches)
        return
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            owner = _pool_recordings.get(tensor.untyped_storage().data_ptr())
            recording = owner() if owner is not None else None
            if recording is not None and not any(r() is tensor for r in recording.returned):
                recording.returned.append(weakref.ref(tensor))      # once: it is marked once


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


def _expire(recording: _Recording, addresses: frozenset[int] | None = None) -> None:
    """Before a replay that writes over them: mark what ``recording`` handed out last and the
    caller still holds (only those at the storage ``addresses`` when given)."""
    kept = []
    for reference in recording.returned:
        tensor = reference()
        if tensor is None:
            continue
        if addresses is None or tensor.untyped_storage().data_ptr() in addresses:
            mark_overwritten(tensor)
        else:
            kept.append(reference)
    recording.returned = kept


_use_count = torch._C._storage_Use_Count     # of a storage's _cdata: how many hold that memory


def _distinct_storages(tensors: list[torch.Tensor]) -> list[tuple[torch.UntypedStorage, int]]:
    """The storages of ``tensors``, each with its use count now (the storage object we keep for a
    cheap check per call counts as one of them)."""
    seen: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage)
    return [(storage, _use_count(storage._cdata)) for storage in seen.values()]


def _busy(recording: _Recording) -> bool:
    """Autograd still holds memory of this recording (saved activations, a gradient in p.grad),
    or memory of a later recording that lies in this one's scratch."""
    return any(_use_count(storage._cdata) > count for storage, count in recording.watched) or \
        any(_use_count(storage._cdata) > count for storage, count in recording.hazards) or \
        any((recording.backward and not later.backward or _pending(later)) and _held(later, addresses)
            for later, addresses in recording.protected) or _pending(recording)


def _pending(recording: _Recording) -> bool:
    """A training forward whose last call's backward has not run (autograd still holds its ctx)."""
    return recording.pending is not None and recording.pending() is not None


def _held(recording: _Recording, addresses: frozenset[int]) -> bool:
    """The caller still holds an output ``recording`` handed out at one of ``addresses``."""
    return any(tensor is not None and tensor.untyped_storage().data_ptr() in addresses
               for tensor in (reference() for reference in recording.returned))
