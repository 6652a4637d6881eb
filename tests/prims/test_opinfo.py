"""Every OpInfo op with a decomposition: its samples through to_primitives + prim reference
implementations vs eager, float32 and bfloat16, tolerances of torch.testing for the dtype; a
float mismatch passes when the prims are no worse than eager against a float64 reference
(tests/opinfo_batch.py: bf16 decompositions compute in fp32, more accurately than eager)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import opinfo_batch
import opinfo_util
from harness import assert_close, check_metas, clone_inputs, run_with_contract

from ember.prims import to_primitives

SAMPLES_PER_OP = 6
DTYPES = (torch.float32, torch.bfloat16)

# (op name, dtype or None for all) -> why it fails today
KNOWN_FAILURES: dict[tuple[str, torch.dtype | None], str] = {
    ("empty", None): "uninitialized memory: nothing to compare",
    ("empty_like", None): "uninitialized memory: nothing to compare",
}

_CASES = [(info, fn, dtype) for info, fn in opinfo_util.decomposed_opinfos()
          for dtype in DTYPES if dtype in info.supported_dtypes("cpu")]


def _case_id(case: tuple) -> str:
    info, _, dtype = case
    return f"{info.name}{'.' + info.variant_test_name if info.variant_test_name else ''}-{str(dtype)[6:]}"


def run_case(info, fn, dtype) -> None:
    torch.manual_seed(0)
    samples = list(info.sample_inputs("cpu", dtype, requires_grad=False))[:SAMPLES_PER_OP]
    for sample in samples:
        graph, inputs = opinfo_util.single_op_graph(fn, sample)
        try:
            expected = list(graph.run(*clone_inputs(inputs)))
        except Exception:  # noqa: BLE001, S112 - samples that eager rejects are not ours to check
            continue
        prim_graph = to_primitives(graph)
        actual = run_with_contract(prim_graph, clone_inputs(inputs))
        assert len(actual) == len(expected)
        for index, (a, e) in enumerate(zip(actual, expected)):
            try:
                assert_close(a, e, check_stride=False)
            except AssertionError:
                # bf16 decompositions compute in fp32: fine when no worse than eager vs float64
                if not opinfo_batch.no_worse_than_eager(fn, sample, inputs, index, a, e):
                    raise
        check_metas(prim_graph, clone_inputs(inputs))


@pytest.mark.parametrize("case", _CASES, ids=[_case_id(c) for c in _CASES])
def test_opinfo(case) -> None:
    info, fn, dtype = case
    reason = KNOWN_FAILURES.get((info.name, dtype)) or KNOWN_FAILURES.get((info.name, None))
    if reason:
        pytest.xfail(reason)
    run_case(info, fn, dtype)


def test_opinfo_summary(capsys) -> None:
    """Prints the pass rate over the OpInfo ops with a decomposition (pytest -s shows it)."""
    known = sum(1 for info, _, dtype in _CASES
                if (info.name, dtype) in KNOWN_FAILURES or (info.name, None) in KNOWN_FAILURES)
    ops_run = len({info.name + info.variant_test_name for info, _, _ in _CASES})
    with capsys.disabled():
        print(f"\nOpInfo: {ops_run} ops, {len(_CASES)} (op, dtype) cases, {len(_CASES) - known} expected to pass, "
              f"{known} xfailed with a reason")
