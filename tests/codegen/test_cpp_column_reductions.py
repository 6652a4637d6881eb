"""Column reductions in the C++ code generator: sums/max/min/prod down the columns of a row-major
tensor (weight and bias gradients) are emitted column-tiled (codegen/cpp.py,
``KernelPrinter.emit_column_reduction``): the simd loop runs along adjacent columns instead of
along the rows, a row apart.  Compared with eager, and the generated source is checked for the
column form, so that a detection that silently stops firing fails here."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

import ember
from ember.codegen import cpp
from recording import compile_recording

COLUMN_FORM = "column-tiled reduction"


def with_nans(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[5, 3] = float("nan")                 # one NaN in column 3
    x[-1, -1] = float("nan")               # and one in the last column (the last, partial tile)
    return x


def column_sum(x):
    return x.sum(0)


def column_max(x):
    return x.amax(0)


def column_min(x):
    return x.amin(0)


def column_prod(x):
    return x.prod(0)


def middle_sum(x):                         # [B, R, C] -> [B, C]: outer vars (B, C), tiled along C
    return x.sum(1)


def leading_sum(x):                        # [B, R, C] -> [C]: two inner vars
    return x.sum((0, 1))


def scaled_sum(x):                         # a store after the reduction, in the same kernel
    return x.sum(0) * 2


def normalize_columns(x):                  # the reduction kernel, then a pointwise kernel reading it
    return x / x.sum(0, keepdim=True)


def column_statistics(x):                  # several reductions of one kernel, NaN flags among them
    return x.sum(0), (x * x).sum(0), x.amax(0), x.amin(0)


def row_sum(x):                            # contiguous along the reduced var: the general form
    return x.sum(1)


# (fn, input maker, column form expected, tolerances)
FP32 = {"rtol": 1e-5, "atol": 1e-4}
CASES = [
    (column_sum, lambda: torch.randn(300, 1000), True, FP32),
    (column_sum, lambda: torch.randn(257, 70), True, FP32),
    (column_sum, lambda: torch.randn(40, 64), True, FP32),
    (column_sum, lambda: torch.randn(33, 5), True, FP32),          # fewer columns than a tile
    (column_sum, lambda: torch.randn(300, 1), False, FP32),        # a single column: nothing to tile
    (column_sum, lambda: torch.empty(0, 70), True, FP32),          # no rows: the initial values
    (column_sum, lambda: torch.randn(70, 300).t(), False, FP32),   # the reduced dim contiguous: general form
    (column_sum, lambda: torch.rand(300, 1000, dtype=torch.bfloat16), True, {}),
    (column_sum, lambda: torch.rand(300, 70, dtype=torch.float16), True, {}),
    (column_sum, lambda: torch.randint(-100, 100, (300, 70), dtype=torch.int32), True, {}),
    (column_sum, lambda: torch.randn(200, 70, dtype=torch.float64), True, {}),
    (column_max, lambda: torch.randn(300, 1000), True, {}),
    (column_max, lambda: with_nans(torch.randn(300, 70)), True, {}),
    (column_min, lambda: with_nans(torch.randn(300, 70)), True, {}),
    (column_max, lambda: with_nans(torch.randn(300, 70)).to(torch.bfloat16), True, {}),
    (column_min, lambda: torch.randint(-100, 100, (300, 70)), True, {}),
    (column_prod, lambda: torch.rand(50, 70) + 0.5, True, {"rtol": 1e-4, "atol": 1e-6}),
    (middle_sum, lambda: torch.randn(3, 200, 70), True, FP32),
    (leading_sum, lambda: torch.randn(3, 200, 70), True, FP32),
    (scaled_sum, lambda: torch.randn(300, 1000), True, FP32),
    (normalize_columns, lambda: torch.rand(300, 1000) + 0.1, True, FP32),
    (column_statistics, lambda: with_nans(torch.randn(300, 70)), True, FP32),
    (row_sum, lambda: torch.randn(70, 300), False, FP32),
]


@pytest.mark.parametrize("fn, make, column_form, tolerances", CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_column_reduction_matches_eager(fn, make, column_form, tolerances):
    torch.manual_seed(0)
    x = make()
    compiled, sources = compile_recording(fn)
    out = compiled(x)
    torch.testing.assert_close(out, fn(x), equal_nan=True, **tolerances)
    assert sources and all("# eager" not in s for s in sources), "the graph ran eagerly"
    assert (COLUMN_FORM in "\n".join(sources)) == column_form


def test_column_tile_zero_turns_the_column_form_off(monkeypatch):
    monkeypatch.setattr(cpp, "COLUMN_TILE", 0)
    x = torch.randn(300, 70)
    compiled, sources = compile_recording(column_sum)
    torch.testing.assert_close(compiled(x), x.sum(0), **FP32)
    assert COLUMN_FORM not in sources[0]


def test_gathered_rows_check_their_indices():
    """A column sum of gathered rows checks its indices (the kernel takes the error record): the
    column form leaves such kernels to the general form, which raises eager's error."""
    def gathered(x, idx):
        return x[idx].sum(0)
    x = torch.randn(50, 100)
    idx = torch.randint(0, 50, (300,))
    compiled, sources = compile_recording(gathered)
    torch.testing.assert_close(compiled(x, idx), gathered(x, idx), **FP32)
    assert "ember_error" in sources[0] and COLUMN_FORM not in sources[0]
    bad = idx.clone()
    bad[7] = 50
    with pytest.raises(IndexError):
        compiled(x, bad)


