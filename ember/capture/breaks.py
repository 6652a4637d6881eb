"""Graph breaks: compile the graph so far, run the unsupported instruction natively, continue.

When capture meets a construct it cannot put in a graph (``print``, ``.item()``,
a branch on tensor data, an unknown C function, a break inside an inlined
callee), the frame is split at the *instruction of the user's frame* that
reached it.  Capture runs again and stops exactly there (``StopCapture``), so
the graph and the Python-side state hold everything before that instruction
and nothing of it.  Then:

* the graph so far is compiled, with every tensor still live on the value stack
  or in a local as an output;
* a generated *runner* (readable Python, ``EMBER_LOGS=graph_breaks`` prints it)
  replays the Python-side mutations, rebuilds the stack and the locals from the
  outputs, runs the instruction natively (a call of a user function or module
  goes through its own compiled wrapper, so it is captured on its own), and
* calls the *continuation* (``resume.py``): the rest of the frame as a
  function, itself captured and compiled on its first call, with its own guards
  and cache.  A branch on tensor data gets one continuation per side.

Continuations and compiled callees belong to the CapturedFunction the user
compiled (``BreakRegistry``), share its events (``ember.explain``) and are
dropped with it.
"""
from __future__ import annotations

import dataclasses
import dis
import operator
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import Unsupported
from . import resume
from . import values as V
from .session import EpilogueBuilder, grad_mode_decorator, is_library_value

PY312 = sys.version_info >= (3, 12)


class StopCapture(Exception):
    """Raised by the frame's translator when it reaches the break point (second capture)."""

    def __init__(self, translator: Any) -> None:
        super().__init__("stop")
        self.translator = translator


@dataclasses.dataclass
class TailCall:
    """What a break's runner returns: the continuation and its arguments, for the caller to run."""

    function: Any          # a CapturedFunction
    args: tuple


# ------------------------------------------------------------------ native steps
_BINARY = {"NB_ADD": operator.add, "NB_AND": operator.and_, "NB_FLOOR_DIVIDE": operator.floordiv,
           "NB_LSHIFT": operator.lshift, "NB_MATRIX_MULTIPLY": operator.matmul, "NB_MULTIPLY": operator.mul,
           "NB_REMAINDER": operator.mod, "NB_OR": operator.or_, "NB_POWER": operator.pow,
           "NB_RSHIFT": operator.rshift, "NB_SUBTRACT": operator.sub, "NB_TRUE_DIVIDE": operator.truediv,
           "NB_XOR": operator.xor}
_BINARY.update({name.replace("NB_", "NB_INPLACE_"): getattr(operator, "i" + fn.__name__.strip("_"))
                for name, fn in list(_BINARY.items())})
_BINARY_BY_ARG = [_BINARY[name] for name, _ in getattr(dis, "_nb_ops", [])]
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
            ">=": operator.ge}
_CONDITIONAL_JUMPS = {"POP_JUMP_IF_TRUE": True, "POP_JUMP_FORWARD_IF_TRUE": True, "POP_JUMP_BACKWARD_IF_TRUE": True,
                      "POP_JUMP_IF_FALSE": False, "POP_JUMP_FORWARD_IF_FALSE": False,
                      "POP_JUMP_BACKWARD_IF_FALSE": False}
_KEEP_AND_JUMP = {"JUMP_IF_TRUE_OR_POP": True, "JUMP_IF_FALSE_OR_POP": False}
_SIMPLE = {"BINARY_OP": 2, "COMPARE_OP": 2, "BINARY_SUBSCR": 2, "STORE_SUBSCR": 3, "STORE_ATTR": 2,
           "LOAD_ATTR": 1, "UNARY_NOT": 1, "CONTAINS_OP": 2}


def operand_count(inst: dis.Instruction) -> int | None:
    """Stack values the instruction consumes, when ember can run it natively (None: it cannot)."""
    name = inst.opname
    if name == "CALL":
        return inst.arg + 2
    if name == "CALL_FUNCTION_EX":
        return 3 + (inst.arg & 1)
    if name in _CONDITIONAL_JUMPS or name in _KEEP_AND_JUMP:
        return 1
    if name == "LOAD_ATTR" and PY312 and inst.arg & 1:
        return None  # the method form pushes NULL/self: not worth a special case
    if name == "BINARY_OP" and inst.arg >= len(_BINARY_BY_ARG):
        return None
    return _SIMPLE.get(name)


