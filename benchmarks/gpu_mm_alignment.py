"""Does a matmul whose size is not a multiple of 8 run slower in cuBLAS, and does padding help?
(GPU diagnosis, not a test.)   python benchmarks/gpu_mm_alignment.py

GPT-2's LM head is x (8192 x 768) @ wte^T with vocab 50257: the output's row stride (50257
bf16 elements) is not 16-byte aligned.  Times F.linear as eager runs it against the same product
with the weight padded to 50264 rows (result sliced back), bf16, and reports the TFLOP/s.

Then the LM head's training step (forward and both gradients, whose products have K = 50257 and
a transposed M = 50257) compiled by ember against eager: gradients compared in fp32 (TF32 off),
times in bf16.
"""
import torch
import torch.nn.functional as F


def bench(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    torch.manual_seed(0)
    for m, k, n in ((8192, 768, 50257), (8192, 1024, 32000), (8192, 768, 2304)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        padded_n = -(-n // 8) * 8
        w_pad = torch.zeros(padded_n, k, device="cuda", dtype=torch.bfloat16)
        w_pad[:n] = w
        flops = 2 * m * k * n
        plain = bench(lambda: F.linear(x, w))
        pad_only = bench(lambda: F.linear(x, w_pad)[:, :n])
        pad_each_call = bench(lambda: F.linear(x, F.pad(w, (0, 0, 0, padded_n - n)))[:, :n])
        pad_and_copy = bench(lambda: F.linear(x, w_pad)[:, :n].contiguous())
        same = torch.equal(F.linear(x, w), F.linear(x, w_pad)[:, :n])
        print(f"{m}x{k}x{n}: plain {plain:.3f} ms ({flops / plain / 1e9:.0f} TFLOP/s), padded weight "
              f"{pad_only:.3f} ms, pad per call {pad_each_call:.3f} ms, padded + contiguous copy "
              f"{pad_and_copy:.3f} ms; bitwise equal: {same}", flush=True)

    lm_head_training()


def lm_head_training(m: int = 4096, k: int = 768, vocab: int = 50257) -> None:
    import ember

    def head(x, w):
        return F.linear(x, w)
    compiled = ember.compile(head)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(vocab, k, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(m, vocab, device="cuda", dtype=dtype)
        results = {}
        for label, fn in (("eager", head), ("ember", compiled)):
            out = fn(x, w)
            grads = torch.autograd.grad(out, (x, w), g)
            results[label] = (out, *grads)
            results[label + " ms"] = bench(lambda fn=fn: torch.autograd.grad(fn(x, w), (x, w), g))
        errors = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                  for a, b in zip(results["ember"], results["eager"])]
        print(f"LM head training {m}x{k}x{vocab} {dtype}: eager {results['eager ms']:.3f} ms, ember "
              f"{results['ember ms']:.3f} ms; max relative error out/grad_x/grad_w "
              + "/".join(f"{e:.1e}" for e in errors), flush=True)


if __name__ == "__main__":
    main()
