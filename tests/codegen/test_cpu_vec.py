"""ember's own vector types (cpp_prelude.VECTOR_PRELUDE, issue #13): loads and stores of every
dtype with masked tails, and the vector math's accuracy.

Each function runs over test_cpu_vector_math's dense sweep (every 4099th float32 bit pattern with
its denormals, a fine grid of the busy range, +-0, +-inf, NaN, FLT_MAX) through whole vectors and a
tail (the sweep's length is no multiple of the width), and is compared with float64 torch in
float32 ulps.  ``MAX_ULP`` is each function's documented bound (the prelude's comment says the
same); the table printed by ``python tests/codegen/test_cpu_vec.py`` is the measured one."""
from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
import torch

from ember.codegen.cpp_prelude import PRELUDE, VECTOR_PRELUDE
from ember.runtime import cpp_build
from test_cpu_vector_math import sweep, ulp_error

# function -> (float64 reference, max ulp, busy range)
MAX_ULP = {
    "exp": (torch.exp, 1, (-110.0, 90.0)),
    "log": (torch.log, 1, (0.0, 100.0)),
    "tanh": (torch.tanh, 1.5, (-10.0, 10.0)),
    "sigmoid": (torch.sigmoid, 2.5, (-88.0, 30.0)),
    "erf": (torch.erf, 1.5, (-5.0, 5.0)),
    "sqrt": (torch.sqrt, 0.5, (0.0, 100.0)),
}
SIGMOID_FLUSH = -88.72283     # below it 1 / (1 + exp(-x)) is 0, as eager's (test_cpu_vector_math)

LOOP = """
extern "C" void apply_{name}(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
  int64_t i = 0;
  for (; i + ember::VEC_WIDTH <= n; i += ember::VEC_WIDTH)
    ember::vec_store(y + i, ember::vec_{name}(ember::vec_load(x + i)));
  if (i < n) ember::vec_store_tail(y + i, ember::vec_{name}(ember::vec_load_tail(x + i, n - i)), n - i);
}}
"""
COPIES = """
extern "C" int width() { return ember::VEC_WIDTH; }
extern "C" void copy_bf16(const uint16_t* __restrict__ x, uint16_t* __restrict__ y, float* __restrict__ f, int64_t n) {
  int64_t i = 0;
  for (; i + ember::VEC_WIDTH <= n; i += ember::VEC_WIDTH) {
    const ember::Vec v = ember::vec_load_bf16(x + i);
    ember::vec_store(f + i, v); ember::vec_store_bf16(y + i, v);
  }
  if (i < n) {
    const ember::Vec v = ember::vec_load_bf16_tail(x + i, n - i);
    ember::vec_store_tail(f + i, v, n - i); ember::vec_store_bf16_tail(y + i, v, n - i);
  }
}
extern "C" void copy_half(const uint16_t* __restrict__ x, uint16_t* __restrict__ y, float* __restrict__ f, int64_t n) {
  int64_t i = 0;
  for (; i + ember::VEC_WIDTH <= n; i += ember::VEC_WIDTH) {
    const ember::Vec v = ember::vec_load_half(x + i);
    ember::vec_store(f + i, v); ember::vec_store_half(y + i, v);
  }
  if (i < n) {
    const ember::Vec v = ember::vec_load_half_tail(x + i, n - i);
    ember::vec_store_tail(f + i, v, n - i); ember::vec_store_half_tail(y + i, v, n - i);
  }
}
// float -> bf16 / fp16 stores (rounded) and the rounding kept in float lanes
extern "C" void narrow(const float* __restrict__ x, uint16_t* __restrict__ bf16, uint16_t* __restrict__ half,
                       float* __restrict__ bf16_rounded, float* __restrict__ half_rounded, int64_t n) {
  int64_t i = 0;
  for (; i + ember::VEC_WIDTH <= n; i += ember::VEC_WIDTH) {
    const ember::Vec v = ember::vec_load(x + i);
    ember::vec_store_bf16(bf16 + i, v); ember::vec_store_half(half + i, v);
    ember::vec_store(bf16_rounded + i, ember::vec_round_bf16(v));
    ember::vec_store(half_rounded + i, ember::vec_round_half(v));
  }
  for (; i < n; ++i) {
    const ember::Vec v = ember::vec_load_tail(x + i, 1);
    ember::vec_store_bf16_tail(bf16 + i, v, 1); ember::vec_store_half_tail(half + i, v, 1);
    ember::vec_store_tail(bf16_rounded + i, ember::vec_round_bf16(v), 1);
    ember::vec_store_tail(half_rounded + i, ember::vec_round_half(v), 1);
  }
}
// horizontal sum / max / min and the NaN-propagating lane max / min
extern "C" void reduce(const float* __restrict__ x, const float* __restrict__ other, float* __restrict__ out,
                       float* __restrict__ maxima, float* __restrict__ minima, int64_t n) {
  ember::Vec sum = {}, high = ember::vec_splat(-__builtin_inff()), low = ember::vec_splat(__builtin_inff());
  int64_t i = 0;
  for (; i + ember::VEC_WIDTH <= n; i += ember::VEC_WIDTH) {
    const ember::Vec v = ember::vec_load(x + i), w = ember::vec_load(other + i);
    sum += v; high = ember::vec_max(high, v); low = ember::vec_min(low, v);
    ember::vec_store(maxima + i, ember::vec_max(v, w)); ember::vec_store(minima + i, ember::vec_min(v, w));
  }
  if (i < n) {
    const ember::VecInt tail = ember::vec_tail_mask(n - i);
    const ember::Vec v = ember::vec_load_tail(x + i, n - i), w = ember::vec_load_tail(other + i, n - i);
    sum += v;
    high = ember::vec_select(tail, ember::vec_max(high, v), high);
    low = ember::vec_select(tail, ember::vec_min(low, v), low);
    ember::vec_store_tail(maxima + i, ember::vec_max(v, w), n - i);
    ember::vec_store_tail(minima + i, ember::vec_min(v, w), n - i);
  }
  out[0] = ember::vec_sum(sum); out[1] = ember::vec_reduce_max(high); out[2] = ember::vec_reduce_min(low);
}
"""


