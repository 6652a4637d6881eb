"""Gradients of every OpInfo op that eager differentiates, compiled vs eager (float32, CPU).

For each op with ``supports_autograd`` and float32 backward support, its first SAMPLES_PER_OP samples
(``requires_grad=True``) are called in a graph whose inputs are the sample's tensors, compiled by
``ember.backend.compile_graph``; then the outputs and ``torch.autograd.grad`` of
``sum(floating output * fixed random weight)`` w.r.t. every input that requires grad are compared
with eager's.  A g++ build costs far more than one op, so the samples of OPS_PER_BATCH ops form ONE
graph (independent calls; their gradients do not mix); a batch that raises is bisected to the case
at fault, and a batch that compiles to an eager graph is bisected to find which cases run eagerly.

Verdicts: a wrong value, or an error that eager does not raise, fails.  A graph that cannot be
compiled (CompileError: the plain "ember" backend would run it eagerly) or that compiles to an
eager graph is counted, not failed: the share of cases that ran compiled is printed by
``test_opinfo_grad_summary`` and written to SUMMARY_PATH.  A float mismatch beyond rtol 1e-4 /
atol 1e-5 passes only when ember's gradient is no further than eager's from a float64 reference.

EMBER_OPINFO_GRAD_OPS=all runs every op (the default, for CI); a number N runs the first N ops
(quick local runs).  Runtime (2 shared cores, fresh kernel cache): about 2 minutes for all
540 ops / ~1000 cases, so it runs in CI without a slow mark.
"""
from __future__ import annotations

import json
import os
import sys
import time
import zlib
from collections import Counter
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from opinfo_batch import _call, _placeholder_maker, _tensors_of, op_id  # noqa: E402

from ember.graph import Graph, TensorMeta  # noqa: E402

SAMPLES_PER_OP = 2
# EMBER_OPINFO_GRAD_SAMPLES=start:stop checks the usable samples start..stop-1 of each op instead
# (longer local runs over the samples CI does not reach, e.g. 2:12)
SAMPLE_WINDOW = tuple(int(n) for n in os.environ.get("EMBER_OPINFO_GRAD_SAMPLES", f"0:{SAMPLES_PER_OP}").split(":"))
OPS_PER_BATCH = 16
RTOL, ATOL = 1e-4, 1e-5
SUMMARY_PATH = os.environ.get("EMBER_OPINFO_GRAD_SUMMARY", "/tmp/ember_opinfo_grad_summary.json")
# EMBER_OPINFO_GRAD_LAYOUT=permuted gives every 2-D+ input the same values in another memory layout
# (transposed in memory; 4-D channels-last) for a local run over layouts CI does not check
LAYOUT = os.environ.get("EMBER_OPINFO_GRAD_LAYOUT", "")

# (op id) -> why it fails today (xfail; a pass then fails, so that the entry is removed)
KNOWN_FAILURES: dict[str, str] = {
}


def _clone_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


class GradCase:
    """One (op, sample): its tensors, weights for the loss, and eager's outputs and gradients."""

    def __init__(self, info: Any, index: int, sample: Any, tensors: list[torch.Tensor]) -> None:
        self.info, self.op_id, self.index, self.sample = info, op_id(info), index, sample
        self.tensors = [_clone_leaf(t) for t in tensors]        # pristine leaves
        gen = torch.Generator().manual_seed(zlib.crc32(self.key.encode()))
        self.weights = [torch.rand(o.shape, generator=gen) + 0.5 if _differentiable(o) else None
                        for o in self.run(self.tensors_copy())]
        tensors = self.tensors_copy()
        outputs = self.run(tensors)
        self.returns_sequence = isinstance(_call(info.op, sample, self.tensors_copy()), (tuple, list))
        self.outputs = [_detach(o) for o in outputs]
        self.requires_grad = [isinstance(o, torch.Tensor) and o.requires_grad for o in outputs]
        self.output_metas = [TensorMeta.of(o) if isinstance(o, torch.Tensor) else None for o in outputs]
        self.grads = gradients(outputs, self.weights, tensors)

    @property
    def key(self) -> str:
        return f"{self.op_id}#{self.index}"

    def tensors_copy(self) -> list[torch.Tensor]:
        return [_clone_leaf(t) for t in self.tensors]

    def run(self, tensors: list[torch.Tensor]) -> list[Any]:
        result = _call(self.info.op, self.sample, tensors)
        return list(result) if isinstance(result, (tuple, list)) else [result]


def _differentiable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point()


