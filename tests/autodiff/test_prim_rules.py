"""Differential tests of the prim VJP rules (ember/autodiff/prim_rules.py).

Each test builds a prim graph by hand: the forward prim, a gradient placeholder, and the rule's
gradients as outputs; runs it with the prims' eager references (Graph.run) and compares with
torch.autograd.grad of the prim's reference.  A handful of rule graphs also go through the real
code generator (compile_graph with fallback="error").
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import ember.autodiff.prim_rules  # noqa: F401  (registers the rules)
from ember.autodiff.rules import PRIM_RULES
from ember.graph import Graph, TensorMeta, tree_leaves, tree_map
from ember.prims import primitives as P
from ember.prims.values import Emitter, Value, building, emit

FP32_TOL = {"rtol": 1e-5, "atol": 1e-6}
BF16_TOL = {"rtol": 2e-2, "atol": 2e-2}


# ==================================================================== harness
def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def build_rule_graph(prim: P.Prim, args: list, grads_wanted: tuple[bool, ...] | None = None):
    """Graph(*tensor leaves of args, *grads) -> the rule's non-None gradients.

    Returns (graph, grad tensors, rule result, forward output Value)."""
    g = Graph()
    with building(Emitter(g)):
        counter = iter(range(10_000))
        as_value = lambda t: Value(g.placeholder(f"x{next(counter)}", TensorMeta.of(t)), TensorMeta.of(t)) \
            if isinstance(t, torch.Tensor) else t  # noqa: E731
        values = tree_map(as_value, args)
        out = emit(prim, *values)
        outs = out if isinstance(out, tuple) else (out,)
        wanted = grads_wanted or (True,) * len(outs)
        grad_tensors, grad_values = [], []
        for o, want in zip(outs, wanted):
            if not want:
                grad_values.append(None)
                continue
            t = torch.randn(o.shape, dtype=torch.float32).to(o.dtype).to(o.device)
            grad_tensors.append(t)
            grad_values.append(Value(g.placeholder(f"grad{len(grad_tensors)}", TensorMeta.of(t)), TensorMeta.of(t)))
        grad = tuple(grad_values) if isinstance(out, tuple) else grad_values[0]
        result = PRIM_RULES[prim.name](grad, out, *values)
        assert isinstance(result, tuple) and len(result) == len(args), \
            f"{prim.name}: one entry per positional argument, got {result}"
        pairs = _pair_with_args(prim.name, args, result)
        g.output([v.node for _, v in pairs if v is not None])
    return g, grad_tensors, pairs


def _pair_with_args(name: str, args: list, result: tuple) -> list[tuple[torch.Tensor, Any]]:
    """(input tensor, its gradient Value or None) for every tensor of args, in leaf order."""
    pairs = []
    for arg, entry in zip(args, result):
        if isinstance(arg, list):
            assert entry is None or (isinstance(entry, list) and len(entry) == len(arg)), (name, entry)
            entries = entry if entry is not None else [None] * len(arg)
            pairs += [(a, e) for a, e in zip(arg, entries) if isinstance(a, torch.Tensor)]
            continue
        if not isinstance(arg, torch.Tensor):
            assert entry is None, f"{name}: a gradient for the constant {arg!r}"
            continue
        pairs.append((arg, entry))
    return pairs


def expected_grads(prim: P.Prim, args: list, grad_tensors: list, grads_wanted=None, reference=None) -> list[Any]:
    """torch.autograd.grad of the prim's eager reference, for every floating input (None if not)."""
    inputs = [t for t in tree_leaves(args) if _is_float(t)]
    leaves = {id(t): t.detach().requires_grad_() for t in inputs}   # detach keeps the strides
    ref_args = tree_map(lambda v: leaves.get(id(v), v) if isinstance(v, torch.Tensor) else v, args)
    out = (reference or prim.reference)(*ref_args)
    outs = out if isinstance(out, tuple) else (out,)
    wanted = grads_wanted or (True,) * len(outs)
    used = [o for o, w in zip(outs, wanted) if w]
    try:
        grads = torch.autograd.grad(used, list(leaves.values()), grad_tensors, allow_unused=True)
    except (RuntimeError, NotImplementedError):    # eager has no derivative (floor_divide): zeros
        grads = [None] * len(leaves)
    by_id = {id(t): (gr if gr is not None else torch.zeros_like(t)) for t, gr in zip(inputs, grads)}
    return [by_id.get(id(t)) for t in tree_leaves(args) if isinstance(t, torch.Tensor)]


