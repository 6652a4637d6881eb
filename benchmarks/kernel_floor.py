"""Each generated kernel's measured GPU time against its memory floor (bytes / copy bandwidth).

    from kernel_floor import floor_table, category_times
    print(floor_table(code_text, times_us))      # times_us: kernel name -> GPU us per step

``code_text`` is what ``EMBER_LOGS=output_code`` prints for a step's graphs (``# ---- wrapper``
then ``# ---- kernels`` per graph; each Triton kernel's docstring carries ``bytes: N``).  Kernel
names repeat across graphs (each graph has its own kernel0), and torch.profiler sums equal names,
so a row is every graph's kernel of that name: floors are summed over every launch in the
wrappers the same way.  The gap (measured - floor) ranks where a step's GPU time goes beyond
what its bytes cost; a matmul or attention extern is not a row (its floor is FLOPs, not bytes).
"""
from __future__ import annotations

import collections
import re

COPY_BANDWIDTH = 3.0e12     # bytes/s: the H100's measured device-to-device copy rate


def kernel_floors(code_text: str, bandwidth: float = COPY_BANDWIDTH) -> tuple[dict, dict, dict]:
    """Per kernel name: (floor us per step, launches per step, one description per graph)."""
    floor: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, int] = collections.defaultdict(int)
    described: dict[str, list[str]] = collections.defaultdict(list)
    for position, module in enumerate(code_text.split("# ---- wrapper")[1:]):
        wrapper, _, kernels = module.partition("# ---- kernels")
        aliases = dict(re.findall(r"^(kernel\d+) = (kernel\d+)", kernels, re.M))
        info = {}
        for name, body in re.findall(r"^def (kernel\d+)\(.*?\):\n(.*?)(?=^@triton.jit|^kernel\d+ =|\Z)",
                                     kernels, re.M | re.S):
            size = re.search(r"bytes: (\d+)", body)
            ops = re.search(r"# (\d+) fused ops: ([^\n]*)", body)
            info[name] = (int(size.group(1)) if size else 0, ops.group(2)[:100] if ops else "")
        for launched in re.findall(r"^\s+(kernel\d+)\(", wrapper, re.M):
            name = aliases.get(launched, launched)
            size, ops = info.get(name, (0, ""))
            floor[name] += size / bandwidth * 1e6
            launches[name] += 1
            text = f"graph {position}: {ops}"
            if text not in described[name]:
                described[name].append(text)
    return floor, launches, described


def floor_table(code_text: str, times_us: dict[str, float], rows: int = 25) -> str:
    floor, launches, described = kernel_floors(code_text)
    measured = {name: us for name, us in times_us.items() if re.fullmatch(r"kernel\d+", name)}
    lines = [f"{'kernel':10s} {'us/step':>8s} {'floor':>8s} {'gap':>8s} {'calls':>5s}  fused ops"]
    for name, us in sorted(measured.items(), key=lambda item: floor[item[0]] - item[1])[:rows]:
        lines.append(f"{name:10s} {us:8.1f} {floor[name]:8.1f} {us - floor[name]:8.1f} {launches[name]:5d}  "
                     + " / ".join(described[name])[:160])
    total, total_floor = sum(measured.values()), sum(floor[name] for name in measured)
    lines.append(f"generated kernels: {total:.1f} us per step, floor {total_floor:.1f} us, gap {total - total_floor:.1f} us")
    return "\n".join(lines)


def category(name: str) -> str:
    """A GPU kernel's kind, from its name, the same way for ember, eager and Inductor."""
    lowered = name.lower()
    if re.fullmatch(r"kernel\d+", name) or lowered.startswith("triton_"):
        return "generated"
    if any(word in lowered for word in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(word in lowered for word in ("gemm", "cutlass", "nvjet", "sm90_", "sm80_", "ampere_", "cublas")):
        return "matmul"
    if "conv" in lowered or "cudnn" in lowered or "implicit" in lowered:
        return "convolution"
    if "copy" in lowered or "memcpy" in lowered or "memset" in lowered or "fill" in lowered:
        return "copy/fill"
    return "other aten"


def category_times(times_us: dict[str, float]) -> dict[str, float]:
    totals: dict[str, float] = collections.defaultdict(float)
    for name, us in times_us.items():
        totals[category(name)] += us
    return dict(totals)
