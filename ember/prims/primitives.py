"""The primitive set: the closed vocabulary that decompositions emit and lower/ consumes.

Every primitive is a `Prim` with
  name         the printed name ("prims.add");
  kind         "elementwise" | "view" | "reduction" | "creation" | "indexing" | "random" | "scan";
  reference    an eager-torch implementation (tests run prim graphs with it);
  meta         (*args, **kwargs) -> TensorMeta | tuple[TensorMeta, ...]; defaults to running
               `reference` on meta-device tensors; explicit rules live in prims/meta.py
               and must also accept sympy sizes.

Conventions (the contract between prims/ and lower/):
  * Elementwise prims take tensors of identical shape and dtype (decompositions insert
    `broadcast_in_dim`/`expand` and `convert_element_type` to get there, following
    PyTorch's type promotion); scalar operands are Python numbers already of the
    right kind.  Comparisons and isnan/isinf/logical_* return bool.
    Low-precision floats (bf16/fp16) are *computed* in fp32 by the code generators and
    rounded once on store, as Inductor does.
  * Views never copy: reshape (of a tensor whose strides allow or not: lower/ turns it
    into an index map either way), permute, expand, slice, as_strided.
    They return new values; aliasing is handled by functionalization.
  * Reductions take `dims` (a sorted tuple of non-negative ints) and drop those
    dimensions (keepdim is a following reshape).  Accumulation is fp32 for low-precision
    floats and the output dtype is the input dtype, except argmax/argmin (int64) and
    var_mean (returns (var, mean)).
  * Nothing here is in-place.  Mutation is expressed by the graph's output list plus
    `Graph.extra["mutated_inputs"]` (see functionalize.py).
  * Anything that is not a Prim in a prim-level graph is an Extern: a torch callable run
    eagerly by the wrapper (mm, convolution, sdpa, unsupported ops).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ember.graph import TensorMeta, tree_map


@dataclasses.dataclass(eq=False)
class Prim:
    name: str
    kind: str
    reference: Callable[..., Any]
    meta: Callable[..., Any] | None = None
    doc: str = ""

    @property
    def qualified_name(self) -> str:
        return f"prims.{self.name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling a Prim runs its reference implementation (used by Graph.run)."""
        return self.reference(*args, **kwargs)

    def infer_meta(self, *args: Any, **kwargs: Any) -> Any:
        """Output meta from input metas (TensorMeta in args); default: run on 'meta'."""
        if self.meta is not None:
            return self.meta(*args, **kwargs)
        devices = [a.device for a in _leaves(args, kwargs) if isinstance(a, TensorMeta)]
        as_meta = lambda v: v.to_meta_tensor() if isinstance(v, TensorMeta) else v
        out = self.reference(*tree_map(as_meta, args), **tree_map(as_meta, kwargs))
        device = devices[0] if devices else kwargs.get("device", torch.device("cpu"))
        return _to_meta(out, device)

    def __repr__(self) -> str:
        return self.qualified_name


def _leaves(args: Any, kwargs: Any) -> list[Any]:
    from ember.graph import tree_leaves
    return tree_leaves((args, kwargs))


def _to_meta(out: Any, device: torch.device) -> Any:
    if isinstance(out, torch.Tensor):
        return dataclasses.replace(TensorMeta.of(out), device=torch.device(device))
    if isinstance(out, (tuple, list)):
        return tuple(_to_meta(o, device) for o in out)
    return None


REGISTRY: dict[str, Prim] = {}


def register_prim(name: str, kind: str, reference: Callable[..., Any], doc: str = "") -> Prim:
    assert name not in REGISTRY, f"primitive {name} registered twice"
    prim = Prim(name, kind, reference, None, doc)
    REGISTRY[name] = prim
    return prim


def is_prim(target: Any) -> bool:
    return isinstance(target, Prim)


# ----------------------------------------------------------------- elementwise
# name -> eager reference.  Unary, binary, ternary; same shape and dtype in.
UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log1p": torch.log1p, "log2": torch.log2, "log10": torch.log10,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma,
    "sigmoid": torch.sigmoid, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "trunc": torch.trunc, "sign": torch.sign, "signbit": torch.signbit,
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
    "logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.true_divide,
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
    "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
    "hypot": torch.hypot, "copysign": torch.copysign,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "bitwise_left_shift": torch.bitwise_left_shift, "bitwise_right_shift": torch.bitwise_right_shift,
}

