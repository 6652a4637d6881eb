"""Host cost of a Triton launch by argument form: tensors, whose pointers Triton's C launcher reads
through ``data_ptr()`` and checks with ``cuPointerGetAttribute``, against ints from
``t.data_ptr()`` in Python (the launcher's fast path, what ember's wrappers pass).  (GPU diagnosis,
not a test.)

    PYTHONPATH=. python benchmarks/gpu_launch_args.py
"""
from __future__ import annotations

import torch
from gpu_host_ops import per_call_us

import ember


def main() -> None:
    a, b, c = (torch.randn(4096, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = ember.compile(lambda a, b, c: ((a * b + c).relu(),), backend="ember")
    compiled(a, b, c)
    entry = compiled._ember_captured.entries[0]
    call = getattr(entry.compiled, "call", entry.compiled)
    launchers = {k: v for k, v in call.__globals__.items() if k.startswith("kernel")}
    name, launch = next(iter(launchers.items()))
    out = torch.empty_like(a)
    tensors = (a, b, c, out)
    pointers = tuple(t.data_ptr() for t in tensors)
    # the C launch the generated launcher makes, called directly with each argument form
    scope = launch.__globals__
    c_launch, grid, get_stream = scope["c_launch"], launch.kernel.grid, scope["get_stream"]
    static = (scope["function"], scope["cooperative"], scope["pdl"], None, None, scope["metadata"], None,
              scope["enter_hook"], scope["exit_hook"])
    device = torch.cuda.current_device()

    def raw(*args):
        c_launch(grid[0], grid[1], grid[2], get_stream(device), *static, *args)
    rows = {
        "launcher(t.data_ptr() per arg), as generated": lambda: launch(a.data_ptr(), b.data_ptr(), c.data_ptr(),
                                                                       out.data_ptr()),
        "C launch(tensors)": lambda: raw(*tensors),
        "C launch(ints, precomputed)": lambda: raw(*pointers),
        "C launch(t.data_ptr() per arg)": lambda: raw(a.data_ptr(), b.data_ptr(), c.data_ptr(), out.data_ptr()),
        "eager torch.add(a, b)": lambda: torch.add(a, b),
        "compiled call (guards, alloc, launch)": lambda: compiled(a, b, c),
    }
    print(f"kernel {name}, {len(tensors)} pointer arguments; thread CPU us per call (best of 7 x 5000)")
    for label, fn in rows.items():
        print(f"  {label:40s} {per_call_us(fn, repeats=5000):6.2f}")


if __name__ == "__main__":
    main()
