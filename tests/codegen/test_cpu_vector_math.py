"""Accuracy of the float32 math functions the C++ generator emits, as it emits them: each one is
printed by ``cpp.render_op`` into an ``omp simd`` loop, built with the kernels' own flags (so
libmvec's vector variants and the prelude's inline functions run vectorized, as in a kernel) and
compared with float64 torch over a dense sweep: every 4099th float32 bit pattern (all
magnitudes, denormals included), a fine grid over the function's busy range, and the special
values (+-0, +-inf, NaN, the smallest and largest denormals, FLT_MAX).  The error is in units in
the last place of the float32 result (ulp of the correctly rounded value, 2^-149 below the
normal range); NaN must map to NaN and exact results (inf, 0, 1) must be exact where float64's
rounded value is.  ``MAX_ULP`` is each function's documented bound: a change of math library or
formula that loses accuracy fails here."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
import torch

from ember.codegen import cpp
from ember.codegen.cpp_prelude import PRELUDE
from ember.lower import ir
from ember.runtime import cpp_build

# function -> (float64 reference, max ulp, grid of its busy range)
FUNCTIONS = {
    "exp": (torch.exp, 4, (-110.0, 90.0)),
    "exp_inline": (torch.exp, 2, (-110.0, 90.0)),        # the prelude's ember_expf (cpp.INLINE_EXPF)
    "exp2": (torch.exp2, 4, (-160.0, 130.0)),
    "expm1": (torch.expm1, 4, (-20.0, 90.0)),
    "log": (torch.log, 4, (0.0, 100.0)),
    "log2": (torch.log2, 4, (0.0, 100.0)),
    "log10": (torch.log10, 4, (0.0, 100.0)),
    "log1p": (torch.log1p, 4, (-1.0, 100.0)),
    "sigmoid": (torch.sigmoid, 4, (-90.0, 30.0)),
    "tanh": (torch.tanh, 4, (-10.0, 10.0)),
    "erf": (torch.erf, 4, (-5.0, 5.0)),
    "erfc": (torch.erfc, 4, (-5.0, 12.0)),
    "sin": (torch.sin, 4, (-10.0, 10.0)),
    "cos": (torch.cos, 4, (-10.0, 10.0)),
    "tan": (torch.tan, 4, (-1.5, 1.5)),
    "asin": (torch.asin, 4, (-1.0, 1.0)),
    "acos": (torch.acos, 4, (-1.0, 1.0)),
    "atan": (torch.atan, 4, (-10.0, 10.0)),
    "sinh": (torch.sinh, 4, (-90.0, 90.0)),
    "cosh": (torch.cosh, 4, (-90.0, 90.0)),
    "asinh": (torch.asinh, 4, (-10.0, 10.0)),
    "acosh": (torch.acosh, 4, (1.0, 10.0)),
    "atanh": (torch.atanh, 4, (-1.0, 1.0)),
    "sqrt": (torch.sqrt, 0.5, (0.0, 100.0)),
    "rsqrt": (torch.rsqrt, 1.5, (0.0, 100.0)),        # 1 / sqrt(x): two roundings
    "reciprocal": (torch.reciprocal, 0.5, (-100.0, 100.0)),
}
# sigmoid = 1 / (1 + exp(-x)), eager's formula too: below this exp(-x) overflows and the result is
# 0 (as eager's) where the exact one is a denormal
SIGMOID_FLUSH = -88.72283
# sin/cos/tan of huge arguments: libmvec's (like every fast implementation) reduces them modulo
# pi with a few hundred ulps of error only past this magnitude; torch's do as well
TRIG_LIMIT = 1e5


def sweep(low: float, high: float) -> np.ndarray:
    every_4099th = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38,
                         1.1754944e-38, 3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, -0.5], dtype=np.float32)
    grid = np.linspace(low, high, 400_001, dtype=np.float64).astype(np.float32)
    near_zero = np.geomspace(1e-30, 1e-1, 20_001, dtype=np.float64).astype(np.float32)
    return np.concatenate([every_4099th, specials, grid, near_zero, -near_zero])


def expression(name: str) -> str:
    """The C++ the generator prints for ``name`` applied to ``x[i]`` (float)."""
    op = "exp" if name == "exp_inline" else name
    node = ir.Op(op, (ir.Load("x", (), torch.float32),), torch.float32)
    return cpp.render_op(node, ["x[i]"], inline_exp=name == "exp_inline")


@pytest.fixture(scope="module")
def library():
    loops = []
    for name in FUNCTIONS:
        loops.append(f'extern "C" void apply_{name}(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{\n'
                     f"#pragma omp simd\n  for (int64_t i = 0; i < n; ++i) y[i] = {expression(name)};\n}}\n")
    source = PRELUDE + "\n".join(loops)
    return cpp_build.load(cpp_build.build(source, "vector_math_test"))


def ulp_error(actual: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|actual - reference| in float32 ulps of the correctly rounded reference (inf where the
    special values differ)."""
    rounded = reference.astype(np.float32)
    finite = np.isfinite(rounded)
    magnitude = np.abs(rounded[finite].astype(np.float64))
    exponent = np.floor(np.log2(np.maximum(magnitude, 2.0 ** -149)))
    ulp = np.exp2(np.maximum(exponent - 23, -149))
    error = np.zeros(actual.shape, dtype=np.float64)
    error[finite] = np.abs(actual[finite].astype(np.float64) - reference[finite]) / ulp
    same_special = (np.isnan(rounded) & np.isnan(actual)) | (rounded == actual)
    error[~finite & ~same_special] = np.inf
    error[np.isnan(actual) & ~np.isnan(rounded)] = np.inf
    return error


