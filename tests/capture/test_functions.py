"""Differential tests: captured functions against eager PyTorch."""
import collections
import dataclasses
import math

import pytest
import torch

SCALE = 2.0


def assert_same(actual, expected):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected)
        for k in expected:
            assert_same(actual[k], expected[k])
    elif dataclasses.is_dataclass(expected):
        assert type(actual) is type(expected)
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name))
    else:
        assert actual == expected


def check(compile_fn, fn, *args, **kwargs):
    captured = compile_fn(fn)
    assert_same(captured(*args, **kwargs), fn(*args, **kwargs))
    assert captured.events and captured.events[-1].graph is not None, captured.events[-1].break_reason
    return captured


def test_arithmetic_loop_and_shapes(compile_fn):
    def f(x, y):
        z = x + y * SCALE
        for i in range(x.shape[0]):
            z = z - i / 2
        if x.dim() == 2 and x.size(1) > 2:
            z = z @ y.T
        return torch.relu(z).sum(dim=-1), x.numel()
    check(compile_fn, f, torch.randn(3, 4), torch.randn(3, 4))


def test_python_values(compile_fn):
    def f(x, n, name, flag=True):
        values = [i * 2 for i in range(n) if i % 2 == 0]
        table = {k: v for k, v in zip("abc", values)}
        total = sum(values) + max(values) + min(values) + abs(-n) + len(table)
        s = f"{name}-{n:03d}-{total!r}"
        first, *rest = values
        a, b = divmod(n, 3)
        if flag and any(v > 3 for v in values) and all(v >= 0 for v in values) and "a" in table:
            x = x * math.sqrt(total) + math.pi
        t = tuple(reversed(values)) + (first,)
        return x + len(s) + len(rest) + a + b, t, s, sorted(values, reverse=True)
    check(compile_fn, f, torch.randn(4), 7, "nm")


def test_closures_and_nested_functions(compile_fn):
    offset = 3.0

    def make_adder(k):
        def add(t):
            return t + k + offset
        return add

    def f(x):
        inner_scale = 2

        def helper(t, power=2):
            return t ** power * inner_scale
        adder = make_adder(5)
        square = lambda t: t * t
        return adder(helper(x)) + square(x) + helper(x, power=3)
    check(compile_fn, f, torch.randn(5))


def test_kwargs_and_varargs(compile_fn):
    def inner(a, b, *rest, scale=1.0, **options):
        out = (a - b) * scale
        for r in rest:
            out = out + r
        if options.get("double"):
            out = out * 2
        return out

    def f(*xs, **kw):
        args = list(xs)
        return inner(*args, scale=kw.get("scale", 1.0), double=True)
    x = torch.randn(3)
    check(compile_fn, f, x, x + 1, x * 3, scale=0.5)


@dataclasses.dataclass
class Output:
    value: torch.Tensor
    aux: dict
    count: int = 0


Pair = collections.namedtuple("Pair", ["left", "right"])


def test_structured_returns(compile_fn):
    def f(x, pair):
        p = Pair(x + 1, right=pair.right * 2)
        return Output(p.left, {"r": p.right, "list": [x, None, 3]}, count=len(p)), p, None
    check(compile_fn, f, torch.randn(2), Pair(torch.randn(2), torch.randn(2)))


def test_input_returned_unchanged_is_same_object(compile_fn):
    def f(x, y):
        return x, y * 2, [x]
    captured = compile_fn(f)
    x, y = torch.randn(2), torch.randn(2)
    out = captured(x, y)
    assert out[0] is x and out[2][0] is x


def test_tensor_methods_indexing_and_setitem(compile_fn):
    def f(x, idx):
        y = x.clone()
        y[0] = y[1] * 2
        y[:, 1:3] += 1
        a, b = y.chunk(2, dim=1)
        values, indices = torch.max(y, dim=1)
        z = y[idx] + y[..., None, 0].squeeze(-1)[: y.shape[0] - 1].sum()
        return a.contiguous().view(-1), b.transpose(0, 1), values, indices, z, y.mT, y.to(torch.float64)
    check(compile_fn, f, torch.randn(4, 4), torch.tensor([0, 2]))


def test_in_place_on_input_and_mutated_python_containers(compile_fn):
    def f(x, items, table):
        x.add_(1)
        items.append(x * 2)
        items.pop(0)
        table["new"] = len(items)
        del table["old"]
        return x

    captured = compile_fn(f)
    for _ in range(3):
        x1, x2 = torch.zeros(3), torch.zeros(3)
        items1, items2 = [1, 2], [1, 2]
        table1, table2 = {"old": 1}, {"old": 1}
        out = captured(x1, items1, table1)
        f(x2, items2, table2)
        assert out is x1
        assert_same(x1, x2)
        assert_same(items1, items2)
        assert table1 == table2
    assert len([e for e in captured.events if e.graph is not None]) == 1


def test_no_grad_block(compile_fn):
    def f(x, w):
        with torch.no_grad():
            frozen = x * w
        return frozen + x * w, frozen.requires_grad

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    captured = check(compile_fn, f, x, w)
    out, flag = captured(x, w)
    assert out.requires_grad and flag is False


def test_factories_and_random(compile_fn):
    def f(x):
        noise = torch.zeros(x.shape, dtype=x.dtype) + torch.ones_like(x)
        r = torch.rand(3)
        return x + noise + torch.arange(x.shape[-1]), r.shape
    check(compile_fn, f, torch.randn(2, 5))


def test_dtype_and_rank_change_recompiles(compile_fn):
    def f(x):
        return x.sum(-1) * 2 if x.dim() > 1 else x * 3

    captured = compile_fn(f)
    for x in [torch.randn(3, 4), torch.randn(3, 4), torch.randn(5, 4), torch.randn(3, 4).double(),
              torch.randn(6), torch.randn(3, 4)]:
        assert_same(captured(x), f(x))
    assert len(captured.events) == 4
    assert all(e.recompile_reason for e in captured.events[1:])


def test_global_changes_recompile(compile_fn):
    global SCALE

    def f(x):
        return x * SCALE

    captured = compile_fn(f)
    x = torch.randn(3)
    assert_same(captured(x), x * 2.0)
    try:
        SCALE = 5.0
        assert_same(captured(x), x * 5.0)
    finally:
        SCALE = 2.0
    assert "G['SCALE']" in captured.events[-1].recompile_reason


def test_closure_cell_change_recompiles(compile_fn):
    factor = 2

    def f(x):
        return x * factor

    captured = compile_fn(f)
    x = torch.randn(3)
    assert_same(captured(x), x * 2)
    factor = 3
    assert_same(captured(x), x * 3)
    assert len(captured.events) == 2


def test_aliased_inputs_are_guarded(compile_fn):
    def f(a, b):
        a.mul_(2)
        return a + b

    captured = compile_fn(f)
    x, y = torch.ones(3), torch.ones(3)
    assert_same(captured(x, y), torch.full((3,), 3.0))
    z = torch.ones(3)
    assert_same(captured(z, z), torch.full((3,), 4.0))


def test_cache_size_limit_warns_once(compile_fn):
    def f(x, n):
        return x + n

    captured = compile_fn(f, cache_size_limit=2)
    x = torch.randn(2)
    with pytest.warns(UserWarning, match="L\\['n'\\]") as record:
        for n in range(5):
            assert_same(captured(x, n), x + n)
    assert len([w for w in record if "cache size limit" in str(w.message)]) == 1
    assert len(captured.entries) == 2
