"""In-place tensor ops on inputs, views of inputs, mutated list/dict inputs."""
import torch

from . import call, ints, program, randn


@program(call(randn(3)), call(randn(5)), call(randn(2, 2)), graphs=1, breaks=0)
def in_place_ops_on_input(x):
    x.mul_(2)
    x.add_(1).clamp_(min=-1.5)
    return x.sum()


@program(call(randn(4, 3)), call(randn(2, 3)), call(randn(5, 3)), graphs=1, breaks=0)
def setitem_on_input_and_view(x):
    x[0] = 0.0
    row = x[1:]
    row += 1
    x[:, -1].fill_(7.0)
    return row.mean()


@program(call(randn(3), [randn(3)]), call(randn(2), []), call(randn(4), [randn(4), randn(4)]), graphs=1, breaks=0)
def list_input_appended_and_popped(x, items):
    items.append(x * 2)
    first = items.pop(0)
    items.insert(0, first + 1)
    items.extend([x.neg()])
    return len(items)


@program(call(randn(3), {"a": randn(3)}), call(randn(2), {"a": randn(2), "b": 1}), call(randn(1), {"a": randn(1)}),
         graphs=1, breaks=0)
def dict_input_updated(x, state):
    state["count"] = state.get("count", 0) + 1
    state["a"] = state["a"] + x
    state.setdefault("seen", []).append(x.shape[0])
    state.pop("b", None)
    return state["a"] * 2


@program(call(randn(3), randn(3)), call(randn(4), randn(4)), call(randn(2), randn(2)), graphs=1, breaks=0)
def in_place_with_out_argument_and_copy(x, out):
    torch.add(x, 1, out=out)
    out.copy_(out * 2)
    x.zero_()
    return out + x


@program(call(ints(6), torch.tensor([0, 2])), call(ints(6), torch.tensor([5])), call(ints(4), torch.tensor([1, 3, 0])),
         graphs=1, breaks=0)
def index_put_and_scatter_on_input(x, idx):
    x[idx] = -1.0
    x.index_add_(0, idx, torch.ones(idx.shape[0]))
    return x.cumsum(0)


@program(call(randn(3), randn(3)), call(randn(3), randn(3)), call(randn(2), randn(2)), graphs=1, breaks=0)
def mutation_through_alias_in_container(a, b):
    pair = [a, b]
    for t in pair:
        t.mul_(3)
    alias = a.view(-1)
    alias.sub_(b)
    return a.clone(), pair[1] is b


@program(call(ints(4, dtype=torch.int64)), call(ints(3, dtype=torch.int64)), call(ints(6, dtype=torch.int32)),
         graphs=1, breaks=0)
def integer_in_place_ops(x):
    x += 3
    x.mul_(2)
    x.bitwise_and_(7)
    return x.sum(), x.max()


@program(call(randn(3)), call(randn(4)), call(randn(2, 2)), graphs=1, breaks=0)
def returns_none_after_in_place(x):
    x.add_(1)
    x.div_(2)


@program(call(randn(3, requires_grad=True)), call(randn(4, requires_grad=True)), call(randn(2)), graphs=1, breaks=0)
def detach_of_an_input_requiring_grad(x):
    return x.detach()


@program(call(randn(3), randn(3), ints(3)), call(randn(4), randn(4), ints(4)), call(randn(1), randn(1), ints(1)),
         graphs=1, breaks=0)
def out_arguments_return_and_write_the_input(x, out, other):
    returned = torch.mul(x.sin(), 2, out=out)      # the same object comes back, already written
    seen = out.sum()
    torch.add(x, returned, alpha=2, out=other)     # reads one written input, writes another
    return returned is out, seen, out * 1, other + 0
