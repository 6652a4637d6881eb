"""print in many positions: each one is a graph break (pieces before and after stay compiled)."""
import torch
from torch import nn

from . import call, ints, program, randn


@program(call(randn(3)), call(randn(4)), call(randn(2, 2)), graphs=2, breaks=1)
def print_in_the_middle(x):
    y = x * 2
    print("middle")
    return y + 1


@program(call(randn(3)), call(randn(5)), call(randn(1)), graphs=1, breaks=1)
def print_as_first_statement(x):
    print("start")
    return x.cos() * 2


@program(call(randn(3)), call(randn(2, 3)), call(randn(4)), graphs=1, breaks=1)
def print_just_before_return(x):
    y = x.sin()
    print("shape", y.shape)
    return y


@program(call(randn(3), True), call(randn(3), False), call(randn(3), True), call(randn(5), False), graphs=2, breaks=1)
def print_inside_if(x, verbose):
    y = x + 1
    if verbose:
        print("verbose:", verbose, y.shape[0])
    return y * 2


@program(call(randn(3), 3), call(randn(3), 1), call(randn(2), 4), graphs=4, breaks=3)
def print_inside_loop(x, n):
    # pieces: [x*2, +0], [+1], [+2], [sum]
    out = x * 2
    for i in range(n):
        out = out + i
        print("step", i)
    return out.sum()


@program(call(randn(2, 3)), call(randn(4, 3, dtype=torch.float64)), call(randn(5)), graphs=2, breaks=1)
def print_formatted_shapes_and_dtypes(x):
    y = x.t() * 2
    print(f"in={tuple(x.shape)} out={list(y.shape)} dtype={y.dtype} dims={y.dim()} numel={y.numel():04d}")
    return y.relu()


@program(call(randn(3)), call(randn(6)), call(randn(2)), graphs=2, breaks=1)
def print_with_sep_and_end(x):
    y = x.exp()
    print("a", x.shape[0], "b", sep="|", end=";\n")
    return y - 1


@program(call(randn(3)), call(randn(4)), call(randn(1)), graphs=3, breaks=2)
def two_prints(x):
    y = x + 1
    print("first")
    y = y * 2
    print("second", y.shape)
    return y - 1


@program(call(ints(4)), call(ints(3)), call(ints(5)), graphs=2, breaks=1)
def print_a_tensor_value(x):
    y = x * 2
    print("sum is", y.sum(), "max", y.max())
    return y + 1


@program(call(randn(3), randn(3, requires_grad=True)), call(randn(2), randn(2, requires_grad=True)),
         call(randn(3), randn(3)), graphs=2, breaks=1)
def print_inside_no_grad(x, w):
    with torch.no_grad():
        y = x * w
        print("inside no_grad", torch.is_grad_enabled())
        z = y + 1
    return z * w, z.requires_grad


@program(call(randn(3), 2), call(randn(3), 5), call(randn(4), 0), graphs=0, breaks=1)
def print_without_tensor_ops(x, n):
    print("n =", n, "len", len(x))
    return x, n * 2


class Verbose(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        print("hidden", tuple(h.shape), self.training)
        return torch.tanh(h)


@program(call(randn(2, 3)), call(randn(5, 3)), call(randn(1, 3)), graphs=2, breaks=1, factory=True)
def print_in_module_forward():
    return Verbose()


@program(call(randn(3), [1, 2]), call(randn(3), []), call(randn(2), [3]), graphs=2, breaks=1)
def print_of_python_containers(x, items):
    y = x * len(items)
    print({"items": items, "n": len(items)}, (1, "two"), [x.shape[0]], None, True, 2.5)
    return y + 1


@program(call(randn(3), 2), call(randn(3), 0), call(randn(2), 3), graphs=2, breaks=1)
def print_in_else_branch_with_python_condition(x, k):
    y = x * 3
    if k > 5:
        y = y + 1
    else:
        print("small k", k)
    return y - k