def check_rule(name: str, args: list, grads_wanted=None, compile: bool = False, reference=None,
               device: str = "cpu", **tolerance: Any) -> None:
    """The rule's gradients equal autograd's of the prim's reference (or of `reference`, an
    equivalent function where eager's own derivative fails)."""
    prim = P.get(name)
    args = tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, args)
    tolerance = tolerance or (BF16_TOL if any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
                                              for t in tree_leaves(args)) else FP32_TOL)
    g, grad_tensors, pairs = build_rule_graph(prim, args, grads_wanted)
    expected = expected_grads(prim, args, grad_tensors, grads_wanted, reference)
    leaves = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
    if compile:
        from ember.backend import compile_graph
        compiled = compile_graph(g, [*leaves, *grad_tensors], {"fallback": "error"})
        assert getattr(compiled, "kind", "kernels") == "kernels", getattr(compiled, "eager_reason", "")
        actual = list(compiled(*leaves, *grad_tensors))
    else:
        actual = list(g.run(*leaves, *grad_tensors))
    for (tensor, value), want in zip(pairs, expected):
        if not _is_float(tensor):
            assert value is None, f"{name}: a gradient for a {tensor.dtype} tensor"
            continue
        assert want is not None
        if value is None:    # no gradient: only right where eager's is identically zero
            assert not want.any(), f"{name}: missing a nonzero gradient"
            continue
        # the rule's meta: exactly the argument's shape and dtype
        assert tuple(value.shape) == tuple(tensor.shape) and value.dtype == tensor.dtype, \
            f"{name}: gradient meta {value.meta} for a {tensor.dtype}{tuple(tensor.shape)} argument"
        got = actual.pop(0)
        assert got.shape == tensor.shape and got.dtype == tensor.dtype
        torch.testing.assert_close(got, want, equal_nan=True, **tolerance)
    assert not actual


# ================================================================== registry
def test_every_prim_has_a_rule():
    missing = sorted(set(P.REGISTRY) - set(PRIM_RULES))
    assert not missing, f"prims without a VJP rule: {missing}"
    assert not set(PRIM_RULES) - set(P.REGISTRY), "rules for names that are no prims"


# ============================================================ unary elementwise
def _with_edges(values: torch.Tensor, edges: list[float]) -> torch.Tensor:
    flat = values.reshape(-1).clone()
    flat[:len(edges)] = torch.tensor(edges)
    return flat.reshape(values.shape)


def _uniform(low: float, high: float, shape=(4, 6)) -> torch.Tensor:
    return torch.rand(shape) * (high - low) + low


