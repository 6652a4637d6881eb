"""Logs, while loops, isinstance, device handling (CUDA part runs only where CUDA exists)."""
import pytest
import torch
from torch import nn

from ember.debug import logs

from .test_functions import assert_same, check


def test_while_loop_and_isinstance(compile_fn):
    def f(x, items):
        n = 0
        while x.shape[0] > 1 and n < 3:
            x = x[: x.shape[0] // 2] * 2
            n += 1
        tensors = [t for t in items if isinstance(t, torch.Tensor)]
        return x, sum(tensors), n, isinstance(items, list)
    check(compile_fn, f, torch.randn(8, 2), [torch.ones(2), 3, torch.ones(2)])


def test_logs_channels(compile_fn, capsys):
    def f(x, k):
        return x * k
    logs.set_logs("graph,guards,recompiles")
    try:
        captured = compile_fn(f)
        captured(torch.randn(2), 2)
        captured(torch.randn(2), 3)
    finally:
        logs.set_logs("")
    err = capsys.readouterr().err
    assert "[ember:graph]" in err and "[ember:guards]" in err and "L['k'] == 2" in err
    assert "[ember:recompiles]" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_devices_and_transfers(compile_fn):
    def f(x, w):
        y = (x.cuda() @ w).cpu()
        return y + torch.ones(y.shape, device=y.device), torch.zeros(2, device=w.device)

    captured = check(compile_fn, f, torch.randn(3, 4), torch.randn(4, 2, device="cuda"))
    graph = captured.events[0].graph
    assert [str(n.meta.device) for n in graph.call_nodes() if n.meta is not None][0].startswith("cuda")
    model = nn.Linear(4, 4).cuda()
    from ember.capture import compile_function
    compiled = compile_function(model, backend=lambda g, ex: g.as_callable())
    x = torch.randn(2, 4, device="cuda")
    assert_same(compiled(x), model(x))
    assert_same(compiled(x.cpu().cuda()), model(x))
    assert len(compiled.events) == 1