@dataclasses.dataclass
class Branch:
    """Where the frame goes on after the native step: offset in the original code, and the stack then."""

    offset: int
    stack: list[str]       # expressions (NULL slots as None), bottom first
    kinds: tuple[str, ...]


@dataclasses.dataclass
class Step:
    lines: list[str]
    condition: str | None          # jumps: the Python condition choosing `taken`
    taken: Branch | None
    fall_through: Branch
    below: Branch | None = None    # the stack under the instruction's operands


class _StepBuilder:
    """Python source for one instruction run on real values."""

    def __init__(self, builder: EpilogueBuilder, registry: BreakRegistry, inst: dis.Instruction,
                 next_offset: int, kw_names: tuple[str, ...]) -> None:
        self.builder = builder
        self.registry = registry
        self.inst = inst
        self.next_offset = next_offset
        self.kw_names = kw_names

    def bind(self, obj: Any, hint: str) -> str:
        return self.builder.namespace.bind(obj, hint)

    def build(self, below: list[V.Value], operands: list[V.Value]) -> Step:
        rest, rest_kinds = self._stack(below)
        name = self.inst.opname
        if name in _CONDITIONAL_JUMPS or name in _KEEP_AND_JUMP:
            value = self.builder.expr(operands[0])
            jump_if = _CONDITIONAL_JUMPS.get(name, _KEEP_AND_JUMP.get(name))
            kept = name in _KEEP_AND_JUMP
            taken = Branch(self.inst.argval, rest + ([value] if kept else []),
                           rest_kinds + ((resume.VALUE,) if kept else ()))
            fall_through = Branch(self.next_offset, rest, rest_kinds)
            condition = f"bool({value})" if jump_if else f"not {value}"
            return Step([], condition, taken, fall_through, Branch(-1, rest, rest_kinds))
        lines, produced = self._simple(name, operands)
        kinds = rest_kinds + (resume.VALUE,) * len(produced)
        return Step(lines, None, None, Branch(self.next_offset, rest + produced, kinds), Branch(-1, rest, rest_kinds))

    def _stack(self, values: list[V.Value]) -> tuple[list[str | None], tuple[str, ...]]:
        exprs: list[str | None] = []
        kinds: list[str] = []
        for value in values:
            if value is V.NULL:
                exprs.append(None)
                kinds.append(resume.NULL)
            elif isinstance(value, V.IteratorValue):
                exprs.append(self.builder.expr(V.TupleValue(value.items[value.position:])))
                kinds.append(resume.ITERATOR)
            else:
                exprs.append(self.builder.expr(value))
                kinds.append(resume.VALUE)
        return exprs, tuple(kinds)

    def _simple(self, name: str, operands: list[V.Value]) -> tuple[list[str], list[str]]:
        expr = self.builder.expr
        if name in ("CALL", "CALL_FUNCTION_EX"):
            return [f"result = {self._call(name, operands)}"], ["result"]
        if name == "BINARY_OP":
            fn = self.bind(_BINARY_BY_ARG[self.inst.arg], _BINARY_BY_ARG[self.inst.arg].__name__)
            return [f"result = {fn}({expr(operands[0])}, {expr(operands[1])})"], ["result"]
        if name == "COMPARE_OP":
            fn = self.bind(_COMPARE[self.inst.argval], _COMPARE[self.inst.argval].__name__)
            return [f"result = {fn}({expr(operands[0])}, {expr(operands[1])})"], ["result"]
        if name == "CONTAINS_OP":
            negate = "not " if self.inst.arg else ""
            return [f"result = {negate}({expr(operands[0])} in {expr(operands[1])})"], ["result"]
        if name == "BINARY_SUBSCR":
            return [f"result = {expr(operands[0])}[{expr(operands[1])}]"], ["result"]
        if name == "STORE_SUBSCR":
            value, obj, key = (expr(v) for v in operands)
            return [f"{obj}[{key}] = {value}"], []
        if name == "STORE_ATTR":
            value, obj = (expr(v) for v in operands)
            return [f"setattr({obj}, {self.inst.argval!r}, {value})"], []
        if name == "LOAD_ATTR":
            return [f"result = getattr({expr(operands[0])}, {self.inst.argval!r})"], ["result"]
        if name == "UNARY_NOT":
            return [f"result = not {expr(operands[0])}"], ["result"]
        raise Unsupported(f"no native step for {name}")

    def _call(self, name: str, operands: list[V.Value]) -> str:
        if name == "CALL_FUNCTION_EX":
            callee, star = operands[1], operands[2]
            function, first = self._callee(callee)
            args = first + [f"*{self.builder.expr(star)}"]
            if len(operands) == 4:
                args.append(f"**{self.builder.expr(operands[3])}")
            return f"{function}({', '.join(args)})"
        below, callable_or_self, *values = operands
        if below is V.NULL:
            callee, args = callable_or_self, values
        else:
            callee, args = below, [callable_or_self] + values
        function, first = self._callee(callee)
        n_kw = len(self.kw_names)
        positional = first + [self.builder.expr(v) for v in args[:len(args) - n_kw]]
        keywords = [f"{k}={self.builder.expr(v)}" for k, v in zip(self.kw_names, args[len(args) - n_kw:])]
        return f"{function}({', '.join(positional + keywords)})"

    def _callee(self, callee: V.Value) -> tuple[str, list[str]]:
        """The function to call and leading arguments: user functions and modules are called through
        their own compiled wrapper (a bound method: its function, with self first)."""
        compiled = self.bind(self.registry.compiled, "compiled")
        if isinstance(callee, V.GradModeFunctionValue):  # @torch.no_grad() on a function: the same decorator
            function, first = self._callee(callee.func)
            return f"{grad_mode_decorator(self.builder, callee.enabled)}({function})", first
        if isinstance(callee, V.ModuleValue) or \
                (isinstance(callee, V.ObjectValue) and _is_user_function(callee.obj)):
            return f"{compiled}({self.builder.expr(callee)})", []
        if isinstance(callee, V.BoundMethodValue) and isinstance(callee.func, V.ObjectValue) \
                and _is_user_function(callee.func.obj):
            return f"{compiled}({self.builder.expr(callee.func)})", [self.builder.expr(callee.self_value)]
        return self.builder.expr(callee), []


