"""cat, constant_pad, gather, index (embedding) and philox_rand lowered to native loops (no
Externs), checked against the prims' eager references; one compiled graph for most cases."""
import numpy as np
import pytest
import torch

from ember.backend import compile_graph
from ember.lower.builder import PrimGraphBuilder
from ember.prims.philox import philox_uint32


def test_cat_pad_gather_index_are_fused_loops_equal_to_eager():
    xv, yv = torch.randn(5, 7), torch.randn(5, 3)
    table = torch.randn(11, 4)
    ids = torch.tensor([[1, 0, 10], [3, 3, 7]])
    gidx = torch.randint(0, 7, (5, 6))
    rows, cols = torch.tensor([4, 0, 2]), torch.tensor([[3], [1]])
    b = PrimGraphBuilder()
    x, y, w = b.input("x", xv), b.input("y", yv), b.input("w", table)
    i, g, r, c = b.input("ids", ids), b.input("g", gidx), b.input("rows", rows), b.input("cols", cols)
    outs = [
        b.cat([x, b.exp(y), x], 1),                              # three ranges along the last dim
        b.cat([x, b.mul(x, 2.0)], 0),
        b.constant_pad(x, (1, 2, 0, 3), 1.5),                    # right dims first, like F.pad
        b.constant_pad(x, (-2, 1), 0.0),                         # a negative pad crops
        b.index(w, [i]),                                         # embedding
        b.gather(x, 1, g),
        b.index(x, [r, None]),                                   # x[rows]
        b.index(x, [None, b.reshape(r, (3,))]),                  # x[:, rows]
        b.index(x, [c, r]),                                      # broadcast (2, 3) pair of index tensors
        b.tanh(b.cat([b.constant_pad(y, (0, 4), 0.0), x], 0)),  # nested, fused with its consumer
    ]
    inputs = [xv, yv, table, ids, gidx, rows, cols]
    graph = b.build(outs)
    compiled = compile_graph(graph, inputs)
    for actual, expected in zip(compiled(*inputs), graph.run(*inputs)):
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    assert compiled.stats["extern_count"] == 0


def test_out_of_range_indices_raise_like_eager_never_read_out_of_bounds():
    table = torch.arange(12.0).reshape(6, 2)
    ids = torch.tensor([0, 5, 6, 1 << 40])        # 6 and 2**40 are out of range: torch raises
    b = PrimGraphBuilder()
    w, i = b.input("w", table), b.input("ids", ids)
    compiled = compile_graph(b.build([b.index(w, [i])]), [table, ids])
    with pytest.raises(IndexError, match="index 6 is out of bounds|index out of range"):
        compiled(table, ids)
    ok = torch.tensor([0, 5, 3, 1])
    torch.testing.assert_close(compiled(table, ok)[0], table[ok])   # the error record was reset


def test_philox_rand_matches_the_reference_bit_for_bit():
    seed = 0x1234_5678_9ABC
    b = PrimGraphBuilder()
    dummy = torch.zeros(1)
    b.input("unused", dummy)
    uniform = b.philox_rand((3, 1000), seed, 77, torch.float32, torch.device("cpu"))
    compiled = compile_graph(b.build([uniform]), [dummy])
    (out,) = compiled(dummy)
    expected = b.graph.run(dummy)[0]
    assert torch.equal(out, expected)
    assert 0.0 <= out.min() and out.max() < 1.0
    # spot-check the reference itself against the Philox4x32-10 known-answer vector (Random123)
    assert int(philox_uint32(0, np.array([0], dtype=np.uint64))[0]) == 0x6627E8D5
