"""The Triton code generator vs eager PyTorch.

On the CPU (CI) graphs are compiled with ``options={"cpu_backend": "triton"}``:
CPU tensors make ember run every kernel in Triton's interpreter by itself, so
TRITON_INTERPRET is never set here and cannot leak into the other tests of the
process (the C++ ones), whenever triton happens to be imported.  With
``EMBER_TRITON_TEST_DEVICE=cuda`` the same cases run compiled on a GPU.
"""
import functools
import math
import os
import re

import pytest

DEVICE = os.environ.get("EMBER_TRITON_TEST_DEVICE", "cpu")

triton = pytest.importorskip("triton")
import torch

from ember.backend import compile_graph
from ember.codegen import triton as triton_codegen
from ember.graph import TensorMeta
from ember.lower.builder import PrimGraphBuilder
from ember.runtime import triton_build

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

OPTIONS = {"cpu_backend": "triton"}


@pytest.fixture(scope="module")
def fresh_triton_cache(tmp_path_factory):
    """Triton's own cache would skip the front end for kernels built before."""
    return str(tmp_path_factory.mktemp("triton-cache"))


@functools.cache
def builds_for_sm90_here() -> bool:
    """Can this Triton compile for an H100 without one (its CUDA backend and ptxas are installed)?"""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    source = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef probe(out):\n    tl.store(out, 1.0)\n"
    try:
        module = triton_build.load_module(source, interpret=False)
        triton.compile(ASTSource(module.probe, {"out": "*fp32"}, None, {}), target=GPUTarget("cuda", 90, 32))
        return True
    except Exception:
        return False


@pytest.fixture(autouse=True)
def kernels_also_build_for_an_h100(monkeypatch, fresh_triton_cache):
    """On the CPU every schedule is also generated as for a GPU (without the interpreter's rounding
    helpers) and compiled for sm_90 (no GPU needed): the interpreter accepts code the real compiler
    rejects, and interpreted runs must not break later GPU builds.  The value: the GPU sources built
    (none where this Triton cannot build for sm_90 without a GPU)."""
    sources = []
    if DEVICE != "cpu":
        return sources
    monkeypatch.setenv("TRITON_CACHE_DIR", fresh_triton_cache)
    if not builds_for_sm90_here():
        return sources
    from triton.backends.compiler import GPUTarget
    build_kernels = triton_codegen.build_kernels

    def build_kernels_also_for_gpu(sched, interpret=None):
        source, kernels = triton_codegen.generate_triton(sched, interpret=False)
        module = triton_build.load_module(source, interpret=False)
        for kernel in kernels:
            triton_build._compile(getattr(module, kernel.name), kernel, kernel.aligned, GPUTarget("cuda", 90, 32))
        sources.append(source)
        return build_kernels(sched, interpret)
    monkeypatch.setattr(triton_codegen, "build_kernels", build_kernels_also_for_gpu)
    return sources


TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-9, 1e-12), torch.bfloat16: (1.6e-2, 1e-2),
       torch.float16: (2e-3, 1e-3)}


def t(value):
    return value.to(DEVICE)


def check(graph, inputs, rtol=1e-4, atol=1e-5, exact_dtype=True):
    compiled = compile_graph(graph, inputs, options=OPTIONS)
    expected = graph.run(*inputs)
    actual = compiled(*inputs)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and (a.dtype == e.dtype or not exact_dtype), (i, a.dtype, e.dtype, a.shape, e.shape)
        assert a.device.type == e.device.type
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"output {i}: {m}")
    return compiled


def softmax(b, x, shape):
    m = b.broadcast(b.amax(x, (1,)), shape, (0,))
    e = b.exp(b.sub(x, m))
    return b.div(e, b.broadcast(b.sum(e, (1,)), shape, (0,)))


def layer_norm(b, x, w, bias, shape):
    vm = b.var_mean(x, (1,))
    var, mean = b.getitem(vm, 0), b.getitem(vm, 1)
    rstd = b.rsqrt(b.add(var, 1e-5))
    y = b.mul(b.sub(x, b.broadcast(mean, shape, (0,))), b.broadcast(rstd, shape, (0,)))
    return b.add(b.mul(y, b.broadcast(w, shape, (1,))), b.broadcast(bias, shape, (1,))), mean, rstd


def rms_norm(b, x, w, shape):
    ms = b.div(b.sum(b.mul(x, x), (1,)), float(shape[1]))
    r = b.rsqrt(b.add(ms, 1e-6))
    return b.mul(b.mul(x, b.broadcast(r, shape, (0,))), b.broadcast(w, shape, (1,)))


