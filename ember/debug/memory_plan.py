"""What a compiled program's buffer plan keeps alive, step by step (no allocator involved).

Used by tests/autodiff/test_backward_memory.py and benchmarks/backward_memory_plan.py: the plan is
the same for the C++ and Triton backends (the scheduler is shared), so a CPU run predicts the GPU's.
"""
from __future__ import annotations

from ember.codegen.wrapper import buffer_releases
from ember.lower.scheduler import ExternCall, Schedule


def live_bytes(sched: Schedule) -> tuple[list[int], list[set[str]]]:
    """Bytes (and the allocations holding them) alive during each step, as the wrapper allocates
    and ``del``s them (``buffer_releases``), with the plan's storage reuse.  Inputs are not counted:
    a backward's saved values live through it anyway."""
    releases = buffer_releases(sched)
    released_at = {name: position for position, names in releases.items() for name in names}
    made_at: dict[str, int] = {}
    for position, step in enumerate(sched.steps):
        for name in [o.name for o in step.outputs] if isinstance(step, ExternCall) else step.writes:
            made_at.setdefault(name, position)
    end = len(sched.steps)
    storages: dict[str, list[int]] = {}      # allocation -> [bytes, first step, last step]
    for name, plan in sched.buffers.items():
        node = sched.program.nodes[name]
        if plan.kind == "input" or name not in made_at or getattr(node, "scalar", False):
            continue
        storage = storages.setdefault(plan.allocation, [0, end, -1])
        if plan.allocation == name:
            storage[0] = node.numel() * node.dtype.itemsize
        storage[1] = min(storage[1], made_at[name])
        storage[2] = max(storage[2], released_at.get(name, end))
    live = [0] * (end + 1)
    owners: list[set[str]] = [set() for _ in range(end + 1)]
    for allocation, (nbytes, first, last) in storages.items():
        for position in range(first, last + 1):
            live[position] += nbytes
            owners[position].add(allocation)
    return live, owners
