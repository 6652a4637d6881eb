"""A zoo model set up for a training step on the GPU, as the harness runs it (shared by the
gpu_train_*profile.py and gpu_host_profile.py diagnosis scripts; the harness directory must be
on sys.path)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def zoo_training(name: str, dtype: torch.dtype = torch.bfloat16, device: str = "cuda",
                 size: str = "full") -> tuple[Any, Any, tuple, dict]:
    """(model, bench, call_args, call_kwargs): the harness's train batch, the model in ``dtype`` and
    train mode on CUDA, floating inputs cast to ``dtype``; ``bench.loss_fn`` is the harness's loss."""
    import models as zoo
    spec = zoo.MODELS[name]
    torch.manual_seed(0)
    bench = spec.build(batch_size=spec.train_bs, seq_len=spec.seq_len, size=size, device=device)
    model = bench.model.to(device=device, dtype=dtype).train()

    def cast(t: Any) -> Any:
        return t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t
    inputs = bench.example_inputs
    if isinstance(inputs, dict):
        return model, bench, (), {k: cast(v) for k, v in inputs.items()}
    return model, bench, tuple(cast(v) for v in inputs), {}


def phased_step(model: Any, fn: Any, bench: Any, call_args: tuple, call_kwargs: dict,
                mark: Callable[[], None] | None = None) -> tuple[Callable[..., None], dict[str, float]]:
    """(step, phases): ``step(timed)`` runs one harness training step (``mark()`` first when given,
    then zero_grad, forward, loss, backward) and, when timed, adds each phase's host time in us to
    ``phases`` (reset it in place to start over)."""
    names = (("mark",) if mark is not None else ()) + ("zero_grad", "forward", "loss", "backward")
    phases = dict.fromkeys(names, 0.0)

    def step(timed: bool = False) -> None:
        marks = [time.perf_counter()]
        if mark is not None:
            mark()
            marks.append(time.perf_counter())
        model.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        out = fn(*call_args, **call_kwargs)
        marks.append(time.perf_counter())
        loss = bench.loss_fn(out)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        if timed:
            for key, a, b in zip(names, marks, marks[1:]):
                phases[key] += (b - a) * 1e6
    return step, phases
