"""Reductions with few output rows and a long reduced range run as two kernels on CUDA
(lower/split_reductions.py).  Here the split is switched on for the CPU with small thresholds, so
that both code generators run every reduction type split and are checked against eager."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_graph
from ember.lower import split_reductions
from ember.lower.split_reductions import SplitPolicy
from recording import compile_recording


@pytest.fixture(autouse=True)
def split_on_cpu(monkeypatch):
    policies = dict(split_reductions.SPLIT_POLICIES)
    policies["cpu"] = SplitPolicy(target_rows=64, min_chunk=8, min_elements=256, min_inner=16)
    monkeypatch.setattr(split_reductions, "SPLIT_POLICIES", policies)


def batch_norm_train(x, w, b, mean, var):
    y = F.batch_norm(x, mean, var, w, b, training=True, momentum=0.1, eps=1e-5)
    return y, mean.clone(), var.clone()


def channel_stats(x):
    return x.sum((0, 2, 3)), x.amax((0, 2, 3)), x.amin((0, 2, 3)), x.mean((0, 2, 3))


def channel_var_mean(x):
    v0, m0 = torch.var_mean(x, (0, 2, 3), correction=0)
    v1, m1 = torch.var_mean(x, (0, 2, 3), correction=1)
    return v0, m0, v1, m1, x.std((0, 2, 3))


def full_reductions(x):
    return x.sum(), x.abs().max(), (x > 0).any(), (x > 0.5).sum(), torch.linalg.vector_norm(x)


def few_long_rows(x):
    flat = x.reshape(2, -1)
    return torch.softmax(flat, -1), torch.logsumexp(flat, -1), flat.argmax(-1), flat.prod(-1)


def column_sums(x):
    rows = x.reshape(-1, x.shape[-1])            # a bias gradient: sum over tokens, columns contiguous
    return rows.sum(0), (rows * rows).sum(0)


def integer_sum(x):
    return (x * 100).to(torch.int32).sum((0, 2, 3)), (x * 100).to(torch.int64).sum()


def stats_inputs(dtype=torch.float32, channels_last=False):
    def make():
        x = torch.randn(8, 3, 16, 12, dtype=dtype) + 2.0
        return (x.to(memory_format=torch.channels_last) if channels_last else x,)
    return make


CASES = [
    ("channel_stats", channel_stats, stats_inputs(), True),
    ("channel_stats_bf16", channel_stats, stats_inputs(torch.bfloat16), True),
    ("channel_stats_channels_last", channel_stats, stats_inputs(channels_last=True), True),
    ("var_mean", channel_var_mean, stats_inputs(), True),
    ("var_mean_bf16", channel_var_mean, stats_inputs(torch.bfloat16), True),
    ("batch_norm_train", batch_norm_train,
     lambda: (torch.randn(8, 3, 16, 12) * 3 + 1, torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5), True),
    ("full", full_reductions, stats_inputs(), True),
    ("few_long_rows", few_long_rows, lambda: (torch.rand(2, 4, 300) + 0.5,), True),
    ("column_sums", column_sums, lambda: (torch.randn(4, 128, 6),), True),
    ("integer_sum", integer_sum, stats_inputs(), True),
    ("small_not_split", channel_stats, lambda: (torch.randn(2, 3, 4, 4),), False),
]

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}


@pytest.mark.parametrize("options", [None, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
@pytest.mark.parametrize("name, fn, make, splits", CASES, ids=[c[0] for c in CASES])
def test_split_reduction_matches_eager(name, fn, make, splits, options):
    if options:
        pytest.importorskip("triton")
    inputs = make()
    expected_inputs = [t.clone() for t in inputs]
    expected = fn(*expected_inputs)
    compiled, sources = compile_recording(fn, options)
    out = compiled(*inputs)
    for a, e in zip(out, expected):
        rtol, atol = TOL.get(e.dtype, (0, 0))
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
    for a, e in zip(inputs, expected_inputs):            # running stats updated in place
        torch.testing.assert_close(a, e)
    assert len(sources) == 1
    assert ("stage 1" in sources[0]) == splits, "the reduction was not split as expected"


def test_split_welford_is_accurate_far_from_zero():
    """Chunk means combine without cancellation: a large mean with a small spread."""
    x = torch.randn(8, 3, 16, 12, dtype=torch.float64).float() * 1e-2 + 1e3

    def fn(t):
        return torch.var_mean(t, (0, 2, 3))
    var, mean = ember.compile(fn)(x)
    ref_var, ref_mean = torch.var_mean(x.double(), (0, 2, 3))
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-3, atol=0)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-6, atol=0)


def test_split_reductions_off_by_config(monkeypatch):
    from ember import config
    monkeypatch.setattr(config, "split_reductions", False)
    sources = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs)
        sources.append(compiled.source)
        return compiled
    x = torch.randn(8, 3, 16, 12)
    torch.testing.assert_close(ember.compile(channel_stats, backend=backend)(x), channel_stats(x), rtol=1e-5, atol=1e-4)
    assert "stage 1" not in sources[0]


@pytest.mark.parametrize("fn, make, columns", [
    (channel_stats, stats_inputs(channels_last=True), 3),
    (column_sums, lambda: (torch.randn(4, 128, 6),), 6)], ids=["channels_last", "column_sums"])
def test_partials_of_a_column_reduction_keep_rows_adjacent(fn, make, columns):
    """The partial's kept dims put the chunks first, so that the rows a Triton program reduces
    together are adjacent in memory and get the column form (many rows, a short reduced block),
    not chunks of one channel far apart."""
    pytest.importorskip("triton")
    compiled, sources = compile_recording(fn, {"cpu_backend": "triton"})
    compiled(*make())
    kernels = sources[0].split("# ---- kernels")[1].split("@triton.jit")
    stage1 = [k for k in kernels if "(split, stage 1)" in k]
    assert stage1
    for kernel in stage1:
        outer = kernel.split("# loops: outer [")[1].split("]")[0]
        assert int(outer.split(",")[-1]) == columns, kernel
        rblock = int(kernel.split("RBLOCK=")[1].split(" ")[0].rstrip(","))
        assert rblock <= 64, kernel


SYMBOLIC_CASES = [
    ("channel_stats", channel_stats, lambda n: (torch.randn(n, 3, 16, 12) + 2.0,)),
    ("var_mean", channel_var_mean, lambda n: (torch.randn(n, 3, 16, 12) + 2.0,)),
    ("var_mean_bf16", channel_var_mean, lambda n: (torch.randn(n, 3, 16, 12, dtype=torch.bfloat16) + 2.0,)),
    ("batch_norm_train", batch_norm_train,
     lambda n: (torch.randn(n, 3, 16, 12) * 3 + 1, torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5)),
    ("column_sums", column_sums, lambda n: (torch.randn(n, 128, 6),)),
]


SYMBOLIC_TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1.6e-2, 1e-2)}


@pytest.mark.parametrize("options", [{}, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
@pytest.mark.parametrize("name, fn, make", SYMBOLIC_CASES, ids=[c[0] for c in SYMBOLIC_CASES])
def test_split_reduction_with_symbolic_sizes(name, fn, make, options):
    """With every size symbolic the split is still taken (a symbolic reduced dim becomes a chunk
    dim whole; the Welford combine reads the counts from the sizes), one compile serves every
    size, and the results are eager's at sizes other than the one compiled for."""
    if options:
        pytest.importorskip("triton")
    compiled = ember.compile(fn, dynamic=True, options={**options, "fallback": "error"})
    for n in (8, 5, 2, 13):
        inputs = make(n)
        expected_inputs = [t.clone() for t in inputs]
        expected = fn(*expected_inputs)
        out = compiled(*inputs)
        for a, e in zip(out, expected):      # sums of up to 1664 values in another order
            rtol, atol = SYMBOLIC_TOL.get(e.dtype, (0, 0))
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
        for a, e in zip(inputs, expected_inputs):
            torch.testing.assert_close(a, e)
    events = compiled._ember_captured.events
    assert len(events) == 1, [e.recompile_reason for e in events]
    source = events[0].compiled.source
    assert "(split, stage 1)" in source and "s0" in source, source


