"""PyTorch baseline for `make bench`: one training step (forward, backward,
AdamW) of Hugging Face's LlamaForCausalLM with the same shape as
bench_train, on CPU with the same thread count or on the GPU. Weights,
gradients and AdamW state are fp32 in every mode (as in mtrain); bf16 is
torch.autocast(bfloat16) around forward and loss, the mixed precision a
PyTorch user runs. Prints one JSON object (peak_mem_mib: the CUDA caching
allocator's peak over the timed steps).

usage: torch_llama_step.py LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ STEPS
environment: DEVICE=cpu|cuda, TF32=0|1 (fp32 matmuls on TF32 tensor cores),
             ATTN=eager|sdpa (attention implementation), PRECISION=fp32|bf16|fp8 (fp8: bf16 autocast, and
             the decoder layers' linears multiply in FP8 through torch._scaled_mm, scripts/bench/torch_fp8.py),
             FUSED=0|1 (AdamW's fused CUDA kernel), COMPILE=0|1 (torch.compile the model)
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

L, C, H, KV, FF, V, B, T, STEPS = map(int, sys.argv[1:10])
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=KV, max_position_embeddings=T, tie_word_embeddings=False)
DEVICE = os.environ.get("DEVICE", "cpu")
TF32 = os.environ.get("TF32", "0") == "1"
torch.backends.cuda.matmul.allow_tf32 = TF32
torch.backends.cudnn.allow_tf32 = TF32
cfg._attn_implementation = os.environ.get("ATTN", "eager")
PRECISION = os.environ.get("PRECISION", "fp32")
FUSED = os.environ.get("FUSED", "0") == "1"
COMPILE = os.environ.get("COMPILE", "0") == "1"
model = LlamaForCausalLM(cfg).float().to(DEVICE)
if PRECISION == "fp8":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_fp8 import fp8_linears
    fp8_linears(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        **({"fused": True} if FUSED else {}))
fwd = torch.compile(model) if COMPILE else model
batch = torch.randint(0, V, (B, T + 1), device=DEVICE)
x, y = batch[:, :T], batch[:, 1:]


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=PRECISION in ("bf16", "fp8")):
        loss = F.cross_entropy(fwd(input_ids=x).logits.reshape(-1, V).float(), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


step()  # warm-up (and compilation)
step()
if DEVICE == "cuda":
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    loss = step()  # .item() waits for the device
    times.append(time.perf_counter() - t0)
step_s = statistics.median(times)
peak = torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else 0
print(json.dumps({"device": DEVICE, "tf32": TF32, "precision": PRECISION, "fused_adamw": FUSED, "compile": COMPILE,
                  "attn": cfg._attn_implementation, "params": sum(p.numel() for p in model.parameters()),
                  "threads": torch.get_num_threads(), "torch": torch.__version__, "step_s": round(step_s, 4),
                  "tokens_per_s": round(B * T / step_s, 2), "peak_mem_mib": round(peak, 1),
                  "final_loss": round(loss, 4)}))
