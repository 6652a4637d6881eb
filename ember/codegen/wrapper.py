"""The host program: readable Python that allocates buffers, runs externs and kernels.

    def call(x, w, b):
        buf_linear_out = _extern_linear(x, w, b)           # extern linear
        add_1 = torch.empty_strided((64, 128), (128, 1), dtype=torch.float32)
        kernel0(buf_linear_out.data_ptr(), add_1.data_ptr())
        del buf_linear_out
        return (add_1,)

Every intermediate and Extern result is ``del``ed right after the last step that reads
it (``buffer_releases``), so peak memory follows the BufferPlan, not the whole program;
storages the plan hands on stay referenced by their first owner until reused.
A graph with ``extra["boxed_inputs"]`` (a training backward: its inputs are saved activations
and gradients, not the user's tensors) takes its inputs as one list, ``call(boxed_inputs)``,
empties it, and ``del``s each input after its last reader too.

Everything static (shapes, strides, dtypes, function pointers) is decided at
generation time; a call does only the allocations, launches and write-backs.
Kernel launchers are device-specific and passed in as ``launchers``: name ->
(callable taking data pointers, ordered buffer names).

On CUDA, small intermediate buffers (never returned, never seen by an Extern) are
allocated once per (device, stream, thread) and reused by later calls
(``PersistentBuffers``): kernels on one stream run in order, so a later call's
writes cannot overtake an earlier call's reads.  Returned outputs are always fresh.
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import Any

import torch

from ember.errors import CompileError
from ember.graph import tree_map
from ember.lower import ir
from ember.lower.scheduler import BufferPlan, ExternCall, Schedule
from ember.symbolic import is_symbolic, known_equal, known_equal_sizes, python_code, size_access


class WrapperSource:
    """Python source for ``call`` plus the globals it needs."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {"torch": torch}

    def bind(self, hint: str, value: Any) -> str:
        # a hint may come from a callable's __name__ ("<lambda>"): keep only identifier characters
        hint = re.sub(r"\W", "_", hint) or "value"
        if hint[0].isdigit():
            hint = f"_{hint}"
        name = hint
        n = 0
        while name in self.globals and self.globals[name] is not value:
            n += 1
            name = f"{hint}_{n}"
        self.globals[name] = value
        return name


