"""Which attention kernels does the re-run of SDPA in ember's backward use?  (GPU diagnosis.)"""
import torch
import torch.nn.functional as F

from ember.autodiff.extern_rules import AutogradBackward, _Slot

torch.manual_seed(0)
base = [torch.randn(8, 512, 768, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
q, k, v, g = (b.as_strided((8, 12, 512, 64), (393216, 64, 768, 1)) for b in base)
template = ((_Slot(0), _Slot(1), _Slot(2)), {"attn_mask": None, "dropout_p": 0.0, "scale": 0.125, "is_causal": False})
helper = AutogradBackward(F.scaled_dot_product_attention, template, (0,), (0, 1, 2))
for label, fn in [("helper", lambda: helper(g, q, k, v)),
                  ("eager", lambda: torch.autograd.grad(F.scaled_dot_product_attention(
                      q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_(),
                      scale=0.125), (), g) if False else None)]:
    if label == "eager":
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        fn = lambda: torch.autograd.grad(F.scaled_dot_product_attention(qq, kk, vv, scale=0.125), (qq, kk, vv), g)  # noqa
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print("----", label)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=90))
with torch.no_grad():
    helper(g, q, k, v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        helper(g, q, k, v)
        torch.cuda.synchronize()
print("---- helper under no_grad (as in a compiled backward)")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=90))
