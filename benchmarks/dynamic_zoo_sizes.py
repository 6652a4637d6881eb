"""Dynamic shapes on the zoo's transformer models, CPU (not a test: the zoo lives in ../shared/bench).

    python3 benchmarks/dynamic_zoo_sizes.py [gpt2,llama_small,bert_base,nanogpt]

Each model (tiny config, eval, no_grad) is compiled once with ``dynamic=True`` and called at
several (batch, sequence) sizes with new random inputs; each output is compared with eager's, and
the number of compiles is printed (1 means no size was pinned by a guard).
"""
from __future__ import annotations

import os
import sys
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ember  # noqa: E402
from zoo_capture import DEFAULT_ZOO, load_zoo  # noqa: E402

SIZES = [(2, 16), (3, 16), (2, 9), (4, 23), (5, 7)]


def resized(example: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """A new input like ``example`` with (batch, seq) leading dims: token ids stay in range."""
    shape = (batch, seq, *example.shape[2:]) if example.dim() >= 2 else (batch,)
    if example.dtype.is_floating_point:
        return torch.randn(shape, dtype=example.dtype)
    if example.dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    high = int(example.max()) + 1
    return torch.randint(0, high, shape, dtype=example.dtype) if high > 1 else torch.ones(shape, dtype=example.dtype)


def main_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)):
        return main_tensor(output[0])
    return main_tensor(next(iter(output.values())))


def check(zoo: Any, name: str) -> None:
    spec = zoo.MODELS[name]
    bench = spec.build(batch_size=spec.tiny_bs, seq_len=spec.tiny_seq, size="tiny", device="cpu")
    model, example = bench.model.eval(), bench.example_inputs
    ember.reset()
    compiled = ember.compile(model, dynamic=True, options={"fallback": "error"})
    worst = 0.0
    with torch.no_grad():
        for batch, seq in SIZES:
            if isinstance(example, dict):
                inputs = {k: resized(v, batch, seq) for k, v in example.items()}
                actual, expected = compiled(**inputs), model(**inputs)
            else:
                inputs = [resized(v, batch, seq) for v in example]
                actual, expected = compiled(*inputs), model(*inputs)
            worst = max(worst, (main_tensor(actual) - main_tensor(expected)).abs().max().item())
    print(f"{name:<14} sizes {SIZES}: compiles {len(compiled._ember_captured.events)}, max error {worst:.2e}")


if __name__ == "__main__":
    zoo = load_zoo(DEFAULT_ZOO)
    for model_name in (sys.argv[1] if len(sys.argv) > 1 else "gpt2,llama_small,bert_base,nanogpt").split(","):
        check(zoo, model_name)
