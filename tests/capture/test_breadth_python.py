"""Python features kept in one graph (issue #10): generators (run lazily, as eager runs them),
nn.Module iteration (modules(), named_parameters() ...), torch.overrides queries, properties,
dataclasses, torch.Size arithmetic, isinstance, super(), functools.partial, getattr/hasattr,
dict.get, enumerate/zip/reversed/sorted, f-strings with shapes."""
from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from .breadth_util import assert_same, check

torch.manual_seed(0)


# ---------------------------------------------------------------- generators
def scaled(x, n):
    for i in range(n):
        yield x * i
    return "done"


def test_generator_consumed_by_for_sum_list_next():
    def f(x):
        total = sum(scaled(x, 3))
        items = list(scaled(x, 2))
        it = scaled(x, 5)
        first, second = next(it), next(it)
        out = []
        for y in scaled(x, 4):
            out.append(y + 1)
        return total + items[1] + first + second, torch.stack(out)
    check(f, (torch.randn(3),), (torch.randn(3),))


def _inner():
    yield 1
    yield 2


def _outer(x):
    result = yield from scaled(x, 2)
    yield result
    yield from _inner()


def test_yield_from_and_generator_return_value():
    def f(x):
        items = list(_outer(x))
        return items[0] + items[1], items[2], items[3:]
    check(f, (torch.randn(3),), (torch.randn(2),))


def _counter():
    i = 0
    while True:
        yield i
        i += 1


def test_infinite_generator_left_early_and_zip_enumerate_any():
    def f(x):
        for i in _counter():
            if i > 3:
                break
            x = x + i
        pairs = [i * t for i, t in zip(range(2), scaled(x, 10))]
        found = any(t.shape[0] > 1 for t in scaled(x, 10 ** 9))
        return x, pairs, found, list(enumerate(scaled(x, 2))), list(map(lambda t: t * 2, scaled(x, 2)))
    check(f, (torch.randn(3),), (torch.randn(3),))


LOG = []


def _logging_generator(x):
    for i in range(3):
        LOG.append(i)
        yield x + len(LOG)


def test_generator_interleaved_with_consumer_reads_global_state():
    def f(x):
        seen = []
        for y in _logging_generator(x):
            seen.append(y * len(LOG))  # eager: the generator appended once per item so far
        return seen
    check_calls = []
    x = torch.randn(3)
    from .breadth_util import assert_one_graph
    LOG.clear()
    assert_one_graph(f, x)
    import ember
    compiled = ember.compile(f, fullgraph=True)
    for _ in range(2):
        LOG.clear()
        actual, actual_log = compiled(x), list(LOG)
        LOG.clear()
        expected, expected_log = f(x), list(LOG)
        assert_same(actual, expected)
        assert actual_log == expected_log == [0, 1, 2]
        check_calls.append(1)
    assert len(check_calls) == 2


def test_generator_expression_is_lazy():
    def f(x, xs):
        gen = (t * 2 for t in xs)
        xs.append(x)  # eager's genexpr iterates the list when consumed: it sees the new item
        return list(gen)
    import ember
    from .breadth_util import assert_one_graph
    assert_one_graph(f, torch.randn(2), [torch.randn(2)])
    compiled = ember.compile(f, fullgraph=True)
    for _ in range(2):
        x, y = torch.randn(2), torch.randn(2)
        a_list, e_list = [y], [y]
        assert_same(compiled(x, a_list), f(x, e_list))
        assert_same(a_list, e_list)


# ---------------------------------------------------------------- module iteration
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.norm = nn.LayerNorm(4)
        self.register_buffer("offset", torch.ones(4))
        self.tied = self.body[0]  # the same module twice: modules() yields it once

    def forward(self, x):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                x = module(x)
        names = [name for name, _ in self.named_modules()]
        children = [name for name, _ in self.named_children()]
        total = sum(p.sum() for p in self.parameters())
        params = [name for name, _ in self.named_parameters()]
        buffers = [name for name, b in self.named_buffers()]
        for b in self.buffers():
            x = x + b
        first = next(self.children())
        return self.norm(x) + total, names, children, params, buffers, type(first).__name__


