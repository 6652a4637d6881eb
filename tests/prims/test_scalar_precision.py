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


TERNARY = {
    "addcmul": lambda a, b, c: torch.addcmul(a, b, c, value=0.5),
    "addcdiv": lambda a, b, c: torch.addcdiv(a, b, c, value=0.7),
    "lerp": lambda a, b, c: torch.lerp(a, b, c),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", [torch.float32, torch.float64, torch.int64], ids=lambda k: str(k)[6:])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("op", list(TERNARY))
def test_ternary_op_rounds_a_0d_operand_to_the_common_dtype(op, position, kind, dtype):
    """addcmul/addcdiv/lerp cast every operand to the common dtype before the fp32 op math, a 0-d
    float32 operand too (fuzz seed 6134: ember read it unrounded; a bf16 lerp with a 0-d float32
    weight differed in 19% of elements).  lerp takes a 0-d tensor of another dtype as weight only."""
    fn = TERNARY[op]
    if op == "lerp" and position != 2:
        pytest.skip("lerp's start and end must have one dtype")
    if op == "lerp" and kind is torch.int64:
        pytest.skip("eager's lerp takes no integer weight")
    operands = [(torch.randn(1024) * 3).to(dtype) for _ in range(3)]
    if op == "addcdiv":
        operands[2] = operands[2].abs() + 0.5
    operands[position] = torch.tensor(3 if kind is torch.int64 else 0.3337123, dtype=kind)
    compiled = ember.compile(fn, options={"fallback": "error"})
    expected, actual = fn(*operands), compiled(*operands)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