def _detach(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def weighted_loss(outputs: list[Any], weights: list[torch.Tensor | None]) -> torch.Tensor | None:
    total = None
    for out, weight in zip(outputs, weights):
        if weight is not None and _differentiable(out):
            term = (out * weight).sum()
            total = term if total is None else total + term
    return total


def gradients(outputs: list[Any], weights: list, tensors: list[torch.Tensor]) -> list[torch.Tensor | None]:
    wrt = [t for t in tensors if t.requires_grad]
    loss = weighted_loss(outputs, weights)
    if loss is None or not wrt:
        return [None] * len(wrt)
    return list(torch.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True))


# ------------------------------------------------------------------ collecting cases
def _outputs_of(info: Any, sample: Any, tensors: list[torch.Tensor], seed: int) -> list[Any] | None:
    torch.manual_seed(seed)
    try:
        result = _call(info.op, sample, [_clone_leaf(t) for t in tensors])
    except Exception:  # noqa: BLE001 - samples eager rejects are not ours to check
        return None
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _skip_reason(outputs: list[Any], again: list[Any] | None) -> str | None:
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        return "returns non-tensors"
    if any(o.is_complex() for o in outputs):
        return "complex output"
    if not any(_differentiable(o) for o in outputs):
        return "no differentiable output"
    if again is None or any(not _identical(a, b) for a, b in zip(outputs, again)):
        return "random output (differs between seeds)"
    return None


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def collect_op_cases(info: Any) -> tuple[list[GradCase], str | None]:
    """The usable samples SAMPLE_WINDOW of `info` (the first SAMPLES_PER_OP), or ([], why none)."""
    cases: list[GradCase] = []
    why = "no sample eager accepts"
    torch.manual_seed(0)
    start, stop = SAMPLE_WINDOW
    usable = 0
    for sample in info.sample_inputs("cpu", torch.float32, requires_grad=True):
        if usable == stop:
            break
        tensors = _tensors_of(sample)
        if not any(t.requires_grad for t in tensors) or any(t.layout != torch.strided for t in tensors):
            continue            # nothing to differentiate, or sparse (not a dense graph input)
        if LAYOUT == "permuted":
            tensors = [_permuted(t) for t in tensors]
        outputs = _outputs_of(info, sample, tensors, seed=0)
        if outputs is None:
            continue
        why = _skip_reason(outputs, _outputs_of(info, sample, tensors, seed=1))
        if why is not None:
            if why.startswith("random") or why == "complex output":
                return [], why
            continue
        try:
            case = GradCase(info, len(cases), sample, tensors)
        except Exception as exc:  # noqa: BLE001 - eager's backward rejects the sample
            why = f"eager backward raises {type(exc).__name__}"
            continue
        usable += 1
        if usable > start:
            cases.append(case)
    return cases, (None if cases else why)


def _permuted(t: torch.Tensor) -> torch.Tensor:
    """The same values, transposed in memory (4-D: channels-last), a leaf as ``t`` was."""
    if t.ndim < 2:
        return t
    copy = t.detach()
    copy = copy.contiguous(memory_format=torch.channels_last) if t.ndim == 4 else \
        copy.transpose(-1, -2).contiguous().transpose(-1, -2)
    return copy.requires_grad_(t.requires_grad)


def grad_opinfos() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db
    found = [info for info in op_db
             if info.supports_autograd and torch.float32 in info.supported_backward_dtypes("cpu")]
    limit = os.environ.get("EMBER_OPINFO_GRAD_OPS", "all")
    return found if limit == "all" else found[:int(limit)]


# ------------------------------------------------------------------ batched compile and compare
def batched_graph(cases: list[GradCase]) -> tuple[Graph, list[torch.Tensor], list[slice], list[slice]]:
    """One graph calling every case's op on its own placeholders.  Returns the graph, its input
    leaves, and per case the slice of the graph outputs and of the inputs that are its own."""
    g = Graph()
    inputs: list[torch.Tensor] = []
    outputs: list[Any] = []
    out_slices, in_slices = [], []
    import operator
    for k, case in enumerate(cases):
        first_input = len(inputs)
        lift = _placeholder_maker(g, inputs, case.tensors_copy(), f"c{k}_t")
        args = _tree_map(lift, (case.sample.input,) + tuple(case.sample.args))
        kwargs = _tree_map(lift, dict(case.sample.kwargs))
        out = g.call(case.info.op, args, kwargs)
        start = len(outputs)
        if not case.returns_sequence:
            outputs.append(out)
        else:
            outputs.extend(g.call(operator.getitem, (out, i)) for i in range(len(case.weights)))
        # metas as capture records them: they say whether eager's outputs require grad
        out.meta = tuple(case.output_metas) if case.returns_sequence else case.output_metas[0]
        for node, meta in zip(outputs[start:], case.output_metas):
            node.meta = meta
        out_slices.append(slice(start, len(outputs)))
        in_slices.append(slice(first_input, len(inputs)))
    g.output(tuple(outputs))
    return g, inputs, out_slices, in_slices