class LayerNormGelu(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(dim))
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.layer_norm(x, (self.dim,), self.weight, self.bias))


def test_layer_norm_weight_gradient(monkeypatch):
    """The pattern of a training step's LayerNorm backward: the weight and bias gradients are
    column sums over the batch rows, fused with the normalization they need."""
    sources: list[str] = []
    generate = cpp.generate_cpp

    def recording(sched, *rest):       # the backward compiles at .backward(), outside CompiledGraph.source
        source = generate(sched, *rest)
        sources.append(source)
        return source
    monkeypatch.setattr(cpp, "generate_cpp", recording)

    torch.manual_seed(0)
    model = LayerNormGelu(200)   # 200 columns: not a multiple of the tile
    reference = copy.deepcopy(model)
    compiled = ember.compile(model)
    x, grad = torch.randn(4, 33, 200), torch.randn(4, 33, 200)
    results = []
    for module in (compiled, reference):
        inputs = x.clone().requires_grad_(True)
        out = module(inputs)
        out.backward(grad)
        results.append((out, inputs.grad))
    (out, x_grad), (expected_out, expected_x_grad) = results
    torch.testing.assert_close(out, expected_out, **FP32)
    torch.testing.assert_close(x_grad, expected_x_grad, **FP32)
    torch.testing.assert_close(model.weight.grad, reference.weight.grad, **FP32)
    torch.testing.assert_close(model.bias.grad, reference.bias.grad, **FP32)
    assert any(COLUMN_FORM in s for s in sources), "the weight gradient did not use the column form"


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("columns", [100, 1024, 1500])
def test_tiles_as_wide_as_threads_allow(monkeypatch, threads, columns):
    """Tiles are as wide as leaves one for each thread (COLUMN_TILE_BYTES): each row's memory is
    read in long runs.  The width changes no result: each column adds its rows in the same order."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(0)
    x = torch.randn(512, columns)        # work enough for a parallel kernel
    fn = lambda t: (t.sum(0), (t * t).sum(0), t.amax(0))
    compiled, sources = compile_recording(fn)
    results = compiled(x)
    ember.reset()
    monkeypatch.setattr(cpp, "COLUMN_TILE_BYTES", 0)
    narrow, narrow_sources = compile_recording(fn)
    for actual, same, expected in zip(results, narrow(x), fn(x)):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)   # sums of 512 rows
        assert torch.equal(actual, same)
    tile = -(-columns // threads)
    tile = max(64, min(-(-tile // 64) * 64, 16384 // 16 // 64 * 64))   # 3 float sums and a NaN flag
    assert f"// column-tiled reduction: {tile} adjacent columns per tile" in sources[0], sources[0][:2000]
    assert "// column-tiled reduction: 64 adjacent columns per tile" in narrow_sources[0]
