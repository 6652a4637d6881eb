"""try/except without and with a raised exception, finally, assert, user errors reaching the caller."""
import torch

from . import call, program, randn


@program(call(randn(3)), call(randn(4)), call(randn(2)), graphs=1, breaks=0)
def try_except_nothing_raised(x):
    try:
        y = x * 2
    except ValueError:
        y = x
    return y + 1


@program(call(randn(3), {"a": 1}), call(randn(3), {}), call(randn(2), {"a": 5}), graphs=1, breaks=0)
def key_error_caught(x, table):
    try:
        k = table["a"]
    except KeyError:
        k = -1
    return x * k


@program(call(randn(3), 0), call(randn(3), 5), call(randn(3), 1), graphs=1, breaks=0)
def user_error_raised_and_caught(x, n):
    def check(k):
        if k > 3:
            raise ValueError(f"too big: {k}")
        return k

    try:
        k = check(n)
        out = x + k
    except ValueError as err:
        out = x - len(str(err))
    return out


@program(call(randn(3), [1]), call(randn(3), []), call(randn(4), [2, 3]), graphs=1, breaks=0)
def try_finally_runs_cleanup(x, log):
    try:
        y = x * 3
    finally:
        log.append("cleanup")
    return y


@program(call(randn(3)), call(randn(4)), call(randn(2, 3)), graphs=1, breaks=0)
def assert_that_holds(x):
    assert x.dim() >= 1, "needs a dimension"
    assert x.shape[-1] > 1
    return x.softmax(-1)


@program(call(randn(3)), call(randn(3, 3)), call(randn(5)), graphs=1, breaks=0, raises=(1,))
def assert_that_fails_on_a_later_call(x):
    assert x.dim() == 1, f"expected a vector, got {x.dim()} dims"
    return x * 2


class ShapeError(Exception):
    pass


@program(call(randn(2, 3)), call(randn(3, 3)), call(randn(2, 4)), graphs=1, breaks=0, raises=(1,))
def custom_exception_reaches_caller(x):
    if x.shape[0] != 2:
        raise ShapeError(f"bad rows: {x.shape[0]}")
    return x.t() @ x


@program(call(randn(3), "sum"), call(randn(3), "bogus"), call(randn(3), "mean"), graphs=1, breaks=0, raises=(1,))
def value_error_from_lookup(x, name):
    ops = {"sum": x.sum, "mean": x.mean}
    if name not in ops:
        raise ValueError(f"unknown op {name!r}")
    return ops[name]() * 2


@program(call(randn(3), randn(3)), call(randn(3), randn(4)), call(randn(2), randn(2)), graphs=1, breaks=0, raises=(1,))
def torch_shape_error_propagates(a, b):
    return (a * 2 + b).sum()


@program(call(randn(3), 1), call(randn(3), 0), call(randn(3), 2), graphs=1, breaks=0, raises=(1,))
def zero_division_from_python_scalar(x, k):
    return x * (6 // k) + 10 / k