def generate_wrapper(sched: Schedule, param_names: list[str], launchers: dict[str, tuple[Callable, list[str]]],
                     graph_extra: dict[str, Any], device: str = "cpu") -> tuple[str, dict[str, Any]]:
    """Source of ``def call(<params>)`` and its globals."""
    program = sched.program
    out = WrapperSource()
    lines = out.lines
    boxed = bool(graph_extra.get("boxed_inputs"))
    if boxed:
        # one list, emptied here: the caller keeps no reference, so each input dies after its last reader
        box = "boxed_inputs"
        while box in param_names:
            box += "_"
        lines.append(f"def call({box}):")
        if param_names:
            lines.append(f"    {', '.join(param_names)}{',' if len(param_names) == 1 else ''} = {box}")
        lines.append(f"    {box}.clear()")
    else:
        lines.append(f"def call({', '.join(param_names)}):")
    _emit_alias_check(out, param_names, graph_extra)
    for symbol, (position, dim) in graph_extra.get("_size_symbols", {}).items():
        lines.append(f"    {symbol} = {size_access(param_names[position], dim)}")
    expr_of: dict[str, str] = {}            # buffer name -> Python expression holding the tensor
    for name, plan in sched.buffers.items():
        if plan.kind == "input":
            node = program.nodes[name]
            base = program.nodes[node.alias_of] if node.alias_of else node
            expr_of[name] = param_names[base.position]
            if not node.shape and not node.alias_of and not _is_tensor_input(graph_extra, base.position):
                # a runtime Python scalar: kernels read it as a 0-dim tensor
                lines.append(f"    {name}_t = torch.full((), {expr_of[name]}, dtype={plan.dtype}, device={device!r})")
                expr_of[name] = f"{name}_t"
            elif device != "cpu" and not node.alias_of and _is_host_tensor_input(graph_extra, base.position):
                # a CPU 0-dim tensor beside CUDA ones (eager allows it): the kernels need it on the device
                lines.append(f"    {name}_t = {expr_of[name]}.to({device!r}, non_blocking=True)")
                expr_of[name] = f"{name}_t"
    allocated: set[str] = set()
    dev = out.bind(f"_{device}", torch.device(device))   # a device object: no string parsing per call
    persistent = _persistent_allocations(sched, device)
    if persistent:
        pool = out.bind("_persistent", PersistentBuffers(
            [(sched.buffers[n].shape, sched.buffers[n].stride, sched.buffers[n].dtype) for n in persistent], device))
        names = ", ".join(f"{n}_storage" for n in persistent)
        lines.append(f"    {names}{',' if len(persistent) == 1 else ''} = {pool}.get()"
                     f"  # intermediates kept across calls")
    # Python numbers returned by Externs (the per-call seed): launchers that list them in
    # ``scalar_arguments`` take the number itself; a 0-dim tensor is made only for other readers
    by_value: dict[str, str] = {}
    as_tensor = _scalars_needing_tensors(sched, launchers)
    inputs = _releasable_inputs(sched, param_names, graph_extra, expr_of) if boxed else None
    releases = buffer_releases(sched, launchers, inputs)
    if releases.get(-1):
        lines.append(f"    del {', '.join(releases[-1])}  # inputs no step reads")
    for position, step in enumerate(sched.steps):
        if position > 0 and releases.get(position - 1):
            # buffers no later step reads: drop them so their memory can be reused
            lines.append(f"    del {', '.join(releases[position - 1])}")
        if isinstance(step, ExternCall):
            _emit_extern(out, step, expr_of, sched, device, by_value, as_tensor)
            continue
        for name in step.writes:
            plan = sched.buffers[name]
            owner = sched.buffers.get(plan.allocation)
            if plan.allocation != name and plan.allocation in allocated and owner is not None and \
                    known_equal_sizes(owner.shape, plan.shape) and known_equal_sizes(owner.stride, plan.stride):
                # (provably equal, never a guard: the as_strided form below is right at any size)
                lines.append(f"    {name} = {plan.allocation}  # reuses the dead buffer {plan.allocation}")
            elif plan.allocation != name and plan.allocation in allocated:
                # same numel and dtype; externs see the tensor, so give it this buffer's shape
                lines.append(f"    {name} = {plan.allocation}.as_strided({sizes(plan.shape)}, {sizes(plan.stride)})"
                             f"  # reuses the dead buffer {plan.allocation}")
            elif name in persistent:
                lines.append(f"    {name} = {name}_storage")
            else:
                lines.append(f"    {name} = torch.empty_strided({sizes(plan.shape)}, {sizes(plan.stride)}, "
                             f"dtype={plan.dtype}, device={dev})")
            allocated.add(name)
            expr_of[name] = name
        launcher, arg_names = launchers[step.name]
        fn = out.bind(step.name, launcher)
        if any(v.size == 0 for v in step.outer_vars):
            lines.append(f"    # {fn}: zero-size, skipped")
            continue
        if getattr(launcher, "takes_tensors", False):   # Triton launchers: scalars by value
            scalars = getattr(launcher, "scalar_arguments", ())
            pointer = ".data_ptr()" if getattr(launcher, "takes_pointers", False) else ""   # else the tensors
            ptrs = ", ".join(by_value[a] if a in scalars else f"{expr_of[a]}{pointer}" for a in arg_names)
        else:
            ptrs = ", ".join(f"{expr_of[a]}.data_ptr()" for a in arg_names)
        ptrs += "".join(f", {name}" for name in getattr(launcher, "size_arguments", ()))
        lines.append(f"    {fn}({ptrs})  # {', '.join(step.fused_ops[:6])}{' ...' if len(step.fused_ops) > 6 else ''}")
    if sched.steps and releases.get(len(sched.steps) - 1):
        lines.append(f"    del {', '.join(releases[len(sched.steps) - 1])}")
    results = []
    for value in program.outputs:
        if isinstance(value, str):
            results.append(expr_of[value])
        elif isinstance(value, ir.OutputView) and _is_whole_buffer(value, sched, program.outputs):
            results.append(expr_of[value.base])     # the buffer as allocated: no view to make (2-3 us each)
        elif isinstance(value, ir.OutputView):
            results.append(f"{expr_of[value.base]}.as_strided({sizes(value.shape)}, {sizes(value.stride)}, "
                           f"{sizes(value.storage_offset)})")
        else:
            results.append(_literal(value) if isinstance(value, (int, float, bool, type(None))) else out.bind("const", value))
    _emit_write_backs(out, sched, param_names, results, graph_extra, device)
    num_user = graph_extra.get("num_user_outputs", len(results))
    metas = graph_extra.get("_output_metas", [])
    for output_index, placeholder_index in graph_extra.get("output_aliases", {}).items():
        meta = metas[output_index] if output_index < len(metas) else None
        if meta is not None:
            results[output_index] = (f"{param_names[placeholder_index]}.as_strided({sizes(meta.shape)}, "
                                     f"{sizes(meta.stride)}, {sizes(meta.storage_offset)})")
    _apply_output_sources(out, results, param_names, graph_extra)
    returned = results[:num_user]
    lines.append(f"    return ({''.join(r + ', ' for r in returned)})")
    return "\n".join(lines) + "\n", out.globals


