"""The Graph IR shared by capture, prims and autodiff.

A Graph is a straight-line program: a list of Nodes in execution order.  Each
node is one of

  placeholder  an input of the graph (a tensor or a Python scalar), in order;
  call         target(*args, **kwargs) where target is a torch callable
               (``torch.add``, ``torch.Tensor.view``, ``F.linear``,
               ``operator.getitem`` ...) or a ``prims`` primitive;
  output       the single last node; ``args[0]`` is a flat tuple of values.

Arguments are nested tuples/lists/dicts of Nodes and Python constants (ints,
floats, bools, None, strings, torch.dtype/device/memory_format, slices).
Every value-producing node carries ``meta``: a TensorMeta, a tuple of them
for multi-output ops, or ``None`` for Python values.

Who produces what:
  capture  -> a torch-level Graph (may contain in-place ops and views);
  prims    -> a Graph whose call targets are primitives or Externs;
  backends -> take (graph, example_inputs) and return a callable that maps the
              flat list of placeholder values to the flat list of outputs.

A Graph prints as readable Python (``print(graph)``) and that same source is
what ``Graph.as_callable`` executes, so what you read is what runs.
"""
from __future__ import annotations

import builtins
import dataclasses
import itertools
import keyword
import operator
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from ember.symbolic import known_equal

# Sizes are ints today; they may become sympy expressions (dynamic shapes), so
# code that consumes meta should not assume ``int`` beyond what it must.
Size = Any


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """What the compiler knows about a tensor value without its data."""

    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool = False
    storage_offset: Size = 0

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            t.device,
            bool(t.requires_grad),
            t.storage_offset(),
        )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> Size:
        n = 1
        for s in self.shape:
            n = n * s
        return n

    def is_contiguous(self) -> bool:
        if any(size == 0 for size in self.shape):
            return True           # as torch: an empty tensor is contiguous whatever its strides
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected = expected * size
        return True

    def to_meta_tensor(self) -> torch.Tensor:
        """An empty tensor on the meta device with this shape/stride/dtype."""
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")
        if self.storage_offset:
            t = t.as_strided(self.shape, self.stride, self.storage_offset)
        return t

    def __str__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        shape = ", ".join(str(s) for s in self.shape)
        return f"{dtype}[{shape}]"


def contiguous_strides(shape: Iterable[Size]) -> tuple[Size, ...]:
    strides: list[Size] = []
    running = 1
    for size in reversed(tuple(shape)):
        strides.append(running)
        running = running * (size if size != 0 else 1)
    return tuple(reversed(strides))


def dense_strides_like(shape: Sequence[Size], example_shape: Sequence[int], example_stride: Sequence[int]
                       ) -> tuple[Size, ...]:
    """Strides of a dense layout of ``shape`` whose dims are ordered as in a dense example layout
    (its sizes may be symbolic; size-1 dims keep the example's stride)."""
    order = sorted(range(len(shape)), key=lambda d: (example_stride[d], example_shape[d]))   # fastest first
    strides: list[Size] = list(example_stride)
    running: Size = 1
    for d in order:
        if example_shape[d] != 1:
            strides[d] = running
        running = running * shape[d]
    return tuple(strides)


def channels_last_strides(shape: Sequence[Size]) -> tuple[Size, ...]:
    """The strides of a 4-D (N, C, H, W) tensor laid out channels-last (NHWC in memory)."""
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def memory_format_strides(shape: Sequence[Size], memory_format: Any) -> tuple[Size, ...] | None:
    """The strides a ``memory_format`` gives ``shape``; None for preserve_format (or None).  A
    channels-last format of the wrong rank raises eager's error."""
    shape = tuple(shape)
    if memory_format is torch.contiguous_format:
        return contiguous_strides(shape)
    if memory_format is torch.channels_last:
        if len(shape) != 4:
            raise RuntimeError("required rank 4 tensor to use channels_last format")
        return channels_last_strides(shape)
    if memory_format is torch.channels_last_3d:
        if len(shape) != 5:
            raise RuntimeError("required rank 5 tensor to use channels_last_3d format")
        _, c, d, h, w = shape
        return (d * h * w * c, 1, h * w * c, w * c, c)
    return None