def _scalar_operands_ok(fn: Callable) -> Callable:
    """Some torch binary functions reject a Python number where a tensor is expected
    (torch.maximum(t, 2.0), torch.sub(2.0, t)); retry with a 0-dim tensor of the other operand's
    dtype (decompositions already promoted, so that is the computation dtype)."""
    def reference(a: Any, b: Any) -> Any:
        try:
            return fn(a, b)
        except TypeError:
            like = a if isinstance(a, torch.Tensor) else b
            return fn(_as_tensor(a, like), _as_tensor(b, like))
    reference.__name__ = fn.__name__
    return reference


def _as_tensor(v: Any, like: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v
    return torch.tensor(v, dtype=like.dtype if isinstance(like, torch.Tensor) else None)


for _name, _fn in UNARY.items():
    register_prim(_name, "elementwise", _fn)
for _name, _fn in BINARY.items():
    register_prim(_name, "elementwise", _scalar_operands_ok(_fn))

clone = register_prim("clone", "elementwise", lambda x: x.clone(memory_format=torch.contiguous_format),
                      "clone(x): a fresh contiguous copy (used where eager returns a new tensor but the "
                      "functional value is an input or a view of one)")
where = register_prim("where", "elementwise", torch.where, "where(cond: bool, a, b)")
convert_element_type = register_prim(
    "convert_element_type", "elementwise", lambda x, dtype: x.to(dtype),
    "convert_element_type(x, dtype): C-style cast (float->int truncates, ->bool is != 0)")

# ----------------------------------------------------------------------- views
reshape = register_prim("reshape", "view", lambda x, shape: x.reshape(shape),
                        "reshape(x, shape): same numel, row-major order; never copies in lower/")
permute = register_prim("permute", "view", lambda x, dims: x.permute(dims), "permute(x, dims)")
expand = register_prim("expand", "view", lambda x, shape: x.expand(shape),
                       "expand(x, shape): same rank, size-1 dims broadcast to shape")
slice_ = register_prim("slice", "view", lambda x, dim, start, end, step=1: x.narrow(dim, 0, x.shape[dim])[
    (slice(None),) * dim + (slice(start, end, step),)],
    "slice(x, dim, start, end, step): 0 <= start <= end <= size, step >= 1 (already clamped)")
detach = register_prim("detach", "view", lambda x: x.detach(),
                       "detach(x): x itself (an identity view); autodiff stops gradients here (x.detach(), "
                       "values computed under no_grad)")
as_strided = register_prim("as_strided", "view",
                           lambda x, size, stride, storage_offset=0: x.as_strided(size, stride, storage_offset),
                           "as_strided(x, size, stride, storage_offset): over x's storage")

# ------------------------------------------------------------------ reductions
sum_ = register_prim("sum", "reduction", lambda x, dims: x.sum(dims) if dims else x.clone(), "sum(x, dims)")
prod = register_prim("prod", "reduction",
                     lambda x, dims: _reduce_each(torch.prod, x, dims), "prod(x, dims)")
amax = register_prim("amax", "reduction", lambda x, dims: x.amax(dims) if dims else x.clone(),
                     "amax(x, dims): NaN propagates")
amin = register_prim("amin", "reduction", lambda x, dims: x.amin(dims) if dims else x.clone(),
                     "amin(x, dims): NaN propagates")
argmax = register_prim("argmax", "reduction", lambda x, dim: x.argmax(dim), "argmax(x, dim) -> int64")
argmin = register_prim("argmin", "reduction", lambda x, dim: x.argmin(dim), "argmin(x, dim) -> int64")
var_mean = register_prim("var_mean", "reduction",
                         lambda x, dims, correction=0, whole=False: torch.var_mean(x, dims, correction=correction),
                         "var_mean(x, dims, correction, whole) -> (var, mean), Welford; whole: called without "
                         "dims (eager's gradient then differs where N <= correction)")


def _reduce_each(fn: Callable, x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = fn(x, d)
    return x


# --------------------------------------------------------------------- scans
# in x's dtype: the decomposition promotes integers to int64 unless eager's dtype= says otherwise
cumsum = register_prim("cumsum", "scan", lambda x, dim: torch.cumsum(x, dim, dtype=x.dtype), "cumsum(x, dim)")

# ------------------------------------------------------------------- creation
iota = register_prim("iota", "creation",
                     lambda length, start, step, dtype, device: torch.arange(
                         start, start + step * length, step, dtype=dtype, device=device)[:length],
                     "iota(length, start, step, dtype, device): 1-D arange")
full = register_prim("full", "creation",
                     lambda shape, value, dtype, device, stride=None: torch.full(
                         shape, value, dtype=dtype, device=device) if stride is None else torch.empty_strided(
                         shape, stride, dtype=dtype, device=device).fill_(value),
                     "full(shape, value, dtype, device, stride=None): stride, a dense layout, as *_like "
                     "keeps its input's")

# ------------------------------------------------------------------- indexing
gather = register_prim("gather", "indexing", lambda x, dim, index: torch.gather(x, dim, index),
                       "gather(x, dim, index: int64)")
# aten's index/index_put read None as "this dim is not indexed" (a Python x[None] would add a dim)
index = register_prim("index", "indexing", lambda x, indices: torch.ops.aten.index.Tensor(x, list(indices)),
                      "index(x, indices): advanced indexing; indices is a list of int64 tensors (values in "
                      "[0, size), already wrapped) or None for a dim that is not indexed")
scatter = register_prim("scatter", "indexing", lambda x, dim, index, src: torch.scatter(x, dim, index, src),
                        "scatter(x, dim, index, src): out-of-place")
scatter_add = register_prim("scatter_add", "indexing",
                            lambda x, dim, index, src: torch.scatter_add(x, dim, index, src),
                            "scatter_add(x, dim, index, src): out-of-place")
index_put = register_prim("index_put", "indexing",
                          lambda x, indices, values, accumulate=False: torch.ops.aten.index_put(
                              x, list(indices), values, accumulate),
                          "index_put(x, indices, values, accumulate): out-of-place")
cat = register_prim("cat", "indexing", lambda tensors, dim: torch.cat(tensors, dim), "cat(tensors, dim)")
constant_pad = register_prim("constant_pad", "indexing",
                             lambda x, pad, value: torch.nn.functional.pad(x, pad, value=value),
                             "constant_pad(x, pad, value): pad as F.pad (last dim first, may be negative)")

# 2-D max pooling over (.., height, width): window = kernel, stride, padding, dilation (pairs)
pool_argmax = register_prim(
    "pool_argmax", "indexing",
    lambda x, kernel, stride, padding, dilation, ceil_mode, dtype: torch.nn.functional.max_pool2d(
        x, kernel, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=True)[1].to(dtype),
    "pool_argmax(x, kernel, stride, padding, dilation, ceil_mode, dtype): each window's max position "
    "in the plane (h * width + w), eager's scan: first greatest, NaN wins")
pool_select = register_prim(
    "pool_select", "indexing",
    lambda x, index, kernel, stride, padding, dilation: x.flatten(-2).gather(
        -1, index.flatten(-2).long()).view(*x.shape[:-2], *index.shape[-2:]),
    "pool_select(x, index, kernel, stride, padding, dilation): x at each window's position")
pool_scatter = register_prim(
    "pool_scatter", "indexing",
    lambda grad, index, height, width, kernel, stride, padding, dilation:
        torch.ops.aten.max_pool2d_with_indices_backward(
            grad, grad.new_empty((*grad.shape[:-2], height, width)), kernel, stride, padding, dilation, False,
            index.long()),
    "pool_scatter(grad, index, height, width, kernel, stride, padding, dilation): each input position "
    "gets the sum of the gradients of the windows that selected it (pool_select's gradient)")

# --------------------------------------------------------------------- random
# Philox counter-based: the same (seed, offset) gives the same numbers on every backend.
philox_rand = register_prim("philox_rand", "random",
                            lambda shape, seed, offset, dtype, device: _reference_rand(shape, seed, offset, dtype, device),
                            "philox_rand(shape, seed, offset, dtype, device): uniform [0, 1)")


def _reference_rand(shape, seed, offset, dtype, device):
    from ember.prims.philox import philox_uniform  # Philox4x32-10, the numbers tl.rand gives
    return philox_uniform(shape, seed, offset, dtype, device)


def get(name: str) -> Prim:
    return REGISTRY[name]


# explicit meta rules (symbolic-size friendly) replace the run-on-meta-device default
from ember.prims import meta as _meta  # noqa: F401  (import for its side effect)
