"""Tuples, namedtuples, dicts, sets, lists, star-unpacking, returning structures."""
import collections

import torch

from . import call, program, randn

Point = collections.namedtuple("Point", ["x", "y"])


@program(call((randn(3), randn(3))), call((randn(2), randn(2), randn(2))), call((randn(1),)), graphs=1, breaks=0)
def star_unpacking(pair):
    first, *rest = pair
    *init, last = pair
    out = first * 2
    for t in rest:
        out = out + t
    return out, len(init), last - first


@program(call(Point(randn(3), randn(3))), call(Point(randn(4), 2.0)), call(Point(3.0, randn(2))), graphs=1, breaks=0)
def namedtuple_in_and_out(p):
    q = Point(p.y, y=p.x)
    r = q._replace(x=q.x * 2)
    total = r.x + r.y
    return Point(total, total * 0), r._asdict()["y"], len(r), isinstance(r, tuple)


@program(call(randn(3), {"scale": 2.0}), call(randn(3), {"scale": 0.5, "shift": 1.0}), call(randn(4), {}),
         graphs=1, breaks=0)
def dict_get_items_update_pop(x, options):
    opts = {"scale": 1.0, "shift": 0.0}
    opts.update(options)
    scale = opts.get("scale", 3.0)
    shift = opts.pop("shift")
    extra = opts.pop("missing", 7)
    out = x * scale + shift + extra
    keys = sorted(opts.keys())
    return {"out": out, "keys": keys, "n": len(opts), **{k: v for k, v in opts.items()}}


@program(call(randn(3), [1, 2, 2, 3]), call(randn(3), [5, 5]), call(randn(2), []), graphs=1, breaks=0)
def sets_of_python_values(x, values):
    seen = set(values)
    seen.add(10)
    seen.discard(2)
    common = seen & {1, 3, 5, 10}
    union = seen | {100}
    return x * len(seen) + len(common), 3 in seen, sorted(union), frozenset(common) == frozenset(seen & common)


@program(call(randn(4)), call(randn(6)), call(randn(2)), graphs=1, breaks=0)
def list_methods(x):
    parts = [x, x * 2]
    parts.extend([x + 1, x - 1])
    parts.insert(1, x.neg())
    last = parts.pop()
    parts.reverse()
    index = len(parts[1:3])
    parts[0] = parts[0] + last
    copied = parts.copy()
    copied.append(x)
    return torch.stack(parts), len(copied), index, parts[-1] is x


@program(call(randn(3), randn(3)), call(randn(2), randn(2)), call(randn(5), randn(5)), graphs=1, breaks=0)
def tuple_ops(a, b):
    pair = (a, b)
    swapped = pair[::-1]
    both = pair + swapped
    count = both.count(a) if False else len(both)
    x, (y, z) = a, (b, a + b)
    return sum(both[1:]), count, x * y - z


@program(call(randn(2, 3)), call(randn(4, 3)), call(randn(3, 1)), graphs=1, breaks=0)
def return_nested_structure(x):
    return {"shape": tuple(x.shape), "parts": [x[0], (x.sum(), None)], "flag": x.shape[0] > 2, "name": "out"}


@program(call([randn(3), 1, "a"], {"k": randn(3)}), call([randn(2), 5, "bb"], {"k": randn(2)}),
         call([randn(1), 0, ""], {"k": randn(1)}), graphs=1, breaks=0)
def heterogeneous_containers(items, table):
    tensor, number, text = items
    table = dict(table)
    table["sum"] = tensor + table["k"] * number
    return table, len(text) * tensor, list(map(type, items)) == [torch.Tensor, int, str]


@program(call(randn(3), randn(3)), call(randn(4), randn(4)), call(randn(1), randn(1)), graphs=1, breaks=0)
def list_slicing_and_indexing(a, b):
    xs = [a, b, a + b, a - b, a * b]
    evens = xs[::2]
    tail = xs[-2:]
    xs[1:3] = [b * 10]
    return torch.stack(evens).sum(0), tail[0] + tail[-1], len(xs), xs[1]


@program(call(randn(3), "mean"), call(randn(3), "sum"), call(randn(3), "max"), graphs=1, breaks=0)
def dict_dispatch_of_functions(x, name):
    table = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax}
    reduce = table[name]
    return reduce(x) + x