def _is_user_function(obj: Any) -> bool:
    return isinstance(obj, types.FunctionType) and not is_library_value(obj)


# ------------------------------------------------------------------ the registry
@dataclasses.dataclass(frozen=True)
class Frame:
    """What a continuation of a frame needs from it: its original code and globals (its cells are
    arguments of the continuation)."""

    code: types.CodeType
    globals: dict
    shift: int = 0      # bytes of continuation prologue in front of the original code


class BreakRegistry:
    """Continuations and compiled callees made for one compiled function (and its continuations)."""

    def __init__(self, make_captured: Callable[[Any], Any]) -> None:
        self._make_captured = make_captured
        self._continuations: dict[tuple, Any] = {}
        self._frames: dict[types.CodeType, Frame] = {}       # continuation code -> its original
        self._callees: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def clear(self) -> None:
        self._continuations.clear()
        self._frames.clear()
        self._callees = weakref.WeakKeyDictionary()

    def frame_of(self, function: types.FunctionType) -> Frame:
        known = self._frames.get(function.__code__)
        if known is not None:
            return known
        return Frame(function.__code__, function.__globals__)

    def continuation(self, frame: Frame, offset: int, kinds: tuple[str, ...], unbound: tuple[str, ...]) -> Any:
        key = (frame.code, offset, kinds, unbound)
        captured = self._continuations.get(key)
        if captured is None:
            made = resume.make_continuation(frame.code, offset, kinds, unbound)
            placeholder_closure = tuple(types.CellType() for _ in frame.code.co_freevars) or None
            function = types.FunctionType(made.code, frame.globals, made.code.co_name, None, placeholder_closure)
            function.__qualname__ = made.code.co_qualname
            self._frames[made.code] = Frame(frame.code, frame.globals, made.shift)
            captured = self._continuations[key] = self._make_captured(function)
            captured.description = resume.describe(made, offset)
        return captured

    def compiled(self, fn: Any) -> Any:
        """A user function or module called at a break: compiled on its own (its own graphs and breaks)."""
        try:
            captured = self._callees.get(fn)
        except TypeError:
            return fn
        if captured is None:
            try:
                captured = self._callees[fn] = self._make_captured(fn)
            except TypeError:   # not something capture can compile
                return fn
        return captured


# ------------------------------------------------------------------ planning a break
def break_point(session: Any) -> tuple[int, int] | None:
    """(offset, visit count) of the frame's instruction that failed, when the frame can go on after it."""
    tx = session.root_translator
    if tx is None or tx.failed_instruction is None:
        return None
    inst = tx.failed_instruction
    if operand_count(inst) is None or resume.resumable(tx.code) is not None:
        return None
    return inst.offset, tx.visits[inst.offset]


