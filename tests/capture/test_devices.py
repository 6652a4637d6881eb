"""Device errors reach the user as eager raises them; device mixes eager allows still work."""
from __future__ import annotations

import pytest
import torch

import ember

HAS_CUDA = torch.cuda.is_available()
BACKENDS = ["eager", "ember"]


def _eager_error(fn, *args):
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 - the point is to compare whatever eager raises
        return error
    return None


def add_cuda_ones(x):
    return x + torch.ones(3, device="cuda")


def to_cuda(x):
    return x.cuda() * 2


def to_cuda_string(x):
    return x.to("cuda") + 1


def zeros_cuda_device(x):
    return torch.zeros(3, device=torch.device("cuda", 0)) + x


def new_on_cuda(x):
    return x.new_zeros(3, device="cuda")


def mixed_after_work(x):
    y = x.sin() * 2
    return y + torch.ones(3, device="cuda")


CUDA_CASES = [add_cuda_ones, to_cuda, to_cuda_string, zeros_cuda_device, new_on_cuda, mixed_after_work]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", CUDA_CASES, ids=[f.__name__ for f in CUDA_CASES])
def test_cuda_use_raises_like_eager(fn, backend):
    x = torch.randn(3)
    expected = _eager_error(fn, x)
    compiled = ember.compile(fn, backend=backend)
    if expected is None:  # a CUDA machine: the op is legal there
        torch.testing.assert_close(compiled(x), fn(x))
        return
    for _ in range(2):  # the capture call and a cached call
        with pytest.raises(type(expected)) as info:
            compiled(x)
        assert str(info.value) == str(expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_use_raises_like_eager_with_fullgraph(backend):
    x = torch.randn(3)
    expected = _eager_error(add_cuda_ones, x)
    if expected is None:
        pytest.skip("CUDA available: no error")
    with pytest.raises(type(expected)) as info:
        ember.compile(add_cuda_ones, backend=backend, fullgraph=True)(x)
    assert str(info.value) == str(expected)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_making_tensors_on_another_device(backend):
    """CPU inputs, CUDA results (and back): each tensor on eager's device."""
    def f(x):
        y = x.new_zeros(3, device="cuda") + torch.ones(3, device="cuda")
        return y, (y * 2).cpu() + x, torch.arange(3, device="cuda")
    x = torch.randn(3)
    for e, a in zip(f(x), ember.compile(f, backend=backend)(x)):
        assert e.device == a.device
        torch.testing.assert_close(a, e)


def test_cpu_scalar_tensor_mixes_with_any_device():
    def f(x, s):
        return x * s + s
    x, s = torch.randn(3), torch.tensor(2.0)
    compiled = ember.compile(f)
    torch.testing.assert_close(compiled(x, s), f(x, s))
    assert not [e for e in compiled._ember_captured.events if e.break_reason]


def test_cpu_device_arguments_are_fine():
    def f(x):
        return x.to("cpu") + torch.ones(3, device="cpu") + x.cpu()
    x = torch.randn(3)
    compiled = ember.compile(f)
    torch.testing.assert_close(compiled(x), f(x))
    assert not [e for e in compiled._ember_captured.events if e.break_reason]


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("backend", BACKENDS)
def test_tensors_on_different_devices_raise_like_eager(backend):
    def f(x, y):
        return x + y
    x, y = torch.randn(3), torch.randn(3, device="cuda")
    expected = _eager_error(f, x, y)
    assert expected is not None
    with pytest.raises(type(expected)) as info:
        ember.compile(f, backend=backend)(x, y)
    assert str(info.value) == str(expected)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_index_with_cpu_indices_and_scalars():
    def f(x, i, s):
        return x[i] * s
    x, i, s = torch.randn(5, device="cuda"), torch.tensor([0, 3]), torch.tensor(3.0)
    torch.testing.assert_close(ember.compile(f)(x, i, s), f(x, i, s))


def test_default_device_is_guarded():
    def f(x):
        return torch.ones(3) + x.sum()
    x = torch.randn(3)
    compiled = ember.compile(f)
    assert compiled(x).device.type == "cpu"
    torch.set_default_device("meta")  # a device every machine has: factories now make meta tensors
    try:
        expected = f(x)
        assert expected.device.type == "meta"
        assert compiled(x).device.type == "meta"
    finally:
        torch.set_default_device(None)
    assert compiled(x).device.type == "cpu"
