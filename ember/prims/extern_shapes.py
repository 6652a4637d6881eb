"""Output shapes of the common Externs when input sizes are symbolic (dynamic shapes).

An Extern's meta normally comes from running the torch op on meta-device tensors, which needs
plain ints: symbolic sizes would be specialised (guarded equal to their hints).  For the ops that
dynamic models run most (matmul family, linear, convolution, attention, embedding) a rule here
gives the output shape as expressions of the input sizes instead.  The op still runs once on
meta tensors of the hints: that checks the rule (its hint values must equal the meta run's
shape, else the rule is not used) and gives dtype and dim order of the output.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.graph import TensorMeta, dense_strides_like, is_dense, tree_leaves
from ember.symbolic import hint_of, is_symbolic

F = torch.nn.functional
Shape = tuple[Any, ...]


def _broadcast(a: Sequence[Any], b: Sequence[Any]) -> Shape:
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _matmul(a: TensorMeta, b: TensorMeta, *_: Any, **__: Any) -> Shape | None:
    if a.ndim == 0 or b.ndim == 0:
        return None
    if a.ndim == 1 and b.ndim == 1:
        return ()
    if a.ndim == 1:
        return tuple(b.shape[:-2]) + (b.shape[-1],)
    if b.ndim == 1:
        return tuple(a.shape[:-1])
    return _broadcast(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])


def _addmm(bias: TensorMeta, a: TensorMeta, b: TensorMeta, *_: Any, **__: Any) -> Shape:
    return tuple(a.shape[:-1]) + (b.shape[-1],)


def _linear(x: TensorMeta, weight: TensorMeta, *_: Any, **__: Any) -> Shape | None:
    if weight.ndim != 2:
        return None
    return tuple(x.shape[:-1]) + (weight.shape[0],)


def _attention(q: TensorMeta, k: TensorMeta, v: TensorMeta, *_: Any, **__: Any) -> Shape:
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _embedding(indices: TensorMeta, weight: TensorMeta, *_: Any, **__: Any) -> Shape:
    return tuple(indices.shape) + (weight.shape[1],)


def _conv(spatial: int) -> Callable[..., Shape | None]:
    def rule(x: TensorMeta, weight: TensorMeta, bias: Any = None, stride: Any = 1, padding: Any = 0,
             dilation: Any = 1, groups: int = 1) -> Shape | None:
        if isinstance(padding, str) or x.ndim != spatial + 2:
            return None
        stride, padding, dilation = (_per_dim(v, spatial) for v in (stride, padding, dilation))
        sizes = tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                      zip(x.shape[2:], weight.shape[2:], stride, padding, dilation))
        return (x.shape[0], weight.shape[0]) + sizes
    return rule


def _pool_size(size: Any, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> Any:
    """One spatial size of a max/avg pooling's output (ATen's pooling_output_shape)."""
    out = (size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:   # the last window must start inside the input
        out = out - 1
    return out


def _max_pool(spatial: int, with_indices: bool = False) -> Callable[..., Shape | list[Shape] | None]:
    def rule(x: TensorMeta, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
             ceil_mode: bool = False, return_indices: bool = False) -> Shape | list[Shape] | None:
        return _pooled(x, spatial, kernel_size, stride, padding, dilation, ceil_mode, return_indices or with_indices)
    return rule


def _avg_pool(spatial: int) -> Callable[..., Shape | None]:
    def rule(x: TensorMeta, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
             *_: Any, **__: Any) -> Shape | None:
        return _pooled(x, spatial, kernel_size, stride, padding, 1, ceil_mode, False)
    return rule


def _pooled(x: TensorMeta, spatial: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
            ceil_mode: bool, return_indices: bool) -> Shape | list[Shape] | None:
    if x.ndim not in (spatial + 1, spatial + 2):
        return None
    kernel = _per_dim(kernel_size, spatial)
    stride = kernel if stride is None or stride == () or stride == [] else _per_dim(stride, spatial)
    padding, dilation = _per_dim(padding, spatial), _per_dim(dilation, spatial)
    if not all(isinstance(v, int) for v in (*kernel, *stride, *padding, *dilation)):
        return None
    sizes = tuple(_pool_size(*args, bool(ceil_mode)) for args in
                  zip(x.shape[-spatial:], kernel, stride, padding, dilation))
    shape = tuple(x.shape[:-spatial]) + sizes
    return [shape, shape] if return_indices else shape     # the values and their indices


def _adaptive_pool(spatial: int) -> Callable[..., Shape | None]:
    def rule(x: TensorMeta, output_size: Any, return_indices: bool = False) -> Shape | None:
        if return_indices or x.ndim not in (spatial + 1, spatial + 2):
            return None
        wanted = _per_dim(output_size, spatial)
        sizes = tuple(size if want is None else want for size, want in zip(x.shape[-spatial:], wanted))
        return tuple(x.shape[:-spatial]) + sizes
    return rule


def _diff(x: TensorMeta, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Shape | None:
    """torch.diff: the dim grows by what is prepended and appended, and shrinks by n."""
    if x.ndim == 0 or not isinstance(n, int) or n < 0:
        return None
    dim = dim % x.ndim
    size = x.shape[dim]
    for extra in (prepend, append):
        if isinstance(extra, TensorMeta):
            if extra.ndim != x.ndim:
                return None
            size = size + extra.shape[dim]
        elif extra is not None:      # a Python number: one element
            size = size + 1
    return tuple(x.shape[:dim]) + (size - n if n > 0 else size,) + tuple(x.shape[dim + 1:])


def _pad(x: TensorMeta, pad: Sequence[Any], mode: str = "constant", value: Any = None) -> Shape | None:
    """F.pad with a reflect/replicate/circular mode: each padded dim grows by its two pads.  Eager
    raises unless every pad fits the size it reflects (or wraps) over; that is guarded, so a size
    too small for the pads recompiles (and raises as eager does) instead of failing in the kernel."""
    if mode == "constant" or len(pad) % 2 or len(pad) // 2 > x.ndim or \
            not all(isinstance(p, int) and p >= 0 for p in pad):
        return None
    shape = list(x.shape)
    for k in range(len(pad) // 2):
        dim = x.ndim - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        size = shape[dim]
        if mode == "reflect":
            fits = before < size and after < size
        elif mode == "circular":
            fits = before <= size and after <= size
        else:       # replicate
            fits = size > 0 or before == after == 0
        if not fits:
            return None
        shape[dim] = size + before + after
    return tuple(shape)


def _convolution_backward(grad: TensorMeta, x: TensorMeta, weight: TensorMeta, bias_sizes: Any, stride: Any,
                          padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
                          mask: Sequence[bool]) -> list[Shape | None]:
    """aten.convolution_backward: the input's, the weight's and the bias's gradients, each the
    shape of what it differentiates (None where ``mask`` asks for none)."""
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    return [shape if wanted else None for shape, wanted in zip((x.shape, weight.shape, (channels,)), mask)]


def _same_as_input(position: int) -> Callable[..., Shape]:
    """Backward ops whose result is the gradient of their ``position``-th argument."""
    def rule(*args: Any, **_: Any) -> Shape:
        return args[position].shape
    return rule


def _per_dim(value: Any, count: int) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * count


RULES: dict[Any, Callable[..., Shape | None]] = {
    torch.mm: _matmul, torch.bmm: _matmul, torch.matmul: _matmul,
    torch.addmm: _addmm, torch.baddbmm: _addmm,
    F.linear: _linear,
    F.scaled_dot_product_attention: _attention,
    F.embedding: _embedding,
    F.conv1d: _conv(1), F.conv2d: _conv(2), F.conv3d: _conv(3),
    torch.conv1d: _conv(1), torch.conv2d: _conv(2), torch.conv3d: _conv(3),
    F.max_pool1d: _max_pool(1), F.max_pool2d: _max_pool(2), F.max_pool3d: _max_pool(3),
    torch.max_pool1d: _max_pool(1), torch.max_pool2d: _max_pool(2), torch.max_pool3d: _max_pool(3),
    F.max_pool1d_with_indices: _max_pool(1, True), F.max_pool2d_with_indices: _max_pool(2, True),
    F.max_pool3d_with_indices: _max_pool(3, True),
    F.avg_pool1d: _avg_pool(1), F.avg_pool2d: _avg_pool(2), F.avg_pool3d: _avg_pool(3),
    F.adaptive_avg_pool1d: _adaptive_pool(1), F.adaptive_avg_pool2d: _adaptive_pool(2),
    F.adaptive_avg_pool3d: _adaptive_pool(3),
    torch.diff: _diff,
    F.pad: _pad,
    # backward ops of training graphs (the VJP rules of extern_rules.py)
    torch.ops.aten.convolution_backward: _convolution_backward,
    torch.ops.aten.convolution_backward.default: _convolution_backward,
    **{op: _same_as_input(1) for name in ("max_pool2d_with_indices_backward", "avg_pool2d_backward",
                                          "avg_pool3d_backward", "_adaptive_avg_pool2d_backward",
                                          "_adaptive_avg_pool3d_backward")
       for op in (getattr(torch.ops.aten, name), getattr(torch.ops.aten, name).default)},
}


def hint_meta_tensor(meta: TensorMeta) -> torch.Tensor:
    """A meta-device tensor of the hints of a symbolic meta."""
    return torch.empty_strided(tuple(hint_of(s) for s in meta.shape), tuple(hint_of(s) for s in meta.stride),
                               dtype=meta.dtype, device="meta")


def symbolic_output_meta(target: Any, args: tuple, kwargs: dict, meta_of: Callable[[Any], Any],
                         device: torch.device) -> TensorMeta | None:
    """The output meta of ``target(*args, **kwargs)`` with symbolic sizes, or None (no rule, no
    symbolic input, or a result the rule does not describe)."""
    rule = RULES.get(target)
    if rule is None:
        return None
    metas = [meta_of(a) for a in tree_leaves((args, kwargs))]
    if not any(isinstance(m, TensorMeta) and any(is_symbolic(s) for s in m.shape + m.stride) for m in metas):
        return None
    arg_metas = _map(args, meta_of)
    kwarg_metas = {k: _map(v, meta_of) for k, v in kwargs.items()}
    shape = rule(*arg_metas, **kwarg_metas)
    if shape is None:
        return None
    hinted = lambda v: hint_meta_tensor(v) if isinstance(v, TensorMeta) else v  # noqa: E731
    with torch.no_grad():
        out = target(*_map(arg_metas, hinted), **{k: _map(v, hinted) for k, v in kwarg_metas.items()})
    if isinstance(shape, list):     # several results, None where the op returns none
        if not isinstance(out, (tuple, list)) or len(out) != len(shape):
            return None
        metas = tuple(None if s is None and o is None else _result_meta(s, o, device) for s, o in zip(shape, out))
        return None if any(m is None for m, o in zip(metas, out) if o is not None) else metas
    return _result_meta(shape, out, device)


def _result_meta(shape: Shape | None, out: Any, device: torch.device) -> TensorMeta | None:
    """The meta of a result of symbolic ``shape`` that the hints' run gave as ``out`` (its dtype and
    dim order); None when they disagree."""
    if shape is None or not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(hint_of(s) for s in shape) \
            or not is_dense(tuple(out.shape), tuple(out.stride())):
        return None
    stride = dense_strides_like(shape, tuple(out.shape), tuple(out.stride()))
    return dataclasses.replace(TensorMeta.of(out), shape=shape, stride=stride, device=device, requires_grad=False)


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_map(v, fn) for v in value)
    return fn(value)