def _is_whole_buffer(view: ir.OutputView, sched: Schedule, outputs: list[Any]) -> bool:
    """A view output that is its base buffer exactly as the wrapper holds it (a backward's weight
    gradient reshaped to its own shape), and the only output made from that buffer: the buffer
    itself is returned, as the distinct object eager would return."""
    plan = sched.buffers.get(view.base)
    if plan is None or plan.kind == "input" or not known_equal(view.storage_offset, 0):
        return False
    if plan.kind == "extern" and not math.prod(plan.shape) > 1:
        return False        # not restrided to the plan's strides (_emit_extern): the view sets them
    if not (known_equal_sizes(tuple(view.shape), tuple(plan.shape)) and
            known_equal_sizes(tuple(view.stride), tuple(plan.stride))):
        return False
    return sum((isinstance(o, str) and o == view.base) or (isinstance(o, ir.OutputView) and o.base == view.base)
               for o in outputs) == 1


def _emit_write_backs(out: WrapperSource, sched: Schedule, param_names: list[str], results: list[str],
                      graph_extra: dict[str, Any], device: str) -> None:
    """Functionalized mutation: write the new values back into the caller's tensors.  Two or more
    alike (same shape and dtype, on the graph's device) go in one ``torch._foreach_copy_``: one
    call, and on CUDA a few multi-tensor kernels, where ResNet-50's 159 BatchNorm running-stat
    write-backs cost 1.6 ms of host time per training step as ``copy_`` calls."""
    pairs = graph_extra.get("mutated_inputs", [])
    inputs = {n.position: n for n in sched.program.nodes.values()
              if isinstance(n, ir.InputBuffer) and n.alias_of is None}
    by_dtype: dict[torch.dtype, list[tuple[str, str]]] = {}      # CUDA's fast path wants one dtype
    single: list[tuple[str, str]] = []
    for placeholder_index, output_index in pairs:
        value = sched.program.outputs[output_index]
        node, plan = inputs.get(placeholder_index), sched.buffers.get(value) if isinstance(value, str) else None
        pair = (param_names[placeholder_index], results[output_index])
        if node is not None and plan is not None and plan.dtype == node.dtype and \
                known_equal_sizes(plan.shape, node.shape) and \
                not (device != "cpu" and _is_host_tensor_input(graph_extra, placeholder_index)):
            by_dtype.setdefault(plan.dtype, []).append(pair)
        else:
            single.append(pair)
    for batch in by_dtype.values():
        if len(batch) < 2:
            single += batch
            continue
        out.lines.append(f"    torch._foreach_copy_([{', '.join(d for d, _ in batch)}], "
                         f"[{', '.join(v for _, v in batch)}])  # write back the mutated inputs")
    for destination, value in single:
        out.lines.append(f"    {destination}.copy_({value})")


