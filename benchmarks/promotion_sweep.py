"""Type promotion of binary ops against eager, every pair of 9 dtypes (a check, not a test).

    python benchmarks/promotion_sweep.py

38 binary ops x 9 x 9 dtypes x {same shape, a 0-d second operand, a 0-d first operand}: the compiled result's dtype, shape
and values against eager's, on the CPU.  Prints DIFF/ERROR lines, then the counts.  Session 28:
2688 cases, every dtype equal; the 65 DIFF lines were atan2, hypot and pow in float32/float64, one
ulp apart (glibc's libm against eager's Sleef).
"""
from __future__ import annotations

import itertools
import warnings

import torch

import ember

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
OPS = {
    "add": torch.add, "sub": lambda a, b: a - b, "mul": torch.mul, "div": torch.div, "floordiv": lambda a, b: a // b,
    "remainder": torch.remainder, "pow": torch.pow, "maximum": torch.maximum, "eq": torch.eq, "lt": torch.lt,
    "where": lambda a, b: torch.where(a > 0 if a.dtype != torch.bool else a, a, b), "atan2": torch.atan2,
    "bitand": lambda a, b: a & b, "fmod": torch.fmod, "hypot": torch.hypot, "copysign": torch.copysign,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "addcmul": lambda a, b: torch.addcmul(a, a, b),
    "clamp": lambda a, b: torch.clamp(a, min=b),
    "xlogy": torch.xlogy, "xlog1py": torch.special.xlog1py, "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2, "fmax": torch.fmax, "fmin": torch.fmin, "minimum": torch.minimum,
    "heaviside": torch.heaviside, "nextafter": torch.nextafter, "float_power": torch.float_power,
    "true_divide": torch.true_divide, "ldexp": torch.ldexp, "rsub": torch.rsub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2), "ge": torch.ge, "logical_and": torch.logical_and,
    "gcd": torch.gcd, "lshift": lambda a, b: a << b, "isclose": torch.isclose,
}


def make(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False, True])
    if dtype.is_floating_point:
        return (torch.randn(6) * 5).to(dtype)
    low, high = (0, 100) if dtype == torch.uint8 else (-5, 6)
    return torch.randint(low, high, (6,)).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        torch.nan_to_num(a.double(), 1e30, 2e30, -2e30), torch.nan_to_num(b.double(), 1e30, 2e30, -2e30))


def main() -> None:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    checked = bad = 0
    for first, second in itertools.product(DTYPES, DTYPES):
        a, full = make(first), make(second)
        for shape, b in (("same", full), ("0d", full[0].clone()), ("0d first", full[0].clone())):
            for name, op in OPS.items():
                if shape == "0d first":
                    op = lambda x, y, op=op: op(y, x)  # noqa: E731 - the 0-d tensor as the first operand
                try:
                    expected = op(a, b)
                except Exception:  # noqa: BLE001, S112 - a pair eager rejects is not a case
                    continue
                checked += 1
                try:
                    actual = ember.compile(lambda a, b, op=op: op(a, b), options={"fallback": "error"})(a, b)
                except Exception as exc:  # noqa: BLE001 - reported, and the sweep goes on
                    bad += 1
                    print("ERROR", first, second, shape, name, str(exc)[:100])
                    continue
                if not same(actual, expected):
                    bad += 1
                    print("DIFF", first, second, shape, name, actual.dtype, expected.dtype)
    print("checked", checked, "bad", bad)


if __name__ == "__main__":
    main()
