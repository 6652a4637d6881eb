"""Reduced programs the fuzzer found wrong, one per bug class, compiled and compared with eager
(values, dtypes, shapes, aliasing, mutated inputs; two calls) by the fuzzer's own checker."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import check_program
from program_generator import InputSpec, Program

f32 = torch.float32

# name -> (source, [(shape, dtype, layout)])
REGRESSIONS = {
    # Tensor.where(cond, other) was read as torch.where(cond, other, ...): self is the kept value
    "where_method_f1": ("""def program(a0, a1):
    v0 = torch.pow(a0.abs() + 1, torch.tanh(a0)); v1 = a1.sum(-2)
    return (torch.maximum(v1, v0.where(v1 >= 0, v0)),)
""", [((4, 8), f32), ((4, 4, 8), f32)]),
    "where_method_f2": ("""def program(a0):
    v0 = a0.where(a0 >= a0, a0); v1 = v0.to(torch.float16)
    return (F.gelu(torch.concat([v1, v0], dim=0), approximate="tanh"),)
""", [((5,), f32)]),
    "where_method_f3": ("""def program(a0):
    v = torch.std(a0, dim=0, correction=1, keepdim=True).clamp(-1.25, 0.75)
    return (a0.where(a0 == 1, v @ v),)
""", [((6,), f32)]),
    "where_method_f4": ("""def program(a0, a1):
    v2 = a1.where(a1 <= 2, a0).abs()
    return (torch.cumsum(torch.matmul(v2, v2), dim=0),)
""", [((8,), f32), ((8,), f32)]),
    "where_method_scalar_other": ("""def program(a0):
    return (a0.where(a0 > 0, 2), a0.where(a0 > 0, torch.tensor(1.5, dtype=torch.float64)))
""", [((3, 4), torch.float16)]),
    # addcmul's value takes the tensors' promoted type (0.5 is 0 for ints); the result dtype is the
    # promotion of all three tensors, computed in one common dtype (not x's dtype, not pairwise)
    "addcmul_int_value": ("""def program(a0, a1):
    return (torch.addcmul(a0, a1, a1, value=0.5), torch.addcmul(a0, a1, a1, value=1.7))
""", [((3, 1), torch.int32), ((), torch.int64)]),
    "addcmul_mixed_low_precision": ("""def program(a0, a1):
    return (torch.addcmul(a0, a1, a1, value=1.7), torch.addcmul(a1, a0, a0), torch.addcdiv(a1, a0, a1 + 3))
""", [((4,), torch.float16), ((4,), f32)]),
    "lerp_dtypes": ("""def program(a0, a1):
    return (torch.lerp(a0, a0 * 2, torch.tensor(0.5, dtype=torch.float64)), torch.lerp(a1, a1 + 1, 0.3))
""", [((4,), f32), ((4,), torch.bfloat16)]),
    "lerp_end_dtype_raises": ("""def program(a0, a1):
    return (torch.lerp(a0, a1, 0.5),)
""", [((4,), f32), ((4,), torch.float16)]),
    # 3-D @ 3-D with a broadcast batch dim went to bmm (which does not broadcast): CompileError
    "matmul_broadcast_batch": ("""def program(a0, a1, a2):
    return (a0 @ a1, torch.matmul(a1, a0[0]), torch.matmul(a2, a1))
""", [((1, 2, 3), f32), ((4, 3, 2), f32), ((3, 1, 4, 3), f32)]),
    # constant_pad of a tensor with a size-0 dim wrapped indices modulo 0: "cannot lower constant_pad"
    "pad_of_empty": ("""def program(a0):
    v0 = F.pad(a0, (0, -1), value=1.5)
    return (F.pad(v0, (1, 0, 2, 1), value=-2), F.pad(a0[:0], (1, 1)))
""", [((3, 1), torch.float16)]),
    # eager raises for these dtypes; ember computed a value (the checker wants the same exception type)
    "var_of_int_raises": ("""def program(a0):
    return (torch.var(a0), torch.std(a0, 0))
""", [((4, 3), torch.int64)]),
    "abs_of_bool_raises": ("""def program(a0):
    return ((a0 > 0).abs(),)
""", [((4,), f32)]),
    "int_pow_negative_int_raises": ("""def program(a0):
    return (a0 ** -1,)
