"""A seeded generator of random Python programs full of graph breaks, and their differential check.

`generate(seed)` returns a `BreakProgram`: the Python source of a module (helpers + `def program(x, y,
items, flag, scale)`) and the inputs of 2-3 calls.  Programs mix, at random positions and nestings,

* breaks: print (shapes, Python values, integer tensors), int()/float()/.item()/.tolist(), `if` and
  bounded `while` on tensor data, `a if t.max() > 0 else b`, `and`/`or` over tensor comparisons,
  module-level helpers that break (print, .item(), a tensor branch, raise ValueError), closures that
  break and update a nonlocal, a user class whose `__add__` and property print, a global updated by a
  helper or by the program (`global COUNTER`), *args/keyword calls, a tensor method waiting for a
  breaking argument (`t.mul(t.sum().item())`);
* structure: for loops (range, a list argument, enumerate, zip, a list of tensors) with break/continue,
  while loops, nested if/else, `with torch.no_grad():`, try/except/finally (caught or escaping
  ValueErrors), list/dict locals and a list argument mutated, in-place ops on inputs and on views of
  inputs, unbound locals (`if flag: late = ...`), early returns;
* tensor ops: elementwise, reductions (keepdim, broadcast back), matmul, views (reshape, transpose,
  slicing + cat, flip); every tensor local has the shape of the inputs, so programs never fail on shapes.

Everything is deterministic (no random ops; inputs come from a seeded generator; thresholds of conditions kept away
from 0, where a sum that is 0 up to rounding could flip with the kernels' rounding), so eager and ember
must agree exactly on printed text, Python values, exceptions and mutated state, and closely on tensors.
`check_program` runs one compiled object over the calls and compares with eager on deep copies, in
separate module namespaces (globals are compared too).  Some programs take inputs requiring grad; the
check then backpropagates both results and compares gradients (those programs mutate no input).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import math
import random
import warnings
from typing import Any

import torch

PRELUDE = '''\
import torch

COUNTER = 0


def helper_print(t, tag="h"):
    print("helper", tag, tuple(t.shape))
    return t * 2 - 1


def helper_item(t, scale=1.0):
    return t * (t.tanh().mean().item() * scale)


def helper_branch(t):
    if t.sum() > 0.37:
        return t.relu() + 0.5
    return t.neg().sigmoid()


def check_value(v, limit):
    if v > limit:
        raise ValueError(f"value {v} over {limit}")
    return v


def helper_star(*ts, weight=1.0):
    print("star", len(ts), round(weight, 3))
    total = ts[0]
    for t in ts[1:]:
        total = total + t * weight
    return total


def bump_global(k):
    global COUNTER
    COUNTER += k
    print("counter", COUNTER)
    return COUNTER


class Tracker:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        print("enter", len(self.log))
        return self

    def __exit__(self, kind, value, traceback):
        self.log.append("exit" if kind is None else f"exit {kind.__name__}")
        print("exit", kind)
        return False


class Box:
    def __init__(self, t):
        if t.sum() > 1000:
            print("big box")
        self.t = t

    def __add__(self, other):
        print("Box add")
        return Box(self.t + (other.t if isinstance(other, Box) else other))

    @property
    def doubled(self):
        print("Box doubled")
        return self.t * 2


'''

SHAPES = [(4, 3), (3, 3), (2, 5), (5, 2), (3, 4)]


@dataclasses.dataclass
class Call:
    shape: tuple[int, int]
    items: list[int]
    flag: bool
    scale: float
    value_seed: int

    def make(self, requires_grad: bool) -> list[Any]:
        gen = torch.Generator().manual_seed(self.value_seed)
        x = torch.randn(self.shape, generator=gen)
        y = torch.randn(self.shape, generator=gen)
        if requires_grad:
            x.requires_grad_(True)
            y.requires_grad_(True)
        return [x, y, list(self.items), self.flag, self.scale]


@dataclasses.dataclass
class BreakProgram:
    seed: int
    source: str
    calls: list[Call]
    requires_grad: bool

    def namespace(self) -> dict:
        ns: dict = {"__name__": f"break_fuzz_{self.seed}"}
        exec(compile(self.source, f"<break_fuzz seed {self.seed}>", "exec"), ns)  # noqa: S102
        return ns

    def __str__(self) -> str:
        calls = "\n".join(f"# call {i}: shape={c.shape} items={c.items} flag={c.flag} scale={c.scale} "
                          f"value_seed={c.value_seed} requires_grad={self.requires_grad}"
                          for i, c in enumerate(self.calls))
        return f"# seed {self.seed}\n{self.source}\n{calls}\n"


# ------------------------------------------------------------------ generator
class _Gen:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.grad = self.r.random() < 0.25
        self.mutate_inputs = not self.grad and self.r.random() < 0.6
        self.lines: list[str] = []
        self.tensors = ["x", "y"]          # bound at every point of the frame, main shape
        self.scalars = ["s0"]              # Python numbers, bound everywhere
        self.counter = 0
        self.uses_global = False
        self.uses_closure = False
        self.uses_view = False
        self.lates: list[str] = []
        self.statements = 0
        self.pending: list[tuple[list[str], str]] = []

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * (indent + 1) + line)
        for names, name in self.pending:
            names.append(name)
        self.pending.clear()

    # -------------------------------------------------------------- expressions
    def t(self) -> str:
        return self.r.choice(self.tensors)

    def s(self) -> str:
        return self.r.choice(self.scalars)

    def texpr(self, depth: int = 0) -> str:
        r = self.r
        a = self.t()
        if depth >= 2:
            return a
        kind = r.randrange(14)
        sub = self.texpr(depth + 1)
        if kind == 0:
            return f"{sub}.{r.choice(['sin', 'cos', 'tanh', 'sigmoid', 'relu', 'abs', 'neg'])}()"
        if kind == 1:
            return f"({sub} {r.choice(['+', '-', '*'])} {self.t()})"
        if kind == 2:
            return f"({sub} * {r.choice(['0.5', '2', '-1.5'])} + {r.choice(['1', '0.25', '-0.5'])})"
        if kind == 3:
            return f"torch.maximum({sub}, {self.t()})"
        if kind == 4:
            return f"({sub} - {self.t()}.mean(dim={r.randrange(2)}, keepdim=True))"
        if kind == 5:
            return f"({sub} * {self.t()}.sum(dim={r.randrange(2)}, keepdim=True).tanh())"
        if kind == 6:
            return f"(({sub} @ {self.t()}.t() @ {self.t()}) * 0.1)"
        if kind == 7:
            return f"{sub}.reshape(-1).reshape({a}.shape)"
        if kind == 8:
            return f"{sub}.t().{r.choice(['sin', 'exp', 'cos'])}().t()"
        if kind == 9:
            return f"torch.cat([{sub}[1:], {sub}[:1]], dim=0)"
        if kind == 10:
            return f"{sub}.flip({r.randrange(2)})"
        if kind == 11:
            return f"({sub} * {self.s()})"
        if kind == 12:
            return f"torch.where({sub} > 0.01, {sub}, {self.t()} * 0.5)"
        return f"{sub}.clamp(-1, 1)"

    def tcond(self) -> str:
        a = self.texpr(1)
        # thresholds away from 0: a sum of `t - t.mean(dim)` is 0 up to rounding, which ember's
        # kernels may round differently (a branch flip that is no bug)
        return self.r.choice([f"{a}.sum() > 0.37", f"{a}.mean() < 0.13", f"({a} > 0.01).any()", f"{a}.max() > 0.5",
                              f"({a}.abs() < 2).all()", f"-1 < {a}.sum() < 3",
                              f"{a}.sum() > 0.37 and flag", f"not ({a} > 0.01).all()"])

    def pycond(self, loop_vars: list[str]) -> str:
        options = ["flag", "not flag", f"{self.s()} > 0.05", "len(acc) > 1", "len(items) > 2"]
        options += [f"{v} % 2 == 0" for v in loop_vars]
        return self.r.choice(options)

    def assign_target(self, indent: int) -> str:
        """A tensor local: a new one at the top level, an existing one (not an input) inside blocks."""
        if indent == 0 and self.r.random() < 0.6:
            name = self.fresh("t")
            self.pending.append((self.tensors, name))   # bound once its line is emitted
            return name
        return self.r.choice(self.tensors)

    def scalar_target(self, indent: int) -> str:
        if indent == 0 and self.r.random() < 0.7:
            name = self.fresh("s")
            self.pending.append((self.scalars, name))
            return name
        return self.r.choice(self.scalars)

    # -------------------------------------------------------------- statements
    def block(self, indent: int, size: int, ctx: dict) -> None:
        start = len(self.lines)
        for _ in range(size):
            self.statement(indent, ctx)
        if len(self.lines) == start:
            self.emit(indent, "pass")

    def statement(self, indent: int, ctx: dict) -> None:
        self.statements += 1
        r = self.r
        nested_ok = indent < 3 and self.statements < 30
        choices = [("assign", 4), ("break", 6), ("mutate", 2 if self.mutate_inputs or True else 0)]
        if nested_ok:
            choices += [("tif", 3), ("pyif", 1), ("for", 2), ("while", 1), ("nograd", 1), ("try", 2),
                        ("forelse", 0.7), ("usercm", 0.7), ("dictloop", 0.5)]
        if indent > 0:
            choices += [("return", 0.6)]
        if ctx.get("loop"):
            choices += [("loopjump", 1)]
        if indent == 0:
            choices += [("late", 0.7)]
        names, weights = zip(*choices)
        kind = r.choices(names, weights)[0]
        getattr(self, "st_" + kind)(indent, ctx)

    def st_assign(self, indent: int, ctx: dict) -> None:
        expr = self.texpr()
        target = self.assign_target(indent)
        self.emit(indent, f"{target} = {expr}")

    def st_mutate(self, indent: int, ctx: dict) -> None:
        r = self.r
        options = ["acc.append(%s)" % r.choice([self.s(), f"tuple({self.t()}.shape)", "'m'", f"{self.t()}.shape[0]"]),
                   f"d[{r.choice(['0', '1', repr('k')])}] = {self.s()}",
                   f"acc.extend([{self.s()}, len(d)])"]
        if not ctx.get("items_loop"):
            options.append(f"items.append({r.choice(['len(acc)', 'len(d)', '7'])})")
            options.append("items.pop() if items else None")
        if self.mutate_inputs:
            options += [f"{r.choice(['x', 'y'])}.{r.choice(['add_(1)', 'mul_(0.5)', 'sub_(0.25)', 'clamp_(-1, 1)'])}",
                        "xv.mul_(2)", "xv.add_(-1)", f"{self.t()}.mul_(0.5)"]
        line = r.choice(options)
        if "xv" in line:
            self.uses_view = True
        self.emit(indent, line)

    def st_break(self, indent: int, ctx: dict) -> None:
        r = self.r
        kind = r.randrange(32)
        a = self.t()
        if kind == 0:
            self.emit(indent, f"print('shape', {a}.shape, {self.texpr(1)}.shape[0])")
        elif kind == 1:
            self.emit(indent, f"print('value', round({self.s()}, 3), len(acc), flag)")
        elif kind == 2:
            self.emit(indent, f"print('count', ({self.texpr(1)} > 0.01).sum(), ({a} > 0.01).int())")
        elif kind == 3:
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = int(({self.texpr(1)} > 0.01).sum())")
        elif kind == 4:
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = float({self.texpr(1)}.tanh().mean())")
        elif kind == 5:
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = {self.texpr(1)}.sigmoid().{r.choice(['max', 'min', 'mean'])}().item()")
        elif kind == 6:
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = {self.texpr(1)}.sum(dim=0).tanh().tolist()[{r.choice(['0', '-1'])}]")
        elif kind == 7:
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = {self.texpr(1)} if {self.tcond()} else {self.texpr(1)}")
        elif kind == 8:
            c = self.fresh("c")
            op = r.choice(["and", "or"])
            self.emit(indent, f"{c} = ({self.t()}.sum() > 0.37) {op} ({self.t()}.mean() < 0.2)")
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = {self.t()} + int({c})")
        elif kind == 9:
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = helper_print({self.texpr(1)}, tag={r.choice(['1', repr('a'), 'flag'])})")
        elif kind == 10:
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = helper_item({self.texpr(1)}, scale={self.s()})")
        elif kind == 11:
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = helper_branch({self.texpr(1)})")
        elif kind == 12:
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = check_value(int(({self.texpr(1)} > 0.01).sum()), {r.randrange(2, 12)})")
        elif kind == 13:
            target = self.assign_target(indent)
            if r.random() < 0.5:
                self.emit(indent, f"{target} = helper_star({self.t()}, {self.texpr(1)}, weight={self.s()})")
            else:
                self.emit(indent, f"{target} = helper_star(*[{self.t()}, {self.t()}], **{{'weight': 0.5}})")
        elif kind == 14:
            self.uses_closure = True
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = inner({self.texpr(1)})")
        elif kind == 15:
            target = self.assign_target(indent)
            if r.random() < 0.5:
                self.emit(indent, f"{target} = (Box({self.t()}) + {self.texpr(1)}).t")
            else:
                self.emit(indent, f"{target} = Box({self.texpr(1)}).doubled")
        elif kind == 16:
            if r.random() < 0.5:
                self.emit(indent, f"bump_global({r.randrange(1, 4)})")
            else:
                self.uses_global = True
                self.emit(indent, f"COUNTER += {self.s()} if isinstance({self.s()}, int) else 1")
                self.emit(indent, "print('global', COUNTER)")
        elif kind == 17:
            target = self.assign_target(indent)
            method = r.choice(["mul", "add", "sub"])
            self.emit(indent, f"{target} = {a}.{method}({self.texpr(1)}.tanh().sum().item())")
        elif kind == 18:
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = {a}.{r.choice(['mul', 'add'])}(float({self.t()}.sigmoid().mean()))")
        elif kind == 19:   # the break in the middle of an expression: partial results on the stack
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = {self.texpr(1)} + helper_print({self.t()}) * int(({self.t()} > 0.01).sum())")
        elif kind == 20:   # breaks inside call arguments, with a keyword argument
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = helper_star({self.t()}, helper_branch({self.t()}), "
                              f"weight=float({self.t()}.tanh().mean()))")
        elif kind == 21:   # breaks inside list / dict displays
            if r.random() < 0.5:
                self.emit(indent, f"acc.append([int({self.t()}.sum() > 0.37), round(float({self.t()}.mean()), 3), "
                                  f"{self.s()}])")
            else:
                self.emit(indent, f"d.update({{'a': int(({self.t()} > 0.01).sum()), 'b': len(acc)}})")
        elif kind == 22:   # a comprehension (a nested code object) that breaks
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = sum([int(v > 0.25) for v in {self.texpr(1)}.sum(dim=1)])")
        elif kind == 23:   # a lambda that breaks
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = (lambda u: u * u.tanh().mean().item())({self.texpr(1)})")
        elif kind == 24:   # f-string of .item(), print with keyword arguments
            if r.random() < 0.5:
                self.emit(indent, f"print(f\"sum={{int(({self.t()} > 0.01).sum())}} flag={{flag}}\", {self.s()} > 0.05)")
            else:
                self.emit(indent, f"print('kw', ({self.t()} > 0.01).sum().item(), sep='|', end=';\\n')")
        elif kind == 25:   # walrus on a breaking value
            target = self.assign_target(indent)
            n = self.fresh("n")
            first, second = self.texpr(1), self.texpr(1)
            self.emit(indent, f"if ({n} := int(({self.t()} > 0.01).sum())) > {r.randrange(0, 8)}:")
            self.emit(indent + 1, f"{target} = {first} * {n}")
            self.emit(indent, "else:")
            self.emit(indent + 1, f"{target} = {second} - {n}")
        elif kind == 26 and self.mutate_inputs:   # augmented assignment: in place on a possibly aliased local
            target = r.choice(self.tensors)
            self.emit(indent, f"{target} {r.choice(['+=', '*=', '-='])} {self.t()}.sigmoid().mean().item()")
        elif kind == 29 and self.mutate_inputs:   # index computed from data, input written in place
            self.emit(indent, f"{r.choice(['x', 'y'])}[int({self.t()}.argmax()) % x.shape[0]] = {self.s()}")
        elif kind == 30:   # grad mode switched inside a block
            self.emit(indent, "with torch.enable_grad():")
            target = self.assign_target(indent + 1)
            self.emit(indent + 1, f"{target} = {self.texpr(1)}")
            self.emit(indent + 1, f"print('grad', torch.is_grad_enabled(), {target}.requires_grad)")
        elif kind == 31:   # a shape error raised by a tensor op (only for some input shapes)
            target = self.assign_target(indent)
            self.emit(indent, f"{target} = {self.texpr(1)} + {self.t()}.reshape(3, -1).sum()")
        elif kind == 27:   # assert on tensor data
            self.emit(indent, f"assert {self.t()}.abs().sum() >= 0, 'never'")
        else:
            target = self.scalar_target(indent)
            self.emit(indent, f"{target} = float({self.texpr(1)}.sum()) if flag else len({self.t()}.tolist())")

    def st_tif(self, indent: int, ctx: dict) -> None:
        self.emit(indent, f"if {self.tcond()}:")
        self.block(indent + 1, self.r.randint(1, 3), ctx)
        if self.r.random() < 0.6:
            self.emit(indent, "else:")
            self.block(indent + 1, self.r.randint(1, 2), ctx)

    def st_pyif(self, indent: int, ctx: dict) -> None:
        self.emit(indent, f"if {self.pycond(ctx.get('loop_vars', []))}:")
        self.block(indent + 1, self.r.randint(1, 2), ctx)
        if self.r.random() < 0.5:
            self.emit(indent, "else:")
            self.block(indent + 1, self.r.randint(1, 2), ctx)

    def st_for(self, indent: int, ctx: dict) -> None:
        r = self.r
        i = self.fresh("i")
        kind = r.randrange(5)
        inner = dict(ctx, loop=True, loop_vars=ctx.get("loop_vars", []) + [i])
        if kind == 0:
            self.emit(indent, f"for {i} in range({r.randint(1, 3)}):")
        elif kind == 1:
            self.emit(indent, f"for {i} in items:")
            inner["items_loop"] = True
        elif kind == 2:
            v = self.fresh("v")
            self.emit(indent, f"for {i}, {v} in enumerate(items[:3]):")
        elif kind == 3:
            v = self.fresh("v")
            self.emit(indent, f"for {i}, {v} in zip(range(3), items):")
            inner["items_loop"] = True
        else:
            tt = self.fresh("tt")
            self.emit(indent, f"for {i}, {tt} in enumerate([{self.t()}, {self.t()}]):")
            self.emit(indent + 1, f"acc.append(tuple({tt}.shape))")
        self.block(indent + 1, r.randint(1, 3), inner)

    def st_while(self, indent: int, ctx: dict) -> None:
        w = self.fresh("w")
        target = self.r.choice([t for t in self.tensors if t not in ("x", "y")] or ["x"])
        self.emit(indent, f"{w} = 0")
        self.emit(indent, f"while {target}.abs().sum() < {self.r.choice([5, 20, 50])} and {w} < 3:")
        self.emit(indent + 1, f"{w} += 1")
        self.emit(indent + 1, f"{target} = {target} * 1.5 + 0.1")
        inner = dict(ctx, loop=True, loop_vars=ctx.get("loop_vars", []) + [w])
        self.block(indent + 1, self.r.randint(0, 2), inner)

    def st_forelse(self, indent: int, ctx: dict) -> None:
        i = self.fresh("i")
        self.emit(indent, f"for {i} in range({self.r.randint(1, 3)}):")
        inner = dict(ctx, loop=True, loop_vars=ctx.get("loop_vars", []) + [i])
        self.emit(indent + 1, f"if {self.tcond()}:")
        self.emit(indent + 2, "break")
        self.block(indent + 1, self.r.randint(1, 2), inner)
        self.emit(indent, "else:")
        self.emit(indent + 1, "acc.append('no break')")
        self.block(indent + 1, 1, ctx)

    def st_usercm(self, indent: int, ctx: dict) -> None:
        self.emit(indent, "with Tracker(acc):")
        self.block(indent + 1, self.r.randint(1, 3), ctx)

    def st_dictloop(self, indent: int, ctx: dict) -> None:
        k, v = self.fresh("k"), self.fresh("v")
        self.emit(indent, f"d[len(d)] = {self.s()}")
        self.emit(indent, f"for {k}, {v} in list(d.items()):")
        self.emit(indent + 1, f"print('key', {k})")
        self.emit(indent + 1, f"d[{k}] = {v} if isinstance({v}, int) else int(({self.t()} > 0.01).sum())")
        inner = dict(ctx, loop=True)
        self.block(indent + 1, self.r.randint(0, 2), inner)

    def st_nograd(self, indent: int, ctx: dict) -> None:
        self.emit(indent, "with torch.no_grad():")
        self.block(indent + 1, self.r.randint(1, 3), ctx)

    def st_try(self, indent: int, ctx: dict) -> None:
        r = self.r
        self.emit(indent, "try:")
        self.block(indent + 1, r.randint(1, 3), ctx)
        if r.random() < 0.3:   # the ValueError this may raise is not caught here
            limit = r.randrange(2, 10)
            target = self.s()
            self.emit(indent + 1, f"{target} = check_value(int(({self.t()} > 0.01).sum()), {limit})")
        kind = r.randrange(3)
        if kind in (0, 1):
            e = self.fresh("e")
            self.emit(indent, f"except {r.choice(['ValueError', 'ValueError', '(ValueError, RuntimeError)'])} as {e}:")
            self.emit(indent + 1, f"acc.append(str({e}))")
            self.emit(indent + 1, f"print('caught', {e})")
            if r.random() < 0.5:
                self.block(indent + 1, 1, ctx)
            if r.random() < 0.15:
                self.emit(indent + 1, "raise")   # re-raised after a break in the handler
        if kind in (1, 2):
            self.emit(indent, "finally:")
            self.emit(indent + 1, "acc.append('finally')")
            if r.random() < 0.5:
                self.block(indent + 1, 1, dict(ctx, no_return=True))

    def st_return(self, indent: int, ctx: dict) -> None:
        if ctx.get("no_return"):
            self.st_assign(indent, ctx)
            return
        self.emit(indent, f"if {self.r.choice([self.tcond(), self.pycond(ctx.get('loop_vars', []))])}:")
        self.emit(indent + 1, f"return {self.result()}")

    def st_loopjump(self, indent: int, ctx: dict) -> None:
        cond = self.r.choice([self.tcond(), self.pycond(ctx.get("loop_vars", []))])
        self.emit(indent, f"if {cond}:")
        self.emit(indent + 1, self.r.choice(["break", "continue"]))

    def st_late(self, indent: int, ctx: dict) -> None:
        name = self.fresh("late")
        self.emit(indent, "if flag:")
        self.emit(indent + 1, f"{name} = {self.texpr(1)}")
        self.lates.append(name)

    def result(self) -> str:
        ts = self.r.sample(self.tensors, min(len(self.tensors), self.r.randint(1, 3)))
        tensor = " + ".join(ts)
        extra = self.r.sample(self.scalars, min(len(self.scalars), 2))
        parts = [tensor] + extra + ["acc", "dict(d)"]
        if self.uses_closure:
            parts.append("count")
        return "(" + ", ".join(parts) + ")"

    def program(self) -> str:
        r = self.r
        for _ in range(r.randint(3, 7)):
            self.statement(0, {})
            if self.lates and r.random() < 0.4:
                late = self.lates.pop(0)
                target = self.t()
                self.emit(0, "if flag:")
                self.emit(1, f"{target} = {target} + {late}")
        self.emit(0, f"return {self.result()}")
        head = ["def program(x, y, items, flag, scale):"]
        if self.uses_global:
            head.append("    global COUNTER")
        head += ["    acc = []", "    d = {}", "    s0 = scale"]
        if self.uses_view:
            head.append(f"    xv = x[{r.choice(['0', '1:', ':, 0', '::2'])}]")
        if self.uses_closure:
            head.append("    count = 0")
            head.append("")
            head.append("    def inner(t):")
            head.append("        nonlocal count")
            head.append("        count += 1")
            head.append("        print('inner', count)")
            if r.random() < 0.5:
                head.append("        if t.sum() > count:")
                head.append("            return t - count")
            head.append("        return t * 0.5 + count + y.sum().item()")
            head.append("")
        return PRELUDE + "\n".join(head + self.lines) + "\n"


def generate(seed: int) -> BreakProgram:
    g = _Gen(seed)
    source = g.program()
    r = random.Random(seed * 7919 + 1)
    shape = r.choice(SHAPES)
    flag = r.random() < 0.5
    items = [r.randrange(0, 6) for _ in range(r.randint(2, 4))]
    calls = []
    for k in range(r.randint(2, 3)):
        if k and r.random() < 0.3:
            shape = r.choice(SHAPES)
        if k and r.random() < 0.4:
            flag = not flag
        if k and r.random() < 0.3:
            items = [r.randrange(0, 6) for _ in range(r.randint(1, 4))]
        calls.append(Call(shape, list(items), flag, r.choice([0.5, 1.0, 1.5, 2.0, -1.0]), seed * 1000 + k))
    return BreakProgram(seed, source, calls, g.grad)


# ------------------------------------------------------------------ check
@dataclasses.dataclass
class Outcome:
    status: str   # ok | wrong_result | ember_error | generator_error
    detail: str = ""
    fallbacks: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Mismatch(AssertionError):
    pass


def compare(expected: Any, got: Any, path: str = "result") -> None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor, got {type(got).__name__} {got!r}")
        if expected.requires_grad != got.requires_grad:
            raise Mismatch(f"{path}: requires_grad expected {expected.requires_grad}, got {got.requires_grad}")
        try:
            torch.testing.assert_close(got.detach(), expected.detach(), rtol=2e-3, atol=1e-4, equal_nan=True)  # ember kernels round differently
        except AssertionError as error:
            raise Mismatch(f"{path}: {error}") from None
        return
    if type(expected) is not type(got):
        raise Mismatch(f"{path}: expected {type(expected).__name__} {expected!r}, got {type(got).__name__} {got!r}")
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(got):
            raise Mismatch(f"{path}: expected length {len(expected)} {expected!r}, got {len(got)} {got!r}")
        for i, (e, g) in enumerate(zip(expected, got)):
            compare(e, g, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if list(expected) != list(got):
            raise Mismatch(f"{path}: expected keys {list(expected)}, got {list(got)}")
        for k in expected:
            compare(expected[k], got[k], f"{path}[{k!r}]")
        return
    if isinstance(expected, float):
        if not (math.isclose(expected, got, rel_tol=1e-4, abs_tol=1e-6) or (expected != expected and got != got)):
            raise Mismatch(f"{path}: expected {expected!r}, got {got!r}")
        return
    if expected != got:
        raise Mismatch(f"{path}: expected {expected!r}, got {got!r}")


def _run(fn: Any, args: list[Any]) -> tuple[Any, BaseException | None, str, list[str], bool]:
    out = io.StringIO()
    grad_before = torch.is_grad_enabled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(out):
                result = fn(*args)
            error = None
        except Exception as exc:  # noqa: BLE001 (an exception is a result to compare)
            result, error = None, exc
    grad_same = torch.is_grad_enabled() == grad_before
    torch.set_grad_enabled(grad_before)
    return result, error, out.getvalue(), [str(w.message) for w in caught], grad_same


def _grads(result: Any, inputs: list[Any]) -> list[Any] | None:
    first = result[0] if isinstance(result, tuple) else None
    if not isinstance(first, torch.Tensor) or not first.requires_grad:
        return None
    wanted = [t for t in inputs[:2] if t.requires_grad]
    grads = torch.autograd.grad(first.tanh().sum(), wanted, allow_unused=True)
    return [g if g is not None else "none" for g in grads]


def check_program(program: BreakProgram, backend: str = "eager", options: dict | None = None) -> Outcome:
    import ember
    eager_ns, ember_ns = program.namespace(), program.namespace()
    eager_fn = eager_ns["program"]
    compiled = ember.compile(ember_ns["program"], backend=backend, options=options)
    fallbacks: list[str] = []
    for index, call in enumerate(program.calls):
        where = f"call {index}"
        eager_args = call.make(program.requires_grad)
        ember_args = call.make(program.requires_grad)
        expected, eager_error, eager_text, _, eager_grad_same = _run(eager_fn, eager_args)
        got, ember_error, ember_text, warned, ember_grad_same = _run(compiled, ember_args)
        fallbacks += [w for w in warned if "ember" in w]
        if eager_error is not None and not isinstance(eager_error, (ValueError, RuntimeError)):
            return Outcome("generator_error", f"{where}: eager raised {type(eager_error).__name__}: {eager_error}")
        if not eager_grad_same:
            return Outcome("generator_error", f"{where}: eager changed the grad mode")
        try:
            if eager_error is not None or ember_error is not None:
                if ember_error is None:
                    raise Mismatch(f"eager raised {type(eager_error).__name__}: {eager_error}; ember returned {got!r}")
                if eager_error is None:
                    return Outcome("ember_error", f"{where}: ember raised {type(ember_error).__name__}: "
                                                  f"{ember_error}; eager returned", tuple(fallbacks))
                if type(eager_error) is not type(ember_error) or str(eager_error) != str(ember_error):
                    return Outcome("ember_error", f"{where}: eager raised {type(eager_error).__name__}: "
                                                  f"{eager_error}; ember raised {type(ember_error).__name__}: "
                                                  f"{ember_error}", tuple(fallbacks))
            else:
                compare(expected, got)
            if ember_text != eager_text:
                raise Mismatch(f"stdout: expected\n{eager_text!r}\ngot\n{ember_text!r}")
            compare(eager_args, ember_args, "inputs after the call")
            compare(eager_ns["COUNTER"], ember_ns["COUNTER"], "global COUNTER")
            if not ember_grad_same:
                raise Mismatch("grad mode changed by the compiled call")
            if program.requires_grad and eager_error is None:
                expected_grads, got_grads = _grads(expected, eager_args), _grads(got, ember_args)
                compare(expected_grads, got_grads, "gradients")
        except Mismatch as mismatch:
            return Outcome("wrong_result", f"{where}: {mismatch}", tuple(fallbacks))
    return Outcome("ok", "", tuple(fallbacks))


def deep_inputs(call: Call, requires_grad: bool) -> list[Any]:
    return copy.deepcopy(call.make(requires_grad))