@dataclasses.dataclass
class _Handler(Branch):
    lasti: bool = False


def _exception_handler(frame: Frame, offset: int, below: Branch) -> _Handler | None:
    """Where the frame's exception table sends an exception raised at ``offset``: the handler
    continuation with the stack it expects (the entry's depth, lasti, the exception)."""
    for entry in dis._parse_exception_table(frame.code):
        if entry.start <= offset < entry.end:
            if entry.depth > len(below.stack):
                raise Unsupported("graph break with an exception handler deeper than the stack")
            stack = below.stack[:entry.depth] + ([None] if entry.lasti else []) + ["error"]
            kinds = below.kinds[:entry.depth] + ((resume.VALUE,) if entry.lasti else ()) + (resume.VALUE,)
            # the lasti slot is filled in once the handler continuation (and its prologue) exists
            return _Handler(entry.target, [e for e in stack if e is not None], kinds, entry.lasti)
    return None


@dataclasses.dataclass
class Runner:
    function: Callable
    source: str
    continuations: list[str]   # each continuation the runner may call, as Python (resume.describe)


def plan(session: Any, tx: Any, frame: Frame, registry: BreakRegistry, reason: str, location: str) -> Runner:
    """The runner of a break at ``tx``'s current instruction; adds the graph's outputs."""
    inst = tx.instructions[tx.index_of_offset[tx.instruction_offset]]
    n_in = operand_count(inst)
    index = tx.index_of_offset[inst.offset]
    next_offset = tx.instructions[index + 1].offset if index + 1 < len(tx.instructions) else inst.offset
    builder = EpilogueBuilder(session)
    statements = builder.mutation_statements()
    step_builder = _StepBuilder(builder, registry, inst, next_offset - frame.shift, tx.kw_names)
    below, operands = tx.stack[:len(tx.stack) - n_in], tx.stack[len(tx.stack) - n_in:]
    step = step_builder.build(below, operands)
    if step.taken is not None:
        step.taken.offset -= frame.shift
    original_names = frame.code.co_varnames
    locals_ = [builder.expr(tx.locals[name]) if name in tx.locals else "None" for name in original_names]
    unbound = tuple(name for name in original_names if name not in tx.locals)
    cells = [builder.cell(tx.cells[name]) for name in frame.code.co_cellvars + frame.code.co_freevars]
    for value in tx.locals.values():
        if isinstance(value, V.IteratorValue):
            raise Unsupported("graph break while a local variable holds an iterator")

    described: list[str] = []

    def call_continuation(branch: Branch) -> str:
        captured = registry.continuation(frame, branch.offset, branch.kinds, unbound)
        described.append(captured.description)
        name = builder.namespace.bind(captured, captured.spec.function.__code__.co_name.replace(".", "_"))
        args = locals_ + [e for e in branch.stack if e is not None] + cells
        return f"return {tail_call}({name}, ({''.join(a + ', ' for a in args)}))"

    tail_call = builder.namespace.bind(TailCall, "TailCall")

    where = tx.location()
    body = [f"# graph break at {location}: {reason}"]
    if where != location:
        body.append(f"# (inside the call at {where})")
    body += ["# the instruction runs natively, then the rest of the frame:"]
    native = step.lines + ([f"taken = {step.condition}"] if step.condition is not None else [])
    handler = _exception_handler(frame, inst.offset - frame.shift, step.below)
    if handler is None:
        body += native
    else:
        # inside try/except or a with block: what the instruction raises goes to the frame's handler
        captured = registry.continuation(frame, handler.offset, handler.kinds, unbound)
        if handler.lasti:   # the offset RERAISE reports, in the handler continuation's code
            handler.stack.insert(-1, str(inst.offset - frame.shift + registry.frame_of(captured.spec.function).shift))
        body += ["try:"] + [f"    {line}" for line in native] + \
                ["except BaseException as error:", f"    {call_continuation(handler)}"]
    if step.condition is not None:
        body += ["if taken:", f"    {call_continuation(step.taken)}"]
    body.append(call_continuation(step.fall_through))
    session.graph.output(builder.outputs)
    function = builder.function("resume_after_graph", builder.grad_mode_statements() + builder.rebuilt + statements +
                                body)
    return Runner(function, function.__ember_source__, described)

