"""What the generated wrapper hands back: a gradient that is its buffer as allocated is returned
as that buffer (an identity ``as_strided`` per gradient cost 2-3 us of host time each, 8 of them
in a 4-layer MLP's backward), a weight read transposed by a matmul is ``w.t()``, and two outputs
made from one buffer stay two objects sharing storage, as eager's are.  Values, gradients, strides
and aliasing are compared with eager's."""
from __future__ import annotations

import copy

import torch
from recording import compile_keeping
from torch import nn

import ember


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


def test_mlp_gradients_are_returned_as_allocated():
    model = _mlp()
    compiled_model = copy.deepcopy(model)
    compiled, graphs = compile_keeping(compiled_model, {"fallback": "error"})
    x = torch.randn(4, 16)
    for step in range(2):
        compiled(x).square().sum().backward()
        model(x).square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=f"step {step}: {name}")
            assert q.grad.stride() == p.grad.stride(), name
    [graph] = graphs
    backward = graph.call.backward_compiled.source
    returned = [line for line in backward.splitlines() if line.strip().startswith("return")]
    assert returned and "as_strided" not in returned[0], returned
    wrapper = graph.source.split("# ---- kernels")[0]
    assert ".t()" in wrapper and "weight.as_strided" not in wrapper, wrapper


def test_two_outputs_of_one_buffer_stay_two_objects():
    def fn(x, w):
        y = x @ w
        return y.view(y.shape), y.reshape(y.shape)

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    compiled = ember.compile(fn, options={"fallback": "error"})
    for first, second in (fn(x, w), compiled(x, w)):
        assert first is not second
        assert first.data_ptr() == second.data_ptr()
    a, b = compiled(x, w)
    torch.testing.assert_close(a, fn(x, w)[0])
    a.add_(1)
    torch.testing.assert_close(b, a)    # one storage, as eager's


def test_transposed_weight_that_starts_inside_its_storage():
    """Weights that are slices of one bigger tensor (storage offsets 0, 64, 128): ``.t()`` keeps
    the offset as the as_strided form did; values and gradients equal eager's."""
    def fn(x, w):
        return torch.nn.functional.linear(x, w).relu()

    compiled, graphs = compile_keeping(fn, {"fallback": "error"})
    for i in range(3):
        big = torch.randn(3, 8, 8)
        x = torch.randn(4, 8)
        leaf_c, leaf_e = big.clone().requires_grad_(), big.clone().requires_grad_()
        out_c, out_e = compiled(x, leaf_c[i]), fn(x, leaf_e[i])
        torch.testing.assert_close(out_c, out_e)
        out_c.sum().backward()
        out_e.sum().backward()
        torch.testing.assert_close(leaf_c.grad, leaf_e.grad)
    assert any(".t()" in g.source for g in graphs), [g.source for g in graphs]
