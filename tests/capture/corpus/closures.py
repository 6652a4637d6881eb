"""Nested functions, closures (nonlocal, changed between calls), lambdas, default/keyword-only/varargs,
functools.partial, decorators, small recursion."""
import functools

import torch

from . import call, program, randn


@program(call(randn(3)), call(randn(4)), call(randn(2, 2)), graphs=1, breaks=0)
def nested_function_and_lambda(x):
    offset = x.shape[0]

    def affine(t, scale=2.0):
        return t * scale + offset

    square = lambda t: t * t  # noqa: E731
    return affine(square(x)), affine(x, scale=-1.0)


@program(call(randn(3), 3), call(randn(3), 1), call(randn(5), 4), graphs=1, breaks=0)
def nonlocal_counter_inside_call(x, n):
    count = 0
    acc = x

    def step(t):
        nonlocal count, acc
        count += 1
        acc = acc + t * count
        return acc

    for _ in range(n):
        step(x)
    return acc, count


def _closure_scale_target():
    scale = 2.0

    def scaled(x):
        return x * scale + 1

    def set_scale(value):
        nonlocal scale
        scale = value
    scaled.set_scale = set_scale
    return scaled


@program(call(randn(3)), call(randn(3)), call(randn(3)), call(randn(4)), graphs=1, breaks=0, factory=True,
         before=lambda i, fn: fn.set_scale([2.0, 2.0, -3.0, 0.5][i]))
def closure_changed_between_calls():
    return _closure_scale_target()


def _stateful_closure_target():
    history = []
    calls = 0

    def remember(x):
        nonlocal calls
        calls += 1
        history.append(calls)
        return x * calls, list(history)
    return remember


@program(call(randn(2)), call(randn(2)), call(randn(3)), graphs=1, breaks=0, factory=True)
def closure_state_persists_across_calls():
    return _stateful_closure_target()


@program(call(randn(3), 1.0), call(randn(3), 2.0, 3.0), call(randn(3), 1.0, 2.0, 3.0, power=2), graphs=1, breaks=0)
def varargs_and_keyword_only(x, *weights, power=1, **extra):
    out = x ** power
    for i, w in enumerate(weights):
        out = out + w * i
    return out, len(weights), sorted(extra)


@program(call(randn(3), mode="a"), call(randn(3), mode="b", bias=randn(3)), call(randn(4)), graphs=1, breaks=0)
def kwargs_forwarding(x, **kwargs):
    def inner(t, *, mode="a", bias=None):
        out = t.exp() if mode == "a" else t.log1p().nan_to_num()
        return out if bias is None else out + bias

    def outer(t, *args, **kw):
        return inner(t, *args, **kw) * 2
    return outer(x, **kwargs)


@program(call(randn(3), 2), call(randn(3), 3), call(randn(5), 1), graphs=1, breaks=0)
def functools_partial(x, k):
    def combine(a, b, *, alpha=1.0, beta=0.0):
        return a * alpha + b * beta

    half = functools.partial(combine, alpha=0.5)
    shifted = functools.partial(half, beta=k)
    return shifted(x, x.flip(0)), half(x, 1.0)


def _twice(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(fn(*args, **kwargs), **kwargs)
    return wrapper


@_twice
def _add_one(t, amount=1):
    return t + amount


@program(call(randn(3)), call(randn(2)), call(randn(3, 3)), graphs=1, breaks=0)
def decorated_helper(x):
    return _add_one(x), _add_one(x, amount=3), _add_one.__name__


def _power_tree(t, depth):
    if depth == 0:
        return t
    return _power_tree(t * 0.5, depth - 1) + depth


@program(call(randn(3), 3), call(randn(3), 0), call(randn(2), 5), graphs=1, breaks=0)
def small_recursion(x, depth):
    return _power_tree(x, depth)


@program(call(randn(4)), call(randn(5)), call(randn(2)), graphs=1, breaks=0)
def default_argument_captured_at_definition(x):
    fns = [lambda t, i=i: t + i for i in range(3)]
    late = [lambda t: t * i for i in range(3)]  # noqa: B023 (every lambda sees the last i)
    return [f(x) for f in fns], [g(x) for g in late]


@program(call(randn(3)), call(randn(4)), call(randn(1)), graphs=1, breaks=0)
def closure_returned_function(x):
    def make_adder(n):
        def add(t):
            return t + n
        return add

    adders = [make_adder(n) for n in (1, 2, 3)]
    out = x
    for add in adders:
        out = add(out)
    return out
