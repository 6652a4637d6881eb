"""Random programs trained: the fuzzer's straight-line programs (no in-place ops, no complex
tensors) with every float32 and float64 input requiring grad (float64 too since seeds 6000..6299:
186 of 300 programs had no output that required grad), compiled with dynamic=True (size symbols in the
forward and the backward) and, for fewer seeds, with static sizes, over two calls with different
input values.  Outputs and the gradients
of a weighted sum of the outputs that require grad are compared with eager's.  A program eager
cannot differentiate (floor_divide) or call (clamp with a tensor and a number) is skipped.  Seeds
0..119 found a max(dim) gradient on ties that went to every tied element and symbolic sizes in a
view returned from a training graph."""
from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch

import ember
from ember.api import CompileFallbackWarning

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from program_generator import generate

# and seeds from a run over 120..3999 (benchmarks/results/2026-11-24-s17-correctness-sweeps.txt): 433 and 696
# (std of a constant: NaN gradient), 510 and 1059 (an f32 0-d operand of a bf16 where: its gradient
# summed at fp32, eager's rounded to bf16 first); from 4000..6299, 6134 (addcmul's 0-d float32 operand
# read unrounded in a bf16 op); from 7000..7399, 7153 (clamp whose bounds equal each other: eager's
# clamp sends no gradient there, maximum/minimum split ties in halves)
SEEDS = [*range(120), 433, 510, 696, 1059, 6134, 7153]


def _leaves(inputs: list) -> list:
    return [x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64)
            else x for x in inputs]


def _differentiate(outputs: tuple, leaves: list, seed: int) -> list:
    differentiable = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * (torch.rand(o.shape, generator=gen) + 0.5).to(o.dtype)).sum() for o in differentiable)
    wrt = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    return list(torch.autograd.grad(loss, wrt, allow_unused=True))


# static sizes, the backward compiled in a thread while the forward builds (as on CUDA): seeds
# 0..59 and, from session 23's sweep over 9000..9800, 9064 (var without dims where N < correction:
# eager's gradient is NaN) and 9194 (exp's amax gradient NaN on the CPU: the value recomputed by
# another vector form in the comparison's pass)
STATIC_SEEDS = [*range(60), 9064, 9194]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_program_gradients_with_symbolic_sizes(seed):
    check_gradients(seed, dynamic=True)


@pytest.mark.parametrize("seed", STATIC_SEEDS)
def test_random_program_gradients_with_static_sizes(seed, monkeypatch):
    from ember import config
    monkeypatch.setattr(config, "compile_backward_early", "always")
    check_gradients(seed, dynamic=None)


def check_gradients(seed: int, dynamic: bool | None) -> None:
    program = generate(seed, complex_ops=False, inplace_ops=False, raise_rate=0)
    ember.reset()
    compiled = ember.compile(program.function(), dynamic=dynamic)
    eager = program.function()
    for call in range(2):
        raw = program.make_inputs(seed * 10 + call)
        eager_inputs, compiled_inputs = _leaves(raw), _leaves(raw)
        try:
            expected = eager(*eager_inputs)
        except TypeError as error:          # a call eager rejects (clamp with a tensor and a number)
            pytest.skip(str(error))
        if not any(isinstance(o, torch.Tensor) and o.requires_grad for o in expected):
            pytest.skip("no output requires grad")
        try:
            expected_grads = _differentiate(expected, eager_inputs, seed)
        except RuntimeError as error:       # eager has no derivative for an op
            pytest.skip(str(error))
        with warnings.catch_warnings():
            warnings.simplefilter("error", CompileFallbackWarning)  # running eagerly is a failure here
            actual = compiled(*compiled_inputs)
            actual_grads = _differentiate(actual, compiled_inputs, seed)
        for e, a in zip(list(expected) + expected_grads, list(actual) + actual_grads):
            if isinstance(e, torch.Tensor) and e.is_floating_point():
                torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-4, equal_nan=True, msg=lambda m: f"{m}\n{program}")
            elif e is None and isinstance(a, torch.Tensor):
                assert not a.any(), f"a gradient where eager has none\n{program}"