def suggested_memory_format(shape: Sequence[Size], stride: Sequence[Size]) -> Any:
    """ATen's ``suggest_memory_format``: channels_last (4-D) or channels_last_3d (5-D) when the
    strides grow in the order C, W, H, (D,) N, with ATen's tie rules for size-1 dims (an N111 or
    1C1W-like layout is contiguous); density is not asked (a sliced channels-last tensor suggests
    channels-last).  Contiguous otherwise, and for symbolic sizes."""
    shape, stride = tuple(shape), tuple(stride)
    if len(shape) not in (4, 5) or not all(isinstance(v, int) for v in (*shape, *stride)) or stride[1] == 0:
        return torch.contiguous_format
    smallest = 0
    for d in ((1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)):
        if shape[d] == 0 or stride[d] < smallest or (d == 0 and smallest == stride[1]):
            return torch.contiguous_format
        smallest = stride[d] * max(1, shape[d])
    return torch.channels_last if len(shape) == 4 else torch.channels_last_3d


def stacked_at_end_strides(shape: Sequence[Size], inputs: Sequence[TensorMeta]) -> tuple[int, ...] | None:
    """Strides of eager's ``stack(inputs, dim=-1)`` (result ``shape``): cat of the inputs unsqueezed
    at the end, where unsqueeze gives the new dim stride 1, so their common suggested memory format,
    else contiguous (a permuted 3-D input's is contiguous).  None for symbolic sizes."""
    if not all(isinstance(v, int) for v in tuple(shape) + tuple(v for m in inputs for v in (*m.shape, *m.stride))):
        return None
    formats = {suggested_memory_format((*m.shape, 1), (*m.stride, 1)) for m in inputs}
    return memory_format_strides(shape, formats.pop() if len(formats) == 1 else torch.contiguous_format)


def preserved_strides(shape: Sequence[Size], stride: Sequence[Size]) -> tuple[int, ...] | None:
    """The strides of ATen's ``empty_like(x)`` (preserve_format), behind every clone, copy and
    ``*_like`` that keeps a layout: x's own when non-overlapping and dense, else dense strides in
    x's order of dims (``infer_dense_strides``: a transposed slice stays transposed).  None for
    symbolic sizes or strides."""
    shape, stride = tuple(shape), tuple(stride)
    if not all(isinstance(v, int) for v in (*shape, *stride)):
        return None
    if is_dense(shape, stride):
        return stride
    return tuple(elementwise_strides(shape, [TensorMeta(shape, stride, torch.float32, torch.device("cpu"))]))