@pytest.fixture(scope="module")
def library():
    source = PRELUDE + VECTOR_PRELUDE + "".join(LOOP.format(name=name) for name in MAX_ULP) + COPIES
    return cpp_build.load(cpp_build.build(source, "vector_types_test"))


def call(library, name: str, *arrays: np.ndarray) -> None:
    fn = getattr(library, name)
    fn.argtypes = [ctypes.c_void_p] * len(arrays) + [ctypes.c_int64]
    fn(*(a.ctypes.data for a in arrays), arrays[0].size)


def measure(library, name: str) -> tuple[float, float]:
    """(max ulp error, the input where it occurs)."""
    reference_fn, _, busy = MAX_ULP[name]
    x = sweep(*busy)
    if name == "sigmoid":
        x = x[~(x < SIGMOID_FLUSH)]
    y = np.empty_like(x)
    call(library, f"apply_{name}", x, y)
    with np.errstate(all="ignore"):
        error = ulp_error(y, reference_fn(torch.from_numpy(x).double()).numpy())
    worst = int(np.argmax(error))
    return float(error[worst]), float(x[worst])


@pytest.mark.parametrize("name", sorted(MAX_ULP))
def test_max_ulp_error(library, name):
    error, where = measure(library, name)
    assert error <= MAX_ULP[name][1], f"{name}: {error:.2f} ulp at x = {where!r} (bound {MAX_ULP[name][1]})"


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 33, 1000])
def test_exact_results_and_tails(library, n):
    """Special values exact, every length (tails of each size) right, nothing written past n."""
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45], dtype=np.float32)
    x = np.resize(specials, n).astype(np.float32)
    expected = {"exp": [1, 1, np.inf, 0, np.nan, 1, 1], "log": [-np.inf, -np.inf, np.inf, np.nan, np.nan, None, np.nan],
                "tanh": [0.0, -0.0, 1, -1, np.nan, 1e-45, -1e-45], "erf": [0.0, -0.0, 1, -1, np.nan, None, None],
                "sigmoid": [0.5, 0.5, 1, 0, np.nan, 0.5, 0.5],
                "sqrt": [0.0, -0.0, np.inf, np.nan, np.nan, None, np.nan]}
    for name, values in expected.items():
        y = np.full(n + 3, 7.0, dtype=np.float32)
        call(library, f"apply_{name}", x, y[:n])
        assert (y[n:] == 7.0).all(), name
        for i, want in enumerate(np.resize(np.array(values, dtype=object), n)):
            if want is not None:
                np.testing.assert_array_equal(y[i], np.float32(want), err_msg=f"{name}({x[i]})")
        signed_zero = x == 0
        if name in ("tanh", "erf", "sqrt"):   # odd functions keep the sign of zero
            assert (np.signbit(y[:n][signed_zero]) == np.signbit(x[signed_zero])).all(), name


