"""PyTorch baseline for `make bench`: forward + backward of Hugging Face's
MixtralSparseMoeBlock (router, top-k, experts) on random hidden states, fp32,
same threads. Prints one JSON object.

usage: torch_moe_step.py HIDDEN MOE_FFN EXPERTS TOP_K TOKENS STEPS
"""
import json
import os
import statistics
import sys
import time

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

C, FM, E, K, N, STEPS = map(int, sys.argv[1:7])
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
torch.manual_seed(0)
cfg = MixtralConfig(hidden_size=C, intermediate_size=FM, num_local_experts=E, num_experts_per_tok=K)
block = MixtralSparseMoeBlock(cfg).float()
x = torch.rand(1, N, C) * 2 - 1
x.requires_grad_(True)
g = torch.rand(1, N, C) * 2 - 1


def step():
    block.zero_grad(set_to_none=True)
    x.grad = None
    out, _ = block(x)
    out.backward(g)


step()
times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
sec = statistics.median(times)
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "step_s": round(sec, 5),
                  "tokens_per_s": round(N / sec, 1)}))
