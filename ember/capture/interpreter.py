"""The symbolic stack machine over CPython 3.11 / 3.12 bytecode.

``InstructionTranslator`` runs one code object (the root frame or an inlined
function) over Values instead of objects: it owns the value stack, the locals
and the cells, and the control flow.  What an operation *means* (calling,
attribute access, operators) lives in ``operations.py``; this file only moves
Values between the stack and the frame.

Branches are decided on Python values (constants, tensor metadata); a branch on
a tensor raises Unsupported.  Loops are unrolled by simply executing them.

Graph breaks later: every Unsupported is raised with ``tx.instruction_offset``
and the frame state intact, which is what a "compile prefix, run the construct,
continue in a generated continuation" scheme needs to resume from.
"""
from __future__ import annotations

import builtins
import dis
import inspect
import sys
import types
from typing import Any

from ..errors import Unsupported
from . import calls, objects
from . import operations as ops
from . import values as V
from .autocast import AutocastValue
from .breaks import StopCapture
from .resume import cell_name
from .sources import AttrSource, LocalSource, cell_source, global_source
from .values import RealCell

PY312 = sys.version_info >= (3, 12)
MAX_INLINE_DEPTH = 48

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
CO_GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen
CO_GENERATOR = 0x20
CO_ITERABLE_COROUTINE = 0x100

_BINARY_OPS = {name: i for i, (_, name) in enumerate(getattr(dis, "_nb_ops", []))}


def _has_python_enter_exit(manager: V.Value) -> bool:
    try:
        cls = manager.python_type()
    except Unsupported:
        return False
    return all(isinstance(inspect.getattr_static(cls, name, None), types.FunctionType)
               for name in ("__enter__", "__exit__"))


_DECODED: dict[types.CodeType, tuple[list[dis.Instruction], dict[int, int]]] = {}


def _decoded(code: types.CodeType) -> tuple[list[dis.Instruction], dict[int, int]]:
    """Instructions of a code object (decoding costs ~1 ms; the same functions are inlined again and again)."""
    cached = _DECODED.get(code)
    if cached is None:
        if len(_DECODED) > 4096:
            _DECODED.clear()
        instructions = list(dis.get_instructions(code))
        cached = (instructions, {inst.offset: i for i, inst in enumerate(instructions)})
        _DECODED[code] = cached
    return cached


class RaisedException(V.ConstantValue):
    """An exception capture raised itself, exactly as eager raises it (exception_handler)."""


_EXCEPTION_TABLES: dict[types.CodeType, list] = {}


def _exception_table(code: types.CodeType) -> list:
    table = _EXCEPTION_TABLES.get(code)
    if table is None:
        if len(_EXCEPTION_TABLES) > 4096:
            _EXCEPTION_TABLES.clear()
        table = _EXCEPTION_TABLES[code] = list(dis._parse_exception_table(code))
    return table


def _handler_entry(code: types.CodeType, offset: int) -> Any:
    """The exception table entry covering ``offset`` (entries do not overlap), or None."""
    return next((entry for entry in _exception_table(code) if entry.start <= offset < entry.end), None)


def _handlers_catch_only_named_exceptions(code: types.CodeType) -> bool:
    """Every handler of a generator is ``except SomeError:`` (not finally, with, a bare except or
    BaseException/GeneratorExit): closing the suspended generator, as eager does when it is
    dropped, then runs none of them (collections.abc.Sequence.__iter__ catches IndexError)."""
    instructions, index_of = _decoded(code)
    for entry in _exception_table(code):
        position = index_of[entry.target]
        if instructions[position].opname != "PUSH_EXC_INFO":
            continue            # a handler's own cleanup, or 3.12's StopIteration wrapper of generators
        load, check = instructions[position + 1:position + 3]
        if not load.opname.startswith("LOAD_") or check.opname != "CHECK_EXC_MATCH" or \
                load.argval in ("BaseException", "GeneratorExit"):
            return False
    return True


