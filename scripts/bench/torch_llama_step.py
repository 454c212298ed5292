"""PyTorch baseline for `make bench`: one training step (forward, backward,
AdamW) of Hugging Face's LlamaForCausalLM with the same shape as
bench_train, fp32, on CPU with the same thread count or on the GPU.
Prints one JSON object.

usage: torch_llama_step.py LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB MICRO_BATCH SEQ STEPS
environment: DEVICE=cpu|cuda, TF32=0|1 (matmuls on TF32 tensor cores),
             ATTN=eager|sdpa (attention implementation)
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
model = LlamaForCausalLM(cfg).float().to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
batch = torch.randint(0, V, (B, T + 1), device=DEVICE)
x, y = batch[:, :T], batch[:, 1:]


def step():
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(input_ids=x).logits.reshape(-1, V), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


step()  # warm-up
times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t0)
step_s = statistics.median(times)
print(json.dumps({"device": DEVICE, "tf32": TF32, "attn": cfg._attn_implementation, "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads(),
                  "torch": torch.__version__, "step_s": round(step_s, 4), "tokens_per_s": round(B * T / step_s, 2),
                  "final_loss": round(loss, 4)}))