# input domain of each unary prim (default: normal * 2 with zeros, ties, negatives and large values)
UNARY_DOMAIN = {
    "log": lambda: _with_edges(_uniform(0.05, 5), [0.0, 1.0, 100.0]),
    "log2": lambda: _with_edges(_uniform(0.05, 5), [0.0, 1.0, 100.0]),
    "log10": lambda: _with_edges(_uniform(0.05, 5), [0.0, 1.0, 100.0]),
    "sqrt": lambda: _with_edges(_uniform(0.05, 5), [0.0, 1.0, 1e4]),
    "rsqrt": lambda: _with_edges(_uniform(0.05, 5), [1.0, 1e4]),
    "reciprocal": lambda: _with_edges(_uniform(0.2, 5) * torch.randint(0, 2, (4, 6)).mul(2).sub(1), [1.0, -1.0]),
    "lgamma": lambda: _with_edges(_uniform(0.1, 6), [1.0, 2.0, -2.5, -0.5]),
    "log1p": lambda: _with_edges(_uniform(-0.9, 5), [0.0, 100.0]),
    "asin": lambda: _with_edges(_uniform(-0.95, 0.95), [0.0]),
    "acos": lambda: _with_edges(_uniform(-0.95, 0.95), [0.0]),
    "atanh": lambda: _with_edges(_uniform(-0.95, 0.95), [0.0]),
    "erfinv": lambda: _with_edges(_uniform(-0.95, 0.95), [0.0]),
    "acosh": lambda: _with_edges(_uniform(1.05, 6), [100.0]),
    "tan": lambda: _with_edges(_uniform(-1.4, 1.4), [0.0]),
    "exp": lambda: _with_edges(torch.randn(4, 6) * 3, [0.0, -80.0, 20.0]),
    "exp2": lambda: _with_edges(torch.randn(4, 6) * 3, [0.0, -80.0, 20.0]),
    "expm1": lambda: _with_edges(torch.randn(4, 6) * 3, [0.0, -80.0, 20.0]),
    "sinh": lambda: _with_edges(torch.randn(4, 6) * 3, [0.0, 10.0]),
    "cosh": lambda: _with_edges(torch.randn(4, 6) * 3, [0.0, 10.0]),
}
BOOL_INPUT = {"logical_not"}
INT_INPUT = {"bitwise_not"}


def _unary_input(name: str) -> torch.Tensor:
    if name in BOOL_INPUT:
        return torch.rand(4, 6) > 0.5
    if name in INT_INPUT:
        return torch.randint(-50, 50, (4, 6), dtype=torch.int32)
    if name in UNARY_DOMAIN:
        return UNARY_DOMAIN[name]()
    # zeros (abs'(0) = 0), halves (round), NaN/inf (isnan ...), large values
    return _with_edges(torch.randn(4, 6) * 2, [0.0, -0.0, 0.5, -1.5, 1e4, -1e4, 3.0])


# eager computes these derivatives with other (equivalent) formulas: a few ulps apart
UNARY_TOL = {"lgamma": {"rtol": 1e-4, "atol": 1e-5}, "erfinv": {"rtol": 1e-4, "atol": 1e-5}}


@pytest.mark.parametrize("name", sorted(P.UNARY))
def test_unary(name):
    check_rule(name, [_unary_input(name)], **UNARY_TOL.get(name, {}))


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "sqrt", "log", "sin", "abs", "erf"])
def test_unary_bf16(name):
    check_rule(name, [_unary_input(name).abs().add(0.1).to(torch.bfloat16)])


@pytest.mark.parametrize("name,args", [("sum", [(1,)]), ("amax", [(0, 1)]), ("var_mean", [(1,), 1]),
                                       ("cumsum", [1]), ("prod", [(1,)]), ("expand", [(4, 6)])])
def test_reductions_bf16(name, args):
    x = _ties() if name != "expand" else torch.randn(4, 1)
    check_rule(name, [x.to(torch.bfloat16), *args])


def test_unary_on_integers_gets_no_gradient():
    for name in ["neg", "abs", "sign", "floor"]:
        check_rule(name, [torch.randint(-5, 5, (3, 4))])


# ============================================================ binary elementwise
BOOL_BINARY = {"logical_and", "logical_or", "logical_xor"}
INT_BINARY = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"}


