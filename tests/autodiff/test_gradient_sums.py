"""Gradients of pieces split off one tensor (``split``, ``chunk``, ``unbind``, slices) are summed
into that tensor's gradient as one cat, not as adds of zero-pads (autodiff/joint.py
``_joined_pads``): the q/k/v gradients of an attention's fused projection read each element once.
Every case is differentiated by ember and by eager and the gradients compared."""
from __future__ import annotations

import pytest
import torch

import ember
from ember.backend import compile_graph
from ember.prims import primitives as P

BACKWARDS: list = []


def _backend(graph, example_inputs):
    compiled = compile_graph(graph, example_inputs, {"fallback": "error"})
    assert compiled.kind == "autograd"
    BACKWARDS.append(compiled.call)
    return compiled


def _split(x):
    q, k, v = x.split(16, dim=-1)
    return q * 2 + k.sin() + v.exp()


def _unbind(x):
    q, k, v = x.reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
    return q * k.cos() + v


def _chunk_middle_unused(x):
    a, b, c = x.chunk(3, dim=1)
    return a * 3 + c                    # b gets no gradient: a gap, an add of pads


def _two_of_four(x):
    return x[:, 4:8].tanh() + x[:, 8:12]   # adjacent, the rest of the row zero: a pad of a cat


def _overlapping(x):
    return x[:, 0:10].exp().sum(1, keepdim=True) + x[:, 5:15].sin().sum(1, keepdim=True)


def _steps(x):
    return x[:, 0::2] * x[:, 1::2]     # strided slices: pads of spread values, left as adds


def _two_dims(x):
    return x[:2].exp() + x[2:, :] * 3        # adjacent along dim 0 only: one cat


def _different_dims(x):
    return x[:2, :4].sum() + x[:, 4:].sum()   # pads differ in two dims: an add


def _nested(x):
    left, middle = x[:, 0:8].split(4, dim=1)   # their cat, padded, joins the last piece: one cat of 3
    return left * 2 + middle.sin() + x[:, 8:12].cos()


def _piece_used_twice(x):
    a, b = x.chunk(2, dim=-1)
    return a * b + a.exp() + b


CASES = {"split": (_split, (2, 5, 48), 1), "unbind": (_unbind, (2, 5, 48), 1),
         "chunk_gap": (_chunk_middle_unused, (4, 12), 0), "two_of_four": (_two_of_four, (3, 16), 1),
         "overlap": (_overlapping, (3, 16), 0), "steps": (_steps, (3, 16), 0),
         "two_dims": (_two_dims, (4, 6), 1), "different_dims": (_different_dims, (4, 8), 0),
         "nested": (_nested, (3, 12), 1), "piece_used_twice": (_piece_used_twice, (2, 3, 8), 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_of_split_pieces_are_one_cat(name, dtype):
    fn, shape, cats = CASES[name]
    BACKWARDS.clear()
    x = torch.randn(shape, dtype=dtype)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ember.compile(fn, backend=_backend)(ours)
    expected = fn(theirs)
    weights = torch.randn(expected.shape, dtype=dtype)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(out, expected, **tolerance)
    torch.testing.assert_close(ours.grad, theirs.grad, **tolerance)
    backward = BACKWARDS[0].backward_graph
    found = [n for n in backward.call_nodes() if n.target is P.cat]
    assert len(found) == cats, backward
    if name == "nested":
        assert len(found[0].args[0]) == 3


def _random_pieces(seed):
    """A tensor cut along one dim into random contiguous pieces (some unused, some read twice,
    some read through a further slice), each piece through a random op, summed after a reduction."""
    import random
    rng = random.Random(seed)
    rank = rng.randint(1, 3)
    shape = [rng.randint(2, 5) for _ in range(rank)]
    dim = rng.randrange(rank)
    shape[dim] = rng.randint(4, 12)
    cuts = sorted(rng.sample(range(1, shape[dim]), rng.randint(1, min(4, shape[dim] - 1))))
    bounds = list(zip([0] + cuts, cuts + [shape[dim]]))
    ops = [lambda t: t * 2, torch.sin, torch.exp, lambda t: t * t, lambda t: t.cumsum(dim)]
    plan = []
    for start, stop in bounds:
        uses = rng.choice([0, 1, 1, 1, 2])
        plan += [(start, stop, rng.randrange(len(ops))) for _ in range(uses)]
    if not plan:
        plan = [(bounds[0][0], bounds[0][1], 0)]

    def fn(x):
        total = x.new_zeros(())
        for start, stop, op in plan:
            total = total + ops[op](x.narrow(dim, start, stop - start)).sum()
        return total
    return fn, tuple(shape)


@pytest.mark.parametrize("seed", range(12))
def test_gradients_of_random_pieces_match_eager(seed):
    fn, shape = _random_pieces(seed)
    x = torch.randn(shape, dtype=torch.float64)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ember.compile(fn, backend=_backend)(ours).backward()
    fn(theirs).backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-12, atol=1e-12)
