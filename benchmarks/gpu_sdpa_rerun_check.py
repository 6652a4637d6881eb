"""Which attention kernels does ember's backward re-run of SDPA use, against eager's backward?
(GPU diagnosis: `python benchmarks/gpu_sdpa_rerun_check.py`.)"""
import torch
import torch.nn.functional as F

from ember.autodiff.extern_rules import AutogradBackward, _Slot


def profile(label, fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print("----", label)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=90))


torch.manual_seed(0)
base = [torch.randn(8, 512, 768, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
q, k, v, g = (b.as_strided((8, 12, 512, 64), (393216, 64, 768, 1)) for b in base)   # BERT's head views
template = ((_Slot(0), _Slot(1), _Slot(2)), {"attn_mask": None, "dropout_p": 0.0, "scale": 0.125, "is_causal": False})
helper = AutogradBackward(F.scaled_dot_product_attention, template, (0,), (0, 1, 2))
leaves = [t.detach().requires_grad_() for t in (q, k, v)]
profile("ember's re-run", lambda: helper(g, q, k, v))
profile("eager", lambda: torch.autograd.grad(F.scaled_dot_product_attention(*leaves, scale=0.125), leaves, g))
with torch.no_grad():       # as inside a compiled backward
    profile("ember's re-run under no_grad", lambda: helper(g, q, k, v))
