"""PyTorch's type promotion, computed from metas and Python scalars (no tensors needed).

Operands fall in three tiers: tensors with dims, zero-dim tensors, Python scalars.  A
lower tier only changes the result when its *category* (bool < int < float < complex)
is higher; then it contributes its own dtype (zero-dim tensor) or the default dtype of
its category (Python scalar).  Same rules as torch.result_type.
"""
from __future__ import annotations

import enum
from typing import Any

import torch

from ember.symbolic import SymInt


class Promotion(enum.Enum):
    DEFAULT = "default"              # add, mul, where ...: the promoted type
    INT_TO_FLOAT = "int_to_float"    # true div, exp, sin ...: bool/int -> default float
    ALWAYS_BOOL = "always_bool"      # comparisons: compute in the promoted type, return bool
    COMPLEX_TO_FLOAT = "complex_to_float"  # abs: complex -> its real type


def category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def scalar_category(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, SymInt)):
        return 1
    if isinstance(value, complex):
        return 3
    return 2


def default_dtype_for_category(cat: int) -> torch.dtype:
    if cat == 0:
        return torch.bool
    if cat == 1:
        return torch.int64
    if cat == 2:
        return torch.get_default_dtype()
    return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64


def result_type(operands: list[tuple[str, Any]]) -> torch.dtype:
    """operands: ("tensor", dtype) | ("zerodim", dtype) | ("scalar", python value or type)."""
    tiers: dict[str, torch.dtype | None] = {"tensor": None, "zerodim": None}
    scalar_cat = -1
    for tier, value in operands:
        if tier == "scalar":
            cat = scalar_category(value() if isinstance(value, type) else value)
            scalar_cat = max(scalar_cat, cat)
        else:
            current = tiers[tier]
            tiers[tier] = value if current is None else torch.promote_types(current, value)
    result = tiers["tensor"]
    zerodim = tiers["zerodim"]
    if zerodim is not None and (result is None or category(zerodim) > category(result)):
        if result is not None and category(zerodim) == 3 and category(result) == 2:
            # complex zero-dim with a float tensor keeps the tensor's precision
            result = torch.promote_types(result, torch.complex64)
        else:
            result = zerodim
    if scalar_cat >= 0 and (result is None or scalar_cat > category(result)):
        if result is not None and scalar_cat == 3 and category(result) == 2:
            result = torch.promote_types(result, torch.complex64)
        else:
            result = default_dtype_for_category(scalar_cat)
    assert result is not None, "type promotion needs at least one operand"
    return result


def elementwise_dtypes(operands: list[tuple[str, Any]], kind: Promotion) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype of the prim, result dtype) for an elementwise op."""
    promoted = result_type(operands)
    if kind is Promotion.INT_TO_FLOAT and category(promoted) < 2:
        promoted = torch.get_default_dtype()
    if kind is Promotion.ALWAYS_BOOL:
        return promoted, torch.bool
    if kind is Promotion.COMPLEX_TO_FLOAT and promoted.is_complex:
        return promoted, torch.empty((), dtype=promoted).real.dtype
    return promoted, promoted


LOW_PRECISION = (torch.float16, torch.bfloat16)


def computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Composite decompositions (softmax, norms, gelu ...) compute low-precision floats in fp32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype
