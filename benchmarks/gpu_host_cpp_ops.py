"""Host microseconds per call of wrapper operations done from C++ (a torch extension built with
load_inline) against the Python calls a generated wrapper makes today: the measurement behind a
C++ helper for ember's wrappers (session 26; a diagnosis, not a test).

    python benchmarks/gpu_host_cpp_ops.py          # needs ninja and a C++ compiler
"""
import os
import time

import torch
from gpu_host_ops import per_call_us
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/extension.h>

// a tensor over t's storage with the given geometry: no dispatcher, no autograd view record
at::Tensor reinterpret(const at::Tensor& t, c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
    impl->set_sizes_and_strides(size, stride, offset);
    return at::Tensor(std::move(impl));
}

at::Tensor empty(c10::IntArrayRef size, c10::IntArrayRef stride, at::ScalarType dtype, at::Device device) {
    return at::empty_strided(size, stride, at::TensorOptions().dtype(dtype).device(device));
}

at::Tensor mm_views(const at::Tensor& a, c10::IntArrayRef as, c10::IntArrayRef ast, int64_t ao,
                    const at::Tensor& b, c10::IntArrayRef bs, c10::IntArrayRef bst, int64_t bo) {
    return at::mm(reinterpret(a, as, ast, ao), reinterpret(b, bs, bst, bo));
}
"""


def main():
    t0 = time.time()
    ext = load_inline("ember_host_ops", CPP, functions=["reinterpret", "empty", "mm_views"], verbose=False)
    print(f"built in {time.time() - t0:.1f} s", flush=True)
    dev, bf16 = torch.device(os.environ.get("DEV", "cuda")), torch.bfloat16
    M, K, N = 256, 768, 768
    x3 = torch.randn(2, M // 2, K, device=dev, dtype=bf16)
    w = torch.randn(N, K, device=dev, dtype=bf16)
    cases = {
        "py empty_strided": lambda: torch.empty_strided((M, N), (N, 1), dtype=bf16, device=dev),
        "cpp empty": lambda: ext.empty((M, N), (N, 1), bf16, dev),
        "py as_strided, offset": lambda: x3.as_strided((M, K), (K, 1), x3.storage_offset()),
        "cpp reinterpret": lambda: ext.reinterpret(x3, (M, K), (K, 1), 0),
        "py mm(as_strided, as_strided)": lambda: torch.mm(x3.as_strided((M, K), (K, 1), x3.storage_offset()),
                                                          w.as_strided((K, N), (1, K), w.storage_offset())),
        "cpp mm_views": lambda: ext.mm_views(x3, (M, K), (K, 1), 0, w, (K, N), (1, K), 0),
        "py mm(x2, w.t()) (views made once)": None,
    }
    x2, wt = x3.view(M, K), w.t()
    cases["py mm(x2, w.t()) (views made once)"] = lambda: torch.mm(x2, wt)
    a = torch.mm(x3.as_strided((M, K), (K, 1), 0), w.as_strided((K, N), (1, K), 0))
    b = ext.mm_views(x3, (M, K), (K, 1), 0, w, (K, N), (1, K), 0)
    print("mm_views equal:", torch.equal(a, b), flush=True)
    with torch.no_grad():
        for name, fn in cases.items():
            print(f"{name:38s} {per_call_us(fn):7.2f} us", flush=True)


if __name__ == "__main__":
    main()