def is_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Non-overlapping and dense: a permutation of a contiguous layout (size-1 dims free; a
    derived size that may be 1, ``s0 - 1``, counts as a dim: no guard, and no false "dense")."""
    expected = 1
    for st, size in sorted((st, size) for st, size in zip(stride, shape) if not known_equal(size, 1)):
        if st != expected:
            return False
        expected *= size
    return True


def dense_in_order(shape: Sequence[int], stride: Sequence[int], order: Sequence[int]) -> bool:
    """Dense with dims ``order`` from slowest to fastest (size-1 dims free)."""
    expected = 1
    for dim in reversed(tuple(order)):
        if shape[dim] != 1:
            if stride[dim] != expected:
                return False
            expected *= shape[dim]
    return True


def elementwise_strides(shape: Sequence[Size], inputs: Sequence[TensorMeta]) -> tuple[Size, ...]:
    """Strides of a fresh elementwise result, as eager's TensorIterator allocates it.

    The dims are ordered by the inputs' strides (the first input with a strict order between
    two dims decides; broadcast dims are ambiguous), then laid out densely in that order: a
    permuted or channels-last input gives a permuted/channels-last result.  Contiguous when
    sizes or strides are symbolic."""
    shape = tuple(shape)
    ndim = len(shape)
    contiguous = contiguous_strides(shape)
    if ndim <= 1 or not all(isinstance(s, int) for s in shape):
        return contiguous
    operands = []
    for meta in inputs:
        if not all(isinstance(s, int) for s in tuple(meta.shape) + tuple(meta.stride)):
            return contiguous
        # a lower-rank operand is aligned to the trailing dims (its leading dims broadcast), and a
        # broadcast dim (size 1 -> n, or missing) has stride 0 in TensorIterator: ambiguous there,
        # but a (3, 2, 8) contiguous operand still orders the last dims of a (1, 3, 2, 8) result
        lead = ndim - len(meta.shape)
        operands.append((0,) * lead + tuple(0 if size == 1 and out != 1 else stride
                                            for size, out, stride in zip(meta.shape, shape[lead:], meta.stride)))
    if not operands:
        return contiguous
    fast = _fast_setup_strides(shape, inputs)
    if fast is not None:
        return fast

    def should_swap(dim0: int, dim1: int) -> int:
        for strides in operands:
            s0, s1 = strides[dim0], strides[dim1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))      # perm[0] is the fastest-moving dim
    for i in range(1, ndim):                  # insertion sort with ambiguous comparisons (ATen's)
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    if perm == list(range(ndim - 1, -1, -1)):
        return contiguous
    strides: list[Size] = [0] * ndim
    running: Size = 1
    for dim in perm:
        strides[dim] = running
        running = running * shape[dim]
    return tuple(strides)


def _fast_setup_strides(shape: tuple[int, ...], inputs: Sequence[TensorMeta]) -> tuple[int, ...] | None:
    """TensorIterator's fast path: all operands of the output's shape and all contiguous /
    all channels-last / all dense with equal strides -> that layout."""
    if any(tuple(m.shape) != shape for m in inputs):
        return None
    ndim = len(shape)
    if all(dense_in_order(shape, tuple(m.stride), range(ndim)) for m in inputs):
        return contiguous_strides(shape)
    if ndim == 4 and all(dense_in_order(shape, tuple(m.stride), (0, 2, 3, 1)) for m in inputs):
        strides = [0] * 4
        running = 1
        for dim in (1, 3, 2, 0):
            strides[dim] = running
            running *= max(shape[dim], 1)
        return tuple(strides)
    first = tuple(inputs[0].stride)
    if all(tuple(m.stride) == first for m in inputs):
        order = sorted(range(ndim), key=lambda d: (-first[d], -shape[d]))
        if dense_in_order(shape, first, order):
            return first
    return None


class Node:
    """One operation (or input/output) of a Graph."""

    __slots__ = ("graph", "name", "op", "target", "args", "kwargs", "meta", "users", "source_line", "extra")

    def __init__(self, graph: "Graph", name: str, op: str, target: Any, args: tuple, kwargs: dict,
                 meta: Any = None, source_line: str | None = None):
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self.meta = meta
        self.users: dict[Node, None] = {}  # insertion-ordered set
        # "file.py:42" of the user code that produced this node, for errors
        self.source_line = source_line
        # free-form annotations a pass may attach (e.g. the capture source)
        self.extra: dict[str, Any] = {}
        for inp in self.inputs():
            inp.users[self] = None

    def inputs(self) -> list["Node"]:
        """Nodes this node reads, in argument order, without duplicates."""
        seen: dict[Node, None] = {}
        _collect_nodes(self.args, seen)
        if self.kwargs:
            _collect_nodes(self.kwargs, seen)
        return list(seen)

    def replace_input(self, old: "Node", new: "Node") -> None:
        self.args = tree_map(lambda v: new if v is old else v, self.args)
        self.kwargs = tree_map(lambda v: new if v is old else v, self.kwargs)
        old.users.pop(self, None)
        new.users[self] = None

    def replace_all_uses_with(self, new: "Node") -> None:
        for user in list(self.users):
            user.replace_input(self, new)

    def __repr__(self) -> str:
        return self.name


class Graph:
    """A list of Nodes plus helpers to build, print, copy and run it."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        # facts a pass records about the whole graph (e.g. "mutated_inputs", see prims/)
        self.extra: dict[str, Any] = {}
        self._names: set[str] = set()
        self._counter = itertools.count()

    # ---------------------------------------------------------------- building
    def _unique_name(self, hint: str) -> str:
        if hint.isascii() and hint.isidentifier():     # most hints (node names): nothing to replace
            base = hint
        else:
            base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
            if base[0].isdigit():
                base = "_" + base
        if keyword.iskeyword(base) or base in _RESERVED_NAMES:
            base = base + "_"
        name = base
        while name in self._names:
            name = f"{base}_{next(self._counter)}"
        self._names.add(name)
        return name

    def placeholder(self, name: str, meta: Any = None) -> Node:
        node = Node(self, self._unique_name(name), "placeholder", None, (), {}, meta)
        # placeholders stay ahead of every call node
        position = sum(1 for n in self.nodes if n.op == "placeholder")
        self.nodes.insert(position, node)
        return node

    def call(self, target: Any, args: tuple = (), kwargs: dict | None = None, meta: Any = None,
             name: str | None = None, source_line: str | None = None) -> Node:
        node = Node(self, self._unique_name(name or target_name(target)), "call", target,
                    tuple(args), dict(kwargs or {}), meta, source_line)
        self._insert(node)
        return node

    def output(self, values: Iterable[Any]) -> Node:
        assert not any(n.op == "output" for n in self.nodes), "graph already has an output"
        node = Node(self, "output", "output", None, (tuple(values),), {})
        self.nodes.append(node)
        return node

    def _insert(self, node: Node) -> None:
        if self.nodes and self.nodes[-1].op == "output":
            self.nodes.insert(len(self.nodes) - 1, node)
        else:
            self.nodes.append(node)

    # -------------------------------------------------------------- inspecting
    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node:
        assert self.nodes and self.nodes[-1].op == "output", "graph has no output"
        return self.nodes[-1]

    @property
    def outputs(self) -> tuple[Any, ...]:
        return self.output_node.args[0]

    def call_nodes(self) -> Iterator[Node]:
        return (n for n in self.nodes if n.op == "call")

    # ---------------------------------------------------------------- editing
    def erase(self, node: Node) -> None:
        assert not node.users, f"{node} still has users {list(node.users)}"
        for inp in node.inputs():
            inp.users.pop(node, None)
        self.nodes.remove(node)
        self._names.discard(node.name)

    def eliminate_dead_code(self, is_impure: Callable[[Node], bool] | None = None) -> None:
        """Drop call nodes whose values nobody uses (in-place ops count as used)."""
        impure = is_impure or _default_is_impure
        for node in reversed(list(self.nodes)):
            if node.op == "call" and not node.users and not impure(node):
                self.erase(node)

    def copy(self) -> tuple["Graph", dict[Node, Node]]:
        """A deep copy of the structure (targets and constants are shared)."""
        new = Graph()
        mapping: dict[Node, Node] = {}
        remap = lambda v: mapping[v] if isinstance(v, Node) else v  # noqa: E731
        for node in self.nodes:
            if node.op == "placeholder":
                copy = new.placeholder(node.name, node.meta)
            elif node.op == "call":
                copy = new.call(node.target, tree_map(remap, node.args), tree_map(remap, node.kwargs),
                                node.meta, node.name, node.source_line)
            else:
                copy = new.output(tree_map(remap, node.args[0]))
            copy.extra = dict(node.extra)
            mapping[node] = copy
        new.extra = dict(self.extra)
        return new, mapping

    # ---------------------------------------------------------------- printing
    def python_code(self, fn_name: str = "forward") -> tuple[str, dict[str, Any]]:
        """Readable Python source for the graph, and the globals it needs."""
        namespace = _CodeNamespace()
        params = ", ".join(n.name for n in self.placeholders)
        lines = [f"def {fn_name}({params}):"]
        for node in self.nodes:
            if node.op != "call":
                continue
            call = namespace.call_expr(node.target, node.args, node.kwargs)
            comment = f"  # {_meta_str(node.meta)}" if node.meta is not None else ""
            lines.append(f"    {node.name} = {call}{comment}")
        outputs = self.outputs if self.nodes and self.nodes[-1].op == "output" else ()
        lines.append(f"    return ({''.join(namespace.arg(v) + ', ' for v in outputs)})")
        return "\n".join(lines) + "\n", namespace.globals

    def __str__(self) -> str:
        source, _ = self.python_code()
        header = "".join(f"# {n.name}: {_meta_str(n.meta)}\n" for n in self.placeholders if n.meta is not None)
        return header + source

    # ----------------------------------------------------------------- running
    def as_callable(self, fn_name: str = "forward") -> Callable[..., tuple]:
        """Compile the printed source into a function: the `eager` backend."""
        source, globals_ = self.python_code(fn_name)
        filename = f"<ember graph {id(self):x}>"
        code = compile(source, filename, "exec")
        exec(code, globals_)
        fn = globals_[fn_name]
        fn.__ember_source__ = source
        return fn

    def run(self, *inputs: Any) -> tuple:
        """Interpret node by node (slow; for debugging and tests)."""
        env: dict[Node, Any] = {}
        load = lambda v: env[v] if isinstance(v, Node) else v  # noqa: E731
        for node, value in zip(self.placeholders, inputs):
            env[node] = value
        for node in self.nodes:
            if node.op == "call":
                env[node] = node.target(*tree_map(load, node.args), **tree_map(load, node.kwargs))
            elif node.op == "output":
                return tuple(tree_map(load, node.args[0]))
        return ()


