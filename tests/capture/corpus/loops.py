"""for over range/list/dict/zip/enumerate/reversed, break/continue, for-else, nested loops."""
import torch

from . import call, program, randn


@program(call(randn(3), 4), call(randn(3), 1), call(randn(4), 6), graphs=1, breaks=0)
def for_range_with_step(x, n):
    out = torch.zeros_like(x)
    for i in range(0, n, 2):
        out = out + x * i
    for i in range(n - 1, -1, -1):
        out = out - i
    return out


@program(call([randn(3), randn(3), randn(3)]), call([randn(2)]), call([randn(4), randn(4)]), graphs=1, breaks=0)
def for_over_list_of_tensors(xs):
    total = xs[0] * 0
    for t in xs:
        total = total + t.relu()
    return total / len(xs)


@program(call({"a": randn(3), "b": randn(3)}), call({"b": randn(3), "a": randn(3)}),
         call({"a": randn(2), "c": randn(2), "b": randn(2)}), graphs=1, breaks=0)
def for_over_dict_items_keys_values(d):
    out = {}
    for key, value in d.items():
        out[key.upper()] = value * 2
    n = 0
    for key in d:
        n += len(key)
    stacked = torch.stack(list(d.values()))
    return out, stacked.sum(0) + n


@program(call([randn(3), randn(3)], [1.0, 2.0]), call([randn(2)] * 3, [0.5, -1.0, 2.0]),
         call([randn(4)], [3.0, 9.0]), graphs=1, breaks=0)
def zip_and_enumerate(xs, weights):
    total = 0
    for i, (x, w) in enumerate(zip(xs, weights)):
        total = total + x * w + i
    for i, w in enumerate(weights, start=10):
        total = total - w / i
    return total


@program(call([randn(2), randn(2), randn(2)]), call([randn(3)]), call([randn(1), randn(1)]), graphs=1, breaks=0)
def reversed_and_sorted(xs):
    out = []
    for t in reversed(xs):
        out.append(t * len(out))
    order = sorted(range(len(xs)), key=lambda i: -i)
    return out, [xs[i] + 1 for i in order]


def _size(t):
    return t.shape[0]


@program(call([randn(2), randn(4), randn(3)], [3, 1, 2]), call([randn(1), randn(1), randn(5)], [0, 0, 7]),
         call([randn(3)], [4]), graphs=1, breaks=0)
def key_functions_on_sort_min_max(xs, ns):
    seen = []

    def logged(n):
        seen.append(n)
        return (n - 1) ** 2

    longest = max(xs, key=_size)          # ties: the first one, as max picks
    shortest = min(xs, key=lambda t: t.shape[0])
    by_size = sorted(xs, key=_size, reverse=True)
    ordered = list(ns)
    ordered.sort(key=logged)
    ns.sort(reverse=True)
    closest = min(ns, key=logged, default=None)
    return longest * 2, shortest + 1, by_size, ordered, ns, closest, seen, max([], key=len, default=-1)


@program(call(randn(4), 10), call(randn(4), 3), call(randn(4), 0), call(randn(2), 7), graphs=1, breaks=0)
def break_and_continue(x, limit):
    y = x
    for i in range(8):
        if i % 3 == 1:
            continue
        if i >= limit:
            break
        y = y + i
    return y, i


@program(call(randn(3), [1, 2, 3]), call(randn(3), [1, -2, 3]), call(randn(3), []), graphs=1, breaks=0)
def for_else(x, values):
    for v in values:
        if v < 0:
            x = x - 100
            break
        x = x + v
    else:
        x = x * 2
    return x


@program(call(randn(3, 3)), call(randn(2, 4)), call(randn(1, 1)), graphs=1, breaks=0)
def nested_loops_over_shape(x):
    rows, cols = x.shape
    out = x.clone()
    for i in range(rows):
        for j in range(cols):
            if i == j:
                continue
            out[i, j] = out[i, j] * (i + j)
    return out


@program(call(randn(3), 5), call(randn(3), 2), call(randn(3), 9), graphs=1, breaks=0)
def while_with_break_and_accumulator(x, n):
    parts = []
    k = 0
    while True:
        parts.append(x * k)
        k += 1
        if k >= n:
            break
    return torch.cat(parts), len(parts)


@program(call(randn(2, 3)), call(randn(4, 3)), call(randn(1, 3)), graphs=1, breaks=0)
def iterate_over_tensor_rows(x):
    out = []
    for row in x:
        out.append(row.sum() * 2)
    for i, row in enumerate(x.unbind(0)):
        out[i] = out[i] + row.max()
    return torch.stack(out)