def sizes(value: Any) -> str:
    """Python source of a size, or a tuple of sizes, that may be symbolic (read from the inputs)."""
    if isinstance(value, (tuple, list)):
        items = [python_code(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return python_code(value)


def _emit_alias_check(out: WrapperSource, param_names: list[str], graph_extra: dict[str, Any]) -> None:
    """Arguments written in place that share memory with another argument (f(z[:4], z[2:])): the
    prim graph treats inputs as distinct, so such a call runs the torch-level graph eagerly.
    Module and global state (parameters, BatchNorm buffers) is not checked: a check per buffer
    would cost more per call than most graphs run (see _argument_inputs in prims/convert.py)."""
    arguments = graph_extra.get("_argument_inputs", range(len(param_names)))
    mutated = sorted({p for p, _ in graph_extra.get("mutated_inputs", [])} & set(arguments))
    torch_graph = graph_extra.get("_torch_graph")
    tensors = [i for i in arguments if _is_tensor_input(graph_extra, i)]
    if not mutated or len(tensors) < 2 or torch_graph is None:
        return
    eager = out.bind("_eager_graph", torch_graph.as_callable())
    check = out.bind("_inputs_share_memory", inputs_share_memory)
    params = ", ".join(param_names)
    listed = "".join(f"{param_names[i]}, " for i in tensors)
    written = tuple(tensors.index(p) for p in mutated if p in tensors)
    out.lines.append(f"    if {check}(({listed}), {written!r}):  # aliased inputs: eager semantics")
    out.lines.append(f"        return {eager}({params})")


def inputs_share_memory(tensors: tuple[torch.Tensor, ...], written: tuple[int, ...]) -> bool:
    """Does any tensor at a `written` position share its storage with another of `tensors`?"""
    storages = [t.untyped_storage().data_ptr() for t in tensors]
    for position in written:
        if storages[position] in storages[:position] + storages[position + 1:]:
            return True
    return False


def _apply_output_sources(out: WrapperSource, results: list[str], param_names: list[str],
                          graph_extra: dict[str, Any]) -> None:
    """Outputs that are, in eager, an input itself, another output, or a view of another output
    (graph.extra["output_sources"], see prims/convert.py): the same objects and shared storage."""
    sources = graph_extra.get("output_sources", {})
    for index in sorted(sources):
        source = sources[index]
        if source[0] == "input":
            results[index] = param_names[source[1]]
        elif source[0] == "input_view":
            _, position, shape, stride, offset = source
            results[index] = f"{param_names[position]}.as_strided({sizes(shape)}, {sizes(stride)}, {sizes(offset)})"
    for index in sorted(sources):
        source = sources[index]
        if source[0] != "view":
            continue
        _, base, shape, stride, offset = source
        base_name = f"_view_base{base}"
        if results[base] != base_name:
            out.lines.append(f"    {base_name} = {results[base]}")
            results[base] = base_name
        out.lines.append(f"    _output{index} = {base_name}.as_strided({sizes(shape)}, {sizes(stride)}, "
                         f"{base_name}.storage_offset() + {sizes(offset)})")
        results[index] = f"_output{index}"
    for index in graph_extra.get("detached_outputs", ()):   # eager's x.detach(): a view without autograd
        if index in sources and sources[index][0] in ("input_view", "view"):
            results[index] = f"{results[index]}.detach()"
    # last: an output that IS an earlier one (a view made above, an input.as_strided(...)) is
    # that very object, so an expression is named once, not evaluated twice
    for index in sorted(sources):
        if sources[index][0] != "output":
            continue
        first = sources[index][1]
        if not results[first].isidentifier():
            out.lines.append(f"    _output{first} = {results[first]}")
            results[first] = f"_output{first}"
        results[index] = results[first]


def buffer_releases(sched: Schedule, launchers: dict[str, tuple[Callable, list[str]]] | None = None,
                    input_variables: dict[str, str] | None = None) -> dict[int, list[str]]:
    """Step index -> the buffer variables the host program ``del``s after that step.

    An intermediate or Extern result dies right after the last step that reads it (an unread
    one right after the step that makes it).  A storage that the BufferPlan hands on to a later
    buffer stays referenced by its first owner until that buffer is made.  Never released:
    scalars and anything returned (outputs, bases of output views), and inputs unless
    ``input_variables`` (input buffer -> the parameter variable holding it) names them: such a
    variable dies after the last step that reads any buffer it holds (key -1: no step reads it)."""
    program = sched.program
    keep = program.returned_buffers()
    last: dict[str, int] = {}
    made: dict[str, int] = {}
    for position, step in enumerate(sched.steps):
        if isinstance(step, ExternCall):
            used = set(step.node.reads())
            written = [o.name for o in step.outputs]
        else:
            used = set(step.reads)
            if launchers is not None and step.name in launchers:
                used |= set(launchers[step.name][1])
            written = list(step.writes)
        for name in written:
            made.setdefault(name, position)
        for name in (*used, *written):
            last[name] = position
    for name, plan in sched.buffers.items():
        if plan.allocation != name and plan.allocation in last and name in made:
            # the owner's variable is what later reusers are made from
            last[plan.allocation] = max(last[plan.allocation], made[name])
    scalar = {n.name for n in program.nodes.values() if isinstance(n, ir.ExternOutput) and n.scalar}
    releases: dict[int, list[str]] = {}
    for name, position in last.items():
        plan = sched.buffers.get(name)
        if plan is None or plan.kind not in ("intermediate", "extern") or name in keep or name in scalar:
            continue
        releases.setdefault(position, []).append(name)
    if input_variables:
        last_read: dict[str, int] = {}
        for name, variable in input_variables.items():
            last_read[variable] = max(last_read.get(variable, -1), last.get(name, -1))
        for variable, position in last_read.items():
            releases.setdefault(position, []).append(variable)
    return releases


def _releasable_inputs(sched: Schedule, param_names: list[str], graph_extra: dict[str, Any],
                       expr_of: dict[str, str]) -> dict[str, str]:
    """Input buffer -> parameter variable, for the inputs a boxed wrapper may ``del`` once the
    steps are done with them: not those returned, viewed by an output or written back, and not
    the Python scalars and host tensors copied into other variables at the start."""
    program = sched.program
    kept_positions = {p for p, _ in graph_extra.get("mutated_inputs", [])}
    kept_positions |= set(graph_extra.get("output_aliases", {}).values())
    kept_positions |= {s[1] for s in graph_extra.get("output_sources", {}).values() if s[0] in ("input", "input_view")}
    returned = program.returned_buffers()
    variables: dict[str, str] = {}
    for name, plan in sched.buffers.items():
        if plan.kind != "input":
            continue
        node = program.nodes[name]
        position = (program.nodes[node.alias_of] if node.alias_of else node).position
        if expr_of.get(name) != param_names[position]:
            continue
        if name in returned:
            kept_positions.add(position)
        variables[name] = param_names[position]
    kept = {param_names[p] for p in kept_positions}
    return {name: variable for name, variable in variables.items() if variable not in kept}


def _is_tensor_input(graph_extra: dict[str, Any], position: int) -> bool:
    kinds = graph_extra.get("_input_is_tensor")
    return True if kinds is None else kinds[position]


def _is_host_tensor_input(graph_extra: dict[str, Any], position: int) -> bool:
    on_host = graph_extra.get("_input_on_host")
    return bool(on_host and on_host[position])


# devices whose wrappers keep intermediates across calls, and the size limits for doing so
PERSISTENT_DEVICES = {"cuda"}
# per buffer: what a kept buffer saves is an allocation's host time, the same at any size, and a
# buffer of a megabyte takes a kernel longer to write than that; memory held between calls counts
# against the step's peak (at 16 MB, nanoGPT's training graphs kept 13 MB, its peak 10 MB over eager's)
PERSISTENT_MAX_BYTES = 1 << 20
PERSISTENT_TOTAL_BYTES = 8 << 20         # per compiled graph


def _persistent_allocations(sched: Schedule, device: str) -> list[str]:
    """Intermediate storages safe to keep across calls, in allocation order.

    Excluded: anything returned (outputs, bases of output views), anything an Extern reads
    (it could keep or return an alias), and any storage shared with those."""
    if device not in PERSISTENT_DEVICES:
        return []
    exposed = sched.program.returned_buffers()
    for step in sched.steps:
        if isinstance(step, ExternCall):
            exposed |= step.node.reads()
    exposed_storage = {sched.buffers[n].allocation for n in exposed if n in sched.buffers}
    chosen, total = [], 0
    for step in sched.kernels:
        for name in step.writes:
            plan = sched.buffers[name]
            if plan.kind != "intermediate" or plan.allocation != name or name in exposed_storage or \
                    any(is_symbolic(v) for v in (*plan.shape, *plan.stride)):   # sized per call
                continue
            size = math.prod(plan.shape) * plan.dtype.itemsize
            if size > PERSISTENT_MAX_BYTES or total + size > PERSISTENT_TOTAL_BYTES or name in chosen:
                continue
            chosen.append(name)
            total += size
    return chosen


class PersistentBuffers:
    """Intermediate buffers of one compiled graph, one set per (device, stream, thread).

    Calls on one stream are ordered on the GPU, and a thread's calls never interleave, so a set
    is never written by one call while an earlier call still reads it.  At most ``MAX_SETS``
    sets are kept; beyond that (and while a CUDA graph is being captured) a call gets fresh ones."""

    MAX_SETS = 8

    def __init__(self, specs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]], device: str) -> None:
        self.specs = specs
        self.device = device
        self.sets: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self.key = self._cuda_key if device == "cuda" else self._thread_key

    @staticmethod
    def _thread_key() -> tuple:
        return (threading.get_ident(),)

    @staticmethod
    def _cuda_key() -> tuple:
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        index = get_device() if get_device is not None else torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        stream = raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream
        return (index, stream, threading.get_ident())

    def get(self) -> tuple[torch.Tensor, ...]:
        key = self.key()
        found = self.sets.get(key)
        if found is not None:
            return found
        device = torch.device(self.device, key[0]) if self.device == "cuda" else torch.device(self.device)
        made = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in self.specs)
        capturing = self.device == "cuda" and torch.cuda.is_current_stream_capturing()
        if len(self.sets) < self.MAX_SETS and not capturing:
            self.sets[key] = made
        return made


