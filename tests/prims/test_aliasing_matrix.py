"""Output aliasing, compiled (ember.compile, CPU C++ path) vs eager.

For each function, the aliasing signature of eager's outputs and of the compiled outputs must be
equal: for each output, which inputs and outputs it *is* (the same Python object), which it shares
memory with (untyped_storage data_ptr), and, when it shares memory, its shape, strides and storage
offset.  Values are compared too.  Two calls with different inputs.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember

F = torch.nn.functional


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def signature(outputs: Any, inputs: list[torch.Tensor]) -> list[Any]:
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    result = []
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            result.append(("value", out))
            continue
        is_input = [k for k, x in enumerate(inputs) if out is x]
        is_output = [j for j, other in enumerate(outputs) if other is out and j != i]
        shares_input = [k for k, x in enumerate(inputs) if _storage(out) == _storage(x)]
        shares_output = [j for j, other in enumerate(outputs)
                         if j != i and isinstance(other, torch.Tensor) and _storage(other) == _storage(out)]
        shared = bool(shares_input or shares_output)
        layout = (tuple(out.shape), tuple(out.stride()), out.storage_offset()) if shared else tuple(out.shape)
        result.append((is_input, is_output, shares_input, shares_output, layout, out.dtype))
    return result


def _twice(x: torch.Tensor) -> tuple:
    y = x + 1
    return y, y


def _intermediate_and_view(x: torch.Tensor) -> tuple:
    y = x + 1
    return y, y.view(-1)


def _views_of_hidden_intermediate(x: torch.Tensor) -> tuple:
    y = x * 2
    return y.t(), y[1], y.diagonal()


def _view_then_mutate(x: torch.Tensor) -> tuple:
    y = x * 2
    v = y[0]
    y.mul_(3)
    return v, y[1:]


def _mutated_intermediate_and_view(x: torch.Tensor) -> tuple:
    y = x * 2
    y.add_(1)
    return y, y[0]


def _inplace_returns_input(x: torch.Tensor) -> torch.Tensor:
    return x.add_(1)


def _relu_inplace_input(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x, inplace=True)


def _silu_inplace_intermediate(x: torch.Tensor) -> tuple:
    y = x * 2
    return F.silu(y, inplace=True), y


def _split_intermediate(x: torch.Tensor) -> tuple:
    return (x + 1).split(2)


def _contiguous_twice(x: torch.Tensor) -> tuple:
    y = x + 1
    return y, y.contiguous(), y.to(y.dtype)


def _input_and_view_of_it(x: torch.Tensor) -> tuple:
    return x.view(-1), x, x[1:]


def _mutated_input_and_views(x: torch.Tensor) -> tuple:
    x.mul_(2)
    return x, x.t(), x.diagonal()


def _same_view_of_intermediate_twice(x: torch.Tensor) -> tuple:
    # fuzz seed 4416: eager's contiguous() of a contiguous view IS the view; it came back as None
    v = x.any(1, keepdim=True).mT
    return v.contiguous(), v


def _mutated_view_returned_twice(x: torch.Tensor) -> tuple:
    # fuzz seed 20247: the same view of an intermediate, written in place, returned twice
    v = (x * 1)[0].mul_(2)
    return v.float(), x * 1, v


def _same_view_of_input_twice(x: torch.Tensor) -> tuple:
    # fuzz seed 1153: type_as to the same dtype returns the view itself, not a second view
    v = x.transpose(0, 1)
    return v.type_as(x), v


def _type_as_noop_split(x: torch.Tensor) -> tuple:
    # fuzz seed 3739: split(2, 1)[-1] of a size-2 dim is a no-op view; x.type_as(it) is x itself
    v = x.split(2, 1)[-1]
    return x.type_as(v), v.type_as(x)


# name -> (function, input shapes)
def _with_clone(result):
    return result, result.clone()


def _matmul_clone_mutated(a, b):
    product = a @ b
    copy = product.clone()
    copy.add_(1)
    return product, copy


FUNCTIONS: dict[str, tuple[Callable, list[tuple[int, ...]]]] = {
    "identity": (lambda x: x, [(3, 4)]),
    "contiguous_of_contiguous": (lambda x: x.contiguous(), [(3, 4)]),
    "contiguous_of_transposed": (lambda x: x.t().contiguous(), [(3, 4)]),
    "to_same_dtype": (lambda x: x.to(x.dtype), [(3, 4)]),
    "to_float32": (lambda x: x.to(torch.float32), [(3, 4)]),
    "to_same_device": (lambda x: x.to(x.device), [(3, 4)]),
    "to_float64": (lambda x: x.to(torch.float64), [(3, 4)]),
    "to_copy": (lambda x: x.to(x.dtype, copy=True), [(3, 4)]),
    "float_of_float": (lambda x: x.float(), [(3, 4)]),
    "type_as_self": (lambda x: x.type_as(x), [(3, 4)]),
    "view_as_self": (lambda x: x.view_as(x), [(3, 4)]),
    "view": (lambda x: x.view(-1), [(3, 4)]),
    "reshape_view": (lambda x: x.reshape(-1), [(3, 4)]),
    "reshape_copy": (lambda x: x.t().reshape(-1), [(3, 4)]),
    "slice": (lambda x: x[1:], [(3, 4)]),
    "t": (lambda x: x.t(), [(3, 4)]),
    "t_of_1d": (lambda x: x.t(), [(4,)]),
    "flatten_of_1d": (lambda x: torch.flatten(x), [(4,)]),
    "squeeze_nothing": (lambda x: x.squeeze(), [(3, 4)]),
    "expand": (lambda x: x.expand(3, 4), [(1, 4)]),
    "detach": (lambda x: x.detach(), [(3, 4)]),
    "diagonal": (lambda x: x.diagonal(), [(3, 4)]),
    "unfold": (lambda x: x.unfold(1, 2, 1), [(3, 4)]),
    "as_strided": (lambda x: x.as_strided((2, 2), (1, 4), 1), [(3, 4)]),
    "unbind": (lambda x: x.unbind(0), [(3, 4)]),
    "split_input": (lambda x: x.split(2), [(5, 4)]),
    "dropout_eval": (lambda x: F.dropout(x, 0.5, training=False), [(3, 4)]),
    "atleast_1d": (lambda x: torch.atleast_1d(x), [(3, 4)]),
    "input_twice": (lambda x: (x, x), [(3, 4)]),
    "swap_inputs": (lambda a, b: (b, a), [(3, 4), (2,)]),
    "input_and_new": (lambda x: (x, x + 1), [(3, 4)]),
    "same_new_tensor_twice": (_twice, [(3, 4)]),
    "tuple_times_two": (lambda x: (x + 1,) * 2, [(3, 4)]),
    "intermediate_and_view": (_intermediate_and_view, [(3, 4)]),
    "views_of_hidden_intermediate": (_views_of_hidden_intermediate, [(3, 4)]),
    "view_then_mutate": (_view_then_mutate, [(3, 4)]),
    "mutated_intermediate_and_view": (_mutated_intermediate_and_view, [(3, 4)]),
    "inplace_returns_input": (_inplace_returns_input, [(3, 4)]),
    "relu_inplace_input": (_relu_inplace_input, [(3, 4)]),
    "silu_inplace_intermediate": (_silu_inplace_intermediate, [(3, 4)]),
    "split_intermediate": (_split_intermediate, [(5, 4)]),
    "contiguous_twice": (_contiguous_twice, [(3, 4)]),
    "input_and_view_of_it": (_input_and_view_of_it, [(3, 4)]),
    "mutated_input_and_views": (_mutated_input_and_views, [(4, 4)]),
    "same_view_of_intermediate_twice": (_same_view_of_intermediate_twice, [(3, 4, 8)]),
    "mutated_view_returned_twice": (_mutated_view_returned_twice, [(3,)]),
    "same_view_of_input_twice": (_same_view_of_input_twice, [(3, 4)]),
    "type_as_noop_split": (_type_as_noop_split, [(3, 2, 5)]),
    "chunk_of_empty_dim": (lambda x: x.chunk(2, 2), [(5, 4, 0)]),    # fuzz seed 622: 2 empty pieces
    "split_of_empty_dim": (lambda x: x.split(3, 2), [(5, 4, 0)]),
    "contiguous_of_empty": (lambda x: x.contiguous(), [(2, 0, 1)]),     # fuzz seed 100390: x itself
    # an Extern's fresh result and its clone are two buffers (fuzz seed 400527: the clone was the result)
    "matmul_and_its_clone": (lambda a, b: _with_clone(a @ b), [(3, 4), (4, 5)]),
    "dot_clone_first": (lambda a: _with_clone(torch.matmul(a, a))[::-1], [(3,)]),
    "bmm_and_its_clone": (lambda a, b: _with_clone(torch.bmm(a, b)), [(2, 3, 4), (2, 4, 5)]),
    "linear_and_its_clone": (lambda x, w, b: _with_clone(F.linear(x, w, b)), [(3, 4), (5, 4), (5,)]),
    "conv_and_its_clone": (lambda x, w: _with_clone(F.conv2d(x, w)), [(1, 2, 5, 5), (3, 2, 3, 3)]),
    "attention_and_its_clone": (lambda q, k, v: _with_clone(F.scaled_dot_product_attention(q, k, v)),
                                [(1, 2, 4, 8)] * 3),
    "matmul_clone_mutated": (_matmul_clone_mutated, [(3, 4), (4, 5)]),
}


def check_aliasing(fn: Callable, shapes: list[tuple[int, ...]], options: dict | None = None) -> None:
    # fallback="error": a graph that failed to compile would run eagerly and match trivially
    compiled = ember.compile(fn, options={"fallback": "error", **(options or {})})
    for call in range(2):
        inputs = [torch.randn(*s, generator=torch.Generator().manual_seed(10 * call + k)) for k, s in enumerate(shapes)]
        eager_inputs = [x.clone() for x in inputs]
        ember_inputs = [x.clone() for x in inputs]
        expected = fn(*eager_inputs)
        actual = compiled(*ember_inputs)
        assert signature(actual, ember_inputs) == signature(expected, eager_inputs), f"call {call}"
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(ember_inputs, eager_inputs)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_aliasing(name: str) -> None:
    fn, shapes = FUNCTIONS[name]
    check_aliasing(fn, shapes)


@pytest.mark.parametrize("name", ["contiguous_of_contiguous", "views_of_hidden_intermediate",
                                  "mutated_intermediate_and_view", "split_intermediate", "diagonal"])
def test_aliasing_triton(name: str) -> None:
    pytest.importorskip("triton")
    fn, shapes = FUNCTIONS[name]
    check_aliasing(fn, shapes, options={"cpu_backend": "triton"})


def _contiguous_after_transposed_write(x: torch.Tensor) -> tuple:
    x.t()[0].mul_(2)          # the update's value is computed transposed; x keeps its layout
    x[:, 1:3] += 1
    return x.contiguous(), x.view(-1)


def _views_after_broadcast_copy(x: torch.Tensor, row: torch.Tensor) -> tuple:
    x.copy_(row)              # the new value is an expanded row; x stays dense
    flat = x.view(-1)
    flat[0] = -5.0
    return x.contiguous(), flat


@pytest.mark.parametrize("fn", [_contiguous_after_transposed_write, _views_after_broadcast_copy],
                         ids=["contiguous_after_transposed_write", "views_after_broadcast_copy"])
def test_layout_survives_inplace_updates(fn: Callable) -> None:
    shapes = [(4, 4)] if fn is _contiguous_after_transposed_write else [(4, 4), (1, 4)]
    check_aliasing(fn, shapes)
    check_aliasing(fn, shapes, options=None)


def _flatten_of_diagonal_then_write(x: torch.Tensor) -> tuple:
    # fuzz seed 106062: flatten of a non-contiguous diagonal copies in eager; a write to it must
    # not reach the input (it did: the input was silently changed)
    v = x.diagonal().flatten()
    return (v[0].mul_(2),)


def _contiguous_of_transposed_after_update(x: torch.Tensor) -> tuple:
    # fuzz seed 103287: x.t() of a (1, 5) input with strides (1, 2) is not contiguous: a copy
    x.add_(x)
    return (x.transpose(-1, -2).contiguous(),)


@pytest.mark.parametrize("fn, make_input", [
    (_flatten_of_diagonal_then_write, lambda: torch.arange(48.0).view(2, 8, 3).transpose(1, 2)),
    (_contiguous_of_transposed_after_update, lambda: torch.arange(10.0).view(5, 2).t()[:1]),
], ids=["flatten_of_diagonal_then_write", "contiguous_of_transposed_after_update"])
def test_layout_of_strided_inputs(fn: Callable, make_input: Callable) -> None:
    compiled = ember.compile(fn, options={"fallback": "error"})
    for _ in range(2):
        eager_input, compiled_input = make_input(), make_input()
        expected, actual = fn(eager_input), compiled(compiled_input)
        assert signature(actual, [compiled_input]) == signature(expected, [eager_input])
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(compiled_input, eager_input)
