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
import opinfo_util

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

SAMPLES_PER_OP = 3
OPS_PER_BATCH = 16
DTYPES = (torch.float32, torch.bfloat16)

UNCHECKABLE = {
    "empty": "uninitialized memory: nothing to compare",
    "empty_like": "uninitialized memory: nothing to compare",
}
# (op id, dtype or None for all) -> why it fails today
KNOWN_FAILURES: dict[tuple[str, torch.dtype | None], str] = {}

RUN = opinfo_batch.BatchedRun(opinfo_util.decomposed_opinfos(), SAMPLES_PER_OP, OPS_PER_BATCH,
                              options={"cpu_backend": "triton"}, skip=lambda name, dtype: name in UNCHECKABLE,
                              device=DEVICE)
_CASES = [(info, dtype) for info, _ in RUN.opinfos for dtype in DTYPES if dtype in info.supported_dtypes(DEVICE)]


def known_failure(name: str, dtype: torch.dtype) -> str | None:
    return KNOWN_FAILURES.get((name, dtype)) or KNOWN_FAILURES.get((name, None))


@pytest.mark.parametrize("case", _CASES, ids=[f"{opinfo_batch.op_id(i)}-{str(d)[6:]}" for i, d in _CASES])
def test_opinfo_triton(case) -> None:
    info, dtype = case
    name = opinfo_batch.op_id(info)
    if name in UNCHECKABLE:
        pytest.xfail(UNCHECKABLE[name])
    opinfo_batch.check_op(RUN, info, dtype, known_failure(name, dtype))


def test_opinfo_triton_summary() -> None:
    """Prints ops / cases run and passed (pytest -s shows it; run after the parametrized tests)."""
    summary = opinfo_batch.summarize(RUN, _CASES, known_failure, UNCHECKABLE)
    print(f"\nOpInfo through the Triton backend ({DEVICE}): {summary}")
