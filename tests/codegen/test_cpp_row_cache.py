"""Row arrays of multi-pass row kernels in the C++ code generator (codegen/cpp_rows.py, ``RowCache``):
a value that a later pass over a row reuses is stored by the first pass that computes it into a
per-thread row array; a buffer that only later passes of its kernel read lives in a row array;
one that nobody reads is not stored.  Compared with eager, and the generated source is checked
for the form, so that a plan that silently stops firing fails here."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

import ember
from ember.codegen import cpp, cpp_rows
from ember.lower import scheduler
from recording import compile_recording

REUSED_VALUE = "that later passes reuse"
PRIVATE_BUFFER = "only later passes of this kernel read it"


def record_generated(monkeypatch) -> list[str]:
    """Every generated .cpp, the backward's too (it compiles at .backward())."""
    sources: list[str] = []
    generate = cpp.generate_cpp

    def recording(sched, *rest):
        source = generate(sched, *rest)
        sources.append(source)
        return source
    monkeypatch.setattr(cpp, "generate_cpp", recording)
    return sources


def pointwise_chain(x, w, b, g):
    """train_cpu.py's pointwise block: layer norm -> gelu * sigmoid -> RMS norm -> softmax."""
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    h = F.gelu(h) * torch.sigmoid(h)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    return torch.softmax(h, dim=-1)


def softmax_of_tanh(x):                      # max, then sum, then store: tanh reused by both
    return torch.softmax(torch.tanh(x) * 3, dim=-1)


def log_softmax_of_exp(x):                   # a max with a NaN flag over a cached value
    return torch.log_softmax(torch.exp(x * 0.5), dim=-1)


def params(dim: int, dtype=torch.float32):
    return (torch.rand(dim, dtype=dtype) + 0.5, torch.randn(dim, dtype=dtype), torch.rand(dim, dtype=dtype) + 0.5)


FP32 = {"rtol": 1e-5, "atol": 1e-5}
CASES = [
    ("chain-1024", lambda: (torch.randn(4, 8, 1024), *params(1024)), pointwise_chain, FP32),
    ("chain-odd", lambda: (torch.randn(3, 7, 37), *params(37)), pointwise_chain, FP32),
    ("chain-one-column", lambda: (torch.randn(5, 1), *params(1)), pointwise_chain, FP32),
    ("chain-transposed", lambda: (torch.randn(40, 24).t(), *params(40)), pointwise_chain, FP32),
    ("chain-bf16", lambda: (torch.randn(6, 130, dtype=torch.bfloat16), *params(130, torch.bfloat16)),
     pointwise_chain, {"rtol": 2e-2, "atol": 2e-2}),
    ("chain-fp64", lambda: (torch.randn(6, 130, dtype=torch.float64), *params(130, torch.float64)),
     pointwise_chain, {}),
    ("softmax-tanh", lambda: (torch.randn(9, 333),), softmax_of_tanh, FP32),
    ("log-softmax-exp-nan", lambda: (torch.where(torch.rand(9, 50) < 0.05, float("nan"), torch.randn(9, 50)),),
     log_softmax_of_exp, FP32),
]


@pytest.mark.parametrize("name, make, fn, tolerances", CASES, ids=[c[0] for c in CASES])
def test_row_cache_matches_eager(name, make, fn, tolerances):
    torch.manual_seed(0)
    args = make()
    compiled, sources = compile_recording(fn)
    out = compiled(*args)
    torch.testing.assert_close(out, fn(*args), equal_nan=True, **tolerances)
    assert sources and all("# eager" not in s for s in sources), "the graph ran eagerly"
    if args[0].shape[-1] > 1:
        assert REUSED_VALUE in sources[0], "no value was carried between passes in a row array"


