"""Reference Philox4x32-10 uniform numbers: what the `philox_rand` prim means.

Element i of `philox_rand(shape, seed, offset, ...)` is the first 32-bit word of
Philox4x32-10 with key = seed (lo, hi words) and counter = (lo, hi words of the 64-bit
offset + i, 0, 0),
mapped to [0, 1) the way Triton's `tl.rand(seed, offset + i)` does.  So a Triton
kernel calling `tl.rand(seed, offset + linear_index)` reproduces this exactly, and the
C++ backend implements the same few lines.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

_MASK32 = np.uint64(0xFFFFFFFF)
_ROUND_A = np.uint64(0xD2511F53)
_ROUND_B = np.uint64(0xCD9E8D57)
_KEY_A = np.uint64(0x9E3779B9)
_KEY_B = np.uint64(0xBB67AE85)


def _mulhi_lo(a: np.uint64, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    product = a * b  # both < 2**32, so the product fits in 64 bits
    return product >> np.uint64(32), product & _MASK32


def philox_uint32(seed: int, counters: np.ndarray) -> np.ndarray:
    """First output word of Philox4x32-10 for each 64-bit counter: its lo and hi words are the
    first two counter words, the other two start 0 (tl.randint with an int64 offset)."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64(seed >> 32)
    wide = counters.astype(np.uint64)
    c0 = wide & _MASK32
    c1 = wide >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    for _ in range(10):
        hi_b, lo_b = _mulhi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mulhi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0


def philox_uniform(shape: Any, seed: Any, offset: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    counters = np.arange(numel, dtype=np.uint64) + np.uint64(int(offset))
    bits = philox_uint32(int(seed), counters).astype(np.uint32).view(np.int32)
    # tl.rand: x = int32(bits); x = x < 0 ? -x - 1 : x; x * 2**-31 in fp32
    magnitude = np.where(bits < 0, -(bits.astype(np.int64)) - 1, bits.astype(np.int64)).astype(np.float32)
    uniform = magnitude * np.float32(4.6566127342e-10)
    return torch.from_numpy(uniform.reshape(shape)).to(device=device, dtype=dtype)