def _tree_map(fn: Any, value: Any) -> Any:
    from ember.graph import tree_map
    return tree_map(fn, value)


class Outcome:
    """What happened to each case: kind ("autograd", "kernels", "eager", "compile_error"), and a
    failure message where the values (or eager's behaviour) differ."""

    def __init__(self) -> None:
        self.kind: dict[str, str] = {}
        self.reason: dict[str, str] = {}         # why a case ran eagerly / did not compile
        self.failures: dict[str, str] = {}
        self.accepted_vs_fp64: set[str] = set()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {' | '.join(text[:3])[:400]}"


def run_batch(cases: list[GradCase], outcome: Outcome) -> None:
    """Compile the cases as one graph, run forward and backward, compare; bisect on errors and on
    eager graphs (to find the cases that make it eager)."""
    from ember.backend import compile_graph
    from ember.errors import CompileError
    if not cases:
        return
    graph, inputs, out_slices, in_slices = batched_graph(cases)

    def split() -> None:
        half = len(cases) // 2
        run_batch(cases[:half], outcome)
        run_batch(cases[half:], outcome)

    try:
        compiled = compile_graph(graph, [_clone_leaf(t) for t in inputs], {"fallback": "error"})
    except CompileError as exc:
        if len(cases) > 1:
            return split()
        outcome.kind[cases[0].key] = "compile_error"
        outcome.reason[cases[0].key] = _describe(exc)
        return
    kind = getattr(compiled, "kind", "eager")
    if kind == "eager" and len(cases) > 1:
        return split()
    run_inputs = [_clone_leaf(t) for t in inputs]
    try:
        outputs = list(compiled(*run_inputs))
        losses = [weighted_loss(outputs[o], case.weights) for case, o in zip(cases, out_slices)]
        total = sum(loss for loss in losses if loss is not None)
        wrt = [t for t in run_inputs if t.requires_grad]
        grads = dict(zip(map(id, wrt), torch.autograd.grad(total, wrt, allow_unused=True, materialize_grads=True)))
    except Exception as exc:  # noqa: BLE001 - bisect to the case that raised
        if len(cases) > 1:
            return split()
        outcome.kind[cases[0].key] = kind
        outcome.failures[cases[0].key] = f"raised where eager does not: {_describe(exc)}"
        return
    for case, o, i in zip(cases, out_slices, in_slices):
        outcome.kind[case.key] = kind
        if kind == "eager":
            outcome.reason[case.key] = getattr(compiled, "eager_reason", "?")
        case_grads = [grads[id(t)] for t in run_inputs[i] if t.requires_grad]
        why = compare_case(case, outputs[o], case_grads, outcome)
        if why is not None:
            outcome.failures[case.key] = why


def compare_case(case: GradCase, outputs: list[Any], grads: list[torch.Tensor], outcome: Outcome) -> str | None:
    if len(outputs) != len(case.outputs):
        return f"{len(outputs)} outputs, eager has {len(case.outputs)}"
    for i, (a, e) in enumerate(zip(outputs, case.outputs)):
        why = _mismatch(a, e, f"output {i}")
        if why is not None:
            return why
        if isinstance(a, torch.Tensor) and a.requires_grad != case.requires_grad[i]:
            return f"output {i}: requires_grad={a.requires_grad}, eager {case.requires_grad[i]}"
    reference = None
    for j, (a, e) in enumerate(zip(grads, case.grads)):
        why = _mismatch(a, e, f"grad of input {j}")
        if why is None:
            continue
        reference = reference or fp64_gradients(case)
        if reference is not None and _no_worse_than_eager(a, e, reference[j]):
            outcome.accepted_vs_fp64.add(case.key)
            continue
        return why
    return None


def _mismatch(actual: Any, expected: Any, what: str) -> str | None:
    if not isinstance(expected, torch.Tensor):
        return None if actual == expected else f"{what}: {actual!r} != {expected!r}"
    if not isinstance(actual, torch.Tensor):
        return f"{what}: expected a tensor, got {type(actual).__name__}"
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return f"{what}: {actual.dtype}{list(actual.shape)}, eager {expected.dtype}{list(expected.shape)}"
    try:
        torch.testing.assert_close(actual.detach(), expected, rtol=RTOL, atol=ATOL, equal_nan=True,
                                   check_stride=False)
    except AssertionError as exc:
        return f"{what}: " + " ".join(str(exc).split("\n")[:4])
    return None


