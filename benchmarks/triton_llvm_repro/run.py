"""A Triton kernel that computes wrong values on the GPU (H200, Triton 3.6) unless LLVM's
optimizer is off: ember's generated gradient of two 2-D max poolings in one kernel
(``pool_scatter_kernels.py``, written by ember for tests/prims/test_max_pool.py's windows
(3, (1, 2), 0, 2) and ((3, 2), (1, 2), 0, 2)).  Found in session 26; not understood further.

    python benchmarks/triton_llvm_repro/run.py                    # mismatches in both windows
    DISABLE_LLVM_OPT=1 TRITON_CACHE_DIR=/tmp/tc python benchmarks/triton_llvm_repro/run.py   # none
    DEV=cpu TRITON_INTERPRET=1 python benchmarks/triton_llvm_repro/run.py                    # none

Each variant is checked against eager's max-pool backward for 20 random inputs:
  original          the kernel as ember wrote it (XBLOCK=512): wrong on the GPU for 4, 1 and 8 warps
  one_store_each    the same source with one of the two stores dropped: right
  xblock128         XBLOCK=128, four programs: right
  mul_mask          tl.where(mask, g, 0.0) written as g * mask: right
  reload            a loaded gradient used by two taps loaded twice: still wrong
"""
import importlib.util
import os
import re
import tempfile

import torch
import torch.nn.functional as F

DEV = os.environ.get("DEV", "cuda")
SOURCE = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pool_scatter_kernels.py")).read()
# kernel0(argmax_66, grad_66, argmax_42, grad_42, out_66, out_42): the windows' (kernel, stride, padding, dilation)
WINDOWS = {66: ((3, 2), (1, 2), 0, 2), 42: (3, (1, 2), 0, 2)}
STORE_66 = "tl.store(out_pool_scatter + (xindex), tmp71, mask=xmask)"
STORE_42 = "tl.store(out_pool_scatter_0 + (xindex), tmp141, mask=xmask)"


def load(name, text):
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel0


def reload_reused(text):
    loads, used, out = {}, set(), []
    for line in text.splitlines():
        load_line = re.match(r"    (tmp\d+) = (tl\.load\(.*\))$", line)
        if load_line:
            loads[load_line.group(1)] = load_line.group(2)
        where = re.match(r"    (tmp\d+) = tl\.where\((tmp\d+), (tmp\d+), 0\.0\)$", line)
        if where and where.group(3) in loads:
            if where.group(3) in used:
                line = f"    {where.group(1)} = tl.where({where.group(2)}, {loads[where.group(3)]}, 0.0)"
            used.add(where.group(3))
        out.append(line)
    return "\n".join(out) + "\n"


def eager(seed):
    torch.manual_seed(seed)
    result = {}
    for window, (k, s, p, d) in WINDOWS.items():
        x = torch.randn(2, 3, 9, 8, device=DEV, requires_grad=True)
        out, index = F.max_pool2d(x, k, s, p, d, return_indices=True)
        grad = torch.randn_like(out)
        (expected,) = torch.autograd.grad(out, x, grad)
        result[window] = (index.to(torch.int16), grad, expected)
    return result


def check(name, kernel, programs=1, num_warps=4, windows=(66, 42)):
    wrong = {}
    for seed in range(20):
        r = eager(seed)
        outs = {w: torch.zeros(2, 3, 9, 8, device=DEV) for w in WINDOWS}
        kernel[(programs, 1, 1)](r[66][0], r[66][1], r[42][0], r[42][1], outs[66], outs[42], num_warps=num_warps)
        for w in windows:
            n = int((outs[w] != r[w][2]).sum())
            if n:
                wrong.setdefault(w, []).append(n)
    print(f"{name:24s} elements wrong per seed: {wrong or 'none'}", flush=True)


def main():
    original = load("original", SOURCE)
    for warps in (4, 1, 8):
        check(f"original, {warps} warps", original, num_warps=warps)
    check("only window 66 stored", load("only66", SOURCE.replace(STORE_42, "pass")), windows=(66,))
    check("only window 42 stored", load("only42", SOURCE.replace(STORE_66, "pass")), windows=(42,))
    check("xblock128", load("xblock128", SOURCE.replace("XBLOCK: tl.constexpr = 512", "XBLOCK: tl.constexpr = 128")),
          programs=4)
    check("mul_mask", load("mul_mask", re.sub(r"tl\.where\((tmp\d+), (tmp\d+), 0\.0\)", r"(\2 * \1.to(tl.float32))", SOURCE)))
    check("reload", load("reload", reload_reused(SOURCE)))


if __name__ == "__main__":
    main()
