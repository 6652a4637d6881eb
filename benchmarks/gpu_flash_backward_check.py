"""The CUDA attention backward through eager's fused kernels called directly
(extern_rules._fused_attention_backward): gradients vs eager's, and which backward op ran, with
eager's default backend choice (cuDNN on an H100 with torch 2.11) and with flash forced; then
masked attention (a causal bool mask as Hugging Face's GPT-2 and Llama pass it, a padding mask, a
float bias) with eager's default choice and with memory-efficient attention forced.

    python benchmarks/gpu_flash_backward_check.py        (GPU)
"""
import torch
import torch.nn.functional as F

import ember
from ember.autodiff import extern_rules as er


def main() -> None:
    calls = {"flash": 0, "cudnn": 0, "efficient": 0}

    def counting(name, real):
        def op(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return op
    er._FLASH_BACKWARD = counting("flash", er._FLASH_BACKWARD)
    er._CUDNN_BACKWARD = counting("cudnn", er._CUDNN_BACKWARD)
    er._EFFICIENT_BACKWARD = counting("efficient", er._EFFICIENT_BACKWARD)
    check_masked(calls, "masked default")
    torch.backends.cuda.enable_cudnn_sdp(False)
    check_masked(calls, "masked, cuDNN off")
    torch.backends.cuda.enable_cudnn_sdp(True)
    for forced in ("default", "flash"):
        if forced == "flash":
            torch.backends.cuda.enable_cudnn_sdp(False)
            torch.backends.cuda.enable_mem_efficient_sdp(False)
        check(calls, forced)


def check_masked(calls: dict, label: str) -> None:
    torch.manual_seed(0)
    B, H, D = 2, 4, 64
    for dtype in (torch.bfloat16, torch.float16):
        for L in (128, 100):
            causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device="cuda"))
            padding = torch.ones(B, 1, 1, L, dtype=torch.bool, device="cuda")
            padding[1, ..., L // 2:] = False
            masks = {"causal_bool_b11": causal.expand(B, 1, L, L), "causal_bool_2d": causal,
                     "padding_bool": padding, "float_bias": torch.randn(1, H, L, L, device="cuda", dtype=dtype)}
            for name, mask in masks.items():
                w = torch.nn.Linear(D * H, 3 * D * H, device="cuda", dtype=dtype)

                def fn(x, m):
                    q, k, v = w(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                    return out.transpose(1, 2).reshape(B, L, H * D)
                x = torch.randn(B, L, H * D, device="cuda", dtype=dtype, requires_grad=True)
                g = torch.randn(B, L, H * D, device="cuda", dtype=dtype)
                q = torch.randn(B, H, L, D, device="cuda", dtype=dtype, requires_grad=True)
                choice = torch.nn.attention.SDPBackend(er._SDP_CHOICE(q, q, q, mask, 0.0, False)).name
                compare(calls, f"{label}: {dtype} L={L} {name} eager picks {choice};", fn, (x, mask), g, w)


def check(calls: dict, label: str) -> None:
    torch.manual_seed(0)
    B, H, L, D = 2, 4, 128, 64
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            for same in (False, True):
                w = torch.nn.Linear(D * H, 3 * D * H, device="cuda", dtype=dtype)

                def fn(x):
                    q, k, v = w(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
                    if same:
                        k = v = q
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return out.transpose(1, 2).reshape(B, L, H * D)
                x = torch.randn(B, L, H * D, device="cuda", dtype=dtype, requires_grad=True)
                g = torch.randn(B, L, H * D, device="cuda", dtype=dtype)
                compare(calls, f"{label}: {dtype} causal={causal} q_is_k_is_v={same}", fn, (x,), g, w)


def compare(calls: dict, label: str, fn, args: tuple, g: torch.Tensor, w: torch.nn.Linear) -> None:
    """ember's gradients of x and w against eager's, and which backward ops ember's step ran."""
    x = args[0]
    before = dict(calls)
    ember.compile(fn, options={"fallback": "error"})(*args).backward(g)
    grads = [t.grad.clone() for t in (x, w.weight, w.bias)]
    for t in (x, w.weight, w.bias):
        t.grad = None
    fn(*args).backward(g)
    rel = [((a.float() - t.grad.float()).norm() / t.grad.float().norm()).item()
           for a, t in zip(grads, (x, w.weight, w.bias))]
    ran = {k: calls[k] - before[k] for k in calls}
    print(f"{label} backward ops {ran} rel err x {rel[0]:.1e} w {rel[1]:.1e} b {rel[2]:.1e}")
    for t in (x, w.weight, w.bias):
        t.grad = None


if __name__ == "__main__":
    main()
