"""PyTorch peer of the MoE GPU benchmarks (scripts/bench/moe_gpu.sh): one training
step (forward, backward, AdamW) of Hugging Face's MixtralForCausalLM or
DeepseekV3ForCausalLM built from an mtrain recipe's model section
(scripts/bench/shapes/), what a PyTorch user runs: fp32 weights, gradients and
AdamW state, torch.autocast(bfloat16), SDPA attention, fused AdamW (on CUDA),
eager or torch.compile. The experts run through transformers' experts
implementations (eager: a loop over experts; batched_mm; grouped_mm:
torch._grouped_mm); EXPERTS=fastest times each for a few steps and keeps the
fastest. Under autocast with fp32 weights, transformers 5's grouped_mm experts
run in fp32 (torch._grouped_mm is not autocast-enabled, and the input is cast
to the weights' dtype), so eager's bf16 loop usually wins; the bf16 grouped
GEMM is torch_moe_layer.py's, the MoE layer alone. Prints one JSON object: median step, tokens/s, the allocator's peak
memory, and one step's kernel launches and host synchronisations.

usage: torch_moe_model_step.py RECIPE STEPS
environment: DEVICE=cuda|cpu, COMPILE=0|1, EXPERTS=fastest|eager|batched_mm|grouped_mm
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_moe_common import count_launches_and_syncs, hf_config, recipe_model  # noqa: E402

RECIPE, STEPS = sys.argv[1], int(sys.argv[2])
DEVICE = os.environ.get("DEVICE", "cuda")
COMPILE = os.environ.get("COMPILE", "0") == "1"
EXPERTS = os.environ.get("EXPERTS", "fastest")
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
torch.manual_seed(0)
m, t = recipe_model(RECIPE)
B, T, V = int(t.get("micro_batch", 1)), int(t["seq_len"]), m["vocab_size"]
cfg = hf_config(m, T)
cfg._attn_implementation = "sdpa"
if m["arch"] == "mixtral":
    from transformers import MixtralForCausalLM as Model
else:
    from transformers import DeepseekV3ForCausalLM as Model
with torch.device(DEVICE):  # initialised where it runs: a host init of billions of weights takes minutes
    model = Model(cfg).float()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        **({"fused": True} if DEVICE == "cuda" else {}))
batch = torch.randint(0, V, (B, T + 1), device=DEVICE)
x, y = batch[:, :T], batch[:, 1:]
fwd = torch.compile(model) if COMPILE else model


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = fwd(input_ids=x)
        loss = F.cross_entropy(out.logits.reshape(-1, V).float(), y.reshape(-1))
        aux = getattr(out, "aux_loss", None)  # Mixtral's balance loss (output_router_logits)
        if aux is not None:
            loss = loss + cfg.router_aux_loss_coef * aux
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def timed(n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        loss = step()  # .item() waits for the device
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loss


def use(impl):
    model.set_experts_implementation(impl)
    if COMPILE:
        torch._dynamo.reset()


tried = {}
if EXPERTS == "fastest":
    for impl in ("grouped_mm", "eager", "batched_mm"):
        # batched_mm gathers each routed token's expert weights: past a few GiB it cannot be the fastest
        need = B * T * m["experts_per_token"] * m["hidden_size"] * m["moe_intermediate_size"] * 2
        if impl == "batched_mm" and need > 8 * 2**30:
            tried[impl] = "not tried: gathers %.0f GiB of weights per matrix" % (need / 2**30)
            continue
        try:
            use(impl)
            step()  # warm-up (and compilation)
            tried[impl] = round(timed(2)[0], 4)
        except Exception as e:  # an implementation this torch or device lacks, or memory
            tried[impl] = "failed: %s" % str(e).splitlines()[0][:120]
            opt.zero_grad(set_to_none=True)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    ok = {k: v for k, v in tried.items() if isinstance(v, float)}
    if not ok:
        raise SystemExit("torch_moe_model_step: no experts implementation ran: %s" % tried)
    impl = min(ok, key=ok.get)
else:
    impl = EXPERTS
use(impl)
step()
step()
if DEVICE == "cuda":
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
step_s, loss = timed(STEPS)
peak = torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else 0
launches, syncs = count_launches_and_syncs(step, DEVICE)
print(json.dumps({"device": DEVICE, "arch": m["arch"], "precision": "bf16 autocast", "fused_adamw": DEVICE == "cuda",
                  "compile": COMPILE, "attn": "sdpa", "experts": impl, "experts_tried_s": tried,
                  "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads(),
                  "torch": torch.__version__, "transformers": transformers.__version__, "tokens": B * T,
                  "step_s": round(step_s, 4), "tokens_per_s": round(B * T / step_s, 2), "peak_mem_mib": round(peak, 1),
                  "launches_per_step": launches, "syncs_per_step": syncs, "final_loss": round(loss, 4)}))