def fp64_gradients(case: GradCase) -> list[torch.Tensor] | None:
    """Eager's gradients with the floating inputs (and weights) in float64."""
    tensors = [t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t.detach().clone()
               for t in case.tensors]
    try:
        outputs = case.run(tensors)
        weights = [w.double() if w is not None else None for w in case.weights]
        return [g.float() for g in gradients(outputs, weights, tensors)]
    except Exception:  # noqa: BLE001
        return None


def _no_worse_than_eager(actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor) -> bool:
    """ember's max error vs the float64 reference is at most eager's (or within tolerance)."""
    def score(value: torch.Tensor) -> float:
        diff = (value.double() - reference.double()).abs() / (ATOL + RTOL * reference.double().abs())
        if (value.isnan() != reference.isnan()).any():
            return float("inf")
        diff = torch.where(reference.isfinite() & value.isfinite(), diff, torch.zeros_like(diff))
        return float(diff.max()) if diff.numel() else 0.0
    return score(actual) <= max(score(expected), 1.0)


# ------------------------------------------------------------------ the suite
class GradSuite:
    """Lazily runs batches of OPS_PER_BATCH ops the first time a test asks about one of them."""

    def __init__(self) -> None:
        self.opinfos = grad_opinfos()
        names = Counter(op_id(info) for info in self.opinfos)
        self.ids = [op_id(info) + (f"@{i}" if names[op_id(info)] > 1 else "") for i, info in enumerate(self.opinfos)]
        self.skipped: dict[str, str] = {}
        self.cases: dict[str, list[GradCase]] = {}
        self.outcome = Outcome()
        self._done: set[int] = set()
        self.seconds = 0.0

    def check(self, index: int) -> None:
        info = self.opinfos[index]
        name = self.ids[index]
        batch = index // OPS_PER_BATCH
        if batch not in self._done:
            self._done.add(batch)
            self._run_batch(batch)
        if name in self.skipped:
            pytest.skip(self.skipped[name])
        failures = {c.key: self.outcome.failures[c.key] for c in self.cases[name] if c.key in self.outcome.failures}
        known = KNOWN_FAILURES.get(op_id(info))
        if failures and known:
            pytest.xfail(known)
        if known:
            pytest.fail(f"passes now: remove {op_id(info)} from KNOWN_FAILURES ({known})")
        assert not failures, "\n".join(f"{key}: {why}" for key, why in failures.items())

    def _run_batch(self, batch: int) -> None:
        start = time.perf_counter()
        indices = range(batch * OPS_PER_BATCH, min((batch + 1) * OPS_PER_BATCH, len(self.opinfos)))
        batch_cases: list[GradCase] = []
        for i in indices:
            cases, why = collect_op_cases(self.opinfos[i])
            self.cases[self.ids[i]] = cases
            if why is not None:
                self.skipped[self.ids[i]] = why
            batch_cases.extend(cases)
        with torch.enable_grad():
            run_batch(batch_cases, self.outcome)
        self.seconds += time.perf_counter() - start

    def summary(self) -> dict[str, Any]:
        kinds = Counter(self.outcome.kind.values())
        total = sum(kinds.values())
        compiled = kinds.get("autograd", 0) + kinds.get("kernels", 0)
        eager_reasons = Counter(r.split(":")[0][:80] for r in self.outcome.reason.values())
        return {
            "ops_run": len(self.cases), "ops_skipped": len(self.skipped),
            "cases": total, "kinds": dict(kinds),
            "compiled_share": round(compiled / total, 4) if total else 0.0,
            "failures": len(self.outcome.failures),
            "accepted_vs_fp64": sorted(self.outcome.accepted_vs_fp64),
            "eager_or_error_cases": {k: self.outcome.reason.get(k, "?") for k, v in self.outcome.kind.items()
                                     if v in ("eager", "compile_error")},
            "eager_reasons": dict(eager_reasons.most_common(20)),
            "skipped": dict(self.skipped),
            "seconds_in_batches": round(self.seconds, 1),
        }


SUITE = GradSuite()


@pytest.mark.parametrize("index", range(len(SUITE.opinfos)), ids=SUITE.ids)
def test_opinfo_grad(index: int) -> None:
    SUITE.check(index)


def test_opinfo_grad_summary() -> None:
    """Prints and writes the share of cases that ran compiled (run after the parametrized tests)."""
    summary = SUITE.summary()
    with open(SUMMARY_PATH, "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print(f"\nOpInfo gradients: {summary['ops_run']} ops, {summary['ops_skipped']} skipped, "
          f"{summary['cases']} cases, kinds {summary['kinds']}, compiled share {summary['compiled_share']:.1%}, "
          f"{summary['failures']} value failures, {len(summary['accepted_vs_fp64'])} accepted vs fp64; "
          f"{summary['seconds_in_batches']} s in batches; details in {SUMMARY_PATH}")