@pytest.fixture
def looped_reductions():
    """Force the looped (non-persistent) reduction path at test sizes."""
    saved = dict(triton_codegen.TUNING)
    triton_codegen.TUNING.update(persistent_limit=16, looped_rblock=16)
    yield
    triton_codegen.TUNING.clear()
    triton_codegen.TUNING.update(saved)


# ---------------------------------------------------------------- pointwise
def test_pointwise_chain_is_one_kernel_without_masks():
    xv = t(torch.randn(16, 64))
    b = PrimGraphBuilder()
    y = b.input("x", xv)
    for name in ("tanh", "exp", "neg", "sigmoid", "erf", "abs", "sqrt", "log1p", "sin", "cos"):
        y = b.call(name, y)
    compiled = check(b.build([y]), [xv])
    assert compiled.stats == {"kernel_count": 1, "extern_count": 0}
    kernel_source = compiled.source.split("def kernel0")[1]
    assert "mask" not in kernel_source           # 1024 elements: the block divides the size
    assert "in_x + (xindex)" in kernel_source    # contiguous: vectorizable flat index


def test_broadcast_noncontiguous_and_views():
    base = t(torch.randn(10, 24))
    tv = base.t()
    sv = t(torch.randn(12, 50))[:, ::2]
    rv = t(torch.randn(1, 24))
    ov = t(torch.randn(100))[3:]
    b = PrimGraphBuilder()
    tt, s, r, o = b.input("t", tv), b.input("s", sv), b.input("r", rv), b.input("o", ov)
    outs = [
        b.add(b.permute(tt, (1, 0)), b.expand(r, (10, 24))),
        b.mul(b.slice(s, 1, 1, 25, 3), 2.0),
        b.reshape(b.permute(tt, (1, 0)), (240,)),
        b.exp(b.reshape(o, (97,))),
        b.as_strided(o, (4, 5), (10, 2), 7),
        b.sum(b.reshape(b.exp(b.permute(tt, (1, 0))), (2, 5, 24)), (1,)),
        b.permute(b.sin(tt), (1, 0)),
        b.sum(s, (0,)),                                                 # column reduction
        b.sum(s, (0, 1)),                                               # full reduction
    ]
    check(b.build(outs), [tv, sv, rv, ov], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_float_ops(dtype):
    torch.manual_seed(0)
    xv = t(torch.randn(7, 33).to(dtype))
    pv = t((torch.rand(7, 33) + 0.1).to(dtype))
    b = PrimGraphBuilder()
    x, p = b.input("x", xv), b.input("p", pv)
    outs = [b.call(name, x) for name in ("exp", "tanh", "erf", "sigmoid", "sin", "cos", "abs", "neg", "floor",
                                         "ceil", "round", "trunc", "expm1", "atan", "sign", "isnan")]
    outs += [b.call(name, p) for name in ("log", "sqrt", "rsqrt", "log1p", "reciprocal", "log2", "acos")]
    outs += [b.call(name, x, p) for name in ("add", "sub", "mul", "div", "maximum", "minimum", "atan2",
                                             "floor_divide", "remainder", "fmod", "lt", "eq")]
    outs += [b.pow(p, 2.5), b.mul(x, 3.0), b.where(b.gt(x, 0.0), x, p)]
    outs += [b.sum(x, (1,)), b.amax(x, (1,)), b.amin(x, (0,)), b.argmax(x, 1), b.argmin(x, 0), b.prod(p, (1,))]
    vm = b.var_mean(x, (1,), correction=1)
    outs += [b.getitem(vm, 0), b.getitem(vm, 1), b.cast(x, torch.float32), b.cast(b.mul(x, 10.0), torch.int32)]
    rtol, atol = TOL[dtype]
    check(b.build(outs), [xv, pv], rtol, atol)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_int_ops(dtype):
    torch.manual_seed(0)
    low = 0 if dtype == torch.uint8 else -20
    xv = torch.randint(low, 20, (5, 17), dtype=dtype)
    dv = torch.randint(1, 7, (5, 17), dtype=dtype)
    if dtype != torch.uint8:
        dv = dv * (torch.randint(0, 2, (5, 17), dtype=dtype) * 2 - 1)
    xv, dv = t(xv), t(dv)
    b = PrimGraphBuilder()
    x, d = b.input("x", xv), b.input("d", dv)
    outs = [b.call(name, x, d) for name in ("add", "sub", "mul", "floor_divide", "remainder", "fmod", "maximum",
                                            "minimum", "bitwise_and", "bitwise_or", "bitwise_xor", "eq", "lt")]
    outs += [b.abs(x), b.mul(x, 3), b.sum(b.cast(x, torch.int64), (1,)), b.amax(x, (1,)), b.amin(x, (0,)),
             b.argmax(x, 1), b.cast(x, torch.float32), b.bitwise_not(x)]
    check(b.build(outs), [xv, dv], 0, 0)


def test_bool_ops_and_integer_division_by_zero_survives():
    av, cv = t(torch.rand(9, 5) > 0.5), t(torch.rand(9, 5) > 0.3)
    b = PrimGraphBuilder()
    a, c = b.input("a", av), b.input("c", cv)
    outs = [b.logical_and(a, c), b.logical_or(a, c), b.logical_xor(a, c), b.logical_not(a),
            b.where(a, b.cast(c, torch.float32), 2.5), b.cast(a, torch.int64), b.amax(a, (1,))]
    check(b.build(outs), [av, cv], 0, 0)
    xv, zv = t(torch.tensor([7, -7, 0, 5], dtype=torch.int32)), t(torch.zeros(4, dtype=torch.int32))
    b = PrimGraphBuilder()
    x, z = b.input("x", xv), b.input("z", zv)
    graph = b.build([b.floor_divide(x, z), b.remainder(x, z), b.fmod(x, z)])
    out = compile_graph(graph, [xv, zv], options=OPTIONS)(xv, zv)
    assert all(o.shape == (4,) for o in out)


# ---------------------------------------------------------------- reductions
@pytest.mark.parametrize("looped", [False, True])
def test_softmax_layer_norm_rms_norm(looped, request):
    if looped:
        request.getfixturevalue("looped_reductions")
    n, c = 12, 40
    torch.manual_seed(0)
    xv, wv, bv = t(torch.randn(n, c) * 3), t(torch.randn(c)), t(torch.randn(c))
    b = PrimGraphBuilder()
    x, w, bias = b.input("x", xv), b.input("w", wv), b.input("b", bv)
    ln, mean, rstd = layer_norm(b, x, w, bias, (n, c))
    compiled = check(b.build([softmax(b, x, (n, c)), ln, mean, rstd, rms_norm(b, x, w, (n, c))]), [xv, wv, bv])
    kind = "looped" if looped else "persistent"
    if not looped:   # a value stored and read again in one kernel is reused, never reloaded (a GPU race)
        assert "tl.load(out_" not in compiled.source
    assert all(f"# {kind}:" in compiled.source.split(f"def {k.name}")[1] for k in compiled.schedule.kernels)


@pytest.mark.parametrize("looped", [False, True])
def test_var_mean_argmax_and_nan(looped, request):
    if looped:
        request.getfixturevalue("looped_reductions")
    xv = torch.randn(6, 37)
    xv[1, 3] = float("nan")
    xv[2, 0] = float("nan")
    xv[3, 5] = xv[3, 30] = 50.0                # tie: first index wins
    xv[4, :] = float("-inf")
    xv = t(xv)
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    finite = b.where(b.isinf(x), 0.0, x)      # an all -inf row: torch's Welford mean is NaN, two-pass gives -inf
    vm = b.var_mean(finite, (1,), correction=1)
    vm0 = b.var_mean(finite, (1,), correction=0)
    graph = b.build([b.amax(x, (1,)), b.amin(x, (1,)), b.maximum(x, 0.0), b.minimum(x, 0.0), b.argmax(x, 1),
                     b.argmin(x, 1), b.amax(x, (0, 1)), b.getitem(vm, 0), b.getitem(vm, 1), b.getitem(vm0, 0),
                     b.sum(x, (1,)), b.prod(b.div(x, 10.0), (1,))])
    check(graph, [xv], 1e-4, 1e-5)


def test_column_welford_with_a_partial_last_pass(monkeypatch):
    """BatchNorm's statistics over a channels-last activation: a column Welford reduction whose
    last pass is partial (105 rows in passes of 32).  The mean's update multiplies by one
    reciprocal per pass (every lane has the same count until the last pass); lanes past the end
    keep their state.  Values far from 0 (mean 10, std 4) check the update's accuracy."""
    monkeypatch.setitem(triton_codegen.TUNING, "column_few_elements", 0)     # looped, not one tile
    xv = t((torch.randn(3, 8, 5, 7) * 4 + 10).to(memory_format=torch.channels_last))
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    vm = b.var_mean(x, (0, 2, 3), correction=0)
    compiled = check(b.build([b.getitem(vm, 0), b.getitem(vm, 1)]), [xv], 1e-5, 1e-5)
    assert "looped: XBLOCK=8 RBLOCK=32" in compiled.source and "_weight = " in compiled.source, compiled.source


def test_bf16_in_out_softmax_and_layer_norm():
    n, c = 8, 96
    xv = t(torch.randn(n, c).to(torch.bfloat16))
    wv, bv = t(torch.randn(c).to(torch.bfloat16)), t(torch.randn(c).to(torch.bfloat16))
    b = PrimGraphBuilder()
    x, w, bias = b.input("x", xv), b.input("w", wv), b.input("b", bv)
    ln, _, _ = layer_norm(b, x, w, bias, (n, c))
    # every bf16 prim is rounded as eager rounds it; a 1-ulp difference in the mean (summation
    # order) still moves a cancelling (x - mean) * rstd * w + b by one ulp of its |terms| (< 4):
    # 2**-6, hence the absolute tolerance of two such ulps
    compiled = check(b.build([softmax(b, x, (n, c)), ln]), [xv, wv, bv], TOL[torch.bfloat16][0], 2 ** -5)
    assert ".to(tl.float32)" in compiled.source and ".to(tl.bfloat16)" in compiled.source


def test_zero_size_tensors():
    xv = t(torch.randn(0, 5))
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    compiled = check(b.build([b.exp(x), b.sum(x, (0,)), b.add(x, 1.0)]), [xv])
    assert compiled(xv)[0].shape == (0, 5)


def test_extern_then_fused_epilogue():
    xv, wv, bv = t(torch.randn(32, 48)), t(torch.randn(48, 64)), t(torch.randn(64))
    b = PrimGraphBuilder()
    x, w, bias = b.input("x", xv), b.input("w", wv), b.input("b", bv)
    mm = b.graph.call(torch.mm, (x, w), meta=TensorMeta.of(torch.empty(32, 64, device=DEVICE)))
    h = b.add(mm, b.broadcast(bias, (32, 64), (1,)))
    gelu = b.mul(b.mul(h, 0.5), b.add(b.erf(b.mul(h, 1 / math.sqrt(2))), 1.0))
    compiled = check(b.build([gelu, softmax(b, h, (32, 64))]), [xv, wv, bv], rtol=1e-3, atol=1e-3)
    assert compiled.stats["extern_count"] == 1


def test_outputs_keep_eager_strides_and_mutation_write_back():
    xv = t(torch.randn(6, 4))
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    y = b.permute(b.exp(x), (1, 0))
    graph = b.build([y, b.add(x, 1.0)])
    graph.extra.update({"num_user_outputs": 1, "mutated_inputs": [(0, 1)]})
    expected = torch.exp(xv).t()
    target = xv.clone()
    (out,) = compile_graph(graph, [xv.clone()], options=OPTIONS)(target)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()
    torch.testing.assert_close(target, xv + 1)


def test_iota_full_and_runtime_scalar_input():
    b = PrimGraphBuilder()
    x = b.input("x", t(torch.randn(5)))
    s = b.input("s", 2.5)
    i = b.iota(5, 0, 1, torch.float32, torch.device(DEVICE))
    f = b.full((5,), 3.0, torch.float32, torch.device(DEVICE))
    graph = b.build([b.add(b.mul(x, i), f), b.mul(x, s)])
    compiled = compile_graph(graph, [t(torch.randn(5)), 2.5], options=OPTIONS)
    xv = t(torch.randn(5))
    out = compiled(xv, 4.0)
    torch.testing.assert_close(out[0], xv * t(torch.arange(5.0)) + 3)
    torch.testing.assert_close(out[1], xv * 4.0)


# ---------------------------------------------------------------- generated code and cache
def test_generated_kernel_is_cached_on_disk_and_reused():
    xv = t(torch.randn(4, 8))
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    graph = b.build([b.mul(b.exp(x), 0.25)])
    compile_graph(graph, [xv], options=OPTIONS)
    written = triton_build.stats["modules_written"]
    triton_build._modules.clear()                  # as in a fresh process
    compiled = compile_graph(graph, [xv], options=OPTIONS)
    assert triton_build.stats["modules_written"] == written
    path = compiled.source.splitlines()[compiled.source.splitlines().index("# ---- kernels") + 1][2:]
    assert os.path.exists(path) and path.startswith(os.environ["EMBER_CACHE_DIR"])
    torch.testing.assert_close(compiled(xv)[0], torch.exp(xv) * 0.25)


def test_kernels_with_the_same_code_are_compiled_once():
    # two "layers": softmax(x) @ w1, softmax of that @ w2, ... -> the softmax kernels differ only in names
    xv, w1v, w2v = t(torch.randn(16, 16)), t(torch.randn(16, 16)), t(torch.randn(16, 16))
    b = PrimGraphBuilder()
    x, w1, w2 = b.input("x", xv), b.input("w1", w1v), b.input("w2", w2v)
    meta = TensorMeta.of(torch.empty(16, 16, device=DEVICE))
    h = b.graph.call(torch.mm, (softmax(b, x, (16, 16)), w1), meta=meta)
    h = b.graph.call(torch.mm, (softmax(b, h, (16, 16)), w2), meta=meta)
    compiled = check(b.build([softmax(b, h, (16, 16))]), [xv, w1v, w2v], rtol=1e-3, atol=1e-4)
    assert compiled.stats["kernel_count"] == 3
    assert compiled.source.count("@triton.jit\ndef kernel") == 1
    assert "kernel1 = kernel0  # the same code as kernel0" in compiled.source
    assert "kernel2 = kernel0" in compiled.source


def test_channels_last_pointwise_walks_memory_in_order():
    # logical NCHW loops over NHWC buffers would stride by C between neighbouring lanes
    xv = t(torch.randn(2, 8, 5, 6)).to(memory_format=torch.channels_last)
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    compiled = check(b.build([b.add(b.mul(x, 2.0), 1.0)]), [xv])
    assert "outer [2, 5, 6, 8]" in compiled.source
    assert "tl.load(in_x + (xindex)" in compiled.source and "tl.store(out_add + (xindex)" in compiled.source
    assert compiled(xv)[0].stride() == xv.stride()


def test_block_choices_follow_the_problem():
    b = PrimGraphBuilder()
    xv = t(torch.randn(3, 100))
    x = b.input("x", xv)
    compiled = check(b.build([b.sum(x, (1,)), b.mul(x, 2.0)]), [xv])
    header = compiled.source.split("def kernel0")[1]
    assert "persistent: XBLOCK=" in header and "RBLOCK=128" in header and "rmask = rindex < rnumel" in header
    assert "int32 indexing" in header


def test_column_sum_over_a_cat_of_heads_tiles_across_columns():
    """The bias gradient of a fused qkv projection: the column sums of q, k, v's gradients
    ([rows, 1, heads, dim] each) concatenated.  A column's address is a mod of the column index
    (``x % 24``, from ``8*((x // 8) % 3) + x % 8``), not the plain var; the row stride still makes
    it a column read, so the block is many columns by a few rows (as a row reduction, 16 rows per
    block read 16 bytes per row: vit's 12 such kernels ran at 0.6 TB/s on the H100)."""
    rows, heads, dim = 200, 3, 8
    values = [t(torch.randn(rows, 1, heads, dim)) for _ in range(3)]
    b = PrimGraphBuilder()
    q, k, v = (b.input(name, value) for name, value in zip("qkv", values))
    qkv = b.reshape(b.cat([q, k, v], 1), (rows, 3 * heads * dim))
    compiled = check(b.build([b.sum(qkv, (0,))]), values, rtol=1e-4, atol=1e-4)
    header = compiled.source.split("def kernel0")[1]
    assert "24 * rindex + ((xindex) % 24)" in header       # the address this test is about
    # many columns per block (32 when there are few programs; their rows in longer tiles)
    assert re.search(r"(looped|persistent): XBLOCK=(32|64) RBLOCK=", header)


# ---------------------------------------------------------------- regressions (harness zoo, bf16)
def test_bf16_output_reread_in_same_kernel():
    """A bf16 residual stored and re-read after a reduction of the same kernel (LayerNorm of
    x + y, as in nanoGPT/gpt2): the re-read takes the stored bf16 value up to fp32 once (the
    interpreter's explicit rounding failed on it: 'Cannot bitcast data-type of size 16 to ... 32')."""
    torch.manual_seed(0)
    n, c = 8, 32
    xv = t(torch.randn(n, c).to(torch.bfloat16))
    yv = t(torch.randn(n, c).to(torch.bfloat16))
    b = PrimGraphBuilder()
    x, y = b.input("x", xv), b.input("y", yv)
    h = b.add(x, y)
    h32 = b.cast(h, torch.float32)
    mean = b.getitem(b.var_mean(h32, (1,)), 1)
    out = b.cast(b.sub(h32, b.broadcast(mean, (n, c), (0,))), torch.bfloat16)
    check(b.build([h, out]), [xv, yv], *TOL[torch.bfloat16])


def widened_before_stored(source: str) -> list[str]:
    """Temporaries of each kernel whose bf16/fp16 value is widened to fp32 above the line storing it."""
    late = []
    for kernel in source.split("@triton.jit")[1:]:
        lines = kernel.splitlines()
        stored = {m.group(1): i for i, line in enumerate(lines)
                  if (m := re.search(r"tl\.store\(.*, (tmp\d+)\)$", line))}
        widened = {m.group(1): i for i, line in enumerate(lines)
                   if (m := re.match(r"\s*tmp\d+ = (tmp\d+)\.to\(tl\.float32\)$", line))}
        late += [name for name, i in stored.items() if name in widened and widened[name] < i]
    return late


def test_bf16_value_stored_before_it_is_widened(kernels_also_build_for_an_h100):
    """Three bf16 outputs of one [4, 1024] tile (8 warps), the second widened again for the third.
    With the store of a bf16 value below its widening (``v = x.to(bf16); w = v.to(fp32); ...
    tl.store(p, v)``), Triton 3.6 failed to compile the kernel for sm_90: 'operand #0 does not
    dominate this use' in TritonGPURemoveLayoutConversions (the pointwise zoo model's backward on
    the H100; Triton 3.9 compiles both orders, hence the check of the order too)."""
    rows, cols = 4, 1024
    uv = t(torch.randn(rows))
    w1v, w2v = t(torch.randn(cols).to(torch.bfloat16)), t(torch.randn(cols).to(torch.bfloat16))
    b = PrimGraphBuilder()
    u, w1, w2 = b.input("u", uv), b.input("w1", w1v), b.input("w2", w2v)
    w1_tile = b.broadcast(w1, (rows, cols), (1,))
    a = b.mul(b.broadcast(u, (rows, cols), (0,)), w1_tile)
    a_bf16 = b.cast(a, torch.bfloat16)
    half = b.cast(b.mul(a, 0.5), torch.bfloat16)
    scaled = b.mul(half, b.broadcast(w2, (rows, cols), (1,)))
    compiled = check(b.build([a_bf16, half, scaled, b.sum(w1_tile, (1,))]), [uv, w1v, w2v], *TOL[torch.bfloat16])
    header = compiled.source.split("def kernel0")[1]
    assert "persistent: XBLOCK=4 RBLOCK=1024, num_warps=8" in header
    for source in [compiled.source, *kernels_also_build_for_an_h100]:
        assert not widened_before_stored(source), source
    if DEVICE == "cpu" and not kernels_also_build_for_an_h100:
        pytest.skip("this Triton cannot compile for sm_90 without a GPU (only the order was checked)")


def test_load_through_size_one_dims_is_unmasked_scalar():
    """(2, 1) = slice of an expanded arange (gpt2's position ids): every element reads offset 0,
    so the pointer is a scalar and may not take a block mask ('Mask argument cannot be block
    type if pointer argument is not a block', in the interpreter and in Triton's compiler)."""
    av = t(torch.arange(32))
    b = PrimGraphBuilder()
    a = b.input("a", av)
    s = b.slice(b.expand(b.reshape(a, (1, 32)), (2, 32)), 1, 0, 1, 1)
    check(b.build([b.sub(s, 1)]), [av])


def test_interpreted_kernels_leave_triton_language_unpatched():
    # Triton 3.6's interpreter patches triton.language for every device-function call (tl.sum,
    # ember's helpers) and never undoes it; GPU compiles in the same process then failed
    import triton.language as tl
    before = {name: dict(vars(ns)) for name, ns in (("tl", tl), ("core", tl.core), ("tensor", tl.core.tensor))}
    xv = t(torch.randn(4, 33))
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    check(b.build([b.argmax(x, 1), b.sum(x, (1,)), b.floor_divide(x, 3.0)]), [xv])
    for name, ns in (("tl", tl), ("core", tl.core), ("tensor", tl.core.tensor)):
        changed = [key for key, value in before[name].items() if vars(ns).get(key) is not value]
        assert not changed, (name, changed)
