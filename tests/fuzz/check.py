"""Differential check of one fuzz Program: ember.compile against eager PyTorch.

Compared, on two calls with different input values: exceptions (eager raises -> ember raises the
same type; eager runs -> ember runs, without falling back), output values (tolerance by dtype),
dtypes, shapes, strides, aliasing of outputs (same object as an input or an earlier output,
shares storage with an input) and the values of inputs after the call (in-place ops on inputs).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

import ember
from program_generator import Program

# (rtol, atol) per dtype; low-precision results may differ by a few rounding steps because ember
# keeps fused intermediates in fp32 (as Inductor does) where eager rounds after every op
TOLERANCE = {torch.float64: (1e-6, 1e-6), torch.float32: (1e-3, 1e-4), torch.float16: (2e-2, 2e-2),
             torch.bfloat16: (8e-2, 8e-2), torch.complex64: (1e-3, 1e-4)}


@dataclasses.dataclass
class Outcome:
    status: str  # ok | mismatch | compile_error | fallback | error_mismatch
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def expected_fallback(program: Program, outcome: Outcome) -> bool:
    """Graphs with complex tensors run eagerly by design (ember compiles real dtypes only), with
    one warning: a fallback is the right outcome for them."""
    return outcome.status == "fallback" and "complex" in program.source


def check_program(program: Program, options: dict | None = None, calls: int = 2) -> Outcome:
    compiled = ember.compile(program.function(), options=options)
    eager_fn = program.function()
    for call in range(calls):
        outcome = _check_call(program, eager_fn, compiled, input_seed=program.seed * 7 + call)
        if not outcome.ok:
            outcome.detail = f"call {call + 1}: {outcome.detail}"
            return outcome
    return Outcome("ok")


def _run(fn: Any, inputs: list[Any]) -> tuple[Any, BaseException | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*inputs), None, [str(w.message) for w in caught]
        except Exception as error:  # noqa: BLE001 (any exception is a result to compare)
            return None, error, [str(w.message) for w in caught]


def _check_call(program: Program, eager_fn: Any, compiled: Any, input_seed: int) -> Outcome:
    eager_inputs = program.make_inputs(input_seed)
    ember_inputs = program.make_inputs(input_seed)  # same values, same layouts
    expected, eager_error, _ = _run(eager_fn, eager_inputs)
    actual, ember_error, warned = _run(compiled, ember_inputs)
    if eager_error is not None:
        if ember_error is None:
            return Outcome("error_mismatch", f"eager raised {type(eager_error).__name__}: {eager_error}; "
                                             "ember ran")
        if type(ember_error) is not type(eager_error):
            return Outcome("error_mismatch", f"eager raised {type(eager_error).__name__}: {eager_error}; "
                                             f"ember raised {type(ember_error).__name__}: {ember_error}")
        return Outcome("ok")
    if ember_error is not None:
        return Outcome("compile_error", f"{type(ember_error).__name__}: {ember_error}")
    fallbacks = [w for w in warned if w.startswith("ember")]
    if fallbacks:
        return Outcome("fallback", fallbacks[0])
    problem = (_compare_outputs(expected, actual) or _compare_aliasing(expected, actual, eager_inputs, ember_inputs)
               or _compare_inputs(eager_inputs, ember_inputs))
    return Outcome("mismatch", problem) if problem else Outcome("ok")


def _compare_outputs(expected: tuple, actual: tuple) -> str | None:
    if not isinstance(actual, tuple) or len(actual) != len(expected):
        return f"output structure: expected {len(expected)} outputs, got {type(actual).__name__}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        problem = compare_tensors(e, a) or _compare_strides(e, a)
        if problem:
            return f"output {i}: {problem}"
    return None


def _compare_strides(e: Any, a: Any) -> str | None:
    """Outputs keep eager's layout (a size-1 dim's stride is free)."""
    if not isinstance(e, torch.Tensor) or e.numel() <= 1:
        return None
    if [st for st, n in zip(e.stride(), e.shape) if n != 1] != [st for st, n in zip(a.stride(), a.shape) if n != 1]:
        return f"strides: expected {e.stride()}, got {a.stride()} (shape {tuple(e.shape)})"
    return None


def compare_tensors(e: Any, a: Any) -> str | None:
    if not isinstance(e, torch.Tensor):
        return None if e == a or (e != e and a != a) else f"expected {e!r}, got {a!r}"
    if not isinstance(a, torch.Tensor):
        return f"expected a tensor, got {type(a).__name__}"
    if e.dtype != a.dtype:
        return f"dtype: expected {e.dtype}, got {a.dtype}"
    if e.shape != a.shape:
        return f"shape: expected {tuple(e.shape)}, got {tuple(a.shape)}"
    if e.device != a.device:
        return f"device: expected {e.device}, got {a.device}"
    if e.requires_grad != a.requires_grad:
        return f"requires_grad: expected {e.requires_grad}, got {a.requires_grad}"
    if e.dtype.is_complex:
        e, a = torch.view_as_real(e.resolve_conj()), torch.view_as_real(a.resolve_conj())
    rtol, atol = TOLERANCE.get(e.dtype, (0, 0))
    expected, actual = e.double(), a.double()
    close = torch.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    bad = (~close).nonzero()[0].tolist()
    diff = (actual - expected).abs().nan_to_num(float("inf")).max().item()
    return (f"values differ at {bad}: expected {e[tuple(bad)].item()!r}, got {a[tuple(bad)].item()!r} "
            f"(max abs diff {diff:.3g}, {int((~close).sum())} of {close.numel()} elements)")


def _alias_signature(outputs: tuple, inputs: list[Any]) -> list[tuple]:
    def storage(t: torch.Tensor) -> int | None:
        return t.untyped_storage().data_ptr() if t.numel() and t.untyped_storage().nbytes() else None
    input_storages = {i: storage(x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
    signature = []
    for j, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            signature.append(())
            continue
        same_input = tuple(i for i, x in enumerate(inputs) if x is out)
        same_output = tuple(k for k in range(j) if outputs[k] is out)
        shares = tuple(i for i, s in input_storages.items() if s is not None and s == storage(out))
        signature.append((same_input, same_output, shares))
    return signature


def _compare_aliasing(expected: tuple, actual: tuple, eager_inputs: list, ember_inputs: list) -> str | None:
    e, a = _alias_signature(expected, eager_inputs), _alias_signature(actual, ember_inputs)
    if e != a:
        return f"aliasing: eager (is input, is output, shares storage with input) {e}, ember {a}"
    return None


def _compare_inputs(eager_inputs: list, ember_inputs: list) -> str | None:
    for i, (e, a) in enumerate(zip(eager_inputs, ember_inputs)):
        if isinstance(e, torch.Tensor):
            problem = compare_tensors(e, a)
            if problem:
                return f"input a{i} after the call: {problem}"
    return None