""", [((4,), torch.int32)]),
    # add/sub's alpha is cast to the promoted type of the two operands (2 is True for bools), it does
    # not promote them: bool + 2 * bool stays bool (was int64, and 2.0 where eager gives 1.0)
    "add_alpha_bool": ("""def program(a0, a1):
    v0 = a0.all(1, keepdim=True)
    return (torch.add(a1, v0, alpha=2).float(), torch.add(v0, v0, alpha=2), torch.add(a0, 3, alpha=2))
""", [((2, 8), torch.float16, "expanded"), ((), torch.bool)]),
    "add_alpha_int8_wraps": ("""def program(a0):
    return (torch.add(a0, 100, alpha=2), torch.sub(a0.float(), a0, alpha=3))
""", [((5,), torch.int8)]),
    "sub_of_bool_raises": ("""def program(a0):
    return (torch.sub(a0.float(), a0 > 0),)
""", [((4,), f32)]),
    # a kernel over a zero-size tensor delinearized its index modulo 0 (internal AssertionError)
    "cat_of_empty": ("""def program(a0, a1):
    v1 = torch.zeros_like(a0).clamp(0, None)
    return (v1, torch.cat([v1, a1], dim=0))
""", [((2, 0, 5), f32), ((1, 0, 5), torch.float16, "offset")]),
    # eager rounds each fp16/bf16 op's result; fused kernels compared/floored the unrounded fp32 value
    "low_precision_rounding_per_op": ("""def program(a0, a1):
    v0 = a0 * 0.01
    return (torch.eq(torch.tanh(v0), v0), (a0 * 3).floor(), torch.remainder(torch.reciprocal(a1), a0.abs() + 1))
""", [((2, 2, 1, 5), torch.float16), ((), torch.float16)]),
    # std of bf16 is the sqrt of the fp32 variance, rounded once (was the sqrt of the rounded variance)
    "std_low_precision": ("""def program(a0, a1):
    v0 = a0.squeeze(2)
    v4 = torch.std(v0, dim=-2, unbiased=False, keepdim=True)
    return (torch.addcmul(v4, v0.where(v0 > 0.5, a1), v0.clamp(-1.25, 0.75), value=0.5), torch.std_mean(a0, 0)[0])
""", [((5, 5, 4), torch.bfloat16), ((5, 5, 1), f32)]),
    # clamp promotes x and both bounds together (int x, half and bf16 0-d bounds: float32)
    "clamp_promotes_all_bounds": ("""def program(a0, a1, a2):
    return (torch.clamp(a1, a2, a0.squeeze(0)), torch.clamp(a1, 0.5), torch.clamp(a2, a1.sum()))
""", [((1,), torch.bfloat16), ((5,), torch.int64), ((), torch.float16)]),
    # sign(NaN) is 0 in eager ((0 < x) - (x < 0)); the kernels returned NaN
    "sign_of_nan": ("""def program(a0):
    return (torch.pow(a0, a0).sum(0).sign(), (a0 / 0).sign())
""", [((2, 2, 5), torch.float64)]),
    # clone of a strided slice is contiguous in eager: a returned view of it was rebuilt from the
    # slice's strides, out of the clone's buffer (seed 40262: RuntimeError setStorage)
    "clone_of_a_strided_slice": ("""def program(a0, a1):
    v0 = a0.clone()
    v2 = v0[:, ::2]
    return (v2.copy_(a1), v0, a0.clone().t())
""", [((1, 3), torch.int32, "strided"), ((), torch.int64)]),
    # a skipped 1-D empty tensor still takes part in cat's dtype (seed 36516: float32, not float16)
    "cat_empty_dtype": ("""def program(a0, a1):
    return (torch.concat([a0, a1, a1], dim=0) * -1.25, torch.cat([a0, a0]))
""", [((0,), f32), ((1,), torch.float16)]),
}


def _program(name: str) -> Program:
    source, inputs = REGRESSIONS[name]
    specs = [InputSpec(tuple(shape), dtype, *rest) for shape, dtype, *rest in inputs]
    return Program(seed=sum(map(ord, name)), source=source, inputs=specs)


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_fuzz_regression(name):
    program = _program(name)
    outcome = check_program(program)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}\n{program}"
