"""Continuation code objects: a user function resumed in the middle, after a graph break.

A graph break stops capture at an instruction of the user's frame.  What follows
that instruction runs in a *continuation*: a copy of the user's code object
with a short prologue in front,

    def forward.resume_at_42(self, x, h, ..., __stack0, __stack1, __cell_z):
        COPY_FREE_VARS / RESUME          (as the original starts)
        LOAD_FAST __stack0 ...           the value stack at the break, rebuilt
        PUSH_NULL                        (NULL slots of a call in progress)
        DELETE_FAST y                    locals that were unbound at the break
        LOAD_FAST __cell_z; STORE_FAST z  the cell of a cell variable, into its slot
        JUMP_FORWARD  -> offset 42 of the original code
        <the original code, unchanged>

Its arguments are the original locals (all of them, in order, so no
instruction of the original needs renumbering), the stack values, and the cell
objects of the frame's cell and free variables (stored straight into their
slots: closures made before the break and the continuation share them, and one
continuation serves every closure made from the same code).
The original bytes follow the prologue as they are: jumps are relative in
3.11/3.12, so only the exception table (absolute offsets) and the localsplus
indices of free variables (shifted by the added stack arguments) change.  The
continuation is an ordinary function, captured and compiled on its first call
like any other.
"""
from __future__ import annotations

import dataclasses
import dis
import inspect
import types

from ..errors import Unsupported

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
CO_GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200

# slot kinds of the value stack passed to a continuation
VALUE, NULL, ITERATOR = "value", "null", "iterator"

_OP = dis.opmap
# ops whose argument is an index into localsplus (varnames + cells + free variables)
_DEREF_OPS = {_OP[name] for name in ("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "MAKE_CELL",
                                     "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF") if name in _OP}
_NO_LOCATION = 15  # line-table entry code: "no location" (3.11/3.12)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """A continuation's code plus how it maps back to the user's code."""

    code: types.CodeType
    original: types.CodeType
    shift: int                     # bytes of prologue: continuation offset = original offset + shift
    stack_names: tuple[str, ...]   # argument names of the non-NULL stack slots, bottom first
    cell_names: tuple[str, ...]    # argument names of the cell objects of the cell and free variables


def stack_name(index: int) -> str:
    return f"__stack{index}"


def resumable(code: types.CodeType) -> str | None:
    """Why a frame of ``code`` cannot be resumed in the middle (None: it can)."""
    if code.co_flags & CO_GENERATOR_LIKE:
        return "the frame is a generator or coroutine"
    return None


def cell_name(name: str) -> str:
    return f"__cell_{name}"


