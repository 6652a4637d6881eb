"""Output strides (and values) of every OpInfo op through ember.compile against eager, with permuted inputs
(each 2-D+ tensor transposed in memory, 4-D ones channels-last): the layout half of "the same
result as eager", which the OpInfo value suites do not check (a diagnosis, not a test).

    python benchmarks/stride_sweep.py [--samples 2] [--ops add,mul] [--layout permuted|sliced|offset]
                                      [--dtype float32|bfloat16|float16] [--out sweep.txt]

Prints one line per (op, sample) whose compiled output strides differ from eager's (size-1 dims
free; only dense outputs with more than one element) or whose values do (rtol = atol = 1e-4; not
for empty*, whose memory is uninitialized), and counts of compiled, eager-run and failed cases.
CPU, float32.
"""
from __future__ import annotations

import argparse
import sys
import warnings

import torch

import ember


LAYOUT = "permuted"


def _permuted(t: torch.Tensor) -> torch.Tensor:
    """The same values in another memory layout (LAYOUT): permuted (2-D+ transposed in memory, 4-D
    channels-last), sliced (every other element of a buffer twice as long in the last dim) or offset
    (a view starting one element into its storage)."""
    if t.layout != torch.strided:
        return t
    if LAYOUT == "sliced" and t.ndim >= 1:
        wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    if LAYOUT == "offset":
        flat = torch.zeros(t.numel() + 1, dtype=t.dtype)
        flat[1:] = t.reshape(-1)
        return flat[1:].view(t.shape)
    if LAYOUT != "permuted":
        return t
    if t.ndim == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if t.ndim >= 2:
        return t.mT.contiguous().mT
    return t


def _lift(value, tensors):
    if isinstance(value, torch.Tensor):
        tensors.append(_permuted(value))
        return ("tensor", len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return (type(value), [_lift(v, tensors) for v in value])
    if isinstance(value, dict):
        return (dict, {k: _lift(v, tensors) for k, v in value.items()})
    return ("const", value)


def _build(spec, tensors):
    kind, payload = spec
    if kind == "tensor":
        return tensors[payload]
    if kind == "const":
        return payload
    if kind is dict:
        return {k: _build(v, tensors) for k, v in payload.items()}
    return kind(_build(v, tensors) for v in payload)


def _outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _strides_differ(e, a) -> bool:
    if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor) or e.numel() <= 1:
        return False
    if e.shape != a.shape or not _dense(e):
        return False
    return [s for s, n in zip(e.stride(), e.shape) if n != 1] != [s for s, n in zip(a.stride(), a.shape) if n != 1]


def _dense(t: torch.Tensor) -> bool:
    order = sorted(range(t.ndim), key=lambda d: t.stride(d))
    expected = 1
    for d in order:
        if t.shape[d] != 1:
            if t.stride(d) != expected:
                return False
            expected *= t.shape[d]
    return True


def main() -> None:
    from torch.testing._internal.common_methods_invocations import op_db
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--ops", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--layout", default="permuted", choices=["permuted", "sliced", "offset"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    global LAYOUT
    LAYOUT = args.layout
    dtype = getattr(torch, args.dtype)
    wanted = set(args.ops.split(",")) if args.ops else None
    warnings.simplefilter("ignore")
    counts = {"compiled": 0, "eager": 0, "eager raises": 0, "error": 0, "differ": 0, "values differ": 0}
    lines = []
    for info in op_db:
        name = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if wanted and info.name not in wanted and name not in wanted:
            continue
        if not info.supports_dtype(dtype, "cpu"):
            continue
        try:
            samples = list(info.sample_inputs("cpu", dtype, requires_grad=False))[:args.samples]
        except Exception:  # noqa: BLE001
            continue
        for number, sample in enumerate(samples):
            tensors: list[torch.Tensor] = []
            try:
                spec = _lift((sample.input, tuple(sample.args), dict(sample.kwargs)), tensors)
            except Exception:  # noqa: BLE001 - a layout that cannot be permuted
                continue

            def fn(*ts, _spec=spec, _op=info.op):
                inp, rest, kwargs = _build(_spec, ts)
                return _op(inp, *rest, **kwargs)
            try:
                expected = _outputs(fn(*tensors))
            except Exception:  # noqa: BLE001
                counts["eager raises"] += 1
                continue
            try:
                report = ember.explain(fn, *tensors)
            except Exception as exc:  # noqa: BLE001
                counts["error"] += 1
                lines.append(f"ERROR {name}[{number}]: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
                continue
            compiled = report.graph_count >= 1 and not any(getattr(c, "eager_reason", None) for c in report.compiled)
            counts["compiled" if compiled else "eager"] += 1
            actual = _outputs(report.output)
            for index, (e, a) in enumerate(zip(expected, actual)):
                uninitialized = info.name.startswith(("empty", "new_empty"))
                if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.layout == torch.strided \
                        and not uninitialized:
                    try:
                        tolerance = {} if e.dtype in (torch.bfloat16, torch.float16) else {"atol": 1e-4, "rtol": 1e-4}
                        torch.testing.assert_close(a, e, equal_nan=True, check_stride=False, **tolerance)
                    except AssertionError as exc:
                        counts["values differ"] += 1
                        lines.append(f"VALUES {name}[{number}] output {index}: {' '.join(str(exc).split())[:200]}")
                        break
                if _strides_differ(e, a):
                    counts["differ"] += 1
                    shapes = [tuple(t.shape) for t in tensors]
                    lines.append(f"DIFFER {name}[{number}] output {index}: eager {e.stride()}, ember {a.stride()} "
                                 f"(shape {tuple(e.shape)}; inputs {shapes}; compiled {compiled})")
                    break
        print(f"{name}: {counts}", file=sys.stderr, flush=True)
    text = "\n".join(lines + [str(counts)])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
