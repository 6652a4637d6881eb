"""Scalar-level printing for the Triton generator: dtypes, literals, casts and elementwise ops.

Values of bf16/fp16 tensors are computed in fp32 (rounded on store and on explicit
casts), like the C++ generator.  ``PRELUDE`` holds the small ``@triton.jit`` helpers
every generated module starts with (NaN-propagating max/min, arg-reductions,
Welford combine, Python division semantics); unused helpers cost nothing since
Triton compiles a helper only where a kernel calls it.
"""
from __future__ import annotations

import contextvars
import math

import torch

from ember.errors import CompileError
from ember.lower.ir import Op

TL_TYPE = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1",
}
# pointer types in Triton's signature strings (what triton.compile expects)
SIGNATURE_TYPE = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
    torch.int8: "*i8", torch.uint8: "*u8", torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64",
    torch.bool: "*i1",
}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_type(dtype: torch.dtype) -> str:
    """The Triton type a value of this torch dtype is computed in."""
    if dtype in LOW_PRECISION:
        return "tl.float32"
    try:
        return TL_TYPE[dtype]
    except KeyError:
        raise CompileError(f"dtype {dtype} is not supported by the Triton backend", stage="codegen") from None


def accumulator_type(dtype: torch.dtype) -> str:
    if dtype in LOW_PRECISION or dtype == torch.float32:
        return "tl.float32"
    if dtype == torch.float64:
        return "tl.float64"
    return "tl.int64"


def literal(value: object, dtype: torch.dtype, typed: bool = False) -> str:
    """A scalar constant; ``typed`` wraps it in a 0-d tensor of the exact dtype (needed unless fp32/int32)."""
    if dtype == torch.bool:
        text = "1" if value else "0"
        return f"tl.full([], {text}, tl.int1)"
    if dtype.is_floating_point:
        v = float(value)
        text = 'float("nan")' if math.isnan(v) else (f'float("{"-" if v < 0 else ""}inf")' if math.isinf(v) else repr(v))
    else:
        text = str(int(value))
    if not typed and (dtype in (torch.float32, torch.float16, torch.bfloat16) or
                      (dtype == torch.int32 and -2**31 <= int(value) < 2**31)):
        return text
    return f"tl.full([], {text}, {compute_type(dtype)})"


def lowest(dtype: torch.dtype) -> str:
    """Identity of max reductions."""
    if dtype.is_floating_point:
        return 'float("-inf")'
    if dtype == torch.bool:
        return "0"
    return str(torch.iinfo(dtype).min)


