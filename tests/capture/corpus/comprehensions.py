"""List, dict, set and generator comprehensions, nested and filtered."""
import torch

from . import call, program, randn


@program(call(randn(3), 4), call(randn(2), 1), call(randn(5), 3), graphs=1, breaks=0)
def list_comprehension_of_tensors(x, n):
    powers = [x ** i for i in range(n)]
    filtered = [p * 2 for i, p in enumerate(powers) if i % 2 == 0]
    return torch.stack(powers).sum(0) + sum(filtered)


@program(call({"a": randn(2), "b": randn(2)}), call({"x": randn(3)}),
         call({"p": randn(1), "q": randn(1), "r": randn(1)}), graphs=1, breaks=0)
def dict_comprehension(d):
    doubled = {k: v * 2 for k, v in d.items()}
    lengths = {k: len(k) + i for i, k in enumerate(d)}
    return doubled, lengths


@program(call(randn(2, 3)), call(randn(4, 4)), call(randn(3, 1)), graphs=1, breaks=0)
def set_comprehension_of_shapes(x):
    sizes = {s for s in x.shape}
    odd = {s % 2 for s in x.shape}
    return x * len(sizes) + len(odd), sorted(sizes)


@program(call(randn(4), 3), call(randn(2), 5), call(randn(3), 1), graphs=1, breaks=0)
def generator_expression_sum(x, n):
    return sum(x * i for i in range(n)), max(i * i for i in range(n))


@program(call(randn(2, 2)), call(randn(3, 2)), call(randn(1, 2)), graphs=1, breaks=0)
def nested_comprehension(x):
    grid = [[x[i, j] * (i + j) for j in range(x.shape[1])] for i in range(x.shape[0])]
    flat = [v for row in grid for v in row]
    return torch.stack(flat), len(grid)


@program(call([randn(3), randn(3), randn(3)]), call([randn(2)]), call([randn(4), randn(4)]), graphs=1, breaks=0)
def comprehension_with_condition_on_shapes(xs):
    kept = [t for t in xs if t.shape[0] > 2]
    names = [f"t{i}" for i, _ in enumerate(xs)]
    return [t.sum() for t in kept], names, any(t.dim() == 1 for t in xs)


@program(call(randn(3), [1, 2, 3]), call(randn(3), [0]), call(randn(2), [4, 4]), graphs=1, breaks=0)
def generator_into_tuple_and_all(x, ks):
    parts = tuple(x + k for k in ks)
    return parts, all(k >= 0 for k in ks), torch.cat(list(p * 2 for p in parts))
