"""Intermediate buffers kept across calls (wrapper.PersistentBuffers, on by default for CUDA only).

Exercised here on the CPU by enabling it for "cpu" too: the logic is device-neutral except
for the key (device, stream, thread on CUDA; thread on CPU)."""
import threading

import pytest
import torch

from ember.backend import compile_graph
from ember.codegen import wrapper
from ember.graph import TensorMeta
from ember.lower.builder import PrimGraphBuilder


@pytest.fixture
def persistent_on_cpu(monkeypatch):
    monkeypatch.setattr(wrapper, "PERSISTENT_DEVICES", {"cpu", "cuda"})


def column_normalize_graph(x):
    """out = x / colsum(x): the column sums are an intermediate of another kernel."""
    b = PrimGraphBuilder()
    xi = b.input("x", x)
    s = b.sum(xi, (0,))
    out = b.div(xi, b.broadcast(s, tuple(x.shape), (1,)))
    return b.build([out])


def test_intermediates_reused_outputs_fresh(persistent_on_cpu):
    x = torch.rand(16, 8) + 0.5
    compiled = compile_graph(column_normalize_graph(x), [x])
    wrapper_source = compiled.source.split("# ---- kernels")[0]
    assert "kept across calls" in wrapper_source, wrapper_source
    (first,) = compiled(x)
    keep = first.clone()
    y = torch.rand(16, 8) + 0.5
    (second,) = compiled(y)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, keep)                      # never overwritten by a later call
    torch.testing.assert_close(second, y / y.sum(0))
    pool = next(v for v in compiled_globals(compiled) if isinstance(v, wrapper.PersistentBuffers))
    assert len(pool.sets) == 1


def compiled_globals(compiled):
    call = compiled.call
    return list(call.__globals__.values())


def test_each_thread_gets_its_own_buffers(persistent_on_cpu):
    x = torch.rand(64, 32) + 0.5
    compiled = compile_graph(column_normalize_graph(x), [x])
    inputs = [torch.rand(64, 32) + 0.5 for _ in range(4)]
    results = [None] * 4

    def work(i):
        for _ in range(20):
            (results[i],) = compiled(inputs[i])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for inp, out in zip(inputs, results):
        torch.testing.assert_close(out, inp / inp.sum(0))


def test_returned_or_extern_read_buffers_are_never_kept(persistent_on_cpu):
    x = torch.rand(8, 8) + 0.5
    b = PrimGraphBuilder()
    xi = b.input("x", x)
    s = b.sum(xi, (0,))
    normalized = b.div(xi, b.broadcast(s, (8, 8), (1,)))          # read by the extern below
    product = b.graph.call(torch.mm, (normalized, normalized), meta=TensorMeta.of(torch.empty(8, 8)))
    graph = b.build([product, s])                                   # s is returned
    compiled = compile_graph(graph, [x])
    assert "kept across calls" not in compiled.source
    out, colsum = compiled(x)
    n = x / x.sum(0)
    torch.testing.assert_close(out, n @ n)
    torch.testing.assert_close(colsum, x.sum(0))


def test_off_by_default_on_cpu():
    x = torch.rand(16, 8) + 0.5
    compiled = compile_graph(column_normalize_graph(x), [x])
    assert "kept across calls" not in compiled.source
    assert "device=_cpu" in compiled.source            # a bound torch.device, not a string per call