def test_module_iteration():
    net = Net()
    check(net, (torch.randn(2, 4),), (torch.randn(3, 4),))


def test_named_parameters_with_shared_weight_and_prefix():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    seq = nn.Sequential(a, b)

    def f(x):
        names = [name for name, _ in seq.named_parameters(prefix="m")]
        n_all = len(list(seq.named_parameters(remove_duplicate=False)))
        return seq(x) * len(names), names, n_all

    check(f, (torch.randn(2, 3),), (torch.randn(2, 3),))


# ---------------------------------------------------------------- torch.overrides, Python objects
def test_torch_function_queries_are_false_for_plain_tensors():
    weight = nn.Parameter(torch.randn(3))

    def f(x):
        flags = (torch.overrides.has_torch_function((x, weight)), torch.overrides.has_torch_function_unary(x),
                 torch.overrides.has_torch_function_variadic(x, None, weight))
        return x * weight, flags, torch.is_floating_point(x), torch.is_tensor(weight)

    check(f, (torch.randn(3),), (torch.randn(3),))


class Scaler:
    def __init__(self, scale):
        self.scale = scale

    @property
    def double(self):
        return self.scale * 2


@dataclasses.dataclass
class Result:
    value: torch.Tensor
    rows: int
    tag: str = "r"


def test_property_dataclass_partial_getattr_dict_get():
    scaler = Scaler(1.5)
    options = {"bias": 1.0}

    def f(x):
        add = functools.partial(torch.add, alpha=2)
        affine = functools.partial(lambda a, b, c=1: a * b + c, c=3)
        y = add(x, x) + affine(x, 2) + scaler.double
        y = y + getattr(scaler, "scale", 0.0) + getattr(scaler, "missing", 2.0) + hasattr(scaler, "double")
        y = y * options.get("bias") + options.get("absent", 0.5)
        return Result(y, x.shape[0], tag=f"{tuple(x.shape)}:{x.shape[-1]:>3}:{x.dtype}")

    check(f, (torch.randn(2, 3),), (torch.randn(4, 3),))


def test_size_arithmetic():
    def f(x):
        shape = x.shape
        new_shape = shape[1:] + (4,)
        y = x.new_zeros(new_shape).sum() + torch.Size([2, 3]).numel() + shape.numel()
        same = (shape == (2, 3), shape[-1:] == torch.Size([3]), shape[:1] < (3,), len(shape[:1]))
        return x.reshape(*shape[:-1], 3, 1).flatten(-2) + y, new_shape, same, shape[::-1]

    check(f, (torch.randn(2, 3),), (torch.randn(2, 3),))


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x)


class Child(Base):
    def forward(self, x):
        return super().forward(x) + super(Child, self).forward(x * 2)


def test_super_isinstance_enumerate_zip_reversed_sorted():
    child = Child()
    seq = nn.Sequential(nn.Linear(3, 3), nn.GELU(), nn.Linear(3, 3))

    def f(x):
        x = child(x)
        order = []
        for i, module in enumerate(seq):
            if isinstance(module, nn.Linear):
                x = module(x)
            elif isinstance(module, (nn.ReLU, nn.GELU)):
                x = module(x) * 2
            order.append(i)
        for a, module in zip([10, 20], reversed(seq)):
            order.append(a + isinstance(module, nn.Module))
        return x, order, sorted([3, 1, 2], reverse=True), [type(m).__name__ for m in reversed(list(seq))]

    check(f, (torch.randn(2, 3),), (torch.randn(5, 3),))


def test_string_join_over_a_generator_of_shape_dims():
    def f(x):
        label = "x".join(str(d) for d in x.shape)
        return x.flatten() * len(label), label

    check(f, (torch.randn(2, 3),), (torch.randn(4, 5),))