def _binary_inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (5, 6)
    if name in BOOL_BINARY:
        return torch.rand(shape) > 0.5, torch.rand(shape) > 0.5
    if name in INT_BINARY:
        return torch.randint(0, 100, shape, dtype=torch.int32), torch.randint(0, 5, shape, dtype=torch.int32)
    a, b = torch.randn(shape) * 2, torch.randn(shape) * 2
    b[0] = a[0]                       # ties (maximum/minimum split them)
    a[1, :3] = 0.0                    # zeros (copysign, pow's zero base)
    b[1, 3:] = 0.0
    if name == "pow":
        a = a.abs() + 0.1
        a[1, :4] = 0.0                # 0 ** (b in {x, 0, 1, 0.5, -1}); 0**0 grad of the base is 0
        b[1, :4] = torch.tensor([0.0, 1.0, 0.5, 2.0])
        b[0] = a[0]
    if name in ("div", "remainder", "fmod", "floor_divide"):
        b = torch.where(b.abs() < 0.3, torch.full_like(b, 0.7), b)
    if name in ("maximum", "minimum"):
        a[2, 0] = math.nan            # NaN: eager gives both operands the gradient
    if name in ("atan2", "hypot"):
        a[1, 3], b[1, 3] = 0.0, 0.0   # the origin: NaN gradients as eager
    return a, b


@pytest.mark.parametrize("name", sorted(P.BINARY))
def test_binary(name):
    check_rule(name, list(_binary_inputs(name)))


SCALAR_OPERAND = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "fmod", "atan2",
                  "hypot", "copysign"]


@pytest.mark.parametrize("name", SCALAR_OPERAND)
@pytest.mark.parametrize("scalar", [1.5, 0.0, -2.0])
def test_binary_scalar_second(name, scalar):
    if name in ("div", "remainder", "fmod") and scalar == 0.0:
        pytest.skip("division by zero")
    a, _ = _binary_inputs(name)
    a[0, :2] = scalar                 # ties with the scalar
    check_rule(name, [a, scalar])


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2"])
@pytest.mark.parametrize("scalar", [2.0, 0.0])
def test_binary_scalar_first(name, scalar):
    _, b = _binary_inputs(name)
    if name == "div":
        b = torch.where(b.abs() < 0.3, torch.full_like(b, 0.7), b)
    check_rule(name, [scalar, b])


@pytest.mark.parametrize("name", ["pow", "mul", "maximum", "copysign"])
@pytest.mark.parametrize("scalar", [0.0, 2.0])
@pytest.mark.parametrize("scalar_first", [False, True])
def test_binary_runtime_scalar(name, scalar, scalar_first):
    """A runtime Python scalar operand (a graph input, not a constant) gets no gradient."""
    x = _binary_inputs(name)[0 if not scalar_first else 1]
    x[0, :2] = scalar
    if scalar_first and name in ("copysign",):
        pytest.skip("copysign's magnitude operand is a tensor")
    g = Graph()
    with building(Emitter(g)):
        tensor = Value(g.placeholder("x", TensorMeta.of(x)), TensorMeta.of(x))
        number = Value(g.placeholder("s", None), None, float)
        operands = (number, tensor) if scalar_first else (tensor, number)
        out = emit(P.get(name), *operands)
        grad = torch.randn(x.shape)
        grads = PRIM_RULES[name](Value(g.placeholder("grad", TensorMeta.of(grad)), TensorMeta.of(grad)), out, *operands)
        assert grads[0 if scalar_first else 1] is None
        g.output([grads[1 if scalar_first else 0].node])
    (actual,) = g.run(x, scalar, grad)
    leaf = x.clone().requires_grad_()
    ref = P.get(name).reference(*((scalar, leaf) if scalar_first else (leaf, scalar)))
    (expected,) = torch.autograd.grad(ref, leaf, grad)
    torch.testing.assert_close(actual, expected, equal_nan=True, **FP32_TOL)


@pytest.mark.parametrize("name", ["mul", "div", "pow", "maximum", "atan2", "sub"])
def test_binary_bf16(name):
    a, b = _binary_inputs(name)
    if name == "div":
        b = b.abs() + 0.5
    check_rule(name, [a.to(torch.bfloat16), b.to(torch.bfloat16)])


# ======================================================== other elementwise
def test_where():
    cond = torch.rand(4, 5) > 0.5
    check_rule("where", [cond, torch.randn(4, 5), torch.randn(4, 5)])
    check_rule("where", [cond, torch.randn(4, 5), 0.0])
    check_rule("where", [cond, 1.0, torch.randn(4, 5)])