def _scalars_needing_tensors(sched: Schedule, launchers: dict[str, tuple[Callable, list[str]]]) -> set[str]:
    """Scalar extern results that some reader needs as a 0-dim tensor (not passed by value)."""
    scalar = {n.name for n in sched.program.nodes.values() if isinstance(n, ir.ExternOutput) and n.scalar}
    if not scalar:
        return set()
    needed = {o for o in sched.program.outputs if isinstance(o, str)} & scalar
    for step in sched.steps:
        if isinstance(step, ExternCall):
            needed |= step.node.reads() & scalar
        else:
            launcher = launchers[step.name][0]
            by_value = getattr(launcher, "scalar_arguments", ()) if getattr(launcher, "takes_tensors", False) else ()
            needed |= {r for r in step.reads if r in scalar and r not in by_value}
    return needed


def _emit_extern(out: WrapperSource, step: ExternCall, expr_of: dict[str, str], sched: Schedule,
                 device: str, by_value: dict[str, str] | None = None, as_tensor: set[str] | None = None) -> None:
    node = step.node
    fn = out.bind(f"_extern_{getattr(node.fn, '__name__', 'fn')}", node.fn)

    def arg_text(value: Any) -> Any:
        if isinstance(value, ir.BufferView):
            return _Raw(_strided_view(expr_of[value.name], value, sched.buffers[value.name]))
        if isinstance(value, ir.BufferRef):
            return _Raw(expr_of[value.name])
        return value

    args = tree_map(arg_text, node.args)
    kwargs = tree_map(arg_text, node.kwargs)
    parts = [_py(out, a) for a in args] + [f"{k}={_py(out, v)}" for k, v in kwargs.items()]
    single = len(step.outputs) == 1 and step.outputs[0].item is None
    result = step.outputs[0].name if single else f"{node.name}_result"
    out.lines.append(f"    {result} = {fn}({', '.join(parts)})  # extern{' at ' + node.source if node.source else ''}")
    for output in step.outputs:
        plan = sched.buffers[output.name]
        if not single:
            out.lines.append(f"    {output.name} = {result}[{output.item}]")
        if output.scalar:
            if by_value is not None:
                by_value[output.name] = output.name
            if as_tensor is None or output.name in as_tensor:
                tensor = f"{output.name}_t" if by_value is not None else output.name
                out.lines.append(f"    {tensor} = torch.tensor({output.name}, dtype={output.dtype}, device={device!r})")
                expr_of[output.name] = tensor
            continue
        if math.prod(plan.shape) > 1:
            # kernels index extern results with the strides predicted at compile time: enforce them
            fix = out.bind("_restride", _restride)
            out.lines.append(f"    if {output.name}.stride() != {sizes(plan.stride)}: "
                             f"{output.name} = {fix}({output.name}, {sizes(plan.stride)})")
        expr_of[output.name] = output.name
    if not single:
        out.lines.append(f"    del {result}  # the tuple would keep every result alive")


