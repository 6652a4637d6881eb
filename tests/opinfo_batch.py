"""OpInfo samples through the full compiler (ember.backend.compile_graph), many per build.

A g++ build (or a Triton interpreter warm-up) costs far more than lowering one op, so the
samples of many ops go into ONE graph: independent calls, each with its own placeholders
and outputs.  When a batched compile or run raises, the batch is bisected down to the
single (op, sample) that raises; a wrong value is attributed to its case directly.

    cases = collect_cases([(info, fn)], torch.float32, samples_per_op=3)
    failures = run_cases(cases, options={})     # {case.key: "why"} for the failing ones

Comparison: torch.testing tolerances for the dtype, outputs and inputs after the call (so
mutations count).  A mismatch in a floating dtype is accepted when ember is no worse than
eager against a float64 reference of the same op (ember often computes bf16 ops in fp32,
which is more accurate than eager's bf16 kernels); such cases are counted in
`ACCEPTED_VS_FP64`.
"""
from __future__ import annotations

import dataclasses
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.graph import Graph, TensorMeta, tree_map

# case keys accepted through the float64 rule (for reports)
ACCEPTED_VS_FP64: list[str] = []


@dataclasses.dataclass
class Case:
    op_id: str                 # "name" or "name.variant"
    dtype: torch.dtype
    sample_index: int
    fn: Callable
    sample: Any
    inputs: list[torch.Tensor]               # pristine inputs (never mutated)
    expected: list[torch.Tensor]             # eager outputs (top-level results)
    expected_inputs: list[torch.Tensor]      # inputs after eager ran (mutations)

    @property
    def key(self) -> str:
        return f"{self.op_id}-{str(self.dtype)[6:]}#{self.sample_index}"


def op_id(info: Any) -> str:
    return info.name + ("." + info.variant_test_name if info.variant_test_name else "")


