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

# (op id, dtype or None for all) -> why it fails today
KNOWN_FAILURES: dict[tuple[str, torch.dtype | None], str] = {}
SUITE = opinfo_batch.BackendSuite(samples_per_op=4, ops_per_batch=16, options={}, known_failures=KNOWN_FAILURES)


@pytest.mark.parametrize("case", SUITE.cases, ids=SUITE.ids)
def test_opinfo_cpp(case) -> None:
    SUITE.check(case)


def test_opinfo_cpp_summary() -> None:
    """Prints ops / cases run and passed (pytest -s shows it; run after the parametrized tests)."""
    print(f"\nOpInfo through the C++ backend: {SUITE.summary()}")
