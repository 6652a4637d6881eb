"""Why is vit's q/k/v gradient pack slow?  (GPU diagnosis, not a test.)

    python benchmarks/gpu_cat_pack.py

The kernel: out (6304, 2304) bf16 = cat([dq, dk, dv], dim=1), each (6304, 768) bf16; 58 MB moved,
19 us at 3 TB/s; ember's generated kernel took 28 us, Inductor's 18 us.  Times variants of the
same copy written by hand (CUDA events around 100 back-to-back launches): ember's form (flat index, int64 segment
compares, three masked loads), the same with int32 compares, a 2D grid (one program per row block
and segment: no div/mod, unmasked loads), and torch.cat."""
from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl

ROWS, WIDTH = 6304, 768


@triton.jit
def flat_int64(a, b, c, out, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    segment = ((xindex % 2304) // 768).to(tl.int64)
    row, col = xindex // 2304, (xindex % 2304) % 768
    first = segment < 1
    second = (segment >= 1) & (segment < 2)
    third = segment >= 2
    va = tl.load(a + (768 * row + col), mask=first, other=0)
    vb = tl.load(b + (768 * row + col), mask=second, other=0)
    vc = tl.load(c + (768 * row + col), mask=third, other=0)
    tl.store(out + xindex, tl.where(first, va, tl.where(second, vb, vc)))


@triton.jit
def flat_int32(a, b, c, out, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    segment = (xindex // 768) % 3
    row, col = xindex // 2304, xindex % 768
    va = tl.load(a + (768 * row + col), mask=segment == 0, other=0)
    vb = tl.load(b + (768 * row + col), mask=segment == 1, other=0)
    vc = tl.load(c + (768 * row + col), mask=segment == 2, other=0)
    tl.store(out + xindex, tl.where(segment == 0, va, tl.where(segment == 1, vb, vc)))


@triton.jit
def tiled(a, b, c, out, RBLOCK: tl.constexpr, CBLOCK: tl.constexpr):
    rows = tl.program_id(0) * RBLOCK + tl.arange(0, RBLOCK)[:, None]
    cols = tl.arange(0, CBLOCK)[None, :]
    mask = (rows < 6304) & (cols < 768)
    segment = tl.program_id(1)
    source = tl.where(segment == 0, a, tl.where(segment == 1, b, c))
    value = tl.load(source + 768 * rows + cols, mask=mask)
    tl.store(out + 2304 * rows + 768 * segment + cols, value, mask=mask)


def timed(fn, reps: int = 100) -> float:
    """Median over 5 batches of the mean time of ``reps`` back-to-back launches (one launch per
    event pair measures the clock ramp and the launch gap as much as the kernel)."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def main() -> None:
    a, b, c = (torch.randn(ROWS, WIDTH, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    expected = torch.cat([a, b, c], dim=1)
    out = torch.empty_like(expected)
    n = expected.numel()
    nbytes = 2 * expected.numel() * expected.element_size()
    variants = {"torch.cat": lambda: torch.cat([a, b, c], dim=1, out=out)}
    for kernel in (flat_int64, flat_int32):
        for block, warps in ((1024, 4), (1024, 8), (2048, 8), (512, 4)):
            variants[f"{kernel.__name__} XBLOCK={block} warps={warps}"] = (
                lambda k=kernel, bl=block, w=warps: k[(triton.cdiv(n, bl),)](a, b, c, out, XBLOCK=bl, num_warps=w))
    for rblock, warps in ((8, 4), (16, 8), (32, 8)):
        variants[f"tiled RBLOCK={rblock} warps={warps}"] = (
            lambda r=rblock, w=warps: tiled[(triton.cdiv(ROWS, r), 3)](a, b, c, out, RBLOCK=r, CBLOCK=1024, num_warps=w))
    for name, fn in variants.items():
        out.zero_()
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a diagnosis script: report and go on
            print(f"{name:40s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        ok = torch.equal(out, expected)
        us = timed(fn)
        print(f"{name:40s} {us:7.1f} us  {nbytes / us / 1e6:5.2f} TB/s  {'ok' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    main()
