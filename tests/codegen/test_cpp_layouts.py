"""Views, strided and broadcast inputs, zero-size tensors, outputs with eager's strides."""
import torch

from ember.backend import compile_graph
from ember.lower.builder import PrimGraphBuilder


def compare(graph, inputs):
    compiled = compile_graph(graph, inputs)
    for a, e in zip(compiled(*inputs), graph.run(*inputs)):
        assert a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, equal_nan=True)
    return compiled


def test_noncontiguous_broadcast_and_views_in_one_graph():
    base = torch.randn(10, 24)
    tv = base.t()                       # transposed input
    sv = torch.randn(12, 50)[:, ::2]     # strided slice input (12, 25)
    rv = torch.randn(1, 24)              # broadcast row
    ov = torch.randn(100)[3:]            # input with a storage offset
    b = PrimGraphBuilder()
    t, s, r, o = b.input("t", tv), b.input("s", sv), b.input("r", rv), b.input("o", ov)
    outs = [
        b.add(b.permute(t, (1, 0)), b.expand(r, (10, 24))),            # back to (10, 24) + broadcast
        b.mul(b.slice(s, 1, 1, 25, 3), 2.0),                           # slice of a strided input
        b.reshape(b.permute(t, (1, 0)), (240,)),                        # reshape of a permuted view
        b.exp(b.reshape(o, (97,))),
        b.as_strided(o, (4, 5), (10, 2), 7),                            # as_strided over input storage
        b.sum(b.reshape(b.exp(b.permute(t, (1, 0))), (2, 5, 24)), (1,)),
        b.permute(b.sin(t), (1, 0)),                                    # output that is a view
        b.sum(s, (0,)),                                                 # column reduction
    ]
    compare(b.build(outs), [tv, sv, rv, ov])


def test_zero_size_tensors():
    xv = torch.randn(0, 5)
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    compiled = compare(b.build([b.exp(x), b.sum(x, (0,)), b.add(x, 1.0)]), [xv])
    assert compiled(xv)[0].shape == (0, 5)


def test_outputs_keep_eager_strides_and_mutation_write_back():
    xv = torch.randn(6, 4)
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    y = b.permute(b.exp(x), (1, 0))
    graph = b.build([y, b.add(x, 1.0)])
    graph.extra.update({"num_user_outputs": 1, "mutated_inputs": [(0, 1)]})
    expected = torch.exp(xv).t()
    target = xv.clone()
    compiled = compile_graph(graph, [xv.clone()])
    (out,) = compiled(target)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()
    torch.testing.assert_close(target, xv + 1)


def test_iota_full_and_runtime_scalar_input():
    b = PrimGraphBuilder()
    x = b.input("x", torch.randn(5))
    s = b.input("s", 2.5)
    i = b.iota(5, 0, 1, torch.float32, torch.device("cpu"))
    f = b.full((5,), 3.0, torch.float32, torch.device("cpu"))
    graph = b.build([b.add(b.mul(x, i), f), b.mul(x, s)])
    compiled = compile_graph(graph, [torch.randn(5), 2.5])
    xv = torch.randn(5)
    out = compiled(xv, 4.0)
    torch.testing.assert_close(out[0], xv * torch.arange(5.0) + 3)
    torch.testing.assert_close(out[1], xv * 4.0)


def test_a_size_one_dim_is_never_the_vectorized_loop():
    """A batch of 1 (decoding: (1, H, T, D) caches) puts its loop outermost: as the innermost loop
    (its stores' stride is 0) it took the `omp simd` pragma with one iteration, and the real
    contiguous dim ran scalar (a KV-cache cat 6x slower than it is now)."""
    import re

    import ember
    from recording import compile_recording

    def grow(cache, new):
        return torch.cat([cache, new], dim=2) * 2
    compiled, sources = compile_recording(grow)
    for length in (5, 9):
        inputs = (torch.randn(1, 4, length, 16), torch.randn(1, 4, 1, 16))
        torch.testing.assert_close(compiled(*inputs), grow(*inputs))
    for source in sources:
        simd_loops = re.findall(r"#pragma omp simd\n\s*for \(int64_t \w+ = 0; \w+ < ([^;]+);", source)
        assert simd_loops and "1" not in simd_loops, source
    dynamic = ember.compile(grow, dynamic=True)
    inputs = (torch.randn(1, 4, 7, 16), torch.randn(1, 4, 1, 16))
    torch.testing.assert_close(dynamic(*inputs), grow(*inputs))


def test_mutated_buffers_are_written_back_in_one_call_per_dtype():
    """BatchNorm's running statistics (float32) and batch counters (int64) of every layer go back
    into the module in one torch._foreach_copy_ per dtype (ResNet-50's 159 copy_ calls cost 1.6 ms
    of host time per training step on an H100 host), and equal eager's after every call."""
    import copy

    import ember
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4)).train()
    reference = copy.deepcopy(model)
    compiled = ember.compile(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 10, 10)
            torch.testing.assert_close(compiled(x), reference(x))
            for (name, mine), (_, theirs) in zip(model.named_buffers(), reference.named_buffers()):
                torch.testing.assert_close(mine, theirs, msg=name)
    source = compiled._ember_captured.events[-1].compiled.source.split("# ---- kernels")[0]
    assert source.count("torch._foreach_copy_(") == 2 and ".copy_(" not in source, source