def _strided_view(base: str, view: ir.BufferView, plan: BufferPlan) -> str:
    """``base.as_strided(...)`` for a view an Extern reads (sizes and strides precomputed here)."""
    layout = ir.strided_layout(view.index, view.vars, plan.shape, plan.stride)
    if layout is None:
        raise CompileError(f"extern argument viewing {view.name} is not strided in its buffer layout",
                           stage="codegen")
    stride, offset = layout
    if known_equal_sizes(tuple(view.shape), tuple(plan.shape)) and known_equal_sizes(tuple(stride), tuple(plan.stride)) \
            and known_equal(offset, 0):
        return base         # the whole buffer as it is laid out: no view to make (2-3 us each)
    if len(view.shape) == 2 and len(plan.shape) == 2 and known_equal(offset, 0) and \
            known_equal_sizes(tuple(view.shape), tuple(plan.shape)[::-1]) and \
            known_equal_sizes(tuple(stride), tuple(plan.stride)[::-1]):
        return f"{base}.t()"    # a weight read transposed by a matmul: one call, not as_strided's three
    if plan.kind in ("input", "extern"):
        # inputs and extern results may start inside their storage; offsets here are relative
        start = f"{base}.storage_offset() + {sizes(offset)}" if offset else f"{base}.storage_offset()"
    else:
        start = sizes(offset) if offset else ""
    return f"{base}.as_strided({sizes(view.shape)}, {sizes(stride)}{', ' + start if start else ''})"


def _literal(value: int | float | bool | None) -> str:
    """Python source for a constant output (repr(nan) is 'nan', a name the wrapper lacks)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    return repr(value)


def _restride(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    fixed = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    fixed.copy_(t)
    return fixed


class _Raw:
    def __init__(self, text: str) -> None:
        self.text = text


def _py(out: WrapperSource, value: Any) -> str:
    if isinstance(value, _Raw):
        return value.text
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_py(out, v) for v in value)
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_py(out, v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if is_symbolic(value):
        return python_code(value)
    if isinstance(value, torch.dtype):
        return str(value)
    return out.bind("const", value)


def compile_wrapper(source: str, globals_: dict[str, Any], filename: str = "<ember wrapper>") -> Callable[..., tuple]:
    code = compile(source, filename, "exec")
    exec(code, globals_)  # noqa: S102 - the generated host program is the artifact
    return globals_["call"]