def test_clone_and_detach():
    check_rule("clone", [torch.randn(3, 4)])
    check_rule("clone", [torch.randn(4, 3).t()])
    check_rule("detach", [torch.randn(3, 4)])


@pytest.mark.parametrize("source,target", [(torch.float32, torch.float64), (torch.float32, torch.bfloat16),
                                           (torch.bfloat16, torch.float32), (torch.float32, torch.int32),
                                           (torch.int64, torch.float32)])
def test_convert_element_type(source, target):
    check_rule("convert_element_type", [torch.randn(3, 4).mul(5).to(source), target], **FP32_TOL)


# ======================================================================= views
def test_reshape_permute_expand():
    check_rule("reshape", [torch.randn(4, 6), (2, 3, 4)])
    check_rule("reshape", [torch.randn(4, 6).t(), (24,)])
    check_rule("permute", [torch.randn(2, 3, 4), (2, 0, 1)])
    check_rule("permute", [torch.randn(2, 3, 4, 5), (1, 3, 0, 2)])
    check_rule("expand", [torch.randn(3, 1, 4), (3, 5, 4)])
    check_rule("expand", [torch.randn(1, 1, 1), (2, 3, 4)])
    check_rule("expand", [torch.randn(3, 4), (3, 4)])


@pytest.mark.parametrize("dim,start,end,step", [(0, 1, 4, 1), (1, 0, 6, 1), (1, 2, 2, 1), (1, 0, 7, 2),
                                                (1, 1, 7, 2), (0, 0, 5, 3), (1, 2, 6, 3), (1, 3, 4, 5),
                                                (1, 0, 7, 7), (2, 1, 3, 1)])
def test_slice(dim, start, end, step):
    check_rule("slice", [torch.randn(5, 7, 3), dim, start, end, step])


def _as_strided_cases():
    base = torch.randn(6, 5)
    return [
        (base, (3, 3), (5, 1), 2),                  # a window of a contiguous input
        (base, (4, 4), (1, 1), 0),                  # overlapping output: gradients add up
        (base, (30,), (1,), 0),                     # the whole storage
        (base, (2, 3), (10, 2), 7),
        (torch.randn(5, 6).t(), (3, 2), (1, 6), 1),     # a transposed (non-contiguous) input
        (torch.randn(8, 5)[2:], (4, 2), (5, 1), 11),  # an input with a storage offset
        (torch.randn(8, 5)[2:], (2, 2), (5, 1), 5),   # reading storage before the input's own
        (torch.randn(6).as_strided((3, 3), (1, 1)), (2, 2), (2, 1), 0),   # an overlapping input
    ]


@pytest.mark.parametrize("case", range(8))
def test_as_strided(case):
    x, size, stride, offset = _as_strided_cases()[case]
    check_rule("as_strided", [x, size, stride, offset])


# ================================================================== reductions
def _ties(shape=(4, 6)) -> torch.Tensor:
    x = torch.randn(shape)
    x[0] = 1.5                        # a row of ties
    x[1, :3] = x[1].max() + 1         # ties at the maximum
    x[2, :2] = x[2].min() - 1         # ties at the minimum
    return x


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 1), ()])
def test_sum(dims):
    check_rule("sum", [torch.randn(4, 6), dims])
    check_rule("sum", [torch.randn(3, 4, 5), tuple(d + 1 for d in dims)])


@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize("dims", [(0,), (1,), (0, 1), ()])
def test_amax_amin(name, dims):
    check_rule(name, [_ties(), dims])


def test_amax_nan():
    x = _ties()
    x[3, 2] = math.nan
    check_rule("amax", [x, (1,)])
    check_rule("amin", [x, (0, 1)])


def _with_zeros(count_per_row: list[int]) -> torch.Tensor:
    x = torch.randn(len(count_per_row), 5).add(0.1)
    for row, count in enumerate(count_per_row):
        x[row, :count] = 0.0
    return x