def make_continuation(code: types.CodeType, resume_offset: int, slots: tuple[str, ...],
                      unbound: tuple[str, ...]) -> Continuation:
    """``code`` resumed at ``resume_offset`` with the value stack ``slots`` (bottom first)."""
    reason = resumable(code)
    if reason is not None:
        raise Unsupported(f"cannot resume after a graph break: {reason}")
    n_varnames = len(code.co_varnames)
    stack_names = tuple(stack_name(i) for i, kind in enumerate(slots) if kind != NULL)
    cells = code.co_cellvars + code.co_freevars
    cell_args = tuple(cell_name(name) for name in cells)
    varnames = code.co_varnames + stack_names + cell_args
    index_of = {name: i for i, name in enumerate(varnames)}
    # localsplus: varnames, then the cell variables that are not arguments, then the free variables
    pure_cells = [name for name in code.co_cellvars if name not in code.co_varnames]
    slot_of_cell = {name: index_of[name] if name in code.co_varnames else len(varnames) + pure_cells.index(name)
                    for name in code.co_cellvars}
    slot_of_cell.update({name: len(varnames) + len(pure_cells) + i for i, name in enumerate(code.co_freevars)})

    prologue: list[tuple[int, int]] = []
    if code.co_freevars:
        prologue.append((_OP["COPY_FREE_VARS"], len(code.co_freevars)))
    prologue.append((_OP["RESUME"], 0))
    for i, kind in enumerate(slots):
        if kind == NULL:
            prologue.append((_OP["PUSH_NULL"], 0))
            continue
        prologue.append((_OP["LOAD_FAST"], index_of[stack_name(i)]))
        if kind == ITERATOR:   # passed as a tuple of the remaining items
            prologue.append((_OP["GET_ITER"], 0))
    for name in unbound:
        prologue.append((_OP["DELETE_FAST"], index_of[name]))
    # the cell objects themselves go into their slots: MAKE_CELL is skipped, and the closure that
    # COPY_FREE_VARS copied is a placeholder (one continuation serves every closure of the code)
    for name in cells:
        prologue.append((_OP["LOAD_FAST"], index_of[cell_name(name)]))
        prologue.append((_OP["STORE_FAST"], slot_of_cell[name]))
    body = _encode(prologue)
    # JUMP_FORWARD counts code units from the end of itself, where the original code starts
    jump = _encode([(_OP["JUMP_FORWARD"], resume_offset // 2)])
    prefix = body + jump
    shift = len(prefix)
    original = _shift_localsplus(code.co_code, n_varnames, len(stack_names) + len(cell_args))

    flags = code.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    line = _line_of_offset(code, resume_offset)
    name = f"{code.co_name}.resume_at_{line}"
    new_code = code.replace(
        co_code=prefix + original,
        co_varnames=varnames,
        co_argcount=len(varnames), co_posonlyargcount=0, co_kwonlyargcount=0,
        co_nlocals=len(varnames),
        co_flags=flags,
        co_stacksize=code.co_stacksize + len(slots) + 1,
        co_exceptiontable=_shifted_exception_table(code, shift),
        co_linetable=_no_location_entries(shift // 2) + code.co_linetable,
        co_name=name,
        co_qualname=f"{code.co_qualname}.resume_at_{line}",
    )
    _check_jump(new_code, shift, resume_offset)
    return Continuation(new_code, code, shift, stack_names, cell_args)


def _check_jump(code: types.CodeType, shift: int, resume_offset: int) -> None:
    """Wrong bytecode crashes the interpreter: decode the prologue's jump and check where it lands."""
    jumps = [inst for inst in dis.get_instructions(code) if inst.offset < shift and inst.opname == "JUMP_FORWARD"]
    starts = {inst.offset for inst in dis.get_instructions(code)}
    if len(jumps) != 1 or jumps[0].argval != shift + resume_offset or jumps[0].argval not in starts:
        raise Unsupported(f"internal error: continuation jump to {resume_offset} is miscoded")


def _encode(instructions: list[tuple[int, int]]) -> bytes:
    out = bytearray()
    for opcode, arg in instructions:
        # EXTENDED_ARG carries the higher bytes, most significant first
        arg_bytes = arg.to_bytes(4, "big").lstrip(b"\0") or b"\0"
        for byte in arg_bytes[:-1]:
            out += bytes((_OP["EXTENDED_ARG"], byte))
        out += bytes((opcode, arg_bytes[-1]))
        out += bytes(2 * dis._inline_cache_entries[opcode])
    return bytes(out)


def _shift_localsplus(co_code: bytes, n_varnames: int, added: int) -> bytes:
    """Cell and free-variable indices come after the varnames: move them past the added arguments."""
    if not added:
        return co_code
    out = bytearray(co_code)
    extended = 0
    for i in range(0, len(out), 2):
        opcode, arg = out[i], out[i + 1]
        if opcode == _OP["EXTENDED_ARG"]:
            extended = (extended | arg) << 8
            continue
        full = extended | arg
        extended = 0
        if opcode in _DEREF_OPS and full >= n_varnames:
            if full + added > 0xFF or full > 0xFF:
                raise Unsupported("cannot resume after a graph break: too many variables")
            out[i + 1] = full + added
    return bytes(out)


def _shifted_exception_table(code: types.CodeType, shift: int) -> bytes:
    out = bytearray()
    for entry in dis._parse_exception_table(code):
        start = (entry.start + shift) // 2
        length = (entry.end - entry.start) // 2
        target = (entry.target + shift) // 2
        _varint(out, start, first=True)
        _varint(out, length)
        _varint(out, target)
        _varint(out, (entry.depth << 1) | int(entry.lasti))
    return bytes(out)


def _varint(out: bytearray, value: int, first: bool = False) -> None:
    """The exception table's 6-bit chunks, most significant first; bit 6 = more follow, bit 7 = entry start."""
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    for i, chunk in enumerate(chunks):
        byte = chunk | (64 if i < len(chunks) - 1 else 0)
        if i == 0 and first:
            byte |= 128
        out.append(byte)


def _no_location_entries(code_units: int) -> bytes:
    out = bytearray()
    while code_units > 0:
        n = min(code_units, 8)
        out.append(0x80 | (_NO_LOCATION << 3) | (n - 1))
        code_units -= n
    return bytes(out)


def _line_of_offset(code: types.CodeType, offset: int) -> int:
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if lineno is not None and start <= offset:
            line = lineno
        if start <= offset < end:
            break
    return line


def describe(made: Continuation, resume_offset: int) -> str:
    """A continuation as Python: its signature, then the user's source from the line it resumes at
    (the bytecode resumes inside that line, at ``resume_offset``)."""
    code = made.original
    line = _line_of_offset(code, resume_offset)
    names = ", ".join(made.code.co_varnames[:made.code.co_argcount])
    header = (f"def {made.code.co_qualname}({names}):\n"
              f"    # resumes {code.co_qualname} at {code.co_filename}:{line} (bytecode offset {resume_offset})")
    try:
        lines, first = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return header + "\n    # (source not available)"
    body = "".join(lines[max(line - first, 0):]).rstrip()
    return f"{header}\n{body}"
