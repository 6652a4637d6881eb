"""Hand-enumerated edge cases around the fuzzer's bug classes: small and unsigned integer dtypes, 0-d
tensors, size-0 dims, reductions' dtype rules and the dtype errors eager raises.  Each case is
compiled with ember and compared with eager: the same exception type, or the same dtype, shape and
values (NaN equal)."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._pytree import tree_leaves

import ember

u8 = lambda: torch.tensor([0, 5, 200, 255], dtype=torch.uint8)
i8 = lambda: torch.tensor([-128, -1, 5, 127], dtype=torch.int8)
i16 = lambda: torch.tensor([-300, 2, 7, 32767], dtype=torch.int16)
f32 = lambda *shape: torch.randn(*shape)
empty = lambda: torch.randn(3, 0)
ints = lambda: torch.tensor([7, -7, 0])

CASES = {
    # small and unsigned ints: wrap-around, promotion with scalars and other ints
    "u8_add": (lambda a: a + 100, [u8]), "u8_neg": (lambda a: -a, [u8]), "u8_sub": (lambda a: a - 10, [u8]),
    "u8_mul_i8": (lambda a, b: a * b, [u8, i8]), "u8_div": (lambda a: a / 3, [u8]),
    "u8_sum": (lambda a: a.sum(), [u8]), "u8_cumsum": (lambda a: a.cumsum(0), [u8]),
    "u8_amax": (lambda a: a.amax(), [u8]), "u8_abs": (lambda a: a.abs(), [u8]), "i8_abs": (lambda a: a.abs(), [i8]),
    "i8_floordiv": (lambda a: a // 3, [i8]), "i8_remainder": (lambda a: a % 3, [i8]),
    "i8_to_u8": (lambda a: a.to(torch.uint8), [i8]), "float_to_i8": (lambda a: (a * 1000).to(torch.int8), [lambda: f32(4)]),
    "i16_mul": (lambda a: a * a, [i16]), "i16_shift": (lambda a: a << 3, [i16]), "i8_rshift": (lambda a: a >> 1, [i8]),
    "u8_bitwise_not": (lambda a: ~a, [u8]), "i8_prod": (lambda a: a.prod(), [i8]), "u8_mean_raises": (lambda a: a.mean(), [u8]),
    "u8_compare_negative": (lambda a: a > -1, [u8]), "u8_pow": (lambda a: a ** 2, [u8]), "i8_sign": (lambda a: a.sign(), [i8]),
    "u8_clamp": (lambda a: a.clamp(10, 100), [u8]), "u8_clamp_wraps": (lambda a: (a.clamp(-5), a.clamp(-255, 255)), [u8]),
    "u8_clamp_overflow_raises": (lambda a: a.clamp(-5, 300), [u8]), "i8_clamp_overflow_raises": (lambda a: a.clamp(-129), [i8]),
    "u8_where_negative": (lambda a: torch.where(a > 3, a, -1), [u8]), "i8_argmax": (lambda a: a.argmax(), [i8]),
    "i16_div_floor": (lambda a: torch.div(a, 7, rounding_mode="floor"), [i16]),
    "i16_div_trunc": (lambda a: torch.div(a, -7, rounding_mode="trunc"), [i16]),
    "i8_sum_dtype": (lambda a: a.sum(dtype=torch.int8), [i8]), "max_of_i8_i16": (lambda a, b: torch.max(a, b), [i8, i16]),
    "int_floordiv_negative": (lambda a: a // -3, [ints]), "int_fmod": (lambda a: torch.fmod(a, -3), [ints]),
    "int_remainder": (lambda a: torch.remainder(a, -3), [ints]),
    "i32_overflow_wraps": (lambda a: a * 2 ** 20, [lambda: torch.tensor([3000, -5000], dtype=torch.int32)]),
    # add/sub alpha, bools
    "add_alpha_bools": (lambda a: (torch.add(a > 0, a > 1, alpha=2), torch.add(a > 0, 3, alpha=2)), [lambda: f32(4)]),
    "add_float_alpha_int_raises": (lambda a: torch.add(a, a, alpha=2.5), [ints]),
    "sub_bool_raises": (lambda a: (a > 0) - (a > 1), [lambda: f32(4)]),
    "abs_bool_raises": (lambda a: (a > 0).abs(), [lambda: f32(4)]),
    "int_pow_negative_raises": (lambda a: a ** -1, [ints]),
    "var_int_raises": (lambda a: a.var(), [ints]),
    "sign_nan": (lambda a: (a / 0).sign(), [lambda: torch.tensor([0.0, 1.0, -1.0])]),
    # 0-d tensors
    "cumsum_0d": (lambda a: torch.cumsum(a.sum(), 0), [lambda: f32(3)]),
    "std_0d": (lambda a: (torch.std(a.sum()), torch.var(a.sum(), correction=0)), [lambda: f32(3)]),
    "logsumexp_0d": (lambda a: torch.logsumexp(a.sum(), 0), [lambda: f32(4)]),
    "argmax_0d": (lambda a: a.sum().argmax(), [lambda: f32(4)]),
    "max_dim_0d": (lambda a: a.sum().max(0).values, [lambda: f32(4)]),
    "where_0d_double": (lambda a: torch.where(a > 0, a.sum().double(), 2), [lambda: f32(3)]),
    "maximum_0d_double": (lambda a, b: torch.maximum(a, b.sum()), [lambda: f32(4).half(), lambda: f32(4).double()]),
    "int_plus_half_0d": (lambda a, b: a + b, [ints, lambda: torch.tensor(1.5, dtype=torch.float16)]),
    "dot_1d_1d": (lambda a: (a @ a, torch.cumsum(a @ a, 0)), [lambda: f32(8)]),
    "matmul_1d_3d": (lambda a, b: (a @ b, b.transpose(1, 2) @ a), [lambda: f32(4), lambda: f32(2, 4, 3)]),
    # size-0 dims
    "sum_empty": (lambda a: (a.sum(1), a.sum(0), a.sum()), [empty]), "mean_empty": (lambda a: (a.mean(1), a.mean()), [empty]),
    "prod_empty": (lambda a: a.prod(1), [empty]), "amax_empty_raises": (lambda a: a.amax(1), [empty]),
    "argmax_empty_raises": (lambda a: a.argmax(1), [empty]), "var_empty": (lambda a: a.var(1), [empty]),
    "softmax_empty": (lambda a: a.softmax(1), [empty]), "matmul_k0": (lambda a: a @ a.t(), [empty]),
    "cumsum_empty": (lambda a: a.cumsum(1), [empty]), "cat_empty": (lambda a: torch.cat([a, a * 2], 1), [empty]),
    "pad_empty": (lambda a: torch.nn.functional.pad(a, (1, 1), value=2.0), [empty]),
    "expand_empty": (lambda a: a.unsqueeze(0).expand(2, 3, 0) + 1, [empty]),
    # type promotion through where / cat / stack / clamp
    "cat_mixed": (lambda a: torch.cat([a.int(), a.half(), a > 0]), [lambda: f32(3)]),
    "stack_mixed": (lambda a: torch.stack([a.int(), a.bfloat16()]), [lambda: f32(3)]),
    "where_scalars": (lambda a: (torch.where(a > 0, 1, 2.5), torch.where(a > 0, 1, 2), torch.where(a > 0, a > 1, True)),
                      [lambda: f32(3)]),
    "where_method": (lambda a: (a.where(a > 0, 2), a.half().where(a > 0, a.double())), [lambda: f32(3)]),
    "clamp_tensor_bounds": (lambda a, b: torch.clamp(a, b, b.double()), [lambda: f32(3), lambda: f32(3)]),
    "clamp_int_float_bounds": (lambda a: a.clamp(0.5, 2.5), [ints]),
    "lerp_0d_double_weight": (lambda a: torch.lerp(a, a * 2, torch.tensor(0.5, dtype=torch.float64)), [lambda: f32(4)]),
    "addcmul_int_value": (lambda a: torch.addcmul(a, a, a, value=0.5), [ints]),
}


def _run(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn(*args), None
        except Exception as error:  # noqa: BLE001 (the exception is the result to compare)
            return None, error


@pytest.mark.parametrize("name", sorted(CASES))
def test_edge_case(name):
    fn, makers = CASES[name]
    torch.manual_seed(0)
    args = [make() for make in makers]
    expected, eager_error = _run(fn, [a.clone() for a in args])
    actual, ember_error = _run(ember.compile(fn), [a.clone() for a in args])
    if eager_error is not None or ember_error is not None:
        assert type(ember_error) is type(eager_error), f"eager: {eager_error!r}, ember: {ember_error!r}"
        return
    for e, a in zip(tree_leaves(expected), tree_leaves(actual), strict=True):
        assert (e.dtype, e.shape) == (a.dtype, a.shape)
        torch.testing.assert_close(a, e, equal_nan=True, rtol=1e-5, atol=1e-6)
