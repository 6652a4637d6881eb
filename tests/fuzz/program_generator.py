"""A seeded generator of random straight-line PyTorch programs, for differential fuzzing.

`generate(seed)` returns a `Program`: Python source of `def program(a0, a1, ...)` plus a spec of
each input (shape, dtype, layout).  Programs are built by *running* them: each statement is tried
on example inputs in eager PyTorch as it is chosen, so the generator always knows every variable's
shape and dtype, and keeps a statement only when eager runs it (or, rarely, as the raising last
statement of a program whose error ember must reproduce).

Ops covered: mixed-dtype elementwise math and comparisons (tensors, 0-d tensors, Python scalars),
where/clamp/pow/maximum/logical ops, casts, views, reductions with dim/keepdim, matmuls of every rank
(incl. broadcast batch dims), cat/stack, pad, in-place ops on intermediates and inputs, and
(optionally) complex tensors.  `check.py` compiles and compares a Program with eager.
"""
from __future__ import annotations

import dataclasses
import random
import warnings
from typing import Any

import torch

FLOATS = [torch.float32, torch.float32, torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int64, torch.int32]
DTYPES = FLOATS + INTS + [torch.bool]
DTYPE_NAMES = {torch.float32: "torch.float32", torch.float16: "torch.float16", torch.bfloat16: "torch.bfloat16",
               torch.float64: "torch.float64", torch.int64: "torch.int64", torch.int32: "torch.int32",
               torch.bool: "torch.bool", torch.complex64: "torch.complex64"}


@dataclasses.dataclass
class InputSpec:
    """One argument: a tensor (shape, dtype, layout) or a Python scalar (dtype None, value)."""
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = torch.float32
    layout: str = "contiguous"  # contiguous | transposed | strided | expanded | offset
    value: Any = None           # Python scalar arguments only

    def make(self, gen: torch.Generator) -> Any:
        if self.dtype is None:  # a Python scalar: other values on other calls (guards must notice)
            changed = bool(torch.randint(0, 2, (1,), generator=gen))
            return self.value + 2 if changed and not isinstance(self.value, bool) else self.value
        if self.layout == "transposed" and len(self.shape) >= 2:
            base = _random_tensor(self.shape[:-2] + (self.shape[-1], self.shape[-2]), self.dtype, gen)
            return base.transpose(-1, -2)
        if self.layout == "strided" and len(self.shape) >= 1:
            base = _random_tensor(self.shape[:-1] + (2 * self.shape[-1],), self.dtype, gen)
            return base[..., ::2]
        if self.layout == "offset" and len(self.shape) >= 1:  # a view with a storage offset
            base = _random_tensor((self.shape[0] + 1,) + self.shape[1:], self.dtype, gen)
            return base[1:]
        if self.layout == "expanded" and len(self.shape) >= 1:
            base = _random_tensor((1,) + self.shape[1:], self.dtype, gen)
            return base.expand(self.shape)
        return _random_tensor(self.shape, self.dtype, gen)

    def describe(self) -> str:
        if self.dtype is None:
            return f"python {type(self.value).__name__} {self.value!r}"
        return f"{DTYPE_NAMES.get(self.dtype, self.dtype)}{list(self.shape)} {self.layout}"


def _random_tensor(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(-4, 5, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


@dataclasses.dataclass
class Program:
    seed: int
    source: str
    inputs: list[InputSpec]
    eager_raises: bool = False  # generation saw eager raise (on the example inputs)

    def function(self) -> Any:
        """A fresh function object from the source (each compile must start cold)."""
        import linecache
        filename = f"<fuzz program {self.seed}>"
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        namespace = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source, filename, "exec"), namespace)
        return namespace["program"]

    def make_inputs(self, seed: int) -> list[Any]:
        gen = torch.Generator().manual_seed(seed)
        return [spec.make(gen) for spec in self.inputs]

    def __str__(self) -> str:
        lines = [f"# seed {self.seed}"] + [f"# a{i}: {s.describe()}" for i, s in enumerate(self.inputs)]
        return "\n".join(lines) + "\n" + self.source