# --------------------------------------------------------------------- helpers
_RESERVED_NAMES = {"torch", "operator", "builtins", "inf", "nan", "forward"} | set(dir(builtins))


def ancestors(roots: Iterable[Node], follow: Callable[[Node], bool] = lambda node: True) -> set[Node]:
    """The roots and every node they are computed from, not looking past a node where ``follow``
    is false (that node itself is included)."""
    found: set[Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        if follow(node):
            stack.extend(node.inputs())
    return found


def target_name(target: Any) -> str:
    """A short readable name for a call target: 'add', 'linear', 'getitem'."""
    name = getattr(target, "name", None)
    if isinstance(name, str):
        return name
    return getattr(target, "__name__", None) or type(target).__name__.lower()


def target_qualified_name(target: Any) -> str:
    """A dotted name for printing: 'torch.add', 'torch.Tensor.view', 'F.gelu'."""
    qual = getattr(target, "qualified_name", None)
    if isinstance(qual, str):
        return qual
    name = getattr(target, "__name__", repr(target))
    if getattr(torch.Tensor, name, None) is target:
        return f"torch.Tensor.{name}"
    if getattr(torch.nn.functional, name, None) is target:
        return f"torch.nn.functional.{name}"
    if getattr(torch, name, None) is target:
        return f"torch.{name}"
    if getattr(operator, name, None) is target:
        return f"operator.{name}"
    module = getattr(target, "__module__", None)
    if module and module != "builtins":
        return f"{module}.{name}"
    return name


def size_is(tensor: Any, dim: int, size: int) -> None:
    """A graph marker, not an op: the captured program used ``tensor.shape[dim]`` as the Python int
    ``size`` (dynamic shapes).  Converting to prims turns it into a guard on the symbolic size."""
    return None


def sym_size(tensor: Any, dim: int) -> Any:
    """``tensor.shape[dim]`` as a graph value (dynamic shapes: a symbolic size in prims)."""
    return tensor.shape[dim]


def size_check(left: Any, op: str, right: Any, expected: bool) -> None:
    """A graph marker: the captured program compared sizes and took ``expected`` (dynamic shapes:
    a guard on the relation, from the prims conversion)."""
    return None


def _default_is_impure(node: Node) -> bool:
    if node.target is size_is or node.target is size_check:
        return True
    name = target_name(node.target)
    return name.endswith("_") and not name.endswith("__") or name in {"copy_", "setitem"}


def _meta_str(meta: Any) -> str:
    if isinstance(meta, (tuple, list)):
        return "(" + ", ".join(_meta_str(m) for m in meta) + ")"
    return str(meta)


class _CodeNamespace:
    """Turns targets and constants into source text plus the globals it needs."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {"torch": torch, "operator": operator, "inf": float("inf"),
                                        "nan": float("nan")}
        self._by_id: dict[int, str] = {}

    def target(self, target: Any) -> str:
        qualified = target_qualified_name(target)
        root = qualified.split(".")[0]
        if root in ("torch", "operator") and _resolves(qualified, target):
            return qualified
        return self._bind(target, target_name(target))

    def _bind(self, value: Any, hint: str) -> str:
        key = id(value)
        if key not in self._by_id:
            base = "".join(c if c.isalnum() else "_" for c in hint)
            name = f"_{base}"
            n = 0
            while name in self.globals:
                n += 1
                name = f"_{base}_{n}"
            self.globals[name] = value
            self._by_id[key] = name
        return self._by_id[key]

    def arg(self, value: Any) -> str:
        if isinstance(value, Node):
            return value.name
        if isinstance(value, tuple):
            inner = ", ".join(self.arg(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, list):
            return "[" + ", ".join(self.arg(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self.arg(k)}: {self.arg(v)}" for k, v in value.items()) + "}"
        if isinstance(value, slice):
            return f"slice({self.arg(value.start)}, {self.arg(value.stop)}, {self.arg(value.step)})"
        if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
            return str(value)
        if isinstance(value, torch.device):
            return f"torch.device({str(value)!r})"
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return {"nan": "nan", "inf": "inf", "-inf": "-inf"}[repr(value)]
        if value is None or isinstance(value, (bool, int, float, str, complex)) or value is Ellipsis:
            return repr(value)
        return self._bind(value, type(value).__name__.lower())

    def call_expr(self, target: Any, args: tuple, kwargs: dict) -> str:
        parts = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in kwargs.items()]
        return f"{self.target(target)}({', '.join(parts)})"


def _resolves(dotted: str, target: Any) -> bool:
    obj: Any = {"torch": torch, "operator": operator}[dotted.split(".")[0]]
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return obj is target


# ------------------------------------------------------ nested-structure utils
def tree_leaves(value: Any) -> list[Any]:
    out: list[Any] = []
    _collect(value, out)
    return out


_CONTAINERS = (tuple, list, dict, slice)


def _collect(value: Any, out: list[Any]) -> None:
    if not isinstance(value, _CONTAINERS):    # most values are leaves: one check for them
        out.append(value)
    else:
        for v in _children(value):
            _collect(v, out)


def _children(container: Any) -> Any:
    if isinstance(container, dict):
        return container.values()
    if isinstance(container, slice):
        return (container.start, container.stop, container.step)
    return container


def _collect_nodes(container: Any, seen: dict) -> None:
    """Node.inputs, the most called function of autodiff: the Nodes alone, no list of leaves."""
    for v in _children(container):
        if isinstance(v, Node):
            seen[v] = None
        elif isinstance(v, _CONTAINERS):
            _collect_nodes(v, seen)


def tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    if not isinstance(value, _CONTAINERS):
        return fn(value)
    if isinstance(value, tuple):
        mapped = [tree_map(fn, v) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else tuple(mapped)
    if isinstance(value, list):
        return [tree_map(fn, v) for v in value]
    if isinstance(value, dict):
        return {k: tree_map(fn, v) for k, v in value.items()}
    return slice(tree_map(fn, value.start), tree_map(fn, value.stop), tree_map(fn, value.step))
