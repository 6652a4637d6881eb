"""if/elif/else on Python values, tensor shapes and dtypes; while loops; short-circuits; match."""
import torch

from . import call, ints, program, randn


@program(call(randn(4), 1), call(randn(4), 2), call(randn(4), 3), call(randn(5), 0), graphs=1, breaks=0)
def if_elif_else_on_int(x, mode):
    if mode == 1:
        y = x + 1
    elif mode == 2:
        y = x * 2
    elif mode > 2:
        y = x.sin()
    else:
        y = -x
    return y * 3


@program((randn(3, 4),), (randn(5, 4),), (randn(6),), (randn(2, 2, 2),), graphs=1, breaks=0)
def branch_on_shape(x):
    if x.dim() == 1:
        return x.cumsum(0)
    if x.shape[0] > 4:
        return x[:4].relu()
    if len(x.shape) == 3:
        return x.flatten(1).sum(-1)
    return x.mean(dim=1, keepdim=True) * x.size(1)


@program((randn(3),), (randn(3, dtype=torch.float64),), (ints(3, dtype=torch.int64),),
         (randn(3, dtype=torch.bfloat16),), graphs=1, breaks=0)
def branch_on_dtype(x):
    if x.dtype == torch.float64:
        return x * 2.0
    if x.dtype in (torch.int32, torch.int64):
        return x // 2 + 1
    if x.is_floating_point() and x.dtype != torch.float32:
        return x.float().exp()
    return x.tanh()


@program(call(randn(4), None), call(randn(4), randn(4)), call(randn(4), 2.0), call(randn(3), None), graphs=1, breaks=0)
def optional_argument(x, bias):
    if bias is None:
        return x * 2
    if isinstance(bias, torch.Tensor):
        return x + bias
    return x - bias


@program(call(randn(5), 3), call(randn(5), 1), call(randn(5), 0), call(randn(2), 5), graphs=1, breaks=0)
def while_on_python_counter(x, n):
    i = 0
    total = x
    while i < n:
        total = total * 0.5 + i
        i += 1
    return total, i


@program(call(randn(3), True, False), call(randn(3), False, True), call(randn(3), False, False),
         call(randn(3), True, True), graphs=1, breaks=0)
def short_circuit_and_ternary(x, a, b):
    y = x * 2 if a and not b else x - 1
    z = (a or b) and x.shape[0] == 3
    return (y + 1) if z else y, z


@program(("add", randn(3), randn(3)), ("mul", randn(3), randn(3)), ("max", randn(3), randn(3)),
         ("other", randn(2), randn(2)), graphs=1, breaks=0)
def match_statement(op, a, b):
    match op:
        case "add":
            return a + b
        case "mul":
            return a * b
        case "max" | "maximum":
            return torch.maximum(a, b)
        case _:
            return a - b


@program((randn(2, 3),), (randn(4, 3),), (randn(2, 5),), graphs=1, breaks=0)
def nested_ifs_on_sizes(x):
    rows, cols = x.shape
    if rows > 2:
        if cols > 3:
            out = x[:, :3]
        else:
            out = x * rows
    else:
        out = x.t() if cols > 4 else x + cols
    return out.sum(0)


@program(call(randn(4), [1, 2]), call(randn(4), []), call(randn(4), [0]), call(randn(4), (3,)), graphs=1, breaks=0)
def truthiness_of_containers(x, items):
    if items:
        x = x + sum(items)
    if not items:
        x = x - 1
    if 0 in items:
        x = x.abs()
    return x


@program((randn(6),), (randn(10),), (randn(1),), graphs=1, breaks=0)
def while_on_shape(x):
    while x.shape[0] > 2:
        x = x[::2] + 1
    return x * 2
