"""A zoo model set up for a training step on the GPU, as the harness runs it (shared by the
gpu_train_*profile.py and gpu_host_profile.py diagnosis scripts; the harness directory must be
on sys.path)."""
from __future__ import annotations

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