def highest(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return 'float("inf")'
    if dtype == torch.bool:
        return "1"
    return str(torch.iinfo(dtype).max)


# set by codegen/triton.py while it generates a module for the interpreter (None: follow the env)
INTERPRET: contextvars.ContextVar[bool | None] = contextvars.ContextVar("ember_triton_interpret", default=None)


def interpreted() -> bool:
    """Is the module being generated for Triton's interpreter?"""
    mode = INTERPRET.get()
    if mode is not None:
        return mode
    import os
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def to_storage(value: str, dtype: torch.dtype) -> str:
    """Convert an fp32 value to bf16/fp16 storage, rounding to nearest even.

    Triton's interpreter truncates fp32 -> bf16, so interpreted kernels round explicitly first
    (GPU kernels use the hardware's round-to-nearest-even conversion).
    """
    if dtype == torch.bfloat16 and interpreted():
        value = f"_ember_round_bf16({value})"
    return f"{value}.to({TL_TYPE[dtype]})"


def cast(value: str, src: torch.dtype, dst: torch.dtype, rounded: bool = False) -> str:
    """``rounded``: the fp32 value is exactly a ``src`` (bf16/fp16) value already (a load, a cast)."""
    if src == dst:
        return value
    if src in LOW_PRECISION and dst != src:
        # the value is a bf16/fp16 tensor in eager: round it before it changes type
        if not rounded:
            value = f"{to_storage(value, src)}.to(tl.float32)"
        if dst == torch.float32:
            return value
    if dst == torch.bool:
        return f"({value} != 0)"
    if dst in LOW_PRECISION:
        if src not in LOW_PRECISION and src != torch.float32:
            # through fp32 as eager does (and _ember_round_bf16 bitcasts fp32 bits)
            value = f"{value}.to(tl.float32)"
        return f"{to_storage(value, dst)}.to(tl.float32)"
    return f"{value}.to({TL_TYPE[dst]})"


_UNARY_FLOAT = {
    "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "expm1": "libm.expm1({0})", "log": "tl.log({0})",
    "log1p": "libm.log1p({0})", "log2": "tl.log2({0})", "log10": "libm.log10({0})", "sqrt": "tl.sqrt_rn({0})",
    "rsqrt": "tl.rsqrt({0})", "reciprocal": "(1.0 / {0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "tan": "libm.tan({0})", "asin": "libm.asin({0})", "acos": "libm.acos({0})", "atan": "libm.atan({0})",
    "sinh": "libm.sinh({0})", "cosh": "libm.cosh({0})", "tanh": "libm.tanh({0})", "asinh": "libm.asinh({0})",
    "acosh": "libm.acosh({0})", "atanh": "libm.atanh({0})", "erf": "tl.erf({0})", "erfc": "libm.erfc({0})",
    "erfinv": "libm.erfinv({0})", "lgamma": "libm.lgamma({0})", "sigmoid": "tl.sigmoid({0})",
    "floor": "tl.floor({0})", "ceil": "tl.ceil({0})", "round": "libm.nearbyint({0})", "trunc": "libm.trunc({0})",
    "abs": "tl.abs({0})", "neg": "(-{0})", "sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, {0}))",
    "signbit": "(libm.signbit({0}) != 0)", "isnan": "({0} != {0})", "isinf": '(tl.abs({0}) == float("inf"))',
    "isfinite": '(tl.abs({0}) < float("inf"))', "logical_not": "({0} == 0)",
}
_UNARY_INT = {
    "abs": "tl.abs({0})", "neg": "(-{0})", "sign": "(({0} > 0).to({T}) - ({0} < 0).to({T}))",
    "signbit": "({0} < 0)", "isnan": "({0} != {0})", "isinf": "({0} != {0})", "isfinite": "({0} == {0})",
    "logical_not": "({0} == 0)", "bitwise_not": "(~{0})", "floor": "{0}", "ceil": "{0}", "round": "{0}",
    "trunc": "{0}",
}
_BINARY_COMMON = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})",
    # logical ops as where/!= rather than & | ^ of comparisons: Triton 3.9's interpreter types the
    # comparison of a scalar (a 0-d load) as its operand's float type, and & | ^ then reject it
    "ge": "({0} >= {1})", "logical_and": "tl.where({0} != 0, {1} != 0, False)",
    "logical_or": "tl.where({0} != 0, True, {1} != 0)", "logical_xor": "(({0} != 0) != ({1} != 0))",
}
_BINARY_FLOAT = {
    # torch.maximum/minimum propagate NaN; tl.maximum does not.  Nested wheres, not an | of two
    # compares: Triton's interpreter types a compare of two 0-d loads as float and rejects the |
    "maximum": "tl.where({0} != {0}, {0}, tl.where({0} > {1}, {0}, {1}))",
    "minimum": "tl.where({0} != {0}, {0}, tl.where({0} < {1}, {0}, {1}))",
    "floor_divide": "_ember_floordiv_float({0}, {1})", "remainder": "_ember_remainder_float({0}, {1})",
    "fmod": "libm.fmod({0}, {1})", "pow": "libm.pow({0}, {1})", "atan2": "libm.atan2({0}, {1})",
    "hypot": "libm.hypot({0}, {1})", "copysign": "libm.copysign({0}, {1})",
}
_BINARY_INT = {
    "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})",
    "floor_divide": "_ember_floordiv_int({0}, {1})", "remainder": "_ember_remainder_int({0}, {1})",
    "fmod": "_ember_fmod_int({0}, {1})",
    "pow": "libm.pow({0}.to(tl.float64), {1}.to(tl.float64)).to({T})",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "bitwise_left_shift": "tl.where(({1} < 0) | ({1} >= {BITS}), 0, {0} << {1}).to({T})",
    "bitwise_right_shift": "tl.where(({1} < 0) | ({1} >= {BITS}), tl.where({0} < 0, -1, 0).to({T}), {0} >> {1})",
}
# each operand compared with 0 first: a bool computed from 0-d loads alone (a clamp's bounds
# compared with each other) is typed as float by Triton 3.6's interpreter, which & | ^ reject;
# compiled, the compare folds away
_AND, _OR, _XOR = "(({0} != 0) & ({1} != 0))", "(({0} != 0) | ({1} != 0))", "(({0} != 0) ^ ({1} != 0))"
_BOOL_OPS = {"add": _OR, "mul": _AND, "maximum": _OR, "minimum": _AND,
             "bitwise_and": _AND, "bitwise_or": _OR, "bitwise_xor": _XOR,
             "bitwise_not": "({0} == 0)", "abs": "{0}", "logical_not": "({0} == 0)",
             "logical_and": _AND, "logical_or": _OR, "logical_xor": _XOR}