def _exception_of(value: V.Value) -> BaseException | None:
    """The exception a raise statement raises: an instance, or a class made with no arguments."""
    try:
        obj = value.as_python()
    except Unsupported:
        return None
    if isinstance(obj, BaseException):
        return obj
    if isinstance(obj, type) and issubclass(obj, BaseException):
        try:
            return obj()
        except Exception:  # noqa: BLE001 - a class eager cannot make without arguments either
            return None
    return None


def _contents_source(cell: RealCell) -> Any:
    if cell.cell_source is not None:
        return AttrSource(cell.cell_source, "cell_contents")
    return cell_source(cell.cell, cell.name)


def user_error(session: Any, reason: str) -> Unsupported:
    error = Unsupported(reason, session.current_line())
    error.eager_may_raise = True
    return error


class ReturnSignal(Exception):
    pass


class InstructionTranslator:
    def __init__(self, session: Any, code: types.CodeType, globals_dict: dict, local_values: dict[str, V.Value],
                 cells: dict[str, Any], depth: int = 0, function_name: str = "") -> None:
        # generators (and generator expressions) run lazily: see RETURN_GENERATOR
        self.generator: V.GeneratorValue | None = None
        if code.co_flags & CO_GENERATOR_LIKE:
            if not code.co_flags & CO_GENERATOR or code.co_flags & CO_ITERABLE_COROUTINE:
                raise Unsupported(f"coroutine {code.co_name}()", session.current_line())
            if not _handlers_catch_only_named_exceptions(code) and \
                    not getattr(session, "generator_handlers_allowed", False):
                # try/finally or with around a yield: eager runs the handler when the generator is closed
                raise Unsupported(f"generator {code.co_name}() with try/finally or with blocks "
                                  f"({code.co_filename}:{code.co_firstlineno})", session.current_line())
        if depth > MAX_INLINE_DEPTH:
            raise Unsupported("inlining too deep (recursion?)", session.current_line())
        self.session = session
        self.code = code
        self.globals = globals_dict
        self.locals = local_values
        self.cells = cells
        self.depth = depth
        self.function_name = function_name or code.co_name
        self.instructions, self.index_of_offset = _decoded(code)
        self.stack: list[V.Value] = []
        self.kw_names: tuple[str, ...] = ()
        self.lineno = code.co_firstlineno
        self.instruction_offset = 0
        self.active_contexts: list[V.GradModeValue] = []
        # the frame being compiled (not an inlined callee) counts visits per instruction, so that a
        # second capture can stop at the same visit of the instruction that broke the graph
        self.visits: dict[int, int] = {}
        self.failed_instruction: dis.Instruction | None = None
        self.handled: list[V.Value] = []      # the exceptions being handled (PUSH_EXC_INFO), innermost last

    # ------------------------------------------------------------ helpers
    def location(self) -> str:
        return f"{self.code.co_filename}:{self.lineno}"

    def push(self, value: V.Value) -> None:
        self.stack.append(value)

    def pop(self) -> V.Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[V.Value]:
        if n == 0:
            return []
        values = self.stack[-n:]
        del self.stack[-n:]
        return values

    def unsupported(self, reason: str, hint: str = "") -> Unsupported:
        return Unsupported(reason, self.session.current_line(), hint)

    def user_error(self, reason: str) -> Unsupported:
        """A break where the user's Python raises (IndexError, NameError, raise, assert): eager runs
        the frame and raises it, also under fullgraph=True."""
        return user_error(self.session, reason)

    # ------------------------------------------------------------ the ways lower modules call back up
    def call(self, callee: V.Value, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
        """``callee(*args, **kwargs)`` through the dispatcher: objects.py, modules.py, operations.py and
        builtins.py run Python code (properties, dunders, hooks, map's function) through this, below calls.py."""
        return calls.call(self, callee, args, kwargs)

    def inline_code(self, code: types.CodeType, globals_dict: dict, local_values: dict[str, V.Value],
                    cells: dict[str, Any], name: str) -> V.Value:
        """Run a callee's bytecode one level deeper (inline.py binds its arguments and cells)."""
        child = InstructionTranslator(self.session, code, globals_dict, local_values, cells, depth=self.depth + 1,
                                      function_name=name)
        return child.run()

    # ------------------------------------------------------------ main loop
    def run(self) -> V.Value:
        session = self.session
        session.line_stack.append(self)
        is_frame = self.depth == 0 and self.code is session.root_code and session.root_translator is None
        if is_frame:
            session.root_translator = self
        stop_at = session.stop_at if is_frame else None
        # stopped at the break: grad-mode blocks still open stay open, the runner makes their __exit__;
        # autocast blocks are left (their real __exit__ replayed) and the runner enters them again
        suspended = False
        try:
            index = 0
            while True:
                inst = self.instructions[index]
                self.instruction_offset = inst.offset
                if is_frame:
                    visits = self.visits[inst.offset] = self.visits.get(inst.offset, 0) + 1
                    if stop_at is not None and stop_at == (inst.offset, visits):
                        suspended = True
                        raise StopCapture(self)
                if inst.positions is not None and inst.positions.lineno is not None:
                    self.lineno = inst.positions.lineno
                elif inst.starts_line:
                    self.lineno = inst.starts_line
                handler = getattr(self, inst.opname, None)
                if handler is None:
                    raise self.unsupported(f"bytecode {inst.opname} is not supported by capture")
                try:
                    jump = handler(inst)
                except ReturnSignal:
                    return self.return_value
                except Unsupported as error:
                    target = self.exception_handler(inst, error)
                    if target is not None:
                        index = self.index_of_offset[target]
                        continue
                    if self.handled and error.python_exception is None:
                        # inside a handler capture entered: a continuation could not re-enter it
                        # (a bare raise there has no exception to re-raise), so no split here
                        error.eager_may_raise = True
                    self.failed_instruction = inst
                    if not error.source_line:
                        error.source_line = self.session.current_line()
                    # innermost first: where in the inlined call chain the break happened (for logs)
                    error.__dict__.setdefault("inline_stack", []).append(f"{self.location()} {self.function_name}")
                    raise
                index = self.index_of_offset[jump] if jump is not None else index + 1
        finally:
            session.line_stack.pop()
            for context in reversed(self.active_contexts):  # an exit never reached
                if not (suspended and isinstance(context, V.GradModeValue)):
                    ops.exit_context(self, context)

    def jump_target(self, inst: dis.Instruction) -> int:
        return inst.argval

    # ------------------------------------------------------------ exceptions
    # An exception that capture raised by evaluating the operation as eager does (a list index out
    # of range in user code, a raise statement) goes to the frame's handler as in CPython: the
    # exception table entry covering the instruction gives the handler, the stack depth to keep
    # and whether the offset is pushed.  Every other failure stays a graph break.
    def exception_handler(self, inst: dis.Instruction, error: Unsupported) -> int | None:
        exception = error.python_exception
        if exception is None:
            return None
        entry = _handler_entry(self.code, inst.offset)
        if entry is None:
            return None
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(V.ConstantValue(inst.offset))
        self.push(RaisedException(exception))
        return entry.target

    def raised(self, exception: BaseException) -> Unsupported:
        return ops.user_error(self.session, f"{type(exception).__name__}: {exception}", exception)

    def PUSH_EXC_INFO(self, inst):
        if not isinstance(self.stack[-1], RaisedException):
            # a continuation entered at a handler with the exception a native step raised: the
            # exception is a run-time value (its type is not guarded), so the handler runs natively
            raise self.unsupported("an exception handler entered with a run-time exception")
        exception = self.pop()
        self.push(self.handled[-1] if self.handled else V.NONE)
        self.handled.append(exception)
        self.push(exception)

    def POP_EXCEPT(self, inst):
        self.pop()
        if self.handled:
            self.handled.pop()

    def CHECK_EXC_MATCH(self, inst):
        classes = self.pop().as_python()
        self.push(V.ConstantValue(isinstance(self.stack[-1].as_python(), classes)))

    def RERAISE(self, inst):
        raise self.raised(self.pop().as_python())

    # ------------------------------------------------------------ no-ops
    def NOP(self, inst): pass
    RESUME = EXTENDED_ARG = CACHE = PRECALL = COPY_FREE_VARS = NOP

    def KW_NAMES(self, inst):
        self.kw_names = self.code.co_consts[inst.arg]

    # ------------------------------------------------------------ stack
    def POP_TOP(self, inst): self.pop()
    def PUSH_NULL(self, inst): self.push(V.NULL)

    def COPY(self, inst): self.push(self.stack[-inst.arg])

    def SWAP(self, inst):
        self.stack[-1], self.stack[-inst.arg] = self.stack[-inst.arg], self.stack[-1]

    def END_FOR(self, inst): self.popn(2)

    # ------------------------------------------------------------ constants and locals
    def LOAD_CONST(self, inst):
        self.push(ops.constant_value(self, inst.argval))

    def RETURN_CONST(self, inst):
        self.return_value = ops.constant_value(self, inst.argval)
        raise ReturnSignal

    def RETURN_VALUE(self, inst):
        self.return_value = self.pop()
        raise ReturnSignal

    def LOAD_FAST(self, inst):
        if inst.argval not in self.locals:
            raise self.user_error(f"local variable {inst.argval!r} referenced before assignment")
        self.push(self.locals[inst.argval])
    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, inst):
        self.push(self.locals.pop(inst.argval, V.NULL))

    def STORE_FAST(self, inst):
        value = self.pop()
        if isinstance(value.source, LocalSource) and value.source.local_name == cell_name(inst.argval):
            # a continuation's prologue: the cell object of a cell or free variable, passed in as
            # the argument __cell_<name>, goes into its slot (resume.py)
            self.cells[inst.argval] = RealCell(value.obj, inst.argval, cell_source=value.source)
        elif value is V.NULL:  # restoring a comprehension variable that was unset (3.12)
            self.locals.pop(inst.argval, None)
        else:
            self.locals[inst.argval] = value

    def DELETE_FAST(self, inst): self.locals.pop(inst.argval, None)

    def MAKE_CELL(self, inst):
        self.cells[inst.argval] = V.CellValue(self.locals.pop(inst.argval, None))

    def LOAD_CLOSURE(self, inst):
        self.push(self.cells[inst.argval])

    def LOAD_DEREF(self, inst):
        cell = self.cells[inst.argval]
        if isinstance(cell, RealCell):
            stored = self.session.stored_outside.get((id(cell.cell), inst.argval))
            if stored is not None:
                self.push(stored[1])
                return
            try:
                contents = cell.cell.cell_contents
            except ValueError:
                raise self.unsupported(f"free variable {inst.argval!r} is empty") from None
            self.push(self.session.wrap(contents, _contents_source(cell)))
        else:
            if cell.contents is None:
                raise self.user_error(f"free variable {inst.argval!r} referenced before assignment")
            self.push(cell.contents)

    def STORE_DEREF(self, inst):
        cell = self.cells[inst.argval]
        if isinstance(cell, RealCell):  # a nonlocal of the compiled function: written back after the graph
            self.session.store_outside((id(cell.cell), inst.argval), _contents_source(cell), self.pop())
            return
        cell.contents = self.pop()

    def LOAD_GLOBAL(self, inst):
        if inst.arg & 1:  # 3.11 and 3.12: NULL goes below the global
            self.push(V.NULL)
        name = inst.argval
        stored = self.session.stored_outside.get((id(self.globals), name))
        if stored is not None:
            value = stored[1]
        elif name in self.globals:
            source = global_source(name, self.globals, self.session.root_globals)
            value = self.session.wrap(self.globals[name], source)
        else:
            builtins_dict = self.globals.get("__builtins__", builtins)
            if isinstance(builtins_dict, types.ModuleType):
                builtins_dict = builtins_dict.__dict__
            if name not in builtins_dict:
                raise self.user_error(f"name {name!r} is not defined")
            value = V.ObjectValue(builtins_dict[name])
        self.push(value)

    def STORE_GLOBAL(self, inst):
        """``global X; X = ...``: later reads in the trace see the Value; written back after the graph."""
        name = inst.argval
        self.session.store_outside((id(self.globals), name),
                                   global_source(name, self.globals, self.session.root_globals), self.pop())

    def IMPORT_NAME(self, inst):
        fromlist = self.pop().as_python()
        level = self.pop().as_python()
        module = __import__(inst.argval, self.globals, None, fromlist, level)
        self.push(V.ObjectValue(module))

    def IMPORT_FROM(self, inst):
        self.push(ops.get_attr(self, self.stack[-1], inst.argval))

    # ------------------------------------------------------------ attributes
    def LOAD_ATTR(self, inst):
        obj = self.pop()
        if PY312 and inst.arg & 1:
            self.push(V.NULL)
        self.push(ops.get_attr(self, obj, inst.argval))

    def LOAD_METHOD(self, inst):
        obj = self.pop()
        self.push(V.NULL)
        self.push(ops.get_attr(self, obj, inst.argval))

    def LOAD_SUPER_ATTR(self, inst):
        self_value = self.pop()
        cls = self.pop().as_python()
        self.pop()  # the global `super`
        value = ops.get_attr(self, V.SuperValue(cls, self_value), inst.argval)
        if inst.arg & 1:
            self.push(V.NULL)
        self.push(value)

    def STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        ops.set_attr(self, obj, inst.argval, value)

    def DELETE_ATTR(self, inst):
        raise self.unsupported("del of an attribute")

    # ------------------------------------------------------------ operators
    def BINARY_OP(self, inst):
        right = self.pop()
        left = self.pop()
        self.push(ops.binary_op(self, inst.argrepr, left, right))

    def UNARY_NEGATIVE(self, inst): self.push(ops.unary_op(self, "neg", self.pop()))
    def UNARY_POSITIVE(self, inst): self.push(ops.unary_op(self, "pos", self.pop()))
    def UNARY_INVERT(self, inst): self.push(ops.unary_op(self, "invert", self.pop()))

    def UNARY_NOT(self, inst):
        self.push(V.ConstantValue(not ops.truthiness(self, self.pop())))

    def COMPARE_OP(self, inst):
        right = self.pop()
        left = self.pop()
        self.push(ops.compare(self, inst.argval, left, right))

    def IS_OP(self, inst):
        right = self.pop()
        left = self.pop()
        same = ops.is_same(self, left, right)
        self.push(V.ConstantValue(same != bool(inst.arg)))

    def CONTAINS_OP(self, inst):
        container = self.pop()
        item = self.pop()
        found = ops.contains(self, container, item)
        self.push(V.ConstantValue(found != bool(inst.arg)))

    def BINARY_SUBSCR(self, inst):
        index = self.pop()
        obj = self.pop()
        self.push(ops.get_item(self, obj, index))

    def STORE_SUBSCR(self, inst):
        index = self.pop()
        obj = self.pop()
        value = self.pop()
        ops.set_item(self, obj, index, value)

    def DELETE_SUBSCR(self, inst):
        index = self.pop()
        obj = self.pop()
        ops.delete_item(self, obj, index)

    def BINARY_SLICE(self, inst):
        stop = self.pop()
        start = self.pop()
        obj = self.pop()
        self.push(ops.get_item(self, obj, ops.make_slice([start, stop])))

    def STORE_SLICE(self, inst):
        stop = self.pop()
        start = self.pop()
        obj = self.pop()
        value = self.pop()
        ops.set_item(self, obj, ops.make_slice([start, stop]), value)

    def BUILD_SLICE(self, inst):
        self.push(ops.make_slice(self.popn(inst.arg)))

    # ------------------------------------------------------------ containers
    def BUILD_TUPLE(self, inst): self.push(V.TupleValue(self.popn(inst.arg)))
    def BUILD_LIST(self, inst): self.push(V.ListValue(self.popn(inst.arg)))

    def BUILD_SET(self, inst):
        self.push(V.SetValue([v.as_python() for v in self.popn(inst.arg)]))

    def BUILD_MAP(self, inst):
        items = self.popn(2 * inst.arg)
        self.push(V.DictValue({items[i].as_python(): items[i + 1] for i in range(0, len(items), 2)}))

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop().as_python()
        values = self.popn(inst.arg)
        self.push(V.DictValue(dict(zip(keys, values))))

    def BUILD_STRING(self, inst):
        self.push(V.ConstantValue("".join(v.as_python() for v in self.popn(inst.arg))))

    def LIST_APPEND(self, inst):
        value = self.pop()
        ops.list_target(self, self.stack[-inst.arg]).items.append(value)

    def SET_ADD(self, inst):
        value = self.pop()
        self.stack[-inst.arg].items.add(value.as_python())

    def MAP_ADD(self, inst):
        value = self.pop()
        key = self.pop()
        self.stack[-inst.arg].items[key.as_python()] = value

    def LIST_EXTEND(self, inst):
        values = ops.unpack(self, self.pop())
        ops.list_target(self, self.stack[-inst.arg]).items.extend(values)

    def SET_UPDATE(self, inst):
        values = ops.unpack(self, self.pop())
        self.stack[-inst.arg].items.update(v.as_python() for v in values)

    def DICT_UPDATE(self, inst):
        other = self.pop()
        if not isinstance(other, V.DictValue):
            raise self.unsupported(f"dict.update with {other.describe()}")
        self.stack[-inst.arg].items.update(other.items)
    DICT_MERGE = DICT_UPDATE

    def LIST_TO_TUPLE(self, inst):
        self.push(V.TupleValue(self.pop().items))

    def CALL_INTRINSIC_1(self, inst):
        name = inst.argrepr
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(V.TupleValue(self.pop().items))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.push(ops.unary_op(self, "pos", self.pop()))
        else:
            raise self.unsupported(f"{name}")

    def UNPACK_SEQUENCE(self, inst):
        items = ops.unpack(self, self.pop())
        if len(items) != inst.arg:
            raise self.user_error(f"unpacking {len(items)} values into {inst.arg}")
        for item in reversed(items):
            self.push(item)

    def UNPACK_EX(self, inst):
        items = ops.unpack(self, self.pop())
        before, after = inst.arg & 0xFF, inst.arg >> 8
        if len(items) < before + after:
            raise self.user_error("not enough values to unpack")
        middle = V.ListValue(items[before:len(items) - after])
        for item in reversed(items[len(items) - after:]):
            self.push(item)
        self.push(middle)
        for item in reversed(items[:before]):
            self.push(item)

    def FORMAT_VALUE(self, inst):
        spec = self.pop().as_python() if inst.arg & 0x04 else ""
        value = self.pop()
        conversion = {0: None, 1: str, 2: repr, 3: ascii}[inst.arg & 0x03]
        if objects.has_python_operators(value) and conversion is not ascii:
            # an instance of a Python class: its __format__ / __str__ / __repr__, inlined
            if conversion is not None:
                value, conversion = objects.to_string(self, value, conversion.__name__), None
            else:
                self.push(objects.to_string(self, value, "format", spec))
                return
        python = ops.format_python_value(self, value)
        if conversion is not None:
            python = conversion(python)
        self.push(V.ConstantValue(format(python, spec)))

    # ------------------------------------------------------------ control flow
    def JUMP_FORWARD(self, inst): return inst.argval
    JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = JUMP = JUMP_NO_INTERRUPT = JUMP_FORWARD

    def _pop_jump_if(self, inst, want: bool):
        if ops.truthiness(self, self.pop()) == want:
            return inst.argval
        return None

    def POP_JUMP_IF_TRUE(self, inst): return self._pop_jump_if(inst, True)
    def POP_JUMP_IF_FALSE(self, inst): return self._pop_jump_if(inst, False)
    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE

    def POP_JUMP_IF_NONE(self, inst):
        return inst.argval if ops.is_none(self, self.pop()) else None

    def POP_JUMP_IF_NOT_NONE(self, inst):
        return None if ops.is_none(self, self.pop()) else inst.argval
    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_IF_TRUE_OR_POP(self, inst):
        if ops.truthiness(self, self.stack[-1]):
            return inst.argval
        self.pop()
        return None

    def JUMP_IF_FALSE_OR_POP(self, inst):
        if not ops.truthiness(self, self.stack[-1]):
            return inst.argval
        self.pop()
        return None

    def GET_ITER(self, inst):
        self.push(ops.get_iter(self, self.pop()))

    def FOR_ITER(self, inst):
        iterator = self.stack[-1]
        if not isinstance(iterator, V.IteratorValue):
            raise self.unsupported(f"iterating over {iterator.describe()}")
        item = iterator.next_item()
        if item is not None:
            self.push(item)
            return None
        self.pop()
        target = inst.argval
        target_inst = self.instructions[self.index_of_offset[target]]
        if target_inst.opname == "END_FOR":  # 3.12: exhaustion skips END_FOR
            return self.instructions[self.index_of_offset[target] + 1].offset
        return target

    # ------------------------------------------------------------ generators
    # A generator function's frame is kept suspended, as CPython keeps it: calling the function
    # runs up to RETURN_GENERATOR, which returns a GeneratorValue; each next() on it runs the frame
    # again (``resume``) from RETURN_GENERATOR, which jumps to where the last yield left off, up to
    # the next YIELD_VALUE.  The body thus runs exactly when eager runs it, interleaved with the
    # consumer's own code.
    def resume(self) -> V.Value | None:
        """Run a suspended generator frame to its next yield: the Value yielded, None once it returned."""
        self.yielded = False
        result = self.run()
        if self.yielded:
            return result
        self.generator.return_value = result
        return None

    def _next_offset(self, inst) -> int:
        return self.instructions[self.index_of_offset[inst.offset] + 1].offset

    def RETURN_GENERATOR(self, inst):
        if self.generator is None:  # the call itself: hand the caller the generator
            self.generator = V.GeneratorValue(self)
            self.resume_offset = self._next_offset(inst)
            self.generator_cells = dict(self.cells)
            self.return_value = self.generator
            raise ReturnSignal
        # a next(): the MAKE_CELLs before this instruction ran again and replaced the cells
        self.cells.update(self.generator_cells)
        self.push(V.NONE)  # the value next() sends in
        return self.resume_offset

    def YIELD_VALUE(self, inst):
        if self.active_contexts:
            raise self.unsupported("yield inside a with-block")
        self.return_value = self.pop()
        self.yielded = True
        self.resume_offset = self._next_offset(inst)
        raise ReturnSignal

    def GET_YIELD_FROM_ITER(self, inst):
        self.push(ops.get_iter(self, self.pop()))

    def SEND(self, inst):
        """``yield from``: the next item of the sub-iterator, or its return value once exhausted."""
        sent = self.pop()
        if not ops.is_none(self, sent):
            raise self.unsupported("generator.send() of a value")
        receiver = self.stack[-1]
        if not isinstance(receiver, V.IteratorValue):
            raise self.unsupported(f"yield from {receiver.describe()}")
        item = receiver.next_item()
        if item is not None:
            self.push(item)
            return None
        result = receiver.return_value if isinstance(receiver, V.GeneratorValue) else V.NONE
        if PY312:  # the receiver stays for END_SEND
            self.push(result)
        else:
            self.stack[-1] = result
        return inst.argval

    def END_SEND(self, inst):
        value = self.pop()
        self.pop()
        self.push(value)

    def RAISE_VARARGS(self, inst):
        if inst.arg == 0:                          # a bare raise: the exception being handled
            if not self.handled:
                raise self.user_error("raise with no exception being handled")
            raise self.raised(self.handled[-1].as_python())
        values = self.popn(inst.arg)
        exception = _exception_of(values[0])
        if exception is None:
            raise self.user_error("raise inside a compiled function")
        if inst.arg == 2:
            cause = _exception_of(values[1])
            if cause is None and not (isinstance(values[1], V.ConstantValue) and values[1].value is None):
                raise self.user_error("raise ... from a value that is not an exception")
            exception.__cause__ = cause
        raise self.raised(exception)

    def LOAD_ASSERTION_ERROR(self, inst):
        raise self.user_error("assert that fails during capture")

    # ------------------------------------------------------------ with blocks (grad mode, autocast, Python managers)
    def BEFORE_WITH(self, inst):
        manager = self.pop()
        if isinstance(manager, objects.GeneratorContextValue):  # @contextlib.contextmanager
            self.push(V.ContextExitValue(manager))
            self.push(ops.enter_generator_context(self, manager))
            return
        if not isinstance(manager, (V.GradModeValue, AutocastValue)):
            # a context manager written in Python (contextlib.nullcontext, a user class): inline
            # __enter__ now; the bytecode calls the pushed __exit__(None, None, None) on normal exit
            enter = ops.get_attr(self, manager, "__enter__") if _has_python_enter_exit(manager) else None
            if enter is None:
                raise self.unsupported(f"with-block on {manager.describe()}",
                                       "grad-mode managers and context managers written in Python are captured")
            exit_method = ops.get_attr(self, manager, "__exit__")
            result = calls.call(self, enter, [], {})
            self.push(exit_method)
            self.push(result)
            return
        ops.enter_context(self, manager)
        self.active_contexts.append(manager)
        self.push(V.ContextExitValue(manager))
        # `with torch.autocast(...) as ac:` binds the manager; grad-mode managers return None
        self.push(manager if isinstance(manager, AutocastValue) else V.NONE)

    # ------------------------------------------------------------ calls
    def CALL(self, inst):
        kw_names, self.kw_names = self.kw_names, ()
        values = self.popn(inst.arg)
        callable_or_self = self.pop()
        below = self.pop()
        if below is V.NULL:
            callee, args = callable_or_self, values
        else:
            callee, args = below, [callable_or_self] + values
        kwargs = {}
        if kw_names:
            kwargs = dict(zip(kw_names, args[len(args) - len(kw_names):]))
            args = args[:len(args) - len(kw_names)]
        self.push(calls.call(self, callee, list(args), kwargs))

    def CALL_FUNCTION_EX(self, inst):
        kwargs_value = self.pop() if inst.arg & 1 else None
        args_value = self.pop()
        callee = self.pop()
        if self.stack and self.stack[-1] is V.NULL:
            self.pop()
        args = ops.unpack(self, args_value)
        kwargs = {}
        if kwargs_value is not None:
            if not isinstance(kwargs_value, V.DictValue):
                raise self.unsupported(f"**kwargs of {kwargs_value.describe()}")
            kwargs = dict(kwargs_value.items)
        self.push(calls.call(self, callee, list(args), kwargs))

    def MAKE_FUNCTION(self, inst):
        code = self.pop().as_python()
        closure = self.pop().items if inst.arg & 0x08 else ()
        if inst.arg & 0x04:
            self.pop()  # annotations
        kwdefaults = self.pop().items if inst.arg & 0x02 else {}
        defaults = tuple(self.pop().items) if inst.arg & 0x01 else ()
        self.push(V.FunctionValue(code, self.globals, code.co_name, defaults, kwdefaults, tuple(closure)))
