"""Type promotion of every binary op against eager, on the CPU: each pair of six dtypes, with the
second operand of the same shape, a 0-d tensor, or the 0-d tensor first.  The result's dtype must
be eager's and its values equal (xlogy of a bf16 tensor and a float32 0-d tensor returned float32,
and a bf16 y of a float32 x had its log rounded to bf16).  One compiled graph per pair and shape
holds every op eager accepts for it."""
from __future__ import annotations

import warnings

import pytest
import torch

import ember

DTYPES = [torch.bool, torch.int32, torch.float16, torch.bfloat16, torch.float32, torch.float64]
OPS = {
    "add": torch.add, "sub": torch.sub, "rsub": torch.rsub, "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": torch.mul, "div": torch.div, "true_divide": torch.true_divide, "floordiv": lambda a, b: a // b,
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow, "float_power": torch.float_power,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "clamp_min": lambda a, b: torch.clamp(a, min=b), "eq": torch.eq, "lt": torch.lt, "ge": torch.ge,
    "isclose": torch.isclose, "logical_and": torch.logical_and, "bitwise_and": lambda a, b: a & b,
    "lshift": lambda a, b: a << b, "gcd": torch.gcd,
    "where": lambda a, b: torch.where(a > 0 if a.dtype != torch.bool else a, a, b),
    "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign, "xlogy": torch.xlogy,
    "xlog1py": torch.special.xlog1py, "logaddexp": torch.logaddexp, "logaddexp2": torch.logaddexp2,
    "heaviside": torch.heaviside, "nextafter": torch.nextafter, "ldexp": torch.ldexp,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "addcmul": lambda a, b: torch.addcmul(a, a, b),
}
# float32/float64 results one ulp apart: glibc's libm in ember's C++ kernels, Sleef in eager's
LIBM = {"atan2", "hypot", "pow", "float_power", "logaddexp", "logaddexp2", "xlogy", "xlog1py"}


def make(dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False, True])
    if dtype.is_floating_point:
        return (torch.randn(6, generator=generator) * 5).to(dtype)
    return torch.randint(-5, 6, (6,), generator=generator).to(dtype)


def operands(first: torch.dtype, second: torch.dtype, shape: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(DTYPES.index(first) * 10 + DTYPES.index(second))
    a, b = make(first, generator), make(second, generator)
    if shape == "0d_second":
        return a, b[0].clone()
    if shape == "0d_first":
        return a[0].clone(), b
    return a, b


@pytest.mark.parametrize("shape", ["same", "0d_second", "0d_first"])
@pytest.mark.parametrize("second", DTYPES, ids=str)
@pytest.mark.parametrize("first", DTYPES, ids=str)
def test_binary_op_promotion_and_values(first, second, shape):
    a, b = operands(first, second, shape)
    expected = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, op in OPS.items():
            try:
                expected[name] = op(a, b)
            except (RuntimeError, TypeError):
                continue        # a pair eager rejects is not a case
    if torch.bool in (a.dtype, b.dtype):
        # bool << int: eager promotes, torch's meta kernel rejects the bool: the graph breaks
        # there (run eagerly, exact), which would leave nothing of this case compiled
        expected.pop("lshift", None)
    names = list(expected)

    def every_op(a, b):
        return tuple(OPS[name](a, b) for name in names)

    report = ember.explain(every_op, a, b)      # generated kernels, not an eager run of the graph
    assert (report.graph_count, report.break_count) == (1, 0) and report.kernel_count >= 1, str(report)
    actual = ember.compile(every_op, options={"fallback": "error"})(a, b)
    for name, value in zip(names, actual):
        reference = expected[name]
        assert value.dtype == reference.dtype and value.shape == reference.shape, \
            f"{name}: {value.dtype}{tuple(value.shape)}, eager {reference.dtype}{tuple(reference.shape)}"
        exact = name not in LIBM or reference.dtype not in (torch.float32, torch.float64)
        torch.testing.assert_close(value, reference, equal_nan=True, rtol=0 if exact else 1e-6, atol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")
