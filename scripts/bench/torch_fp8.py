"""FP8 linear layers for the PyTorch baselines (issue 12): what a PyTorch
user without Transformer Engine runs, torch._scaled_mm with per-tensor
current scaling, e4m3 weights and activations, e5m2 output gradients, fp32
scales (amax / largest value), bf16 outputs; the same recipe as mtrain's
`train.fp8_scaling: tensor` (mtrain rounds its scales to powers of two).

fp8_linears(model) swaps every nn.Linear inside the decoder layers for one
that multiplies in FP8 (the embedding and output head stay as they are).
As a script: the FP8 and bf16 GEMM rates at the 8B-shaped stack's shapes.

usage: torch_fp8.py [TOKENS HIDDEN FFN HEADS KV_HEADS]   (default 8192 4096 14336 32 8)
"""
import json
import sys
import time

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantise(t, dtype):
    """t in dtype with a per-tensor scale, and the scale that undoes it"""
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype), scale.reciprocal()


def mm(a, a_inv, b_t, b_inv, fast=False):
    """a [M, K] row-major times b_t^T where b_t is [N, K] row-major (so b is column-major, as _scaled_mm wants);
    fast: the tensor cores' fast accumulation (torchao's default for the forward GEMM, as mtrain's)"""
    return torch._scaled_mm(a, b_t.t(), scale_a=a_inv, scale_b=b_inv, out_dtype=torch.bfloat16, use_fast_accum=fast)


class Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = quantise(x2, E4M3)
        wq, ws = quantise(w, E4M3)
        ctx.save_for_backward(xq, xs, wq, ws)
        ctx.shape = x.shape
        return mm(xq, xs, wq, ws, fast=True).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        xq, xs, wq, ws = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        gq, gs = quantise(g2, E5M2)
        dx = mm(gq, gs, wq.t().contiguous(), ws)                  # [N, M] @ [M, K]
        dw = mm(gq.t().contiguous(), gs, xq.t().contiguous(), xs)  # [M, N] @ [N, K]
        return dx.reshape(ctx.shape), dw.float()


class Fp8Linear(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.weight = lin.weight

    def forward(self, x):
        return Fp8Matmul.apply(x.to(torch.bfloat16), self.weight.to(torch.bfloat16))


def fp8_linears(model):
    for layer in model.model.layers:
        for name, mod in list(layer.named_modules()):
            for child_name, child in list(mod.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(mod, child_name, Fp8Linear(child))
    return model


def rate(f, flops, reps=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / reps
    return flops / s / 1e12


if __name__ == "__main__":
    N, C, F, H, KV = map(int, sys.argv[1:6]) if len(sys.argv) > 5 else (8192, 4096, 14336, 32, 8)
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        sys.exit(0)
    D = C // H
    shapes = {"qkv": (C, (H + 2 * KV) * D), "o": (C, C), "gate_up": (C, 2 * F), "down": (F, C)}
    for name, (K, M) in shapes.items():
        x = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantise(x, E4M3)
        wq, ws = quantise(w, E4M3)
        flops = 2.0 * N * K * M
        bf16 = rate(lambda: x @ w.t(), flops)
        fp8 = rate(lambda: mm(xq, xs, wq, ws), flops)
        fast = rate(lambda: mm(xq, xs, wq, ws, fast=True), flops)
        print(json.dumps({"gemm": name, "M": N, "K": K, "N": M, "bf16_tflops": round(bf16, 1),
                          "fp8_tflops": round(fp8, 1), "fp8_fast_accum_tflops": round(fast, 1),
                          "ratio": round(fp8 / bf16, 3), "ratio_fast_accum": round(fast / bf16, 3),
                          "torch": torch.__version__}))
