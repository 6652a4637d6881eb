"""Every OpInfo op with a decomposition through the FULL compiler (prims -> loop IR -> scheduler ->
C++ -> wrapper) vs eager, float32 and bfloat16, a few samples each.

g++ dominates the cost, so the samples of OPS_PER_BATCH ops are compiled as ONE graph (see
tests/opinfo_batch.py); a batch that fails to compile is bisected down to the (op, sample) at
fault.  Outputs and inputs-after-the-call are compared with torch.testing's tolerances for the
dtype; a float mismatch passes only when ember is no worse than eager against a float64
reference of the same op.  `pytest -s -k summary` prints the pass rate.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import opinfo_batch
import opinfo_util

SAMPLES_PER_OP = 4
OPS_PER_BATCH = 16
DTYPES = (torch.float32, torch.bfloat16)

# ops whose output is not a function of the inputs: not compiled at all
UNCHECKABLE = {
    "empty": "uninitialized memory: nothing to compare",
    "empty_like": "uninitialized memory: nothing to compare",
}
# (op id, dtype or None for all) -> why it fails today
KNOWN_FAILURES: dict[tuple[str, torch.dtype | None], str] = {}

RUN = opinfo_batch.BatchedRun(opinfo_util.decomposed_opinfos(), SAMPLES_PER_OP, OPS_PER_BATCH, options={},
                              skip=lambda name, dtype: name in UNCHECKABLE)
_CASES = [(info, dtype) for info, _ in RUN.opinfos for dtype in DTYPES if dtype in info.supported_dtypes("cpu")]


def known_failure(name: str, dtype: torch.dtype) -> str | None:
    return KNOWN_FAILURES.get((name, dtype)) or KNOWN_FAILURES.get((name, None))


@pytest.mark.parametrize("case", _CASES, ids=[f"{opinfo_batch.op_id(i)}-{str(d)[6:]}" for i, d in _CASES])
def test_opinfo_cpp(case) -> None:
    info, dtype = case
    name = opinfo_batch.op_id(info)
    if name in UNCHECKABLE:
        pytest.xfail(UNCHECKABLE[name])
    opinfo_batch.check_op(RUN, info, dtype, known_failure(name, dtype))


def test_opinfo_cpp_summary() -> None:
    """Prints ops / cases run and passed (pytest -s shows it; run after the parametrized tests)."""
    summary = opinfo_batch.summarize(RUN, _CASES, known_failure, UNCHECKABLE)
    print(f"\nOpInfo through the C++ backend: {summary}")