def measure(library, name: str) -> tuple[float, float]:
    """(max ulp error, the input where it occurs)."""
    reference_fn, _, busy = FUNCTIONS[name]
    x = sweep(*busy)
    if name in ("sin", "cos", "tan"):
        x = x[~(np.abs(x) > TRIG_LIMIT)]
    if name == "sigmoid":
        x = x[~(x < SIGMOID_FLUSH)]
    y = np.empty_like(x)
    fn = getattr(library, f"apply_{name}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, y.ctypes.data, x.size)
    with np.errstate(all="ignore"):
        reference = reference_fn(torch.from_numpy(x).double()).numpy()
        error = ulp_error(y, reference)
    worst = int(np.argmax(error))
    return float(error[worst]), float(x[worst])


def test_sigmoid_flushes_like_eager(library):
    x = np.array([-88.7229, -90.0, -103.0, -104.0, -1e30, -np.inf], dtype=np.float32)
    y = np.empty_like(x)
    fn = getattr(library, "apply_sigmoid")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, y.ctypes.data, x.size)
    np.testing.assert_array_equal(y, torch.sigmoid(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_max_ulp_error(library, name):
    bound = FUNCTIONS[name][1]
    error, where = measure(library, name)
    assert error <= bound, f"{name}: {error:.2f} ulp at x = {where!r} (bound {bound})"


def test_loops_are_vectorized():
    """Every function's loop is vectorized (g++ reports it): a scalar call in a kernel's simd
    loop would make the whole loop scalar."""
    loops = "".join(f"void apply_{name}(const float* __restrict__ x, float* __restrict__ y) {{\n"
                    f"#pragma omp simd\n  for (int i = 0; i < 1024; ++i) y[i] = {expression(name)};\n}}\n"
                    for name in FUNCTIONS)
    source = PRELUDE + loops
    report = cpp_build.vectorization_report(source)
    if report is None:
        pytest.skip("the compiler does not report vectorization")
    first_loop_line = PRELUDE.count("\n") + 3
    vectorized = {int(m.group(1)) for m in re.finditer(r":(\d+):\d+: optimized: loop vectorized", report)}
    scalar = [name for i, name in enumerate(FUNCTIONS) if first_loop_line + 4 * i not in vectorized]
    assert not scalar, f"not vectorized: {scalar}"