@pytest.mark.parametrize("n", [5, 8, 21, 4099])
def test_low_precision_loads_and_stores_match_torch(library, n):
    bits = np.arange(0, 1 << 16, dtype=np.uint32)
    bits = np.resize(bits, max(n, 1 << 16))[: (1 << 16) if n == 4099 else n].astype(np.uint16)
    for name, dtype in (("copy_bf16", torch.bfloat16), ("copy_half", torch.float16)):
        y = np.full(bits.size + 2, 0x1234, dtype=np.uint16)
        f = np.empty(bits.size, dtype=np.float32)
        call(library, name, bits, y[:bits.size], f)
        expected = torch.from_numpy(bits.view(np.int16)).view(dtype).float().numpy()
        np.testing.assert_array_equal(f, expected)                       # exact widening, NaN included
        assert (y[bits.size:] == 0x1234).all()
        np.testing.assert_array_equal(torch.from_numpy(y[:bits.size].view(np.int16)).view(dtype).float().numpy(),
                                      expected)


def test_rounding_to_bf16_and_fp16_matches_torch(library):
    x = sweep(-70000.0, 70000.0)
    x = np.concatenate([x, np.float32(1.0) + np.arange(-300, 300, dtype=np.float32) * np.float32(2 ** -24)])
    n = x.size
    bf16, half = np.empty(n, dtype=np.uint16), np.empty(n, dtype=np.uint16)
    bf16_rounded, half_rounded = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    call(library, "narrow", x, bf16, half, bf16_rounded, half_rounded)
    t = torch.from_numpy(x)
    for dtype, stored, kept in ((torch.bfloat16, bf16, bf16_rounded), (torch.float16, half, half_rounded)):
        expected = t.to(dtype).float().numpy()
        np.testing.assert_array_equal(torch.from_numpy(stored.view(np.int16)).view(dtype).float().numpy(), expected)
        np.testing.assert_array_equal(kept, expected)


@pytest.mark.parametrize("n", [3, 8, 13, 64, 1001])
def test_reductions_and_nan_propagation(library, n):
    rng = np.random.default_rng(n)
    x, other = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x[n // 2], other[n // 3] = np.nan, np.nan
    out, maxima, minima = np.empty(3, dtype=np.float32), np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    call(library, "reduce", x, other, out, maxima, minima)
    tx, to = torch.from_numpy(x), torch.from_numpy(other)
    np.testing.assert_array_equal(maxima, torch.maximum(tx, to).numpy())
    np.testing.assert_array_equal(minima, torch.minimum(tx, to).numpy())
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.isnan(out[2])
    x[n // 2] = 1.5
    call(library, "reduce", x, other, out, maxima, minima)
    assert out[0] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5, abs=1e-4)
    assert out[1] == x.max() and out[2] == x.min()


@pytest.mark.parametrize("target", [[], ["-mavx2", "-mfma", "-mf16c"], ["-mavx512f", "-mf16c", "-mfma"]])
def test_every_width_compiles(target, tmp_path):
    """The scalar fallback (1 lane), AVX2 (8) and AVX-512 (16) forms all compile (this host runs one)."""
    source = tmp_path / "vec.cpp"
    source.write_text(PRELUDE + VECTOR_PRELUDE + "".join(LOOP.format(name=name) for name in MAX_ULP) + COPIES)
    command = [cpp_build.CXX, *cpp_build.BASE_FLAGS, *target, "-c", str(source), "-o", str(tmp_path / "vec.o")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


if __name__ == "__main__":     # the ulp table of the vector math
    lib = cpp_build.load(cpp_build.build(PRELUDE + VECTOR_PRELUDE + "".join(LOOP.format(name=name) for name in MAX_ULP)
                                         + COPIES, "vector_types_test"))
    print(f"| function | width {lib.width()} lanes: max ulp | at x | bound |\n|---|---|---|---|")
    for fname in MAX_ULP:
        err, at = measure(lib, fname)
        print(f"| {fname} | {err:.3f} | {at!r} | {MAX_ULP[fname][1]} |")