def render_op(node: Op, args: list[str]) -> str:
    """Triton for one elementwise op on already-computed operands."""
    name = node.op
    if name == "where":
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    if name == "philox_uniform":   # (seed, counter) -> fp32 in [0, 1): ember/prims/philox.py is this
        return f"tl.rand({args[0]}, {args[1]})"
    operand_dtype = node.args[0].dtype if node.args else node.dtype
    T = compute_type(operand_dtype)
    is_float = operand_dtype.is_floating_point
    if operand_dtype == torch.bool and name in _BOOL_OPS:
        template = _BOOL_OPS[name]
    elif name == "bitwise_not" and operand_dtype == torch.uint8:
        # not ~x: Triton 3.6's interpreter builds the all-ones mask as -1 and numpy rejects it for uint8
        template = "({0} ^ 255).to(tl.uint8)"
    elif name == "div" and not is_float:
        template = "({0}.to(tl.float64) / {1}.to(tl.float64)).to(" + compute_type(node.dtype) + ")"
    elif name in _BINARY_COMMON:
        template = _BINARY_COMMON[name]
    elif len(args) == 2:
        template = (_BINARY_FLOAT if is_float else _BINARY_INT).get(name)
    else:
        template = (_UNARY_FLOAT if is_float else _UNARY_INT).get(name)
        if template is None and not is_float and name in _UNARY_FLOAT:
            template = _UNARY_FLOAT[name].replace("{0}", "{0}.to(tl.float64)")
        if template is not None and (not is_float or operand_dtype == torch.float64):
            template = template.replace("tl.sqrt_rn(", "tl.sqrt(")   # sqrt_rn is fp32 only; fp64 sqrt is exact
    if template is None:
        raise CompileError(f"no Triton rendering for {name} on {operand_dtype}", stage="codegen", op=name)
    bits = operand_dtype.itemsize * 8 if not is_float else 0
    return template.format(*args, T=T, BITS=bits)


PRELUDE = '''
@triton.jit
def _ember_check_index(index, size, code, reported):
    # an indirect index outside [0, size): a device-side assert like eager's CUDA kernels (kernels
    # that call this are compiled with debug=True); the interpreter rebinds this name to a function
    # that raises eager's CPU exception (runtime/triton_build.py)
    ok = (index >= 0) & (index < size)
    tl.device_assert(ok, "index out of bounds")
    return tl.where(ok, index, 0)


@triton.jit
def _ember_check_index_masked(index, size, code, reported, mask):
    ok = ((index >= 0) & (index < size)) | (mask == 0)
    tl.device_assert(ok, "index out of bounds")
    return tl.where(ok, index, 0)


@triton.jit
def _ember_max_nan(a, b):
    # torch.amax propagates NaN: a NaN operand wins
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _ember_min_nan(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _ember_mul(a, b):
    return a * b


@triton.jit
def _ember_argmax(value_a, index_a, value_b, index_b):
    # first occurrence wins; NaN counts as the largest value (torch.argmax)
    a_nan = value_a != value_a
    b_nan = value_b != value_b
    tie = (value_a == value_b) | (a_nan & b_nan)
    pick_a = (value_a > value_b) | (a_nan & (b_nan == 0)) | (tie & (index_a < index_b))
    return tl.where(pick_a, value_a, value_b), tl.where(pick_a, index_a, index_b)


@triton.jit
def _ember_argmin(value_a, index_a, value_b, index_b):
    a_nan = value_a != value_a
    b_nan = value_b != value_b
    tie = (value_a == value_b) | (a_nan & b_nan)
    pick_a = (value_a < value_b) | (a_nan & (b_nan == 0)) | (tie & (index_a < index_b))
    return tl.where(pick_a, value_a, value_b), tl.where(pick_a, index_a, index_b)


@triton.jit
def _ember_welford_combine(mean_a, m2_a, count_a, mean_b, m2_b, count_b):
    count = count_a + count_b
    delta = mean_b - mean_a
    fraction = tl.where(count == 0.0, 0.0, count_b / tl.where(count == 0.0, 1.0, count))
    return mean_a + delta * fraction, m2_a + m2_b + delta * delta * count_a * fraction, count


@triton.jit
def _ember_floordiv_int(a, b):
    # Python semantics; b == 0 gives 0 (torch raises; a kernel must not trap)
    safe_b = tl.where(b == 0, 1, b)
    quotient = a // safe_b
    quotient = tl.where((a % safe_b != 0) & ((a < 0) != (safe_b < 0)), quotient - 1, quotient)
    return tl.where(b == 0, 0, quotient)


@triton.jit
def _ember_remainder_int(a, b):
    safe_b = tl.where(b == 0, 1, b)
    r = a % safe_b
    r = tl.where((r != 0) & ((r < 0) != (safe_b < 0)), r + safe_b, r)
    return tl.where(b == 0, 0, r)


@triton.jit
def _ember_fmod_int(a, b):
    safe_b = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a % safe_b)


@triton.jit
def _ember_floordiv_float(a, b):
    mod = libm.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    floordiv = tl.floor(div)
    floordiv = tl.where(div - floordiv > 0.5, floordiv + 1.0, floordiv)
    floordiv = tl.where(div == 0, libm.copysign(div * 0.0, a / b), floordiv)
    return tl.where(b == 0, a / b, floordiv)


@triton.jit
def _ember_round_bf16(x):
    # fp32 -> nearest-even bf16 value (still fp32); NaN stays NaN
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _ember_remainder_float(a, b):
    mod = libm.fmod(a, b)
    return tl.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)
'''
