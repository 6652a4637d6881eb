"""The loop IR: every tensor value is a function from index to value.

This is the device-neutral layer shared by the C++ and Triton code generators.
It has three levels, each a small set of immutable, hashable, printable classes:

1. Index expressions (``Index``): integer affine combinations of *atoms*
   (``Var`` loop variables with a known size, ``FloorDiv`` / ``ModIndex`` of an
   Index by a positive constant, and ``Indirect`` = an integer value loaded from a
   tensor).  They simplify on construction using the atoms' bounds, so composing
   views (reshape of a permute of a slice ...) yields short expressions and the
   common reshapes need no division at all.  Views are never copies: a view is a
   function from its index to its base's index, composed into ``Load``s.

2. Body expressions (``Expr``): a DAG of
     Load(buffer, index)        read element ``index`` (one Index per dim of the
                                buffer's *logical* shape; the code generator turns
                                that into an address with the buffer's strides);
     Const(value, dtype)        a scalar;
     Op(op, args, dtype)        an elementwise primitive by name ("add", "exp",
                                "where", "maximum", ... = prims/primitives.py names);
     Cast(arg, dtype)           convert_element_type (C semantics);
     IndexValue(index, dtype)   an index used as a value (iota).
   ``dtype`` is the torch dtype of the value.  Code generators compute bf16/fp16
   in fp32 and round on store (and on explicit casts to them).  Exprs are
   structurally equal when they compute the same thing, so a printer can
   eliminate common subexpressions with a dict.

3. Loop nodes, one per tensor value of the prim graph (``LoopNode`` subclasses):
     InputBuffer   a graph input (strides known from the example input);
     Pointwise     ranges + body over ``vars`` (one Var per dim);
     Reduction     ranges + reduction_ranges + reduction_type + body over
                   ``vars`` + ``reduction_vars``.  reduction_type is one of
                   REDUCTION_TYPES; "welford_mean"/"welford_var" share one
                   Welford state when their bodies are equal;
     Extern        a torch callable run by the host program on materialized
                   buffers; its tensor results are ExternOutput nodes.
   ``LoopProgram`` holds them in topological order plus the graph outputs.

Fusion (lower/scheduler.py) substitutes a producer's vars with the consumer's
load index (``substitute``): that is all "inlining" is.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ember.symbolic import SymInt, as_size, exact_quotient, known_equal

# ============================================================ index expressions


class Atom:
    """Base of the non-linear pieces of an Index."""

    __slots__ = ()

    def bounds(self) -> tuple[int, int]:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Var(Atom):
    """A loop variable ranging over [0, size)."""

    name: str
    size: int

    def bounds(self) -> tuple[int, int]:
        return (0, max(self.size - 1, 0))

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class FloorDiv(Atom):
    arg: Index
    divisor: int

    def bounds(self) -> tuple[int, int]:
        lo, hi = self.arg.bounds()
        return (lo // self.divisor, hi // self.divisor)

    def __str__(self) -> str:
        return f"(({self.arg}) // {self.divisor})"


@dataclasses.dataclass(frozen=True)
class ModIndex(Atom):
    arg: Index
    divisor: int

    def bounds(self) -> tuple[int, int]:
        return (0, self.divisor - 1)

    def __str__(self) -> str:
        return f"(({self.arg}) % {self.divisor})"


@dataclasses.dataclass(frozen=True)
class Indirect(Atom):
    """An index read from a tensor (gather/index); ``size`` bounds it for simplification."""

    value: Expr
    size: int

    def bounds(self) -> tuple[int, int]:
        return (0, max(self.size - 1, 0))

    def __str__(self) -> str:
        return f"[{self.value}]"


class Index:
    """sum(coeff * atom) + const, normalized; build with ``index()``/``const_index()`` and + * // %."""

    __slots__ = ("_hash", "const", "terms")

    def __init__(self, terms: Iterable[tuple[Atom, int]] = (), const: int = 0) -> None:
        merged: dict[Atom, int] = {}
        for atom, coeff in terms:
            merged[atom] = merged.get(atom, 0) + coeff
        if len(merged) >= 2 and any(isinstance(a, ModIndex) for a in merged):
            const += _merge_div_mod(merged)
        # (the most built object of lowering and scheduling: int coefficients skip known_equal,
        # a single term skips the sort, whose key prints non-Var atoms)
        kept = [(a, c) for a, c in merged.items() if (c != 0 if type(c) is int else not known_equal(c, 0))]
        if len(kept) > 1:
            kept.sort(key=_term_order)
        self.terms: tuple[tuple[Atom, int], ...] = tuple(kept)
        self.const = as_size(const)
        self._hash = hash((self.terms, self.const))

    # ---- structure
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return not self.terms and self.const == other
        return isinstance(other, Index) and self._hash == other._hash and \
            self.terms == other.terms and self.const == other.const

    def is_constant(self) -> bool:
        return not self.terms

    def atoms(self) -> Iterator[Atom]:
        for atom, _ in self.terms:
            yield atom

    def free_vars(self) -> set[Var]:
        out: set[Var] = set()
        for atom in self.atoms():
            if isinstance(atom, Var):
                out.add(atom)
            elif isinstance(atom, (FloorDiv, ModIndex)):
                out |= atom.arg.free_vars()
            elif isinstance(atom, Indirect):
                out |= expr_free_vars(atom.value)
        return out

    def bounds(self) -> tuple[int, int]:
        lo = hi = self.const
        for atom, coeff in self.terms:
            alo, ahi = atom.bounds()
            if coeff > 0:
                lo, hi = lo + coeff * alo, hi + coeff * ahi
            else:
                lo, hi = lo + coeff * ahi, hi + coeff * alo
        return lo, hi

    # ---- arithmetic (simplifying)
    def __add__(self, other: Index | int) -> Index:
        other = as_index(other)
        return Index(self.terms + other.terms, self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: Index | int) -> Index:
        return self + as_index(other) * -1

    def __mul__(self, k: int) -> Index:
        assert isinstance(k, (int, SymInt)), "index expressions are affine: multiply by constants only"
        k = as_size(k)
        return Index(((a, c * k) for a, c in self.terms), self.const * k)

    __rmul__ = __mul__

    def _split(self, d: int) -> tuple[Index, Index]:
        """self = d * quotient + rest, moving every exact multiple of d into quotient."""
        if isinstance(d, SymInt) or any(isinstance(c, SymInt) for _, c in self.terms) or \
                isinstance(self.const, SymInt):
            return self._split_symbolic(d)
        q_terms, r_terms = [], []
        for atom, coeff in self.terms:
            (q_terms if coeff % d == 0 else r_terms).append((atom, coeff // d if coeff % d == 0 else coeff))
        return Index(q_terms, self.const // d), Index(r_terms, self.const % d)

    def _split_symbolic(self, d: Any) -> tuple[Index, Index]:
        """_split with symbolic sizes: only what is a multiple of d for every size moves (the
        rest keeps its sign: a C ``%`` of it must not see a negative number)."""
        q_terms, r_terms = [], []
        for atom, coeff in self.terms:
            quotient = exact_quotient(coeff, d)
            (q_terms if quotient is not None else r_terms).append((atom, coeff if quotient is None else quotient))
        quotient = exact_quotient(self.const, d)
        if quotient is not None:
            return Index(q_terms, quotient), Index(r_terms, 0)
        return Index(q_terms, 0), Index(r_terms, self.const)

    def __floordiv__(self, d: int) -> Index:
        assert isinstance(d, (int, SymInt)) and d > 0
        d = as_size(d)
        if known_equal(d, 1):
            return self
        quotient, rest = self._split(d)
        lo, hi = rest.bounds()
        if lo >= 0 and hi < d:
            return quotient
        single = len(rest.terms) == 1 and known_equal(rest.const, 0) and known_equal(rest.terms[0][1], 1)
        if single and isinstance(rest.terms[0][0], FloorDiv):
            inner = rest.terms[0][0]
            return quotient + inner.arg // (inner.divisor * d)
        if single and isinstance(rest.terms[0][0], ModIndex) and \
                exact_quotient(rest.terms[0][0].divisor, d) is not None:
            inner = rest.terms[0][0]       # (a % (k d)) // d is (a // d) % k: one form for both
            return quotient + (inner.arg // d) % (inner.divisor // d)
        common = rest._common_factor(d)
        if common is not None:
            big, g = common
            return quotient + big // (d // g)
        return quotient + Index(((FloorDiv(rest, d), 1),))

    def _common_factor(self, d: int) -> tuple[Index, int] | None:
        """Find g | d with self = g*big + small, 0 <= small < g: then (self // d) = big // (d/g)."""
        if isinstance(d, SymInt):
            return None
        for g in sorted({math.gcd(d, c) for _, c in self.terms if isinstance(c, int)}, reverse=True):
            if g <= 1:
                continue
            big = [(a, c // g) for a, c in self.terms if c % g == 0]
            small = Index([(a, c) for a, c in self.terms if c % g != 0], self.const)
            lo, hi = small.bounds()
            if lo >= 0 and hi < g and big:
                return Index(big), g
        return None

    def __mod__(self, d: int) -> Index:
        assert isinstance(d, (int, SymInt)) and d > 0
        d = as_size(d)
        if known_equal(d, 1):
            return Index()
        _, rest = self._split(d)
        lo, hi = rest.bounds()
        if lo >= 0 and hi < d:
            return rest
        single = len(rest.terms) == 1 and known_equal(rest.const, 0) and known_equal(rest.terms[0][1], 1)
        if single and isinstance(rest.terms[0][0], ModIndex) and \
                exact_quotient(rest.terms[0][0].divisor, d) is not None:
            return rest.terms[0][0].arg % d      # (a % (k d)) % d is a % d
        common = rest._common_factor(d)
        if common is not None:
            big, g = common
            small = rest - big * g
            return (big % (d // g)) * g + small
        return Index(((ModIndex(rest, d), 1),))

    # ---- substitution and printing
    def substitute(self, mapping: dict[Var, Index]) -> Index:
        if not mapping:
            return self
        out = Index((), self.const)
        for atom, coeff in self.terms:
            out = out + _substitute_atom(atom, mapping) * coeff
        return out

    def render(self, atom_fn: Callable[[Atom], str]) -> str:
        """Text with '+', '*' and the caller's rendering of each atom (printers use this)."""
        parts = []
        for atom, coeff in self.terms:
            text = atom_fn(atom)
            if isinstance(coeff, SymInt):     # its sign is not known: never a guard
                parts.append(f"({coeff})*{text}")
            else:
                parts.append(text if coeff == 1 else f"{coeff}*{text}" if coeff > 0 else f"-{-coeff}*{text}")
        if not known_equal(self.const, 0) or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")

    def __str__(self) -> str:
        return self.render(str)

    __repr__ = __str__


def _merge_div_mod(merged: dict[Atom, int]) -> int:
    """Rewrite c*d*(a // d) + c*(a % d) as c*a in place (a reshape composed with its inverse).

    Returns the constant part of the merged ``a``s; their terms are added to ``merged``."""
    const = 0
    changed = True
    while changed:
        changed = False
        for atom, coeff in list(merged.items()):
            if not isinstance(atom, ModIndex) or known_equal(coeff, 0):
                continue
            # the quotient as the // operator normalizes it: ((p // 56) % 56) pairs with p // 3136
            normalized = atom.arg // atom.divisor
            if len(normalized.terms) != 1 or not known_equal(normalized.const, 0) or \
                    not known_equal(normalized.terms[0][1], 1):
                continue
            quotient = normalized.terms[0][0]
            if merged.get(quotient, 0) != coeff * atom.divisor:
                wrapped = _wrapped_quotient(merged, quotient, coeff * atom.divisor)
                if wrapped is None:
                    continue
                # c*d*((a // d) % m) + c*(a % d) is c*(a % (d*m)): the head and dim of a column
                # index split over a cat of heads, (x // 64) % 12 and x % 64, is x % 768
                del merged[atom], merged[wrapped]
                joined = atom.arg % (atom.divisor * wrapped.divisor)
                for inner_atom, inner_coeff in joined.terms:
                    merged[inner_atom] = merged.get(inner_atom, 0) + coeff * inner_coeff
                const += coeff * joined.const
                changed = True
                break
            del merged[atom], merged[quotient]
            for inner_atom, inner_coeff in atom.arg.terms:
                merged[inner_atom] = merged.get(inner_atom, 0) + coeff * inner_coeff
            const += coeff * atom.arg.const
            changed = True
            break
    return const


def _wrapped_quotient(merged: dict[Atom, int], quotient: Atom, coeff: int) -> ModIndex | None:
    """The atom ``(quotient) % m`` of ``merged`` with coefficient ``coeff`` (integer sizes only)."""
    if not isinstance(coeff, int):
        return None
    for atom, c in merged.items():
        if type(c) is int and c == coeff and isinstance(atom, ModIndex) and isinstance(atom.divisor, int) and \
                len(atom.arg.terms) == 1 and atom.arg.terms[0] == (quotient, 1) and known_equal(atom.arg.const, 0):
            return atom
    return None


def _term_order(term: tuple[Atom, int]) -> tuple:
    return _atom_order(term[0])


def _atom_order(atom: Atom) -> tuple:
    if isinstance(atom, Var):
        return (0, atom.name)
    return (1, str(atom))


def _substitute_atom(atom: Atom, mapping: dict[Var, Index]) -> Index:
    if isinstance(atom, Var):
        return mapping.get(atom, Index(((atom, 1),)))
    if isinstance(atom, FloorDiv):
        return atom.arg.substitute(mapping) // atom.divisor
    if isinstance(atom, ModIndex):
        return atom.arg.substitute(mapping) % atom.divisor
    if isinstance(atom, Indirect):
        return Index(((Indirect(substitute(atom.value, mapping), atom.size), 1),))
    raise TypeError(atom)


def as_index(value: Index | Atom | int) -> Index:
    if isinstance(value, Index):
        return value
    if isinstance(value, Atom):
        return Index(((value, 1),))
    return Index((), as_size(value))


def index(atom: Atom) -> Index:
    return as_index(atom)


def const_index(value: int) -> Index:
    return Index((), value)


def make_vars(prefix: str, sizes: Iterable[int]) -> tuple[Var, ...]:
    """Loop variables x0, x1, ... (or r0, r1, ...) for the given sizes."""
    return tuple(Var(f"{prefix}{i}", as_size(s)) for i, s in enumerate(sizes))


def linearize(indices: Iterable[Index], sizes: Iterable[int]) -> Index:
    """Row-major flat index of a multi-dim index."""
    flat = const_index(0)
    for idx, size in zip(indices, sizes):
        flat = flat * as_size(size) + idx
    return flat


def delinearize(flat: Index, sizes: Iterable[int]) -> tuple[Index, ...]:
    """Multi-dim index of a row-major flat index (the inverse of linearize)."""
    sizes = tuple(as_size(s) for s in sizes)
    if 0 in sizes:  # no element: the loop never reaches this index (and there is no size to divide by)
        return tuple(const_index(0) for _ in sizes)
    out = []
    stride = 1
    for size in reversed(sizes):
        out.append((flat // stride) % size if size != 1 else const_index(0))
        stride *= size
    return tuple(reversed(out))


# ============================================================ body expressions


class _Interned(type):
    """Metaclass of Expr: hash-consing.  Constructing an Expr returns the live node that is
    structurally equal to it if there is one, so structural equality *is* identity.

    Without this, ``==`` on a DAG with shared sub-expressions recursed through it as a tree
    (exponential): every CSE dict lookup in the printers paid for it.  The table is weak:
    nodes die with the last program that uses them."""

    _table: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(cls))
            type.__setattr__(cls, "_field_names", names)
        if kwargs or len(args) != len(names):
            if len(args) + len(kwargs) != len(names) or any(n not in kwargs for n in names[len(args):]):
                return super().__call__(*args, **kwargs)   # let the dataclass report the error
            args = (*args, *(kwargs[n] for n in names[len(args):]))
        if cls is Const:
            # 1 == 1.0 == True and 0.0 == -0.0 in Python, nan != nan: intern by type and text
            value = args[0]
            key = (cls, type(value), repr(value) if isinstance(value, float) else value, *args[1:])
        else:
            key = (cls, *args)
        table = _Interned._table
        try:
            node = table.get(key)
        except TypeError:                 # an unhashable field (a list of args): no interning
            node = super().__call__(*args)
            object.__setattr__(node, "_interned", False)
            return node
        if node is None:
            node = super().__call__(*args)
            table[key] = node
        return node


class Expr(metaclass=_Interned):
    """Base of body expressions; subclasses are frozen dataclasses with a ``dtype``.

    Exprs are hash-consed (see ``_Interned``): equal structure means the same object."""

    __slots__ = ()
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return ()


def _cached_hash(cls):
    """Hash deep DAGs once: dataclass hashing would re-walk the whole tree every time."""
    field_names = [f.name for f in dataclasses.fields(cls)]

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((cls.__name__,) + tuple(getattr(self, n) for n in field_names))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not cls or hash(self) != hash(other):
            return False
        if self.__dict__.get("_interned", True) and other.__dict__.get("_interned", True):
            return False                  # both hash-consed: equal structure would be the same object
        return all(getattr(self, n) == getattr(other, n) for n in field_names)

    def __reduce__(self):
        # copies and pickles go through the constructor, so they stay hash-consed
        return (cls, tuple(getattr(self, n) for n in field_names))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    cls.__hash__ = __hash__
    cls.__eq__ = __eq__
    cls.__reduce__ = __reduce__
    cls.__copy__ = __copy__
    cls.__deepcopy__ = __deepcopy__
    return cls


@_cached_hash
@dataclasses.dataclass(frozen=True, eq=False)
class Load(Expr):
    buffer: str
    index: tuple[Index, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{self.buffer}[{', '.join(map(str, self.index))}]"


@_cached_hash
@dataclasses.dataclass(frozen=True, eq=False)
class Const(Expr):
    value: int | float | bool
    dtype: torch.dtype

    def __str__(self) -> str:
        return repr(self.value)


@_cached_hash
@dataclasses.dataclass(frozen=True, eq=False)
class Op(Expr):
    op: str
    args: tuple[Expr, ...]
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __str__(self) -> str:
        return f"{self.op}({', '.join(map(str, self.args))})"


@_cached_hash
@dataclasses.dataclass(frozen=True, eq=False)
class Cast(Expr):
    arg: Expr
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        return f"cast({self.arg}, {str(self.dtype).replace('torch.', '')})"


@_cached_hash
@dataclasses.dataclass(frozen=True, eq=False)
class IndexValue(Expr):
    index: Index
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"index({self.index})"


def walk(expr: Expr) -> Iterator[Expr]:
    """Every distinct sub-expression, children before parents (a topological order)."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        for child in reversed(node.children()):
            if id(child) not in seen:
                stack.append((child, False))


def indirect_atoms(idx: Index) -> Iterator[Indirect]:
    """The Indirect atoms of an index, also those nested in // and % (a reshape of a gather)."""
    for atom in idx.atoms():
        if isinstance(atom, Indirect):
            yield atom
        elif isinstance(atom, (FloorDiv, ModIndex)):
            yield from indirect_atoms(atom.arg)


def loads(expr: Expr) -> list[Load]:
    """The Loads an expression reads, including those inside indirect indices.

    Kept on the (immutable) expression: the scheduler asks for the same bodies' loads often."""
    found = expr.__dict__.get("_loads")
    if found is None:
        found = _loads(expr)
        object.__setattr__(expr, "_loads", found)
    return list(found)


def load_buffers(expr: Expr) -> tuple[str, ...]:
    """The buffers an expression loads, each once, in the order of ``loads`` (so that a set made
    from them iterates as one made from the loads); kept on the expression as ``loads``."""
    found = expr.__dict__.get("_load_buffers")
    if found is None:
        found = tuple(dict.fromkeys(ld.buffer for ld in loads(expr)))
        object.__setattr__(expr, "_load_buffers", found)
    return found


def has_indirect(expr: Expr) -> bool:
    """Does some index in the expression hold a gathered value (an Indirect atom)?  Kept on it."""
    found = expr.__dict__.get("_has_indirect")
    if found is None:
        found = any(next(indirect_atoms(idx), None) is not None for node in walk(expr) for idx in indices_of(node))
        object.__setattr__(expr, "_has_indirect", found)
    return found


def _loads(expr: Expr) -> tuple[Load, ...]:
    out: list[Load] = []
    for node in walk(expr):
        if isinstance(node, Load):
            out.append(node)
        for idx in indices_of(node):
            for atom in indirect_atoms(idx):
                out.extend(loads(atom.value))
    return tuple(out)


def indices_of(node: Expr) -> tuple[Index, ...]:
    """The indices a node holds: a Load's, or an IndexValue's (a gathered index read as a value,
    as cat's branch condition after an index_select)."""
    if isinstance(node, Load):
        return tuple(node.index)
    if isinstance(node, IndexValue):
        return (node.index,)
    return ()


def expr_free_vars(expr: Expr) -> set[Var]:
    out: set[Var] = set()
    for node in walk(expr):
        if isinstance(node, Load):
            for idx in node.index:
                out |= idx.free_vars()
        elif isinstance(node, IndexValue):
            out |= node.index.free_vars()
    return out


def substitute(expr: Expr, mapping: dict[Var, Index]) -> Expr:
    """Rename loop variables inside indices (fusion = substitution)."""
    done: dict[Index, Index] = {}     # the loads of a body share few distinct indices (a third here)

    def substituted(index: Index) -> Index:
        out = done.get(index)
        if out is None:
            out = done[index] = index.substitute(mapping)
        return out
    return map_expr(expr, lambda node, args: _rebuild(node, args, substituted))


class Substitution:
    """``substitute(expr, mapping)`` for one mapping over many expressions: what they share is
    substituted once (the scheduler substitutes the same producers' bodies with the same
    mapping into consumer after consumer).  Keyed by the expressions themselves (hash-consed),
    so an entry never outlives its expression."""

    def __init__(self, mapping: dict[Var, Index]) -> None:
        self.mapping = mapping
        self.exprs: dict[Expr, Expr] = {}
        self.indices: dict[Index, Index] = {}

    def index(self, idx: Index) -> Index:
        out = self.indices.get(idx)
        if out is None:
            out = self.indices[idx] = idx.substitute(self.mapping)
        return out

    def __call__(self, expr: Expr) -> Expr:
        try:
            return self._substitute(expr)
        except TypeError:          # an expression that is not hash-consed (an unhashable field)
            return substitute(expr, self.mapping)

    def _substitute(self, expr: Expr) -> Expr:
        done = self.exprs
        stack: list[tuple[Expr, bool]] = [(expr, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if expanded:
                done[node] = _rebuild(node, tuple(done[c] for c in node.children()), self.index)
                continue
            stack.append((node, True))
            for child in reversed(node.children()):
                if child not in done:
                    stack.append((child, False))
        return done[expr]


def _rebuild(node: Expr, args: tuple[Expr, ...], substituted: Callable[[Index], Index]) -> Expr:
    if isinstance(node, Load):
        return Load(node.buffer, tuple(substituted(i) for i in node.index), node.dtype)
    if isinstance(node, IndexValue):
        return IndexValue(substituted(node.index), node.dtype)
    return replace_children(node, args)


def replace_children(node: Expr, args: tuple[Expr, ...]) -> Expr:
    if isinstance(node, Op):
        return node if args == node.args else Op(node.op, args, node.dtype)
    if isinstance(node, Cast):
        return node if args[0] is node.arg else Cast(args[0], node.dtype)
    return node


def map_expr(expr: Expr, fn: Callable[[Expr, tuple[Expr, ...]], Expr]) -> Expr:
    """Bottom-up rewrite: fn(node, new_children) -> new node; shared sub-DAGs are visited once."""
    done: dict[int, Expr] = {}
    for node in walk(expr):
        done[id(node)] = fn(node, tuple(done[id(c)] for c in node.children()))
    return done[id(expr)]


def count_ops(expr: Expr) -> int:
    """Arithmetic operations in a body (for FLOP estimates and inlining heuristics)."""
    return sum(1 for node in walk(expr) if isinstance(node, Op))


# ============================================================ loop nodes

REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "welford_mean", "welford_var")


@dataclasses.dataclass(eq=False)
class LoopNode:
    """One tensor value of the program.  ``name`` is unique and is what Loads refer to."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def numel(self) -> int:
        return math.prod(self.shape)

    def reads(self) -> set[str]:
        return set()


@dataclasses.dataclass(eq=False)
class InputBuffer(LoopNode):
    stride: tuple[int, ...] = ()
    storage_offset: int = 0
    position: int = 0          # placeholder index in the graph
    alias_of: str | None = None  # set for "<input>_storage": the same pointer, indexed as flat storage


@dataclasses.dataclass(eq=False)
class Pointwise(LoopNode):
    vars: tuple[Var, ...] = ()
    body: Expr | None = None
    source: str = ""           # the prim graph node(s) it came from, for comments and errors

    def reads(self) -> set[str]:
        return set(load_buffers(self.body))

    def __str__(self) -> str:
        return f"{self.name} = pointwise[{', '.join(map(str, self.shape))}]({', '.join(map(str, self.vars))}) -> {self.body}"


@dataclasses.dataclass(eq=False)
class Reduction(LoopNode):
    """Output shape = ``shape`` (kept dims); the body is over vars + reduction_vars."""

    vars: tuple[Var, ...] = ()
    reduction_vars: tuple[Var, ...] = ()
    reduction_type: str = "sum"
    body: Expr | None = None
    correction: float = 0.0    # welford_var only
    source: str = ""

    @property
    def reduction_shape(self) -> tuple[int, ...]:
        return tuple(v.size for v in self.reduction_vars)

    def reads(self) -> set[str]:
        return set(load_buffers(self.body))

    def __str__(self) -> str:
        return (f"{self.name} = {self.reduction_type}[{', '.join(map(str, self.shape))} | "
                f"{', '.join(map(str, self.reduction_shape))}] -> {self.body}")


@dataclasses.dataclass(eq=False)
class Extern(LoopNode):
    """``fn(*args, **kwargs)`` run eagerly; args hold ``BufferRef``s and constants.

    shape/dtype are unused for tuple results; the tensors come out as ExternOutput nodes.
    """

    fn: Any = None
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    source: str = ""

    def reads(self) -> set[str]:
        from ember.graph import tree_leaves
        return {v.name for v in tree_leaves((self.args, self.kwargs)) if isinstance(v, BufferRef)}


@dataclasses.dataclass(eq=False)
class ExternOutput(LoopNode):
    """A tensor result of an Extern (``item`` is None for a single result)."""

    extern: str = ""
    item: int | None = None
    stride: tuple[int, ...] = ()
    storage_offset: int = 0
    scalar: bool = False       # the Extern returns a Python number: the host wraps it in a 0-dim tensor

    def reads(self) -> set[str]:
        return {self.extern}


@dataclasses.dataclass(frozen=True)
class BufferRef:
    """An Extern argument that is a tensor of the program (materialized by the scheduler)."""

    name: str


@dataclasses.dataclass(frozen=True)
class BufferView(BufferRef):
    """An Extern argument that is a view of buffer ``name``, passed as ``base.as_strided(...)``.

    ``index`` is the base's logical index as an affine function of ``vars`` (one Var per dim of
    the view), so the host derives size/stride/offset from the base's BufferPlan strides."""

    shape: tuple[int, ...] = ()
    index: tuple[Index, ...] = ()
    vars: tuple[Var, ...] = ()


def contiguous_strides(shape: Iterable[int]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(tuple(shape)):
        strides.append(running)
        running *= max(as_size(size), 1)
    return tuple(reversed(strides))


def strided_layout(index: tuple[Index, ...], vars_: tuple[Var, ...], base_shape: tuple[int, ...],
                   base_stride: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """(stride, offset) of the view ``base[index(vars)]`` over a base with these strides, or None.

    None when the address is not affine in the view's vars (a reshape that needs a copy, a
    gather).  Offsets are in elements, relative to the base's data pointer."""
    flat = const_index(0)
    for idx, size, stride in zip(index, base_shape, base_stride):
        if size != 1:
            flat = flat + idx * as_size(stride)
    coefficients = dict(flat.terms)
    if any(not isinstance(atom, Var) or atom not in vars_ for atom in coefficients):
        return None
    strides, running = [], 1
    for var in reversed(vars_):
        # a size-1 dim's stride is free: give it the contiguous value (BLAS checks leading dims)
        strides.append(coefficients.get(var, 0) if var.size != 1 else running)
        running *= max(var.size, 1)
    return tuple(reversed(strides)), flat.const


@dataclasses.dataclass(frozen=True)
class OutputView:
    """A program output that is a view (as_strided) of a materialized buffer, made by the host."""

    base: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int


@dataclasses.dataclass(eq=False)
class LoopProgram:
    """Loop nodes in topological order plus outputs.

    ``outputs`` entries are a node name, an ``OutputView``, or a Python constant.
    ``output_strides[i]`` is the stride eager PyTorch gives output i (the host allocates it so).
    """

    nodes: dict[str, LoopNode]
    outputs: list[Any]
    output_strides: list[tuple[int, ...] | None]
    num_inputs: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def returned_buffers(self) -> set[str]:
        """The buffers the caller gets: outputs and the bases of output views."""
        return {out if isinstance(out, str) else out.base for out in self.outputs
                if isinstance(out, (str, OutputView))}

    def users(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {name: [] for name in self.nodes}
        for node in self.nodes.values():
            for read in node.reads():
                out[read].append(node.name)
        return out

    def __str__(self) -> str:
        lines = []
        for node in self.nodes.values():
            if isinstance(node, InputBuffer):
                lines.append(f"{node.name} = input[{', '.join(map(str, node.shape))}] stride {node.stride}")
            elif isinstance(node, Extern):
                lines.append(f"{node.name} = extern {getattr(node.fn, '__name__', node.fn)}{node.args}")
            elif isinstance(node, ExternOutput):
                lines.append(f"{node.name} = {node.extern}[{node.item}]")
            else:
                lines.append(str(node))
        lines.append(f"return {self.outputs}")
        return "\n".join(lines)
