"""Capture report for the team's model zoo (not a test): does each model capture as ONE graph?

    python3 benchmarks/zoo_capture.py [--models a,b] [--size tiny] [--zoo ../shared/bench/models.py]

For every zoo model (eval mode, torch.no_grad, CPU, eager backend) prints: graphs,
graph breaks (reason @ file:line), graph ops, capture seconds, max abs error
against eager (every tensor of the output, ModelOutput / dict / tuple included),
and whether a second call hits the cache.  Models whose library is missing are
reported as unavailable.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ember.capture import compile_function

DEFAULT_ZOO = os.path.join(HERE, "..", "..", "shared", "bench", "models.py")


def eager_backend(graph, example_inputs):
    return graph.as_callable()


def load_zoo(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("zoo_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo_models"] = module
    spec.loader.exec_module(module)
    return module


def import_torchvision_tolerantly() -> None:
    """PyPI's torchvision wheel is CUDA-linked: on a CPU-only torch its C ops fail to load and
    its fake-op registrations raise at import.  The zoo models need none of those ops, so the
    registrations are skipped during the import (only for this report)."""
    if importlib.util.find_spec("torchvision") is None:
        return
    original = torch.library.register_fake

    def tolerant(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::"):
            return lambda fn=None, *a, **k: fn
        return original(op, *args, **kwargs)

    torch.library.register_fake = tolerant
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError) as error:
        print(f"torchvision unavailable: {error}")
    finally:
        torch.library.register_fake = original


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # HF ModelOutput is an OrderedDict
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in tensors_of(getattr(value, name))]
    return []


def max_error(expected: Any, actual: Any) -> float:
    left, right = tensors_of(expected), tensors_of(actual)
    if type(expected) is not type(actual) or len(left) != len(right):
        return float("inf")
    worst = 0.0
    for a, b in zip(left, right):
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if a.numel():
            worst = max(worst, (a.double() - b.double()).abs().max().item())
    return worst


def call(fn: Any, inputs: Any) -> Any:
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def run_model(zoo: Any, name: str, size: str) -> dict:
    spec = zoo.MODELS[name]
    missing = spec.missing()
    if missing:
        return {"name": name, "status": "unavailable", "detail": ",".join(missing)}
    bench = spec.build(batch_size=spec.tiny_bs if size == "tiny" else spec.infer_bs,
                       seq_len=(spec.tiny_seq if size == "tiny" else spec.seq_len) if spec.seq_len else None,
                       size=size, device="cpu")
    model = bench.model.eval()
    inputs = bench.example_inputs
    with torch.no_grad():
        expected = call(model, inputs)
        captured = compile_function(model, backend=eager_backend)
        started = time.perf_counter()
        actual = call(captured, inputs)
        first_s = time.perf_counter() - started
        n_events = len(captured.events)
        again = call(captured, inputs)
        cache_hit = len(captured.events) == n_events
    events = captured.events
    graphs = [e for e in events if e.graph is not None]
    breaks = [e for e in events if e.break_reason is not None]
    ops = sum(sum(1 for n in e.graph.nodes if n.op == "call") for e in graphs)
    return {
        "name": name, "status": "ok", "graphs": len(graphs), "breaks": len(breaks),
        "break_detail": [f"{e.break_reason} @ {e.break_location}" for e in breaks],
        "ops": ops, "capture_s": sum(e.capture_seconds for e in events), "first_call_s": first_s,
        "max_err": max(max_error(expected, actual), max_error(expected, again)), "cache_hit": cache_hit,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="all")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--zoo", default=DEFAULT_ZOO)
    parser.add_argument("--traceback", action="store_true")
    options = parser.parse_args()
    torch.manual_seed(0)
    import_torchvision_tolerantly()
    zoo = load_zoo(options.zoo)
    names = list(zoo.MODELS) if options.models == "all" else options.models.split(",")
    header = f"{'model':<22} {'graphs':>6} {'breaks':>6} {'ops':>5} {'capture_s':>9} {'max_err':>9} {'cache':>5}"
    print(header)
    print("-" * len(header))
    summary = {"one_graph": 0, "ran": 0}
    for name in names:
        try:
            row = run_model(zoo, name, options.size)
        except Exception as error:  # noqa: BLE001  building or running the model itself failed
            if options.traceback:
                traceback.print_exc()
            print(f"{name:<22} error: {type(error).__name__}: {error}")
            continue
        if row["status"] != "ok":
            print(f"{name:<22} {row['status']} ({row['detail']})")
            continue
        summary["ran"] += 1
        if row["graphs"] == 1 and row["breaks"] == 0 and row["cache_hit"] and row["max_err"] < 1e-4:
            summary["one_graph"] += 1
        print(f"{name:<22} {row['graphs']:>6} {row['breaks']:>6} {row['ops']:>5} {row['capture_s']:>9.2f} "
              f"{row['max_err']:>9.2e} {'hit' if row['cache_hit'] else 'MISS':>5}")
        for detail in row["break_detail"]:
            print(f"    break: {detail}")
    print(f"\n{summary['one_graph']}/{summary['ran']} models captured as one graph, 0 breaks, "
          f"equal to eager, cached")


if __name__ == "__main__":
    main()
