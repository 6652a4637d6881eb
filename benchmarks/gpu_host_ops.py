"""Host (CPU) microseconds per call of the operations a generated wrapper issues, on the GPU:
allocations, views, and the matmul externs in the forms ember and eager call them (a diagnosis of
host-bound training steps, not a test).  Small shapes keep the GPU ahead of the host; each figure
is the best of several loops of this thread's CPU time.

    python benchmarks/gpu_host_ops.py
"""
import time

import torch
import torch.nn.functional as F


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn, repeats=2000, rounds=7):
    """Best thread CPU microseconds per call over ``rounds`` loops (the queue drained between them)."""
    for _ in range(50):
        fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(repeats):
            fn()
        best = min(best, (time.thread_time() - start) / repeats * 1e6)
        sync()
    return best


def main():
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    M, K, N = 256, 768, 768
    x3 = torch.randn(2, M // 2, K, device=dev, dtype=bf16)
    x2 = x3.view(M, K)
    w = torch.randn(N, K, device=dev, dtype=bf16)
    b = torch.randn(N, device=dev, dtype=bf16)
    wt = w.t()
    out = torch.empty(M, N, device=dev, dtype=bf16)
    cases = {
        "empty_strided (M,N)": lambda: torch.empty_strided((M, N), (N, 1), dtype=bf16, device=dev),
        "empty (M,N)": lambda: torch.empty((M, N), dtype=bf16, device=dev),
        "new_empty (M,N)": lambda: x2.new_empty((M, N)),
        "as_strided, offset given": lambda: x3.as_strided((M, K), (K, 1), x3.storage_offset()),
        "as_strided, no offset": lambda: x3.as_strided((M, K), (K, 1)),
        "view": lambda: x3.view(M, K),
        ".t()": lambda: w.t(),
        "stride() != tuple": lambda: x2.stride() != (K, 1),
        "data_ptr()": lambda: x2.data_ptr(),
        "mm(x2, wt)": lambda: torch.mm(x2, wt),
        "mm(x2, wt, out=)": lambda: torch.mm(x2, wt, out=out),
        "mm(as_strided x, as_strided w)": lambda: torch.mm(x3.as_strided((M, K), (K, 1), x3.storage_offset()),
                                                           w.as_strided((K, N), (1, K), w.storage_offset())),
        "addmm(b, x2, wt)": lambda: torch.addmm(b, x2, wt),
        "addmm(b, x2, wt, out=)": lambda: torch.addmm(b, x2, wt, out=out),
        "F.linear(x3, w, b)": lambda: F.linear(x3, w, b),
        "F.linear(x2, w, b)": lambda: F.linear(x2, w, b),
        "F.linear(x3, w)": lambda: F.linear(x3, w),
        "mm(x2, wt) fp32": None,
    }
    x2f, wtf = x2.float(), wt.float()
    cases["mm(x2, wt) fp32"] = lambda: torch.mm(x2f, wtf)
    for grad in (False, True):
        torch.set_grad_enabled(grad)
        print(f"---- grad mode {grad}")
        for name, fn in cases.items():
            print(f"{name:34s} {per_call_us(fn):7.2f} us", flush=True)
    torch.set_grad_enabled(True)


if __name__ == "__main__":
    main()
