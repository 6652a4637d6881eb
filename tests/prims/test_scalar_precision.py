"""How an fp16/bf16 binary op reads a scalar operand (a Python number, or a 0-d tensor of another
dtype), bit for bit against eager on the CPU: mul/div/floor_divide read it at fp32 op-math
precision, add/sub/the rest round it to the low-precision dtype first (fuzz seeds 7268, 9354)."""
from __future__ import annotations

import pytest
import torch

import ember

SCALAR_KINDS = [None, torch.float16, torch.bfloat16, torch.float64, torch.float32, torch.int64]


def all_ops(x, s):
    bound = torch.maximum(x, s) if isinstance(s, torch.Tensor) else x.clamp(min=s)
    return x + s, x - s, s - x, x * s, x / s, x // s, bound, x % s, s * x, torch.add(x, s, alpha=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", SCALAR_KINDS, ids=lambda k: "python" if k is None else str(k)[6:])
def test_scalar_operand_precision(dtype, kind):
    x = (torch.randn(1024) * 3).to(dtype)
    compiled = ember.compile(all_ops, options={"fallback": "error"})   # compiled, never eager
    for value in (0.7771234567, 2.71828182846, 3):
        scalar = value if kind is None else torch.tensor(value, dtype=kind)
        for index, (actual, expected) in enumerate(zip(compiled(x, scalar), all_ops(x, scalar))):
            assert actual.dtype == expected.dtype
            torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda m: f"op {index}, scalar {scalar!r}: {m}")
