"""Data-dependent constructs: .item(), .tolist(), int()/float() of tensors, if/while on tensors, .backward()."""
import torch

from . import call, ints, program, randn


@program(call(randn(3)), call(randn(4)), call(randn(3, 2)), graphs=2, breaks=1)
def item_as_scale(x):
    s = x.abs().sum().item()
    return x * s


@program(call(torch.tensor([0.2, 0.9, -1.0])), call(torch.tensor([0.1, 0.2])), call(randn(5)), call(randn(3)),
         graphs=2, breaks=1)
def item_driven_branch(x):
    v = x.max().item()
    if v > 0.5:
        y = x * 2
    else:
        y = x - 1
    return y.sum(), v > 0.5


@program(call(ints(4)), call(ints(2)), call(ints(6)), graphs=1, breaks=1)
def tolist_of_an_input(x):
    values = x.tolist()
    total = sum(values)
    return x + total, values


@program(call(ints(3)), call(ints(5)), call(ints(1)), graphs=2, breaks=1)
def tolist_of_a_computed_tensor(x):
    y = x * 2 + 1
    values = y.tolist()
    return y * len([v for v in values if v > 0]), values


@program(call(torch.tensor([0.0, 5.0, 1.0, 2.0])), call(torch.tensor([9.0, 1.0])), call(randn(6)), graphs=2, breaks=1)
def int_of_argmax_used_as_slice(x):
    n = int(x.argmax())
    return x[: n + 1].sum() * 2, n


@program(call(randn(3)), call(randn(5)), call(randn(2, 2)), graphs=2, breaks=1)
def float_of_mean(x):
    m = float(x.mean())
    return x * m + 1, m


@program(call(torch.tensor([1.0, 2.0])), call(torch.tensor([-3.0, 1.0])), call(randn(4)), graphs=2, breaks=1)
def if_on_tensor_comparison(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@program(call(torch.tensor([1.0, 2.0])), call(torch.tensor([-3.0, 1.0])), call(torch.tensor([0.5, 0.25])), graphs=2,
         breaks=1)
def if_on_all_of_a_mask(x):
    y = x * 2
    if (y > 0).all():
        y = y.log()
    else:
        y = y.abs()
    return y.sum()


@program(call(torch.tensor([1.0, -6.0, 3.0])), call(torch.tensor([100.0, 2.0])), call(torch.tensor([0.5])), graphs=3,
         breaks=2)
def while_on_tensor_condition(x):
    # the condition runs twice on the first call (6 > 4, then 3 > 4): pieces [mul, cond], [div, cond], [add]
    y = x * 1.0
    while y.abs().max() > 4:
        y = y / 2
    return y + 1


@program(call(randn(3), randn(3, requires_grad=True)), call(randn(4), randn(4, requires_grad=True)),
         call(randn(2), randn(2, requires_grad=True)), graphs=2, breaks=1)
def backward_inside(x, w):
    loss = (x * w).sin().sum()
    loss.backward()
    return w.grad * 2, (loss * 1).detach()


@program(call(randn(3), 3), call(randn(3), 2), call(randn(4), 4), graphs=4, breaks=3)
def item_in_a_loop(x, n):
    # pieces: [mul], [mul], [mul], [mul by total]
    total = 0.0
    for i in range(n):
        total += (x[i] * 2).item()
    return x * total


@program(call(torch.tensor([2, 1, 3]), randn(6)), call(torch.tensor([1, 1]), randn(2)),
         call(torch.tensor([4]), randn(4)), graphs=1, breaks=1)
def tolist_sizes_split(lengths, x):
    sizes = lengths.tolist()
    parts = torch.split(x, sizes)
    return [p.sum() for p in parts], len(parts)


@program(call(torch.tensor([3.0, 1.0])), call(torch.tensor([-1.0, -2.0])), call(torch.tensor([0.0, 4.0])), graphs=2,
         breaks=1)
def bool_of_tensor_in_expression(x):
    positive = bool((x > 0).any())
    return (x.exp() if positive else x.neg()), positive