@pytest.mark.parametrize("dims", [(1,), (0, 1), ()])
@pytest.mark.parametrize("zeros", [[0, 0, 0], [0, 1, 2], [1, 0, 0], [2, 0, 0], [0, 0, 0, 5]])
def test_prod(dims, zeros):
    check_rule("prod", [_with_zeros(zeros), dims], rtol=1e-4, atol=1e-6)


def test_prod_middle_dim():
    x = torch.randn(3, 4, 2)
    x[1, 2, 0] = 0.0
    check_rule("prod", [x, (1,)], rtol=1e-4, atol=1e-6)
    check_rule("prod", [x, (0, 2)], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions(name):
    check_rule(name, [_ties(), 1])


@pytest.mark.parametrize("wanted", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dims,correction", [((1,), 1), ((0,), 0), ((0, 1), 1), ((1,), 2)])
def test_var_mean(wanted, dims, correction):
    check_rule("var_mean", [torch.randn(4, 6) * 3 + 1, dims, correction], grads_wanted=wanted, rtol=1e-4, atol=1e-5)


def test_var_mean_zero_degrees_of_freedom():
    x = torch.randn(3, 2)
    x[0, 1] = x[0, 0]                 # x == mean in row 0: inf * 0 = NaN as eager
    check_rule("var_mean", [x, (1,), 2])


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cumsum(dim):
    check_rule("cumsum", [torch.randn(3, 5, 4), dim])
    check_rule("cumsum", [torch.randn(1, 1, 1), dim])


# ===================================================== creation and randomness
def test_creation_prims_get_no_gradients():
    for name, args in [("iota", [5, 0, 1, torch.int64, torch.device("cpu")]),
                       ("full", [(2, 3), 1.5, torch.float32, torch.device("cpu")]),
                       ("philox_rand", [(2, 3), 1, 0, torch.float32, torch.device("cpu")])]:
        assert PRIM_RULES[name](None, None, *args) == (None,) * len(args)


# ==================================================================== indexing
def test_gather():
    x = torch.randn(4, 5)
    check_rule("gather", [x, 1, torch.randint(0, 5, (4, 7))])   # repeated indices accumulate
    check_rule("gather", [x, 0, torch.randint(0, 4, (3, 5))])


def test_index():
    x = torch.randn(5, 4, 3)
    repeated = torch.tensor([0, 2, 2, 4, 0])
    check_rule("index", [x, [repeated]])
    check_rule("index", [x, [None, torch.tensor([[3, 1], [1, 1]])]])
    check_rule("index", [x, [repeated, None, torch.tensor([2, 1, 0, 0, 1])]])   # non-adjacent


def test_scatter():
    x = torch.randn(4, 6)
    index = torch.stack([torch.randperm(6)[:3] for _ in range(2)])   # distinct per row: deterministic
    check_rule("scatter", [x, 1, index, torch.randn(2, 3)])
    # a src larger than index (only its index-shaped corner is read; eager's backward rejects it)
    check_rule("scatter", [x, 1, index, torch.randn(3, 4)],
               reference=lambda x, dim, index, src: torch.scatter(x, dim, index, src[:2, :3]))
    check_rule("scatter_add", [x, 1, torch.randint(0, 6, (3, 8)), torch.randn(3, 8)])
    check_rule("scatter_add", [x, 0, torch.randint(0, 4, (2, 6)), torch.randn(2, 6)])


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    x = torch.randn(5, 4)
    rows = torch.tensor([0, 3, 1])
    check_rule("index_put", [x, [rows], torch.randn(3, 4), accumulate])
    check_rule("index_put", [x, [rows, torch.tensor([1, 1, 2])], torch.randn(3), accumulate])
    check_rule("index_put", [x, [None, torch.tensor([2, 0])], torch.randn(5, 2), accumulate])
    check_rule("index_put", [x, [rows], torch.randn(4), accumulate])       # values broadcast over rows
    if accumulate:
        check_rule("index_put", [x, [torch.tensor([1, 1, 4])], torch.randn(3, 4), accumulate])


def test_cat():
    check_rule("cat", [[torch.randn(2, 3), torch.randn(4, 3), torch.randn(1, 3)], 0])
    check_rule("cat", [[torch.randn(2, 3), torch.randn(2, 0), torch.randn(2, 5)], 1])
    check_rule("cat", [[torch.randn(2, 3), torch.randint(0, 3, (2, 2)).float(), torch.randn(2, 1)], 1])
    check_rule("cat", [[torch.randn(3, 2)], 0])


@pytest.mark.parametrize("pad", [[1, 2], [0, 0, 2, 1], [-1, 2], [1, -2, -1, 0], [0, 0, 0, 0, 1, 1]])
def test_constant_pad(pad):
    check_rule("constant_pad", [torch.randn(2, 4, 5), pad, 0.0])
    check_rule("constant_pad", [torch.randn(2, 4, 5), pad, 3.5])


def _pool_args(kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1), size=(7, 6)):
    """(x, index of its windows' maxima, window): a max pooling's pieces."""
    x = torch.randn(2, 3, *size)
    index = torch.nn.functional.max_pool2d(x, kernel, stride, padding, dilation, return_indices=True)[1]
    return x, index.to(torch.int16), (kernel, stride, padding, dilation)


@pytest.mark.parametrize("window", [{}, {"kernel": (2, 3), "stride": (1, 2), "padding": (0, 1)},
                                    {"dilation": (2, 1), "padding": (0, 0)}])
def test_pool_select_and_scatter(window):
    x, index, args = _pool_args(**window)
    check_rule("pool_select", [x, index, *args])
    grad = torch.randn(index.shape)
    check_rule("pool_scatter", [grad, index, x.shape[-2], x.shape[-1], *args])


def _pool_rule_args(which):
    x, index, window = _pool_args()
    if which == "select":
        return [x, index, *window]
    return [torch.randn(index.shape), index, x.shape[-2], x.shape[-1], *window]


def test_pool_argmax_has_no_gradient():
    x, _, args = _pool_args()
    check_rule("pool_argmax", [x, *args, False, torch.int16])


# ============================================== through the real code generator
COMPILED = {
    "mul": lambda: list(_binary_inputs("mul")),
    "exp": lambda: [_unary_input("exp")],
    "sum": lambda: [torch.randn(4, 6), (1,)],
    "expand": lambda: [torch.randn(3, 1, 4), (3, 5, 4)],
    "slice": lambda: [torch.randn(5, 7, 3), 1, 1, 7, 2],
    "gather": lambda: [torch.randn(4, 5), 1, torch.randint(0, 5, (4, 7))],
    "cat": lambda: [[torch.randn(2, 3), torch.randn(4, 3)], 0],
    "var_mean": lambda: [torch.randn(4, 6), (1,), 1],
    "amax": lambda: [_ties(), (1,)],
    "cumsum": lambda: [torch.randn(3, 5), 1],
    "maximum": lambda: list(_binary_inputs("maximum")),
    "index": lambda: [torch.randn(5, 3), [torch.tensor([0, 2, 2, 4])]],
    "constant_pad": lambda: [torch.randn(2, 4, 5), [1, -2, -1, 0], 0.0],
    "pool_select": lambda: _pool_rule_args("select"),
    "pool_scatter": lambda: _pool_rule_args("scatter"),
    "as_strided": lambda: [torch.randn(5, 6).t(), (3, 2), (1, 6), 1],
    "prod": lambda: [_with_zeros([0, 1, 2]), (1,)],
    "scatter": lambda: [torch.randn(4, 6), 1, torch.stack([torch.randperm(6)[:3] for _ in range(2)]),
                        torch.randn(2, 3)],
    "index_put": lambda: [torch.randn(5, 4), [torch.tensor([0, 3, 1])], torch.randn(4), False],
    "lgamma": lambda: [_unary_input("lgamma")],     # digamma is an Extern
    "pow": lambda: list(_binary_inputs("pow")),
}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled(name, device):
    check_rule(name, COMPILED[name](), compile=True, device=device, rtol=1e-5, atol=1e-5)