def _clone(values: Sequence[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _tensors_of(sample: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            found.append(value)
        return value
    tree_map(visit, ((sample.input,) + tuple(sample.args), dict(sample.kwargs)))
    return found


def _call(fn: Callable, sample: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """fn(sample) with the sample's tensors replaced, in order, by `tensors`."""
    it = iter(tensors)
    swap = lambda v: next(it) if isinstance(v, torch.Tensor) else v
    args = tree_map(swap, (sample.input,) + tuple(sample.args))
    kwargs = tree_map(swap, dict(sample.kwargs))
    return fn(*args, **kwargs)


def collect_cases(opinfos: Sequence[tuple[Any, Callable]], dtype: torch.dtype, samples_per_op: int,
                  skip: Callable[[str, torch.dtype], bool] = lambda name, dtype: False,
                  device: str = "cpu") -> list[Case]:
    """The first `samples_per_op` samples of each op that eager accepts and that return tensors
    (EMBER_OPINFO_SKIP_SAMPLES=N: the next ones after the first N, for local runs over the samples
    CI does not reach)."""
    cases = []
    for info, fn in opinfos:
        skipped_first = int(os.environ.get("EMBER_OPINFO_SKIP_SAMPLES", "0"))
        name = op_id(info)
        if dtype not in info.supported_dtypes(device) or skip(name, dtype):
            continue
        torch.manual_seed(0)
        taken = 0
        for sample in info.sample_inputs(device, dtype, requires_grad=False):
            if taken == samples_per_op:
                break
            inputs = _tensors_of(sample)
            eager_inputs = _clone(inputs)
            try:
                result = _call(fn, sample, eager_inputs)
            except Exception:  # noqa: BLE001, S112 - samples eager rejects are not ours to check
                continue
            expected = list(result) if isinstance(result, (tuple, list)) else [result]
            if not expected or not all(isinstance(e, torch.Tensor) for e in expected):
                continue
            if skipped_first:
                skipped_first -= 1
                continue
            cases.append(Case(name, dtype, taken, fn, sample, _clone(inputs),
                              [e.clone() for e in expected], eager_inputs))
            taken += 1
    return cases


def batched_graph(cases: Sequence[Case]) -> tuple[Graph, list[torch.Tensor], list[slice]]:
    """One graph calling every case's op on its own placeholders; outputs of case k at slices[k]."""
    g = Graph()
    inputs: list[torch.Tensor] = []
    slices = []
    outputs: list[Any] = []
    for k, case in enumerate(cases):
        lift = _placeholder_maker(g, inputs, case.inputs, f"c{k}_t")
        args = tree_map(lift, (case.sample.input,) + tuple(case.sample.args))
        kwargs = tree_map(lift, dict(case.sample.kwargs))
        out = g.call(case.fn, args, kwargs)
        start = len(outputs)
        result = _call(case.fn, case.sample, _clone(case.inputs))
        if isinstance(result, (tuple, list)):
            outputs.extend(g.call(operator.getitem, (out, i)) for i in range(len(result)))
        else:
            outputs.append(out)
        slices.append(slice(start, len(outputs)))
    g.output(tuple(outputs))
    return g, inputs, slices


def _placeholder_maker(g: Graph, inputs: list[torch.Tensor], tensors: Sequence[torch.Tensor],
                       prefix: str) -> Callable[[Any], Any]:
    """Replaces each tensor met (in order) by a new placeholder for the next of `tensors`."""
    it = iter(tensors)

    def lift(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensor = next(it)
            inputs.append(tensor)
            return g.placeholder(f"{prefix}{len(inputs) - 1}", TensorMeta.of(tensor))
        return value
    return lift


# ------------------------------------------------------------------ comparison
def _error_score(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> float:
    """max |value - reference| / (atol + rtol |reference|) with torch.testing's tolerances for dtype;
    a NaN where the reference has none (or the reverse) scores inf."""
    from torch.testing._comparison import default_tolerances
    rtol, atol = default_tolerances(dtype)
    value, reference = value.double(), reference.double()
    nan_mismatch = value.isnan() != reference.isnan()
    if nan_mismatch.any():
        return float("inf")
    both_finite = value.isfinite() & reference.isfinite()
    inf_mismatch = ~both_finite & ~value.isnan() & (value != reference)
    if inf_mismatch.any():
        return float("inf")
    diff = (value - reference).abs() / (atol + rtol * reference.abs())
    diff = torch.where(both_finite, diff, torch.zeros_like(diff))
    return float(diff.max()) if diff.numel() else 0.0


def fp64_reference(fn: Callable, sample: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The op's outputs with its floating inputs in float64 (None if it rejects them)."""
    upcast = [t.double() if t.is_floating_point() else t.clone() for t in inputs]
    try:
        result = _call(fn, sample, upcast)
    except Exception:  # noqa: BLE001
        return None
    result = list(result) if isinstance(result, (tuple, list)) else [result]
    return result if all(isinstance(r, torch.Tensor) for r in result) else None


def no_worse_than_eager(fn: Callable, sample: Any, inputs: Sequence[torch.Tensor], index: int,
                        actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Output `index`: is ember's error vs a float64 reference within tolerance, or no larger than eager's?

    Errors are max |x - ref| / (atol + rtol |ref|) with torch.testing's tolerances for the dtype."""
    if not expected.is_floating_point() or actual.dtype != expected.dtype:
        return False
    reference = fp64_reference(fn, sample, inputs)
    if reference is None or index >= len(reference) or reference[index].shape != expected.shape:
        return False
    ember_error = _error_score(actual, reference[index], expected.dtype)
    eager_error = _error_score(expected, reference[index], expected.dtype)
    return ember_error <= max(eager_error, 1.0)


def compare_case(case: Case, actual: Sequence[Any], actual_inputs: Sequence[torch.Tensor]) -> str | None:
    """None when ember's outputs and inputs-after-the-call match eager's, else why not."""
    if len(actual) != len(case.expected):
        return f"{len(actual)} outputs, eager has {len(case.expected)}"
    pairs = [(f"output {i}", a, e, i) for i, (a, e) in enumerate(zip(actual, case.expected))]
    pairs += [(f"input {i} after the call", a, e, None)
              for i, (a, e) in enumerate(zip(actual_inputs, case.expected_inputs))]
    accepted: list[torch.Tensor] = []       # outputs passed through the fp64 rule
    for what, a, e, index in pairs:
        if not isinstance(a, torch.Tensor):
            return f"{what}: expected a tensor, got {type(a).__name__}"
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"{what}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
        try:
            torch.testing.assert_close(a, e, equal_nan=True, check_stride=False, check_device=False)
        except AssertionError as exc:
            if index is not None and no_worse_than_eager(case.fn, case.sample, case.inputs, index, a, e):
                ACCEPTED_VS_FP64.append(case.key)
                accepted.append(a)
                continue
            if index is None and any(o.shape == a.shape and o.dtype == a.dtype and torch.equal(o, a)
                                     for o in accepted):
                continue   # an input written in place with an accepted output's values (x.logit_())
            return f"{what}: " + " ".join(str(exc).split("\n")[:4])
    return None


# ------------------------------------------------------------------- running
def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {' | '.join(text[:3])[:400]}"


def run_cases(cases: Sequence[Case], options: dict | None = None, compile_fn: Callable | None = None,
              ) -> dict[str, str]:
    """Compile all cases as one graph and compare; bisect a batch that raises.  {key: why} of failures."""
    if compile_fn is None:
        from ember.backend import compile_graph as compile_fn
    if not cases:
        return {}
    graph, inputs, slices = batched_graph(cases)
    run_inputs = _clone(inputs)
    try:
        compiled = compile_fn(graph, _clone(inputs), options or {})
        actual = list(compiled(*run_inputs))
    except Exception as exc:  # noqa: BLE001 - bisect to the case that raised
        if len(cases) == 1:
            return {cases[0].key: _describe(exc)}
        half = len(cases) // 2
        return {**run_cases(cases[:half], options, compile_fn), **run_cases(cases[half:], options, compile_fn)}
    failures = {}
    position = 0
    for case, where in zip(cases, slices):
        n_inputs = len(case.inputs)
        why = compare_case(case, actual[where], run_inputs[position:position + n_inputs])
        position += n_inputs
        if why is not None:
            failures[case.key] = why
    return failures


class BatchedRun:
    """Runs the OpInfo ops in batches of `ops_per_batch` ops (all their samples in one compile),
    lazily, the first time a test asks about one of them; remembers the failures.

        run = BatchedRun(opinfo_util.decomposed_opinfos(), samples_per_op=4, ops_per_batch=16, options={})
        run.failures(info, torch.float32)  -> {case key: why}
    """

    def __init__(self, opinfos: Sequence[tuple[Any, Callable]], samples_per_op: int, ops_per_batch: int,
                 options: dict | None = None, skip: Callable[[str, torch.dtype], bool] = lambda n, d: False,
                 device: str = "cpu", compile_fn: Callable | None = None):
        self.opinfos = list(opinfos)
        self.samples_per_op = samples_per_op
        self.ops_per_batch = ops_per_batch
        self.options = dict(options or {})
        self.skip = skip
        self.device = device
        self.compile_fn = compile_fn        # default: ember.backend.compile_graph
        self.cases_run: dict[tuple[str, torch.dtype], int] = {}      # (op id, dtype) -> samples compiled
        self._failures: dict[tuple[str, torch.dtype], dict[str, str]] = {}
        self.accepted_vs_fp64: set[str] = set()                       # case keys passed by the fp64 rule
        self._done: set[tuple[torch.dtype, int]] = set()
        self._position = {op_id(info): i for i, (info, _) in enumerate(self.opinfos)}

    def failures(self, info: Any, dtype: torch.dtype) -> dict[str, str]:
        name = op_id(info)
        batch = self._position[name] // self.ops_per_batch
        if (dtype, batch) not in self._done:
            self._done.add((dtype, batch))
            ops = self.opinfos[batch * self.ops_per_batch:(batch + 1) * self.ops_per_batch]
            cases = collect_cases(ops, dtype, self.samples_per_op, self.skip, self.device)
            for case in cases:
                self.cases_run[(case.op_id, dtype)] = self.cases_run.get((case.op_id, dtype), 0) + 1
            accepted_before = len(ACCEPTED_VS_FP64)
            for key, why in run_cases(cases, self.options, self.compile_fn).items():
                op = key[:key.rindex("-")]
                self._failures.setdefault((op, dtype), {})[key] = why
            self.accepted_vs_fp64 |= set(ACCEPTED_VS_FP64[accepted_before:])
        return self._failures.get((name, dtype), {})


def summarize(run: BatchedRun, cases: Sequence[tuple[Any, torch.dtype]], known: Callable[[str, torch.dtype], Any],
              uncheckable: dict[str, str]) -> str:
    """One line: (op, dtype) cases and samples run, passed, xfailed, failed (from what has run so far)."""
    ran = [(op_id(info), dtype) for info, dtype in cases
           if (op_id(info), dtype) in run.cases_run or op_id(info) in uncheckable]
    failed = {c for c in ran if run._failures.get(c)}
    xfailed = {c for c in ran if c[0] in uncheckable or (c in failed and known(*c))}
    samples = sum(run.cases_run.get(c, 0) for c in ran)
    bad_samples = sum(len(run._failures.get(c, {})) for c in ran)
    ops = {name for name, _ in ran}
    ops_ok = {name for name in ops if not any(c[0] == name and c in failed | xfailed for c in ran)}
    return (f"{len(ops)} ops ({len(ops_ok)} pass in every dtype), {len(ran)} (op, dtype) cases: "
            f"{len(ran) - len(failed | xfailed)} passed, {len(xfailed)} xfailed, {len(failed - xfailed)} failed; "
            f"{samples} samples, {samples - bad_samples} passed "
            f"({len(run.accepted_vs_fp64)} of them through the fp64 no-worse-than-eager rule)")


def check_op(run: BatchedRun, info: Any, dtype: torch.dtype, known: str | None) -> None:
    """The pytest verdict for one (op, dtype): pass, xfail with `known`, or fail listing the samples."""
    import pytest
    failures = run.failures(info, dtype)
    if failures and known:
        pytest.xfail(known)
    if known:
        pytest.fail(f"passes now: remove {op_id(info)} from KNOWN_FAILURES ({known})")
    assert not failures, "\n".join(f"{key}: {why}" for key, why in failures.items())


# ops whose output is not a function of the inputs: not compiled at all
UNCHECKABLE = {
    "empty": "uninitialized memory: nothing to compare",
    "empty_like": "uninitialized memory: nothing to compare",
}


class BackendSuite:
    """The OpInfo ops with a decomposition through one compile path (C++ or Triton), float32 and
    bfloat16: the parametrized cases, each one's verdict, and the summary line.

        SUITE = BackendSuite(samples_per_op=4, ops_per_batch=16, options={})
        @pytest.mark.parametrize("case", SUITE.cases, ids=SUITE.ids)
        def test_opinfo_cpp(case): SUITE.check(case)
    """

    # EMBER_OPINFO_DTYPES=float64,int64,... checks other dtypes (local runs; CI: these two)
    DTYPES = tuple(getattr(torch, name) for name in os.environ.get("EMBER_OPINFO_DTYPES", "float32,bfloat16").split(","))

    def __init__(self, samples_per_op: int, ops_per_batch: int, options: dict, device: str = "cpu",
                 known_failures: dict[tuple[str, torch.dtype | None], str] | None = None):
        import opinfo_util
        self.known_failures = dict(known_failures or {})     # (op id, dtype or None for all) -> why
        self.run = BatchedRun(opinfo_util.decomposed_opinfos(), samples_per_op, ops_per_batch, options=options,
                              skip=lambda name, dtype: name in UNCHECKABLE, device=device)
        self.cases = [(info, dtype) for info, _ in self.run.opinfos for dtype in self.DTYPES
                      if dtype in info.supported_dtypes(device)]
        self.ids = [f"{op_id(info)}-{str(dtype)[6:]}" for info, dtype in self.cases]

    def known_failure(self, name: str, dtype: torch.dtype) -> str | None:
        return self.known_failures.get((name, dtype)) or self.known_failures.get((name, None))

    def check(self, case: tuple[Any, torch.dtype]) -> None:
        import pytest
        info, dtype = case
        name = op_id(info)
        if name in UNCHECKABLE:
            pytest.xfail(UNCHECKABLE[name])
        check_op(self.run, info, dtype, self.known_failure(name, dtype))

    def summary(self) -> str:
        return summarize(self.run, self.cases, self.known_failure, UNCHECKABLE)
