"""Shared checks of the test_breadth_* files: one graph, no break, outputs (and gradients) as eager."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

import ember


def assert_same(actual: Any, expected: Any, path: str = "out") -> None:
    """Tensors close, everything else equal, through tuples, lists, dicts, dataclasses and HF ModelOutputs."""
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, msg=path)
        assert actual.requires_grad == expected.requires_grad, path
    elif isinstance(expected, dict):  # ModelOutput is an OrderedDict
        assert list(actual.keys()) == list(expected.keys()), path
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same(getattr(actual, field.name), getattr(expected, field.name), f"{path}.{field.name}")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_one_graph(fn: Any, *args: Any, **kwargs: Any) -> None:
    report = ember.explain(fn, *args, **kwargs)
    assert report.break_count == 0, [str(b) for b in report.graph_breaks]
    assert report.graph_count == 1


def check(fn: Any, *calls: tuple, kwargs: dict | None = None) -> Any:
    """fn captures as one graph; each call's outputs equal eager's (ember.compile, fullgraph)."""
    kwargs = kwargs or {}
    assert_one_graph(fn, *calls[0], **kwargs)
    compiled = ember.compile(fn, fullgraph=True)
    for args in calls:
        assert_same(compiled(*args, **kwargs), fn(*args, **kwargs))
    return compiled


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


def check_module_training(module: torch.nn.Module, *calls: tuple, kwargs: dict | None = None) -> None:
    """A module in the mode it is in: one graph; outputs, parameter gradients and input gradients
    (inputs that require grad) equal eager's on an identical copy."""
    kwargs = kwargs or {}
    twin = copy.deepcopy(module)
    assert_one_graph(module, *calls[0], **kwargs)
    compiled = ember.compile(module, fullgraph=True)
    for args in calls:
        inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        twin_inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        module.zero_grad()
        twin.zero_grad()
        actual = compiled(*inputs, **kwargs)
        expected = twin(*twin_inputs, **kwargs)
        assert_same(actual, expected)
        sum(t.float().pow(2).sum() for t in _tensors(actual) if t.requires_grad).backward()
        sum(t.float().pow(2).sum() for t in _tensors(expected) if t.requires_grad).backward()
        for (name, p), (_, q) in zip(module.named_parameters(), twin.named_parameters()):
            if q.grad is None:
                assert p.grad is None, name
            else:
                # fp32 sums over the batch in another order: an error relative to the gradient's scale
                scale = max(1.0, q.grad.abs().max().item())
                torch.testing.assert_close(p.grad, q.grad, msg=name, rtol=1e-4, atol=1e-4 * scale)
        for a, b in zip(inputs, twin_inputs):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
