"""bf16/fp16 matrix products on CPUs without native low-precision dot products are computed in
float32 and rounded once (codegen/cpp_externs.py): results equal eager's up to the order of the
float32 additions, small products keep eager's kernel, CPUs with native support keep it too."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import ember
from ember.codegen import cpp, cpp_externs


@pytest.fixture
def extern_names(monkeypatch) -> list[str]:
    """Names of the Extern functions of every CPU compile, after the policy ran."""
    names: list[str] = []
    apply = cpp_externs.apply_matmul_policy

    def recording(sched):
        apply(sched)
        names.extend(getattr(step.node.fn, "__name__", "?") for step in sched.externs)
    monkeypatch.setattr(cpp, "apply_matmul_policy", recording)
    return names


def no_native_low_precision(monkeypatch) -> None:
    monkeypatch.setattr(cpp_externs, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))


def assert_close_bf16(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    # one bf16 ulp where the float32 sums round differently (the additions' order)
    torch.testing.assert_close(actual.float(), expected.float(), rtol=8e-3, atol=1e-2)


PRODUCTS = {
    "linear": (lambda x, w, b: F.gelu(F.linear(x, w, b)), lambda dt: (torch.randn(4, 64, 96, dtype=dt),
                                                                      torch.randn(80, 96, dtype=dt),
                                                                      torch.randn(80, dtype=dt))),
    "mm": (lambda a, b: torch.relu(a @ b), lambda dt: (torch.randn(256, 64, dtype=dt), torch.randn(64, 48, dtype=dt))),
    "bmm": (lambda a, b: torch.bmm(a, b).sin(), lambda dt: (torch.randn(3, 128, 32, dtype=dt),
                                                            torch.randn(3, 32, 40, dtype=dt))),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0).exp(),
              lambda dt: (torch.randn(40, dtype=dt), torch.randn(200, 24, dtype=dt), torch.randn(24, 40, dtype=dt))),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_large_products_in_float32(monkeypatch, extern_names, product, dtype):
    no_native_low_precision(monkeypatch)
    fn, make = PRODUCTS[product]
    torch.manual_seed(0)
    inputs = make(dtype)
    with torch.no_grad():
        actual = ember.compile(fn)(*inputs)
    assert_close_bf16(actual, fn(*inputs))
    assert any(name.endswith("_in_float32") for name in extern_names), extern_names


def test_small_products_keep_eager_kernel(monkeypatch, extern_names):
    no_native_low_precision(monkeypatch)
    fn = lambda x, w: F.relu(F.linear(x, w))
    x, w = torch.randn(1, 8, 96, dtype=torch.bfloat16), torch.randn(80, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(x, w), fn(x, w))
    assert extern_names and not any(name.endswith("_in_float32") for name in extern_names)


def test_native_bf16_keeps_eager_kernel(monkeypatch, extern_names):
    monkeypatch.setattr(cpp_externs, "_cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    fn, make = PRODUCTS["mm"]
    inputs = make(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(*inputs), fn(*inputs))
    assert extern_names and not any(name.endswith("_in_float32") for name in extern_names)


def test_float32_products_untouched(monkeypatch, extern_names):
    no_native_low_precision(monkeypatch)
    fn, make = PRODUCTS["mm"]
    inputs = make(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(*inputs), fn(*inputs))
    assert extern_names and not any(name.endswith("_in_float32") for name in extern_names)


def test_training_step_bf16(monkeypatch):
    """The backward's products (grad @ weight, grad^T @ x) go through the policy too."""
    no_native_low_precision(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).bfloat16()
    reference = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).bfloat16()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(256, 64, dtype=torch.bfloat16)
    ember.compile(model)(x).float().square().sum().backward()
    reference(x).float().square().sum().backward()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad.float(), theirs.grad.float(), rtol=2e-2, atol=2e-2)