class _Builder:
    """Grows one program statement by statement, running each on example inputs."""

    def __init__(self, rng: random.Random, complex_ops: bool, inplace_ops: bool) -> None:
        self.rng = rng
        self.complex_ops = complex_ops
        self.inplace_ops = inplace_ops
        self.gen = torch.Generator().manual_seed(rng.randrange(2**31))
        self.inputs: list[InputSpec] = []
        self.env: dict[str, Any] = {}       # name -> eager value on the example inputs
        self.tensors: list[str] = []        # names of tensor variables (inputs and results)
        self.lines: list[str] = []
        self.counter = 0
        self.raised = False

    # ------------------------------------------------------------------ operands
    def new_input(self, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None) -> str:
        rng = self.rng
        if shape is None:
            shape = self.random_shape()
        if dtype is None:
            dtype = rng.choice(DTYPES)
        layout = "contiguous"
        roll = rng.random()
        if roll < 0.15 and len(shape) >= 2:
            layout = "transposed"
        elif roll < 0.25 and len(shape) >= 1:
            layout = "strided"
        elif roll < 0.32 and len(shape) >= 1 and shape[0] > 1:
            layout = "expanded"
        elif roll < 0.38 and len(shape) >= 1:
            layout = "offset"
        spec = InputSpec(tuple(shape), dtype, layout)
        name = f"a{len(self.inputs)}"
        self.inputs.append(spec)
        self.env[name] = spec.make(self.gen)
        self.tensors.append(name)
        return name

    def new_scalar_input(self) -> str:
        value = self.rng.choice([2, -1, 0.5, 1.5, True])
        name = f"a{len(self.inputs)}"
        self.inputs.append(InputSpec(dtype=None, value=value))
        self.env[name] = value
        return name

    def random_shape(self) -> tuple[int, ...]:
        rank = self.rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4])
        if self.rng.random() < 0.12 and rank:  # long rows: vectorized loops with tails, split reductions
            return tuple(self.rng.choice([17, 33, 64, 130, 1031]) if i == rank - 1 else self.rng.choice([1, 2, 3])
                         for i in range(rank))
        sizes = [1, 2, 3, 4, 5, 8] + ([0] if self.rng.random() < 0.03 else [])
        return tuple(self.rng.choice(sizes) for _ in range(rank))

    def pick(self, predicate=lambda v: True) -> str | None:
        names = [n for n in self.tensors if predicate(self.env[n])]
        return self.rng.choice(names) if names else None

    def operand_like(self, shape: tuple[int, ...], float_only: bool = False) -> str:
        """A tensor broadcastable against `shape`: an existing one, a new input, a 0-d, a scalar."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            return repr(rng.choice([2, -1, 0, 0.5, -1.25, 3.0, True]) if not float_only else
                        rng.choice([0.5, -1.25, 2.0]))
        if roll < 0.25:
            return self.new_scalar_input()
        candidates = [n for n in self.tensors if _broadcastable(self.env[n].shape, shape)
                      and (not float_only or self.env[n].dtype.is_floating_point)]
        if candidates and roll < 0.75:
            return rng.choice(candidates)
        if roll < 0.85:
            return self.new_input((), rng.choice(FLOATS) if float_only else None)
        sub = tuple(s if rng.random() < 0.7 else 1 for s in shape[rng.randrange(len(shape) + 1):])
        return self.new_input(sub, rng.choice(FLOATS) if float_only else None)

    def any_tensor(self) -> str:
        return self.pick() or self.new_input()

    # ------------------------------------------------------------------ statements
    def try_statement(self, expr: str, allow_raise: bool = False) -> str | None:
        """Run `name = expr` eagerly; keep it when it runs (or raises, on request)."""
        name = f"v{self.counter}"
        env = dict(self.env)
        snapshot = {k: v.clone() for k, v in self.env.items() if isinstance(v, torch.Tensor)}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # eager's own warnings (std with <= 0 degrees of freedom)
                value = eval(expr, {"torch": torch, "F": torch.nn.functional}, env)
        except Exception:
            for k, v in snapshot.items():  # a failed in-place op may have written part of its target
                try:
                    self.env[k].copy_(v)
                except RuntimeError:
                    pass
            if allow_raise:
                self.lines.append(f"{name} = {expr}")
                self.raised = True
                return name
            return None
        if isinstance(value, (tuple, list)) or (isinstance(value, torch.Tensor) and value.numel() > 4096):
            return None
        self.counter += 1
        self.lines.append(f"{name} = {expr}")
        self.env[name] = value
        if isinstance(value, torch.Tensor):
            self.tensors.append(name)
        return name


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    for x, y in zip(reversed(a), reversed(b)):
        if x != y and x != 1 and y != 1:
            return False
    return len(a) <= len(b) or all(s == 1 for s in a[: len(a) - len(b)])


# ---------------------------------------------------------------------------- op menu
UNARY_FLOAT = ["torch.exp({})", "torch.tanh({})", "torch.sigmoid({})", "torch.sin({})", "{}.abs()",
               "torch.log({}.abs() + 1)", "torch.sqrt({})", "torch.rsqrt({}.abs() + 0.5)", "torch.floor({})",
               "torch.round({})", "{}.sign()", "torch.erf({})", "F.relu({})", "F.gelu({})", "F.silu({})",
               "torch.expm1({})", "torch.reciprocal({})", "{}.square()", "torch.trunc({})", "torch.frac({})",
               "F.gelu({}, approximate='tanh')", "torch.nan_to_num({})", "torch.log1p({}.abs())"]
UNARY_ANY = ["-{}", "{}.abs()", "torch.logical_not({})", "~{}", "torch.isnan({})", "{}.clone()", "{}.neg()",
             "torch.square({})", "{}.sign()", "{}.float()", "{}.half()", "{}.double()", "{}.bfloat16()",
             "{}.int()", "{}.long()", "{}.bool()", "{}.to(torch.float16)", "{}.to({}.dtype)", "{}.contiguous()"]
BINARY = ["{} + {}", "{} - {}", "{} * {}", "{} / {}", "torch.add({}, {}, alpha=2)", "torch.maximum({}, {})",
          "torch.minimum({}, {})", "{} > {}", "{} <= {}", "{} == {}", "{} != {}", "torch.logical_and({}, {})",
          "torch.logical_or({}, {})", "torch.pow({}, {})", "{} ** {}", "torch.atan2({}, {})", "{} & {}",
          "{} | {}", "{} ^ {}", "torch.remainder({}, {})", "{} // {}", "torch.fmod({}, {})",
          "torch.sub({}, {})", "torch.mul({}, {})", "torch.div({}, {}, rounding_mode='floor')",
          "torch.eq({}, {})", "torch.lt({}, {})", "torch.hypot({}, {})"]


def _statement(b: _Builder) -> None:
    rng = b.rng
    kind = rng.choices(["unary", "binary", "ternary", "cast", "view", "reduce", "matmul", "cat", "pad",
                        "inplace", "complex", "misc"],
                       weights=[12, 18, 8, 5, 12, 12, 8, 5, 2, 8 if b.inplace_ops else 0,
                                2 if b.complex_ops else 0, 8])[0]
    maker = {"unary": _unary, "binary": _binary, "ternary": _ternary, "cast": _cast, "view": _view,
             "reduce": _reduce, "matmul": _matmul, "cat": _cat, "pad": _pad, "inplace": _inplace,
             "complex": _complex, "misc": _misc}[kind]
    for _ in range(6):  # a few tries to find a statement eager accepts
        expr = maker(b)
        if expr is not None and b.try_statement(expr) is not None:
            return


def _unary(b: _Builder) -> str:
    x = b.any_tensor()
    if b.env[x].dtype.is_floating_point and b.rng.random() < 0.7:
        return b.rng.choice(UNARY_FLOAT).format(x, x)
    return b.rng.choice(UNARY_ANY).format(x, x)


def _binary(b: _Builder) -> str:
    x = b.any_tensor()
    y = b.operand_like(tuple(b.env[x].shape))
    pattern = b.rng.choice(BINARY)
    divides = any(op in pattern for op in ("//", "remainder", "fmod", "floor"))
    if pattern.startswith("{} ") and b.rng.random() < 0.5 and y[0] not in "av" and not divides:
        return pattern.format(y, x)  # Python scalar on the left: the reflected operator
    if b.rng.random() < 0.5:
        x, y = y, x
    if x[0] not in "av":  # torch.fn(scalar, tensor) mostly raises: keep the tensor first
        x, y = y, x
    if divides:
        y = f"({y}.abs() + 1)" if y[0] in "av" else "3"  # integer division by zero raises (data-dependent)
    return pattern.format(x, y)


def _ternary(b: _Builder) -> str:
    rng = b.rng
    x = b.any_tensor()
    shape = tuple(b.env[x].shape)
    roll = rng.random()
    if roll < 0.45:
        cond = rng.choice([f"{x} >= 0", f"{x} > 0.5", f"{x} == 1", f"{x} <= 2"])
        y = b.operand_like(shape)
        if rng.random() < 0.5:
            return f"{x}.where({cond}, {y})"
        z = b.operand_like(shape)
        return f"torch.where({cond}, {y}, {z})"
    if roll < 0.75:
        lo, hi = rng.choice([(-1.25, 0.75), (0, None), (None, 1), (-2, 2), (0.5, 0.5)])
        if rng.random() < 0.3:
            return f"torch.clamp({x}, {b.operand_like(shape)}, {b.operand_like(shape)})"
        return f"{x}.clamp({lo}, {hi})" if rng.random() < 0.5 else f"torch.clamp({x}, min={lo}, max={hi})"
    if roll < 0.85:
        return f"torch.lerp({x}, {b.operand_like(shape, True)}, 0.3)"
    if roll < 0.93:
        return f"torch.addcmul({x}, {b.operand_like(shape)}, {b.operand_like(shape)}, value=0.5)"
    return f"{x}.masked_fill({x} > 0, {rng.choice([0, -1.5, True])})"


def _cast(b: _Builder) -> str:
    x = b.any_tensor()
    dtype = b.rng.choice(DTYPES)
    return b.rng.choice([f"{x}.to({DTYPE_NAMES[dtype]})", f"{x}.type_as({b.any_tensor()})",
                         f"{x}.to(dtype={DTYPE_NAMES[dtype]})"])


def _view(b: _Builder) -> str | None:
    rng = b.rng
    x = b.any_tensor()
    shape = tuple(b.env[x].shape)
    rank = len(shape)
    options = [f"{x}.unsqueeze({rng.randint(-rank - 1, rank)})", f"{x}.reshape(-1)", f"{x}.flatten()",
               f"{x}.squeeze()", f"{x}.view(-1)"]
    if rank >= 1:
        d = rng.randrange(rank)
        n = shape[d]
        index = rng.randrange(-n, n) if n else 0  # a size-0 dim: eager's IndexError is a test too
        options += [f"{x}[{', '.join([':'] * d + [str(index)])}]", f"{x}.select({d}, {index})", f"{x}.narrow({d}, {n // 2}, {n - n // 2})",
                    f"{x}[{', '.join([':'] * d + ['::2'])}]", f"{x}[{', '.join([':'] * d + ['1:'])}]",
                    f"{x}.squeeze({d})", f"{x}.expand({rng.choice([2, 3])}, *{x}.shape)",
                    f"{x}.chunk(2, {d})[0]", f"{x}.unsqueeze(0).expand(2, *{x}.shape)"]
        if n == 1:
            options.append(f"{x}.expand({', '.join(str(s if i != d else 3) for i, s in enumerate(shape))})")
    if rank >= 2:
        options += [f"{x}.t()" if rank == 2 else f"{x}.transpose(0, {rank - 1})", f"{x}.mT",
                    f"{x}.permute({', '.join(map(str, rng.sample(range(rank), rank)))})",
                    f"{x}.transpose(-1, -2).contiguous()", f"{x}.flatten(0, 1)",
                    f"{x}.reshape({shape[0]}, -1)", f"{x}.movedim(0, -1)"]
    return rng.choice(options)


def _reduce(b: _Builder) -> str:
    rng = b.rng
    x = b.any_tensor()
    rank = b.env[x].ndim
    dim = rng.randint(-rank, rank - 1) if rank else rng.choice([0, -1])
    keep = rng.choice(["True", "False"])
    fn = rng.choice(["sum", "mean", "amax", "amin", "prod", "std", "var", "argmax", "argmin", "logsumexp",
                     "softmax", "log_softmax", "cumsum", "max", "min", "all", "any", "norm", "std_mean"])
    if fn in ("softmax", "log_softmax"):
        return f"torch.{fn}({x}, dim={dim})" if rng.random() < 0.5 else f"F.{fn}({x}, {dim})"
    if fn == "cumsum":
        return f"torch.cumsum({x}, dim={dim})"
    if fn in ("max", "min"):
        return f"{x}.{fn}({dim}, keepdim={keep}).values" if rng.random() < 0.6 else f"{x}.{fn}()"
    if fn == "std_mean":
        return f"torch.std_mean({x}, dim={dim}, keepdim={keep})[{rng.randrange(2)}]"
    if fn in ("std", "var"):
        corr = rng.choice(["correction=0", "correction=1", "correction=2", "unbiased=False", ""])
        dims = rng.choice([f"dim={dim}", "dim=None", f"dim=({dim},)", ""])
        args = ", ".join(a for a in [x, dims, corr, f"keepdim={keep}" if dims else ""] if a)
        return f"torch.{fn}({args})"
    if fn == "logsumexp":
        return f"torch.logsumexp({x}, {dim}, keepdim={keep})"
    if fn in ("argmax", "argmin"):
        return f"{x}.{fn}({dim}, keepdim={keep})" if rng.random() < 0.7 else f"{x}.{fn}()"
    if rng.random() < 0.25:
        return f"{x}.{fn}()"
    if fn in ("sum", "mean", "amax", "amin", "norm") and rank >= 2 and rng.random() < 0.4:
        return f"{x}.{fn}(({0}, {rank - 1}), keepdim={keep})" if fn != "norm" else f"{x}.norm(dim=(0, -1))"
    return f"{x}.{fn}({dim}, keepdim={keep})" if fn != "norm" else f"{x}.norm(dim={dim}, keepdim={keep})"


def _matmul(b: _Builder) -> str:
    rng = b.rng
    n, k, m, batch = (rng.choice([1, 2, 3, 4, 8]) for _ in range(4))
    dtype = rng.choice([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64])
    left, right = rng.choice([((k,), (k,)), ((k,), (k, m)), ((n, k), (k,)), ((n, k), (k, m)),
                              ((batch, n, k), (batch, k, m)), ((batch, n, k), (k, m)), ((n, k), (batch, k, m)),
                              ((1, n, k), (batch, k, m)), ((batch, 1, n, k), (2, k, m)), ((k,), (batch, k, m)),
                              ((batch, n, k), (k,))])
    a = _operand_of_shape(b, left, dtype)
    c = _operand_of_shape(b, right, dtype)
    form = rng.choice(["{} @ {}", "torch.matmul({}, {})"] + (
        ["torch.mm({}, {})"] if len(left) == len(right) == 2 else []) + (
        ["torch.bmm({}, {})"] if len(left) == len(right) == 3 else []) + (
        ["torch.mv({}, {})"] if len(left) == 2 and len(right) == 1 else []) + (
        ["torch.dot({}, {})"] if len(left) == len(right) == 1 else []))
    return form.format(a, c)


def _operand_of_shape(b: _Builder, shape: tuple[int, ...], dtype: torch.dtype) -> str:
    same = [n for n in b.tensors if tuple(b.env[n].shape) == shape and b.env[n].dtype == dtype]
    if same and b.rng.random() < 0.6:
        return b.rng.choice(same)
    loose = [n for n in b.tensors if tuple(b.env[n].shape) == shape]
    if loose and b.rng.random() < 0.3:
        return f"{b.rng.choice(loose)}.to({DTYPE_NAMES[dtype]})"
    return b.new_input(shape, dtype)


def _cat(b: _Builder) -> str:
    rng = b.rng
    x = b.any_tensor()
    shape = tuple(b.env[x].shape)
    if not shape:
        return f"torch.stack([{x}, {b.operand_like(())}])" if rng.random() < 0.5 else f"torch.stack([{x}, {x}])"
    dim = rng.randrange(len(shape))
    parts = [x]
    for _ in range(rng.randint(1, 2)):
        other = list(shape)
        other[dim] = rng.choice([1, 2, 3])
        same = [n for n in b.tensors if tuple(b.env[n].shape) == tuple(other)]
        parts.append(rng.choice(same) if same and rng.random() < 0.5 else b.new_input(tuple(other)))
    if rng.random() < 0.3:
        same = [n for n in b.tensors if tuple(b.env[n].shape) == shape]
        return f"torch.stack([{x}, {rng.choice(same)}], dim={rng.randint(-len(shape) - 1, len(shape))})"
    fn = rng.choice(["torch.cat", "torch.concat", "torch.cat"])
    return f"{fn}([{', '.join(parts)}], dim={dim if rng.random() < 0.7 else dim - len(shape)})"


def _pad(b: _Builder) -> str:
    x = b.pick(lambda v: v.ndim >= 1) or b.new_input((3, 4))
    pads = [b.rng.choice([0, 1, 2, -1]) for _ in range(2 * b.rng.randint(1, min(2, b.env[x].ndim)))]
    return f"F.pad({x}, {tuple(pads)}, value={b.rng.choice([0.0, 1.5, -2])})"


def _inplace(b: _Builder) -> str | None:
    rng = b.rng
    on_input = rng.random() < 0.2
    x = b.pick(lambda v: True) if on_input else b.pick(lambda v: True)
    if x is None or (not on_input and x.startswith("a")):
        x = b.pick(lambda v: True)
        if x is None or x.startswith("a") and not on_input:
            return None
    shape = tuple(b.env[x].shape)
    roll = rng.random()
    if roll < 0.4:
        op = rng.choice(["add_", "mul_", "sub_", "div_"])
        return f"{x}.{op}({b.operand_like(shape)})"
    if roll < 0.55:
        return f"{x}.clamp_({rng.choice([-1, 0, -0.5])}, {rng.choice([1, 2, 0.5])})"
    if roll < 0.7 and shape:
        return f"{x}.__setitem__({rng.choice(['0', '(Ellipsis, -1)', 'slice(None, None, 2)'])}, " \
               f"{rng.choice(['0', '1.5', 'True'])}) or {x}"
    if roll < 0.8:
        return f"{x}.zero_()" if rng.random() < 0.5 else f"{x}.fill_({rng.choice([1, 2.5])})"
    if roll < 0.9 and shape:
        return f"{x}[0].mul_(2) if {x}.ndim else {x}.mul_(2)"
    return f"{x}.copy_({b.operand_like(shape)})"


def _misc(b: _Builder) -> str | None:
    """Indexing, creation and data-movement ops."""
    rng = b.rng
    x = b.any_tensor()
    shape = tuple(b.env[x].shape)
    rank = len(shape)
    d = rng.randrange(rank) if rank else 0
    n = shape[d] if rank else 1
    options = [f"torch.zeros_like({x})", f"torch.ones_like({x}, dtype=torch.float32)", f"{x}.new_full((2,), 3)",
               f"torch.full_like({x}, 2.5)", f"{x} + torch.arange({max(n, 1)})" if rank == 1 else f"{x} * 2",
               f"{x}.sum(dtype=torch.float64)", f"{x}.cumsum(0, dtype=torch.float32)" if rank else f"{x} + 0",
               f"torch.where({x} > 0, 1.5, 0)", f"torch.where({x} != 0, {x}, 2)",
               f"F.softmax({x}, -1, dtype=torch.float64)" if rank else f"{x}.exp()",
               f"{x}.expand_as({b.operand_like(shape)})"]
    if rank:
        index = f"torch.tensor({[rng.randrange(-n, n) if n else 0 for _ in range(3)]})"
        options += [f"{x}.flip({d})", f"torch.roll({x}, 1, {d})", f"{x}.repeat({', '.join(['2'] + ['1'] * (rank - 1))})",
                    f"{x}.index_select({d}, {index}.abs() % {max(n, 1)})", f"{x}[{index}]",
                    f"torch.gather({x}, {d}, torch.zeros_like({x}, dtype=torch.int64))",
                    f"{x}[..., None]", f"{x}[None]",
                    f"{x}.unbind({d})[0]", f"{x}.split(2, {d})[-1]", f"{x}.unflatten({d}, ({n}, 1))"]
    if rank >= 2:
        options += [f"torch.tril({x})", f"{x}.triu(1)", f"{x}.diagonal()",
                    f"{x}[[0, -1]][:, [1, 0]]" if shape[0] and shape[1] >= 2 else f"{x}.t()",
                    f"torch.einsum('ij->ji', {x})" if rank == 2 else f"{x}.sum(1)"]
    return rng.choice(options)


def _complex(b: _Builder) -> str:
    x = b.pick(lambda v: v.dtype == torch.float32) or b.new_input(b.random_shape(), torch.float32)
    z = b.try_statement(f"torch.complex({x}, {x} * 0.5)") if b.rng.random() < 0.5 else \
        b.try_statement(f"{x}.to(torch.complex64)")
    if z is None:
        return f"{x} * 1"
    return b.rng.choice([f"({z} * {z}).abs()", f"({z} + 1).real", f"torch.view_as_real({z} * 2)", f"{z}.abs()",
                         f"({z} * {z}).imag"])


# ---------------------------------------------------------------------------- programs
def generate(seed: int, max_statements: int = 7, complex_ops: bool = True, inplace_ops: bool = True,
             raise_rate: float = 0.04) -> Program:
    """A random straight-line program; the same seed always gives the same program."""
    rng = random.Random(seed)
    b = _Builder(rng, complex_ops, inplace_ops)
    for _ in range(rng.randint(1, 2)):
        b.new_input()
    for _ in range(rng.randint(2, max_statements)):
        _statement(b)
    if rng.random() < raise_rate:
        _raising_statement(b)
    results = [n for n in b.tensors if n.startswith("v")]
    if b.raised:
        outputs = [f"v{b.counter}"]
    elif not results:
        outputs = [b.tensors[-1]]
    else:
        outputs = [results[-1]] + rng.sample(results[:-1], min(len(results) - 1, rng.randint(0, 2)))
        if rng.random() < 0.05:
            outputs.append(rng.choice(b.tensors))  # an input, or a repeat: aliasing must match
    params = ", ".join(f"a{i}" for i in range(len(b.inputs)))
    body = "".join(f"    {line}\n" for line in b.lines)
    source = f"def program({params}):\n{body}    return ({', '.join(outputs)},)\n"
    return Program(seed, source, b.inputs, b.raised)


def _raising_statement(b: _Builder) -> None:
    """A last statement eager rejects (shape, dtype or index errors): ember must raise the same type."""
    x = b.any_tensor()
    shape = tuple(b.env[x].shape)
    other = b.new_input(tuple(s + 1 for s in shape) or (2,), torch.float32)
    expr = b.rng.choice([f"{x} + {other}", f"{x}.view(7, -1)", f"{x}.sum(dim={len(shape) + 1})",
                         f"torch.cat([{x}, {other}], dim=0)", f"{x} @ {other}", f"{x}.long().add_(0.5)",
                         f"{x}.bool().neg()", f"{x}.long().mean()"])
    b.try_statement(expr, allow_raise=True)