@pytest.mark.parametrize("options", [{}, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
def test_symbolic_batch_larger_than_the_wanted_chunks_is_split_whole(options):
    """A symbolic reduced dim whose hint exceeds the chunks wanted (here 22, the batch 40) but not
    4x of them becomes a chunk dim whole, as a static batch of 40 picks itself as its divisor:
    the bias gradients of a conv net's training step with a symbolic batch ran as one kernel of
    a few programs (convnext_tiny on the H100: 0.21 ms against 0.05 ms static)."""
    if options:
        pytest.importorskip("triton")
    compiled = ember.compile(channel_stats, dynamic=True, options={**options, "fallback": "error"})
    for n in (40, 31, 60):
        x = torch.randn(n, 3, 16, 12) + 2.0
        for a, e in zip(compiled(x), channel_stats(x)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-4)
    events = compiled._ember_captured.events
    assert len(events) == 1, [e.recompile_reason for e in events]
    assert "(split, stage 1)" in events[0].compiled.source


def _sum_node(shape, reduced, name="s"):
    """sum over the dims ``reduced`` of a row-major input of ``shape``, as a loop node."""
    from ember.lower import ir
    kept = [d for d in range(len(shape)) if d not in reduced]
    out_vars = ir.make_vars("x", [shape[d] for d in kept])
    red_vars = ir.make_vars("r", [shape[d] for d in reduced])
    by_dim = dict(zip(kept, out_vars)) | dict(zip(reduced, red_vars))
    load = ir.Load("x", tuple(ir.index(by_dim[d]) for d in range(len(shape))), torch.float32)
    return ir.Reduction(name, tuple(shape[d] for d in kept), torch.float32, vars=out_vars,
                        reduction_vars=red_vars, reduction_type="sum", body=load)


def test_cuda_splits_a_column_reduction_into_more_partials_than_a_row_reduction():
    """A bias gradient (sum over the 4096 tokens of a (8, 512, 768) activation) splits into 64
    partial rows per column: 768 Triton programs of 64 columns, where chunks of at least 256 rows
    made 192 programs that drew 45% of the H100's bandwidth.  A row reduction of the same size
    keeps chunks of 256 contiguous elements."""
    policy = split_reductions.SPLIT_POLICIES["cuda"]
    columns = split_reductions._choose_split(_sum_node((8, 512, 768), (0, 1)), policy)
    assert columns.count == 64
    rows = split_reductions._choose_split(_sum_node((768, 8, 512), (1, 2)), policy)
    assert rows.count == 16
