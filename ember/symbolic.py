"""Symbolic sizes: integers that stand for every size a compiled graph accepts.

A dynamic dimension of an input becomes a *size symbol* (``s0``, ``s1`` ...) with a value range
(``[2, inf)``: sizes 0 and 1 are specialised, as Dynamo does) and a *hint*, the size seen when it
was made.  ``SymInt`` wraps a sympy expression over such symbols and behaves like an ``int`` for
the code that computes shapes (meta rules, decompositions, the loop IR, the code generators):

* arithmetic (``+ - * // %``) builds a new expression, or a plain ``int`` when it folds to one;
* a comparison, or ``bool()``, is answered from the value ranges when they decide it
  ("statically known": ``s0 * 4 > 3`` needs no check); otherwise from the hints, and the answer is
  recorded as a *guard* (``s0 % 4 == 0``) that the compiled graph's callers must check;
* ``int()`` / ``__index__`` (``range(n)``, ``torch.empty(n)``) specialises: the hint, guarded
  equal.  Anything that does not know about symbols therefore stays correct — it just pins the
  size, and ``ShapeEnv.specialized`` says where.

Guards are therefore the complete list of what the compiled code assumes about its sizes; a
graph compiled under a ShapeEnv is valid exactly for the sizes that satisfy ``env.guards``.
Generated code reads the symbols from the inputs (``ShapeEnv.sources``) and prints expressions
with ``python_code`` / ``c_code``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import os
import sys
import threading
from fractions import Fraction
from collections.abc import Iterator
from typing import Any, Callable

import sympy

INF = math.inf

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_NEGATED = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


@dataclasses.dataclass(frozen=True)
class Guard:
    """``lhs op rhs`` over size symbols, true for every size the compiled code accepts."""

    lhs: sympy.Expr
    op: str
    rhs: sympy.Expr
    reason: str = ""

    def holds(self, values: dict[sympy.Symbol, int]) -> bool:
        return _COMPARE[self.op](_evaluate(self.lhs, values), _evaluate(self.rhs, values))

    def python_code(self, names: Callable[[sympy.Symbol], str] = str) -> str:
        return f"{python_code(self.lhs, names)} {self.op} {python_code(self.rhs, names)}"

    def __str__(self) -> str:
        return self.python_code()


class ShapeEnv:
    """The size symbols of one compilation, their ranges and hints, and the guards taken on them."""

    def __init__(self) -> None:
        self.hints: dict[sympy.Symbol, int] = {}
        self.ranges: dict[sympy.Symbol, tuple[int, float]] = {}
        self.sources: dict[sympy.Symbol, Any] = {}   # how callers read a symbol (opaque here)
        self.guards: list[Guard] = []
        self.specialized: list[str] = []             # why sizes were pinned (logs)
        self._decided: dict[tuple, bool] = {}
        self.replacements: dict[sympy.Symbol, sympy.Expr] = {}   # symbols guarded equal to an expression
        self.frozen = False        # set once the guards are built: no assumption may be added after
        self._hint_values: dict[sympy.Symbol, sympy.Integer] = {}
        self._known: dict[tuple, bool | None] = {}     # statically_known's answers (ranges never change)
        self._quotients: dict[tuple, sympy.Expr] = {}  # cancel(a / b) of sizes (see ``cancel``)
        self._simplified: dict[sympy.Expr, sympy.Expr] = {}   # simplify's answers (until a replacement)
        self._arithmetic: dict[tuple, sympy.Expr] = {}  # SymInt arithmetic: (op, a, b) -> sympy's a op b

    # ---------------------------------------------------------------- symbols
    def symbol(self, hint: int, source: Any = None, lower: int = 2, upper: float = INF) -> SymInt:
        """A new size symbol for a size seen as ``hint``, valid for sizes in [lower, upper]."""
        assert lower <= hint <= upper, (lower, hint, upper)
        # a storage offset may be 0: nonnegative, not positive (sympy simplifies by these assumptions)
        sign = {"positive": True} if lower >= 1 else {"nonnegative": True}
        symbol = sympy.Symbol(f"s{len(self.hints)}", integer=True, **sign)
        self.hints[symbol] = int(hint)
        self._hint_values[symbol] = sympy.Integer(hint)
        self.ranges[symbol] = (lower, upper)
        self.sources[symbol] = source
        return SymInt(symbol, self)

    def size_symbol(self, hint: int, source: Any = None) -> SymInt:
        """The symbol of an input's size: a size equal to one seen before gets that size's symbol
        (duck sizing, as Dynamo does).  Every layer's KV cache then has one length, so their
        kernels fuse and the wrapper reads one size; the guard checks that the sizes stay equal
        (``symbol_source``), and a call where they differ compiles again."""
        for symbol, value in self.hints.items():
            if value == hint and self.ranges[symbol] == (2, INF):
                return SymInt(symbol, self)
        return self.symbol(hint, source)

    def symbol_source(self, value: SymInt) -> Any:
        """Where the guard and the wrapper read a symbol: the first size it was made for."""
        return self.sources[value.expr]

    def hint(self, value: Any) -> int:
        """The value of ``value`` (an int, a SymInt or a sympy expression) at the hints."""
        if isinstance(value, SymInt):
            value = value.expr
        if isinstance(value, sympy.Basic):
            return int(value.xreplace(self._hint_values))
        return int(value)

    # ---------------------------------------------------------------- decisions
    def statically_known(self, lhs: Any, op: str, rhs: Any = 0) -> bool | None:
        """True/False when the ranges decide ``lhs op rhs`` for every size this compile serves,
        else None.  Sizes are read through the replacements: a symbol guarded equal to 1024 is
        1024 here, though a shape made before that guard still names the symbol."""
        key = (self.simplify(_expr(lhs)), op, self.simplify(_expr(rhs)))
        try:
            return self._known[key]
        except KeyError:
            pass
        answer = self._known[key] = self._statically_known(key[0] - key[2], op)
        return answer

    def _statically_known(self, raw: sympy.Expr, op: str) -> bool | None:
        diff = sympy.expand(raw)
        if diff.is_Number:
            return _COMPARE[op](diff, 0)
        # bounds of a sum of products are loose (s0*s1 - s0 spans everything); a product form is tight
        lo, hi = _bounds(diff, self.ranges)
        for form in (raw, sympy.factor(diff)):
            if lo > 0 or hi < 0 or (lo >= 0 and op in ("<", ">=")) or (hi <= 0 and op in ("<=", ">")):
                break
            flo, fhi = _bounds(form, self.ranges)
            lo, hi = max(lo, flo), min(hi, fhi)
        if op == "==":
            return False if (lo > 0 or hi < 0) else None
        if op == "!=":
            return True if (lo > 0 or hi < 0) else None
        if op in ("<", ">="):
            answer = True if hi < 0 else False if lo >= 0 else None
            return answer if op == "<" or answer is None else not answer
        answer = True if hi <= 0 else False if lo > 0 else None      # "<=" and ">"
        return answer if op == "<=" or answer is None else not answer

    def decide(self, lhs: Any, op: str, rhs: Any = 0, reason: str = "") -> bool:
        """``lhs op rhs``: statically known, or the hints' answer kept as a guard."""
        lhs, rhs = self.simplify(_expr(lhs)), self.simplify(_expr(rhs))
        key = (lhs, op, rhs)
        known = self._decided.get(key)
        if known is not None:
            return known
        answer = self.statically_known(lhs, op, rhs)
        if answer is None:
            if self.frozen:
                # the compiled code's guards are built: a new assumption could not be checked
                raise RuntimeError(f"a decision on symbolic sizes after compiling: {lhs} {op} {rhs} "
                                   f"(at {_caller()})")
            answer = _COMPARE[op](self.hint(lhs), self.hint(rhs))
            guard_op = op if answer else _NEGATED[op]
            if guard_op == "==":
                self._replace(_expr(lhs), _expr(rhs))
            self.guards.append(Guard(_expr(lhs), guard_op, _expr(rhs), reason or _caller()))
        self._decided[key] = answer
        return answer

    def _replace(self, lhs: sympy.Expr, rhs: sympy.Expr) -> None:
        """After guarding ``lhs == rhs``, a symbol on one side is the other side from now on, so
        that equal sizes print and compare as one (broadcasting ``s2 == s0`` makes s2 into s0)."""
        diff = sympy.expand(lhs - rhs)
        # the newest symbol that appears alone (coefficient +-1) is solved for: s1 + 1 == s0 + 1
        # makes s1 into s0, 2*s0 == s1 makes s1 into 2*s0
        for symbol in sorted(diff.free_symbols, key=lambda s: -int(s.name[1:]) if s.name[1:].isdigit() else 0):
            coeff = diff.coeff(symbol)
            rest = diff - coeff * symbol
            if symbol in self.hints and coeff in (1, -1) and symbol not in rest.free_symbols:
                self.replacements[symbol] = sympy.expand(-rest / coeff)
                self.replacements = {s: v.xreplace(self.replacements) for s, v in self.replacements.items()}
                self._simplified.clear()
                return

    def cancel(self, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        """``sympy.cancel(a / b)``, remembered: the loop IR's index arithmetic asks for the same
        quotients of sizes again and again (a pure function of the two expressions)."""
        try:
            return self._quotients[a, b]
        except KeyError:
            quotient = self._quotients[a, b] = sympy.cancel(a / b)
            return quotient

    def simplify(self, expr: sympy.Expr) -> sympy.Expr:
        if not self.replacements:
            return expr
        try:
            return self._simplified[expr]
        except KeyError:
            simplified = self._simplified[expr] = expr.xreplace(self.replacements)
            return simplified

    def arithmetic(self, op: str, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        """``a op b`` of two sympy expressions (op one of + - * // %), remembered: building a sympy
        expression costs tens of microseconds, and the same sizes are multiplied and added again
        and again (strides, index coefficients)."""
        key = (op, a, b)
        try:
            return self._arithmetic[key]
        except KeyError:
            pass
        if op == "//":
            result = floordiv(a, b, self)
        elif op == "%":
            result = sympy.Mod(a, b)
        else:
            result = _ARITHMETIC[op](a, b)
        self._arithmetic[key] = result
        return result

    def specialize(self, value: Any, reason: str = "") -> int:
        """The hint of ``value``, guarded equal to it (code that needs a plain int)."""
        hint = self.hint(value)
        if os.environ.get("EMBER_SYMBOLIC_STRICT"):     # debugging: where does a size get pinned?
            raise AssertionError(f"size {value} specialized: {reason}")
        if not self.decide(value, "==", hint, reason or "specialized"):
            raise AssertionError("a hint differs from itself")
        self.specialized.append(f"{value} = {hint}: {reason} at {_caller()}")
        return hint



def _caller() -> str:
    """file:line of the code that asked (the first frame outside this module), for logs."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"


def _expr(value: Any) -> sympy.Expr:
    if isinstance(value, SymInt):
        return value.expr
    if isinstance(value, sympy.Basic):
        return value
    return sympy.Integer(int(value))


def _evaluate(expr: sympy.Expr, values: dict[sympy.Symbol, int]) -> int:
    return int(expr.xreplace({s: sympy.Integer(v) for s, v in values.items()}))


# ------------------------------------------------------------------ interval arithmetic
def _bounds(expr: sympy.Expr, ranges: dict) -> tuple[float, float]:
    if expr.is_Number:
        value = Fraction(int(expr.p), int(expr.q)) if expr.is_Rational else float(expr)
        return value, value
    if expr.is_Symbol:
        return ranges.get(expr, (-INF, INF))
    if expr.is_Add:
        lo = hi = 0
        for arg in expr.args:
            alo, ahi = _bounds(arg, ranges)
            lo, hi = lo + alo, hi + ahi
        return lo, hi
    if expr.is_Mul:
        lo = hi = 1
        for arg in expr.args:
            lo, hi = _mul_interval((lo, hi), _bounds(arg, ranges))
        return lo, hi
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        lo, hi = _bounds(expr.base, ranges)
        if lo >= 0:
            return lo ** int(expr.exp), hi ** int(expr.exp)
    if isinstance(expr, sympy.floor):
        lo, hi = _bounds(expr.args[0], ranges)
        return (math.floor(lo) if lo != -INF else lo), (math.floor(hi) if hi != INF else hi)
    if isinstance(expr, sympy.ceiling):
        lo, hi = _bounds(expr.args[0], ranges)
        return (math.ceil(lo) if lo != -INF else lo), (math.ceil(hi) if hi != INF else hi)
    if isinstance(expr, sympy.Mod):
        alo, ahi = _bounds(expr.args[0], ranges)
        dlo, dhi = _bounds(expr.args[1], ranges)
        if alo >= 0 and ahi < dlo:
            return alo, ahi         # a % d is a
        if alo >= 0 and dlo > 0:
            return 0, min(dhi - 1, ahi)
    if isinstance(expr, (sympy.Max, sympy.Min)):
        pairs = [_bounds(a, ranges) for a in expr.args]
        pick = max if isinstance(expr, sympy.Max) else min
        return pick(p[0] for p in pairs), pick(p[1] for p in pairs)
    return -INF, INF


def _mul_interval(a: tuple, b: tuple) -> tuple[float, float]:
    def mul(x: Any, y: Any) -> Any:
        return 0 if x == 0 or y == 0 else x * y
    products = [mul(x, y) for x in a for y in b]
    return min(products), max(products)


# ------------------------------------------------------------------ SymInt
class SymInt:
    """An integer size given by a sympy expression over size symbols (see the module docstring)."""

    __slots__ = ("env", "expr")

    def __init__(self, expr: sympy.Expr, env: ShapeEnv) -> None:
        self.expr = expr
        self.env = env

    @staticmethod
    def of(expr: sympy.Expr, env: ShapeEnv) -> int | SymInt:
        """A plain int when the expression is a constant."""
        if expr.is_Integer:
            return int(expr)
        return SymInt(expr, env)

    @property
    def hint(self) -> int:
        return self.env.hint(self.expr)

    # ---- arithmetic: new expressions
    def _wrap(self, expr: sympy.Expr) -> int | SymInt:
        return SymInt.of(self.env.simplify(expr), self.env)

    def _op(self, op: str, a: Any, b: Any) -> Any:
        return self._wrap(self.env.arithmetic(op, _expr(a), _expr(b)))

    def __add__(self, other: Any) -> Any:
        return self._op("+", self, other) if _is_int(other) else NotImplemented

    def __radd__(self, other: Any) -> Any:
        return self._op("+", other, self) if _is_int(other) else NotImplemented

    def __sub__(self, other: Any) -> Any:
        return self._op("-", self, other) if _is_int(other) else NotImplemented

    def __rsub__(self, other: Any) -> Any:
        return self._op("-", other, self) if _is_int(other) else NotImplemented

    def __mul__(self, other: Any) -> Any:
        return self._op("*", self, other) if _is_int(other) else NotImplemented

    def __rmul__(self, other: Any) -> Any:
        return self._op("*", other, self) if _is_int(other) else NotImplemented

    def __floordiv__(self, other: Any) -> Any:
        return self._op("//", self, other) if _is_int(other) else NotImplemented

    def __rfloordiv__(self, other: Any) -> Any:
        return self._op("//", other, self) if _is_int(other) else NotImplemented

    def __mod__(self, other: Any) -> Any:
        return self._op("%", self, other) if _is_int(other) else NotImplemented

    def __rmod__(self, other: Any) -> Any:
        return self._op("%", other, self) if _is_int(other) else NotImplemented

    def __neg__(self) -> Any:
        return self._wrap(-self.expr)

    def __pos__(self) -> SymInt:
        return self

    def __abs__(self) -> Any:
        return self if self.env.decide(self, ">=", 0, "abs()") else -self

    def __truediv__(self, other: Any) -> float:
        return self.env.specialize(self, "true division") / other

    def __rtruediv__(self, other: Any) -> float:
        return other / self.env.specialize(self, "true division")

    # ---- decisions: guarded unless the ranges decide them
    def _compare(self, op: str, other: Any) -> Any:
        if not _is_int(other):
            return NotImplemented
        if isinstance(other, SymInt) and other.env is not self.env:
            # sizes of two compilations (a table keyed by both, e.g. the loop IR's hash-consing):
            # never equal, and never a decision of either
            if op in ("==", "!="):
                return op == "!="
            raise TypeError(f"comparing sizes of two compilations: {self} {op} {other}")
        return self.env.decide(self, op, other)

    def __eq__(self, other: Any) -> Any: return self._compare("==", other)
    def __ne__(self, other: Any) -> Any: return self._compare("!=", other)
    def __lt__(self, other: Any) -> Any: return self._compare("<", other)
    def __le__(self, other: Any) -> Any: return self._compare("<=", other)
    def __gt__(self, other: Any) -> Any: return self._compare(">", other)
    def __ge__(self, other: Any) -> Any: return self._compare(">=", other)

    def __bool__(self) -> bool:
        return self.env.decide(self, "!=", 0)

    def __hash__(self) -> int:
        return hash((self.expr, id(self.env)))     # s0 of another compilation is another size

    # ---- code that needs a plain int: specialised
    def __index__(self) -> int:
        return self.env.specialize(self, "used as a Python int")

    def __int__(self) -> int:
        return self.env.specialize(self, "int()")

    def __float__(self) -> float:
        return float(self.env.specialize(self, "float()"))

    def __str__(self) -> str:
        return c_code(self.expr) if getattr(_PRINTING, "c", False) else python_code(self.expr)

    def __repr__(self) -> str:
        return f"SymInt({self})"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, SymInt)) and not isinstance(value, bool) or isinstance(value, sympy.Integer)


def floordiv(a: sympy.Expr, b: sympy.Expr, env: ShapeEnv | None = None) -> sympy.Expr:
    """a // b of sizes (b > 0); exact quotients fold (``(4 * s0) // 4`` is ``s0``)."""
    if b == 1:
        return a
    quotient = env.cancel(a, b) if env is not None else sympy.cancel(a / b)
    if quotient.is_integer:
        return quotient
    return sympy.floor(a / b)


def exact_quotient(a: Any, b: Any) -> Any:
    """a / b when b divides a for every value of the symbols (``(4 * s0) / s0`` is 4), else None."""
    if not isinstance(a, SymInt) and not isinstance(b, SymInt):
        return a // b if a % b == 0 else None
    env = a.env if isinstance(a, SymInt) else b.env
    quotient = env.cancel(_expr(a), _expr(b))
    return SymInt.of(quotient, env) if quotient.is_integer else None


def is_symbolic(value: Any) -> bool:
    return isinstance(value, SymInt)


def hint_of(value: Any) -> int:
    """A size's value at the hints (an int as it is)."""
    return value.hint if isinstance(value, SymInt) else int(value)


# ------------------------------------------------------------------ printing
_PRINTING = threading.local()


@contextlib.contextmanager
def printing_c() -> Iterator[None]:
    """``str()`` of sizes prints C++ inside (the C++ generator's f-strings)."""
    before = getattr(_PRINTING, "c", False)
    _PRINTING.c = True
    try:
        yield
    finally:
        _PRINTING.c = before


def python_code(value: Any, names: Callable[[sympy.Symbol], str] = str) -> str:
    """Python (and Triton) source for a size expression; ``names`` maps symbols to variables."""
    return _print(_expr(value), names, "//")


def c_code(value: Any, names: Callable[[sympy.Symbol], str] = str) -> str:
    """C++ source (int64_t arithmetic; sizes are non-negative, so ``/`` floors)."""
    return _print(_expr(value), names, "/")


def _print(expr: sympy.Expr, names: Callable[[sympy.Symbol], str], div: str) -> str:
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return names(expr)
    if expr.is_Add:
        terms = sorted(expr.args, key=lambda t: (bool(t.is_Number), bool(t.as_coeff_Mul()[0] < 0),
                                                 sympy.default_sort_key(t)))
        text = _print(terms[0], names, div)
        for term in terms[1:]:
            coeff, rest = term.as_coeff_Mul()
            if coeff.is_Number and coeff < 0:
                text += f" - {_print(-term, names, div)}"
            else:
                text += f" + {_print(term, names, div)}"
        return f"({text})"
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            raise ValueError(f"a size with a fraction: {expr}")
        factors = [_print(f, names, div) for f in sympy.Mul.make_args(rest)]
        if coeff != 1:
            factors.insert(0, str(int(coeff)) if coeff > 0 else f"({int(coeff)})")
        # parenthesized: a product printed after // or % must stay one operand (x // (3*s1))
        return f"({'*'.join(factors)})" if len(factors) > 1 else factors[0]
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return f"({'*'.join([_print(expr.base, names, div)] * int(expr.exp))})"
    if isinstance(expr, sympy.floor):
        numerator, denominator = sympy.fraction(sympy.together(expr.args[0]))
        a, b = _print(sympy.expand(numerator), names, div), _print(denominator, names, div)
        # C's / and % truncate: Python's floor semantics through the prelude's helpers
        return f"({a} // {b})" if div == "//" else f"ember_floordiv({a}, {b})"
    if isinstance(expr, sympy.Mod):
        a, b = _print(expr.args[0], names, div), _print(expr.args[1], names, div)
        return f"({a} % {b})" if div == "//" else f"ember_mod({a}, {b})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        function = ("max" if isinstance(expr, sympy.Max) else "min") if div == "//" else \
            ("std::max<int64_t>" if isinstance(expr, sympy.Max) else "std::min<int64_t>")
        text = _print(expr.args[0], names, div)
        for arg in expr.args[1:]:
            text = f"{function}({text}, {_print(arg, names, div)})"
        return text
    raise ValueError(f"cannot print the size expression {expr}")


# ------------------------------------------------------------------ inputs
def symbolic_shape(shape: tuple[int, ...], stride: tuple[int, ...], env: ShapeEnv, dims: Any,
                   source: Callable[[int], Any]) -> tuple[tuple, tuple] | None:
    """Sizes and strides of an input whose dims ``dims`` (sizes >= 2 among them) become symbols.

    Strides become expressions of the sizes when the layout is dense (contiguous, or a permutation
    of it: channels-last).  Any other layout (a slice ``big[:, :n]``, an expanded tensor) keeps
    the strides it has, as constants the guard checks: only its sizes vary."""
    dims = [d for d in dims if shape[d] >= 2]
    if not dims:
        return None
    sizes: list[Any] = list(shape)
    for d in dims:
        sizes[d] = env.size_symbol(shape[d], source(d))
    order = sorted(range(len(shape)), key=lambda d: (stride[d], shape[d]))   # fastest first
    expected = 1
    for d in order:
        if shape[d] != 1 and stride[d] != expected:
            return tuple(sizes), tuple(stride)
        expected *= shape[d]
    strides: list[Any] = [0] * len(shape)
    running: Any = 1
    for d in order:
        strides[d] = running      # a size-1 dim's stride is free: the guard does not check it
        running = running * sizes[d]
    return tuple(sizes), tuple(strides)


# the "dim" of a symbol that stands for an input's storage offset (``data[i]`` views): in
# ``ShapeEnv.sources`` values ``(source, dim)``, beside real dims
STORAGE_OFFSET = "storage_offset"


def size_access(tensor: str, dim: int | str) -> str:
    """Python that reads a symbol's value from the input it comes from: ``x.shape[0]``."""
    return f"{tensor}.storage_offset()" if dim == STORAGE_OFFSET else f"{tensor}.shape[{dim}]"


def known_equal(a: Any, b: Any) -> bool:
    """True when ``a == b`` for every size; never a guard (for optimizations that may be skipped)."""
    if not (isinstance(a, SymInt) or isinstance(b, SymInt)):
        return a == b
    env = a.env if isinstance(a, SymInt) else b.env
    return env.statically_known(a, "==", b) is True


def known_equal_sizes(a: tuple, b: tuple) -> bool:
    """Two shapes (or stride tuples) equal at every size; never a guard."""
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))


def known_multiple(value: Any, factor: int) -> bool:
    """True when ``value`` is a multiple of ``factor`` for every size (no guard is taken)."""
    if not isinstance(value, SymInt):
        return int(value) % factor == 0
    return sympy.Mod(value.expr, factor) == 0


def as_size(value: Any) -> int | SymInt:
    """A size as the compiler keeps it: an int (from numpy or sympy integers too) or a SymInt.

    A SymInt made before one of its symbols was guarded equal to something else (``s1 == 32``:
    the size was pinned) comes back in terms of the replacement, so that one size never appears
    as both ``s1`` and ``32`` in one index expression (they would not merge: a copy kernel)."""
    if isinstance(value, SymInt):
        env = value.env
        if env.replacements:
            simplified = env.simplify(value.expr)
            if simplified is not value.expr:
                return SymInt.of(simplified, env)
        return value
    return int(value)
