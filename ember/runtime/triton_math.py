"""``libm``: the special functions generated Triton kernels call as ``libm.<name>(x)``.

On a GPU this is Triton's libdevice module (CUDA's libdevice: accurate and fast).
Triton's interpreter cannot call libdevice (extern calls are not interpreted), so
a module loaded for the interpreter gets ``numpy_libm()`` instead: the same names
computed with numpy on the interpreter's arrays (runtime/triton_build.py rebinds
its ``libm``).  The kernel source is the same in both modes.  Which one a module
uses is decided per compile, never by TRITON_INTERPRET at import time.
"""
from __future__ import annotations

import functools
import os
import types

import numpy as np


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def numpy_libm() -> types.SimpleNamespace:

    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def wrap(np_fn, result_bool=False):
        def fn(*args):
            tensors = [a for a in args if isinstance(a, tl.tensor)]
            first = tensors[0]
            data = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(a, dtype=first.handle.data.dtype)
                    for a in args]
            with np.errstate(all="ignore"):
                out = np_fn(*np.broadcast_arrays(*data))
            if result_bool:
                scalar = tl.int1
                out = out.astype(np.bool_)
            else:
                scalar = first.dtype
                out = np.asarray(out).astype(first.handle.data.dtype)
            # a block if any operand is one (fmod(scalar, block) is a block)
            is_block = any(isinstance(t.type, tl.block_type) for t in tensors)
            shape = list(out.shape) if is_block else []
            ty = tl.block_type(scalar, shape) if shape else scalar
            return tl.tensor(TensorHandle(out, scalar), ty)
        return fn

    def erfinv(y):
        try:
            from scipy.special import erfinv as scipy_erfinv
            return scipy_erfinv(y)
        except ImportError:
            import torch
            return torch.special.erfinv(torch.from_numpy(np.ascontiguousarray(y))).numpy()

    def lgamma(x):
        import torch  # math.lgamma raises at the poles (0, -1, ...), where torch gives inf
        return torch.lgamma(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    ns = types.SimpleNamespace(
        tanh=wrap(np.tanh), expm1=wrap(np.expm1), log1p=wrap(np.log1p), log10=wrap(np.log10), tan=wrap(np.tan),
        asin=wrap(np.arcsin), acos=wrap(np.arccos), atan=wrap(np.arctan), sinh=wrap(np.sinh), cosh=wrap(np.cosh),
        asinh=wrap(np.arcsinh), acosh=wrap(np.arccosh), atanh=wrap(np.arctanh),
        erfc=wrap(lambda x: 1.0 - _erf(x)), erfinv=wrap(erfinv), lgamma=wrap(lambda x: lgamma(x.astype(np.float64))),
        nearbyint=wrap(np.rint), trunc=wrap(np.trunc), pow=wrap(np.power), atan2=wrap(np.arctan2),
        hypot=wrap(np.hypot), copysign=wrap(np.copysign), fmod=wrap(np.fmod),
        signbit=wrap(np.signbit, result_bool=True),
    )
    return ns


def _erf(x: np.ndarray) -> np.ndarray:
    import torch
    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy()


_numpy_libm = numpy_libm     # the former name

try:
    from triton.language.extra import libdevice as libm
except ImportError:          # a Triton without libdevice: only the interpreter can run kernels
    libm = None
