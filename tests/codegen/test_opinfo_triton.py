"""Every OpInfo op with a decomposition through the full compiler's TRITON path vs eager,
float32 and bfloat16, a few samples each (tests/codegen/test_opinfo_backend.py is the C++ twin).

On the CPU (CI) graphs compile with ``options={"cpu_backend": "triton"}`` and ember runs their
kernels in Triton's interpreter by itself (no TRITON_INTERPRET, which would leak into other tests).  With
``EMBER_TRITON_TEST_DEVICE=cuda`` the same samples are made on the GPU and run compiled.
The interpreter costs little per kernel, so every op runs; the samples of OPS_PER_BATCH ops
share one graph as on the C++ path.  `pytest -s -k summary` prints the pass rate.
"""
from __future__ import annotations

import os
import sys

import pytest

DEVICE = os.environ.get("EMBER_TRITON_TEST_DEVICE", "cpu")
# no TRITON_INTERPRET here: ember runs CPU tensors' kernels in the interpreter by itself, and setting
# the variable would leak into every other test of the process (see tests/codegen/test_triton.py)

triton = pytest.importorskip("triton")
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import opinfo_batch

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

# (op id, dtype or None for all) -> why it fails today
KNOWN_FAILURES: dict[tuple[str, torch.dtype | None], str] = {}
SUITE = opinfo_batch.BackendSuite(samples_per_op=3, ops_per_batch=16, options={"cpu_backend": "triton"},
                                  device=DEVICE, known_failures=KNOWN_FAILURES)


@pytest.mark.parametrize("case", SUITE.cases, ids=SUITE.ids)
def test_opinfo_triton(case) -> None:
    SUITE.check(case)


def test_opinfo_triton_summary() -> None:
    """Prints ops / cases run and passed (pytest -s shows it; run after the parametrized tests)."""
    print(f"\nOpInfo through the Triton backend ({DEVICE}): {SUITE.summary()}")
