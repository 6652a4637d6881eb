"""Ops that eager computes as a composite of other ops, each rounding to a bf16/fp16 result:
ember rounds at the same steps, so values are eager's bit for bit.  torch.logsumexp is
amax, then (x - max).exp(), sum, log, + max, each in x's dtype (ATen's logsumexp_out_impl, the
same on CPU and CUDA); computed in float and rounded once, ember's bf16 value differed from eager's
by one rounding in about one row of four (training fuzz seed 20393)."""
import pytest
import torch

import ember

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _assert_compiled(fn, *inputs):
    """One graph of generated kernels, not an eager fallback: the comparison means ember's kernels."""
    report = ember.explain(fn, *inputs)
    assert (report.graph_count, report.break_count) == (1, 0) and report.kernel_count >= 1, str(report)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim,keepdim", [(-1, True), (-1, False), ((0, 1), False), (0, True)])
def test_logsumexp_rounds_each_step_as_eager(device, dtype, dim, keepdim):
    def fn(x):
        return torch.logsumexp(x, dim, keepdim=keepdim)

    compiled = ember.compile(fn, options={"fallback": "error"})
    _assert_compiled(fn, torch.randn(6, 37, device=device, dtype=dtype))
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(6, 37, generator=gen) * 4
        x[0] = float("-inf")            # a row of -inf: eager's max is replaced by 0
        x[1, 5] = float("inf")
        x = x.to(device=device, dtype=dtype)
        torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0,
                                   equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logsumexp_gradient_close_to_eager(dtype):
    compiled = ember.compile(lambda x: torch.logsumexp(x, -1), options={"fallback": "error"})
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(8, 37, generator=gen) * 3
    weight = torch.randn(8, generator=gen).to(dtype)
    x, y = base.to(dtype).requires_grad_(), base.to(dtype).requires_grad_()
    (torch.logsumexp(x, -1) * weight).sum().backward()
    (compiled(y) * weight).sum().backward()
    # eager rounds grad * exp(x - result) at each step; ember's steps differ: within a rounding
    torch.testing.assert_close(y.grad, x.grad, rtol=2 ** -6, atol=2 ** -10)
