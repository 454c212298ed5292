"""PyTorch peer of the MoE layer alone (scripts/bench/moe_gpu.sh): forward + backward of
one MoE FFN built the way torchtitan builds it, from an mtrain recipe's model section:
a linear router, softmax top-k renormalised over the chosen experts (Mixtral) or
sigmoid scores with the expert bias choosing, group-limited to the best topk_group
of n_group groups, weights normalised and scaled (DeepSeek-V3); tokens sorted into
expert-major order by a stable sort, each expert's rows padded to a multiple of
ALIGN (torch._grouped_mm's alignment), the experts' SwiGLU as three
torch._grouped_mm calls on bf16 weights [E, in, out], the outputs weighted by their
gates and scattered back with index_add. Shared experts are not part of the layer
(as in bench_moe). Random bf16 hidden states and output gradient,
micro_batch x seq_len tokens. Prints one JSON object: median seconds, tokens/s,
the allocator's peak, and one pass's kernel launches and host synchronisations.

usage: torch_moe_layer.py RECIPE STEPS
environment: DEVICE=cuda|cpu, COMPILE=0|1 (torch.compile the layer)
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_moe_common import count_launches_and_syncs, recipe_model  # noqa: E402

ALIGN = 16
RECIPE, STEPS = sys.argv[1], int(sys.argv[2])
DEVICE = os.environ.get("DEVICE", "cuda")
COMPILE = os.environ.get("COMPILE", "0") == "1"
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
torch.manual_seed(0)
m, t = recipe_model(RECIPE)
C, E, K = m["hidden_size"], m["num_experts"], m["experts_per_token"]
FM = m.get("moe_intermediate_size") or m["intermediate_size"]
N = int(t.get("micro_batch", 1)) * int(t["seq_len"])
SIGMOID = m.get("moe_score_func", "softmax") == "sigmoid"


class MoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        std = 0.02
        self.router = torch.nn.Parameter(torch.randn(E, C, device=DEVICE, dtype=torch.bfloat16) * std)
        self.w_gate = torch.nn.Parameter(torch.randn(E, C, FM, device=DEVICE, dtype=torch.bfloat16) * std)
        self.w_up = torch.nn.Parameter(torch.randn(E, C, FM, device=DEVICE, dtype=torch.bfloat16) * std)
        self.w_down = torch.nn.Parameter(torch.randn(E, FM, C, device=DEVICE, dtype=torch.bfloat16) * std)
        self.register_buffer("bias", torch.zeros(E, device=DEVICE))

    def route(self, x):
        logits = F.linear(x, self.router).float()
        if not SIGMOID:
            top, idx = logits.topk(K, dim=-1)
            return idx, top.softmax(-1)
        scores = logits.sigmoid()
        choose = scores + self.bias
        G, TG = int(m["moe_n_group"]), int(m["moe_topk_group"])
        if G > 1:
            group = choose.view(N, G, E // G).topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(group).scatter_(1, group.topk(TG, dim=-1)[1], 1.0)
            choose = choose.masked_fill(keep.repeat_interleave(E // G, dim=1) == 0, float("-inf"))
        idx = choose.topk(K, dim=-1)[1]
        w = scores.gather(1, idx)
        return idx, w / w.sum(-1, keepdim=True) * m["moe_routed_scaling"]

    def forward(self, x):
        idx, w = self.route(x)
        flat = idx.reshape(-1)
        counts = torch.bincount(flat, minlength=E)
        padded = (counts + ALIGN - 1) // ALIGN * ALIGN
        # each routed row's place in the padded expert-major buffer; the padding rows read a zero row
        order = flat.argsort(stable=True)
        start = torch.cumsum(padded, 0) - padded
        rank_in_expert = torch.arange(N * K, device=DEVICE) - (torch.cumsum(counts, 0) - counts)[flat[order]]
        dest = start[flat[order]] + rank_in_expert
        total = N * K + E * (ALIGN - 1)  # an upper bound, so no host sync sizes the buffer
        src = torch.full((total,), N, device=DEVICE, dtype=torch.long)
        src[dest] = order // K
        xe = torch.cat([x, x.new_zeros(1, C)])[src]
        offs = torch.cumsum(padded, 0).to(torch.int32)
        h = F.silu(torch._grouped_mm(xe, self.w_gate, offs=offs)) * torch._grouped_mm(xe, self.w_up, offs=offs)
        ye = torch._grouped_mm(h, self.w_down, offs=offs)
        y = ye[dest] * w.reshape(-1)[order].unsqueeze(1).to(ye.dtype)
        return torch.zeros_like(x).index_add_(0, order // K, y)


layer = MoE()
fwd = torch.compile(layer) if COMPILE else layer
x = (torch.rand(N, C, device=DEVICE) * 2 - 1).to(torch.bfloat16).requires_grad_(True)
g = (torch.rand(N, C, device=DEVICE) * 2 - 1).to(torch.bfloat16)


def step():
    layer.zero_grad(set_to_none=True)
    x.grad = None
    fwd(x).backward(g)


def wait():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


step()  # warm-up (and compilation)
step()
wait()
if DEVICE == "cuda":
    torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    step()
    wait()
    times.append(time.perf_counter() - t0)
sec = statistics.median(times)
peak = torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else 0
launches, syncs = count_launches_and_syncs(step, DEVICE)
flops = 6.0 * N * (C * E + 3.0 * K * C * FM)
print(json.dumps({"device": DEVICE, "arch": m["arch"], "impl": "torch._grouped_mm (torchtitan-style)",
                  "compile": COMPILE, "hidden": C, "moe_ffn": FM, "experts": E, "top_k": K, "tokens": N,
                  "torch": torch.__version__, "step_s": round(sec, 5), "tokens_per_s": round(N / sec, 1),
                  "gflops": round(flops / sec / 1e9, 2), "peak_mem_mib": round(peak, 1), "launches_per_layer": launches,
                  "syncs_per_layer": syncs}))
