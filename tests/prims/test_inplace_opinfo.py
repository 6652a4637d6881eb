"""Every OpInfo op's in-place variant (x.add_, torch.relu_ ...) and every op that takes `inplace=`
(F.silu(x, inplace=True), F.dropout(x, training=False, inplace=True) ...) through the full
compiler (ember.backend.compile_graph, CPU C++ path) vs eager: outputs AND the inputs after the
call (the mutation), float32 and bfloat16.  With ``EMBER_TEST_DEVICE=cuda`` the same samples are made
on the GPU and compiled to Triton kernels (the GPU machine's check).

Cases are batched many per g++ build (tests/opinfo_batch.py); a batch that raises is bisected
down to the sample at fault.  `pytest -s -k summary` prints the pass rate.
"""
from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import opinfo_batch
import opinfo_util

F = torch.nn.functional
DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

# ops whose OpInfo callable is a lambda around the F function that takes inplace= and training=:
# run the F function itself with training=False (with training they draw random numbers)
TRAINING_OFF = {
    "nn.functional.dropout": F.dropout,
    "nn.functional.alpha_dropout": F.alpha_dropout,
    "nn.functional.feature_alpha_dropout": F.feature_alpha_dropout,
    "nn.functional.dropout2d": F.dropout2d,
    "nn.functional.dropout3d": F.dropout3d,
    "nn.functional.rrelu": F.rrelu,
}

# (op id, dtype or None for all) -> the eager-side reason the case cannot be compared
_RANDOM = "draws random numbers: ember's Philox stream is not eager's generator"
EXCLUDED: dict[tuple[str, torch.dtype | None], str] = {
    (name, None): _RANDOM for name in (
        "cauchy", "exponential", "geometric", "log_normal", "normal.in_place", "uniform", "bernoulli",
        # the OpInfo's own in-place lambdas, sampled with training=True (their training=False runs below)
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train")}

# graphs that must run eagerly to be exact (functionalize.RunEagerly), by the reason they give
RUN_EAGERLY_BY_DESIGN = (
    "changes the tensor's shape or strides in place",   # squeeze_, t_, as_strided_, resize_ ...: metadata
    "does not fit",                                     # addbmm_ on a 1-element self: eager resizes self
)


def compile_strict(graph: Any, inputs: list, options: dict) -> Any:
    """ember's backend, refusing to run a graph eagerly: every case must really be compiled."""
    from ember.backend import compile_graph
    compiled = compile_graph(graph, inputs, options)
    source = getattr(compiled, "source", "")
    if source.startswith("# eager") and not any(reason in source.splitlines()[0] for reason in RUN_EAGERLY_BY_DESIGN):
        raise AssertionError(f"ran eagerly: {source.splitlines()[0]}")
    return compiled


class WithKwargs:
    """An OpInfo whose samples get extra keyword arguments (inplace=True, training=False)."""

    def __init__(self, info: Any, extra: dict[str, Any]) -> None:
        self.info = info
        self.extra = extra
        self.name = info.name
        suffix = ",".join(f"{k}={v}" for k, v in extra.items())
        self.variant_test_name = f"{info.variant_test_name}[{suffix}]" if info.variant_test_name else suffix

    def supported_dtypes(self, device: str) -> Any:
        return self.info.supported_dtypes(device)

    def sample_inputs(self, device: str, dtype: torch.dtype, requires_grad: bool = False) -> Any:
        for sample in self.info.sample_inputs(device, dtype, requires_grad=requires_grad):
            yield SampleInput(sample.input, args=tuple(sample.args), kwargs={**dict(sample.kwargs), **self.extra})


def _takes_inplace(fn: Any) -> bool:
    try:
        return "inplace" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def inplace_opinfos() -> list[tuple[Any, Any]]:
    """(OpInfo-like, callable): every in-place variant, then every inplace= op with inplace=True."""
    found = []
    for info in opinfo_util.opinfo_db():
        if info.inplace_variant is not None:
            found.append((info, info.inplace_variant))
        if info.name in TRAINING_OFF:
            found.append((WithKwargs(info, {"training": False, "inplace": True}), TRAINING_OFF[info.name]))
        elif _takes_inplace(info.op):
            found.append((WithKwargs(info, {"inplace": True}), info.op))
    return found


class InplaceSuite(opinfo_batch.BackendSuite):
    def __init__(self, samples_per_op: int, ops_per_batch: int, options: dict) -> None:
        self.known_failures = dict(EXCLUDED)
        self.run = opinfo_batch.BatchedRun(inplace_opinfos(), samples_per_op, ops_per_batch, options=options,
                                           skip=lambda name, dtype: self.known_failure(name, dtype) is not None,
                                           device=DEVICE, compile_fn=compile_strict)
        self.cases = [(info, dtype) for info, _ in self.run.opinfos for dtype in self.DTYPES
                      if dtype in info.supported_dtypes(DEVICE)]
        self.ids = [f"{opinfo_batch.op_id(info)}-{str(dtype)[6:]}" for info, dtype in self.cases]

    def check(self, case: tuple[Any, torch.dtype]) -> None:
        info, dtype = case
        reason = self.known_failure(opinfo_batch.op_id(info), dtype)
        if reason:
            pytest.xfail(reason)      # excluded, never compiled: the reason is eager's
        opinfo_batch.check_op(self.run, info, dtype, None)


SUITE = InplaceSuite(samples_per_op=3, ops_per_batch=40, options={})


@pytest.mark.parametrize("case", SUITE.cases, ids=SUITE.ids)
def test_inplace_opinfo(case) -> None:
    SUITE.check(case)


def test_inplace_opinfo_summary() -> None:
    """Prints ops / cases run and passed (pytest -s shows it; run after the parametrized tests)."""
    print(f"\nOpInfo in-place variants and inplace= ops through the {DEVICE} backend: {SUITE.summary()}")
