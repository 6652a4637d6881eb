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