def test_row_cache_off_gives_the_same_values(monkeypatch):
    # the vector types' loops for both: without libmvec g++ leaves a scalar loop that recomputes tanh
    # unvectorized, and its sum (in order) differs from the vectorized one that reads it from a row array
    monkeypatch.setattr(cpp, "VECTOR_TYPES", True)
    torch.manual_seed(0)
    args = (torch.randn(4, 8, 200), *params(200))
    compiled, sources = compile_recording(pointwise_chain)
    with_cache = compiled(*args)
    monkeypatch.setattr(cpp_rows, "ROW_CACHE_ELEMENTS", 0)
    off, off_sources = compile_recording(pointwise_chain)
    without = off(*args)
    assert REUSED_VALUE in sources[0] and REUSED_VALUE not in off_sources[0]
    torch.testing.assert_close(with_cache, without, rtol=0, atol=0)     # the same operations, in the same order


def test_long_rows_keep_the_general_form():
    """Rows longer than ROW_CACHE_ELEMENTS recompute (the arrays would not stay in cache)."""
    x = torch.randn(2, cpp_rows.ROW_CACHE_ELEMENTS + 1)
    compiled, sources = compile_recording(softmax_of_tanh)
    torch.testing.assert_close(compiled(x), softmax_of_tanh(x), **FP32)
    assert "row_cache" not in sources[0]


@pytest.mark.parametrize("vector_types", [False, True])
def test_max_nan_flag_vectorizes(monkeypatch, vector_types):
    """The NaN flag of a float max is an int: a bool reduction kept g++ from vectorizing the loop.
    On the prelude's vector types (cpp.VECTOR_TYPES) the lanes' max keeps a NaN instead."""
    monkeypatch.setattr(cpp, "VECTOR_TYPES", vector_types)
    x = torch.randn(8, 67)
    x[3, 5], x[5, 66] = float("nan"), float("nan")      # in a whole block and in the tail
    compiled, sources = compile_recording(lambda t: torch.softmax(t, -1))
    torch.testing.assert_close(compiled(x), torch.softmax(x, -1), equal_nan=True)
    if vector_types:
        kernel = sources[0].split("extern \"C\"")[-1]
        assert "ember::vec_max(" in kernel and "_nan" not in kernel
        return
    assert "int amax_nan = 0;" in sources[0] or "_nan = 0;" in sources[0]
    assert "bool " not in "".join(line for line in sources[0].splitlines() if "_nan" in line)


class PointwiseBlock(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln_weight = torch.nn.Parameter(torch.randn(dim) * 0.1 + 1)
        self.ln_bias = torch.nn.Parameter(torch.randn(dim) * 0.1)
        self.rms_weight = torch.nn.Parameter(torch.randn(dim) * 0.1 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pointwise_chain(x, self.ln_weight, self.ln_bias, self.rms_weight)


@pytest.mark.parametrize("shape", [(4, 16, 96), (3, 5, 37)])
def test_training_step_private_buffers(monkeypatch, shape):
    """The backward's row kernel keeps a value only its later passes read in a row array and
    stores no buffer that nobody reads; gradients as eager's.  Every load counts towards a value's
    cost here, as before 0d4f7ec (since then the block's per-column weights do not, and the block
    recomputes the value instead of keeping it: the plan under test no longer arises in it)."""
    monkeypatch.setattr(scheduler, "SMALL_LOAD_RATIO", 10**9)
    sources = record_generated(monkeypatch)
    torch.manual_seed(0)
    model = PointwiseBlock(shape[-1])
    reference = copy.deepcopy(model)
    compiled = ember.compile(model)
    x, grad = torch.randn(shape), torch.randn(shape)
    results = []
    for module in (compiled, reference):
        inputs = x.clone().requires_grad_(True)
        out = module(inputs)
        out.backward(grad)
        results.append([out, inputs.grad] + [p.grad for p in module.parameters()])
    for actual, expected in zip(*results):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    backward = sources[-1]
    assert PRIVATE_BUFFER in backward and REUSED_VALUE in backward

