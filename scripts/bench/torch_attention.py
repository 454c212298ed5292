"""Causal GQA attention alone, forward + backward, in bf16 through every
PyTorch SDPA backend this build of PyTorch has (flash, cuDNN, efficient,
math), on the GPU: what mtrain's attention is measured against (issue 9).
GQA without repeating kv heads where the backend takes enable_gqa, else the
kv heads are expanded (that copy is part of the timed step, as a user pays
it). Prints one JSON object per backend.

usage: torch_attention.py B HEADS KV_HEADS SEQ HEAD_DIM [REPEATS]
TFLOP/s counts the causal half: forward 4*B*H*T*T*D/2, backward 2.5x forward.
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

B, H, KV, T, D = map(int, sys.argv[1:6])
REPEATS = int(sys.argv[6]) if len(sys.argv) > 6 else 10
dev = "cuda"
torch.manual_seed(0)
q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, KV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, KV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
dout = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)
fwd_flops = 4.0 * B * H * T * T * D / 2
try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
except ImportError:  # older PyTorch: no backend selection
    backends, sdpa_kernel = {"default": None}, None


def run(gqa):
    if gqa:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        r = H // KV
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True)
    o.backward(dout)


def timed(gqa):
    run(gqa)  # warm-up; raises if the backend cannot take these inputs
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        q.grad = k.grad = v.grad = None
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(gqa)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


for name, be in backends.items():
    row = {"backend": name, "torch": torch.__version__, "B": B, "H": H, "KV": KV, "T": T, "D": D}
    for gqa in (True, False):
        try:
            if be is None:
                s = timed(gqa)
            else:
                with sdpa_kernel(be):
                    s = timed(gqa)
            row.pop("error", None)
            row.update({"gqa_native": gqa, "fwd_bwd_ms": round(1e3 * s, 3),
                        "tflops": round(3.5 * fwd_flops / s / 1e12, 1)})
            break
        except (RuntimeError, TypeError) as e:  # this backend cannot take these inputs (or no enable_gqa)
            row["error"] = str(e).splitlines()[0][:160]
    print(json.dumps(row), flush=True)
