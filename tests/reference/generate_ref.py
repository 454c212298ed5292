"""mtrain generate / eval against Hugging Face transformers on an exported
model (fp32 CPU):
  * greedy decoding gives the same 32 tokens as generate(do_sample=False);
    a difference is accepted only after a near-tie (top-2 logit gap in
    transformers under 1e-5), where fp32 rounding may pick either token;
  * eval --dump's per-token losses equal transformers' within 1e-5;
  * the KV-cache decoder's logits (generate --json) equal the full forward's
    (eval --dump over the same sequence) within 1e-5, and transformers' too.

usage: generate_ref.py TAG MTRAIN MODEL HF_DIR WORKDIR
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

import ref_common
from ref_common import report

TAG, MTRAIN, MODEL, HF, WORK = sys.argv[1:6]
NEW = 32
os.makedirs(WORK, exist_ok=True)
model = AutoModelForCausalLM.from_pretrained(HF, torch_dtype=torch.float32).eval()
V = model.config.vocab_size
prompt = [int(x) for x in np.random.default_rng(5).integers(0, 256, size=7)]


def mtrain(*args):
    r = subprocess.run([MTRAIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        report(f"{TAG}_mtrain_runs", False, f"mtrain {' '.join(args)}: exit {r.returncode}: {r.stderr[-400:]}")
        sys.exit(1)
    return r.stdout


gen = json.loads(mtrain("generate", MODEL, "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(NEW),
                        "--json", "--json-top", "5", "--stop-id", "-1", "--device", "cpu"))
ours = gen["ids"]
with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW,
                         pad_token_id=0, eos_token_id=None)
theirs = out[0, len(prompt):].tolist()
with torch.no_grad():
    hf_logits = model(torch.tensor([prompt + theirs])).logits[0].double()
first_diff = next((i for i in range(NEW) if i >= len(ours) or ours[i] != theirs[i]), None)
if first_diff is None:
    report(f"{TAG}_greedy_32_tokens_match_hf", len(ours) == NEW, f"{len(ours)} tokens, all equal to transformers'")
else:
    top2 = hf_logits[len(prompt) - 1 + first_diff].topk(2).values
    gap = float(top2[0] - top2[1])
    report(f"{TAG}_greedy_32_tokens_match_hf", gap < 1e-5 and first_diff >= 8,
           f"first difference at token {first_diff} (mtrain {ours[first_diff:first_diff + 3]}, transformers "
           f"{theirs[first_diff:first_diff + 3]}); transformers' top-2 gap there {gap:.3g}")

# the full sequence mtrain generated, scored by eval (full forward) and by transformers
seq = prompt + ours
dump_path = os.path.join(WORK, "dump.json")
mtrain("eval", MODEL, "--ids", ",".join(map(str, seq)), "--dump", dump_path, "--top", "5", "--device", "cpu")
dump = json.load(open(dump_path))["positions"]
with torch.no_grad():
    logits = model(torch.tensor([seq])).logits[0].double()
hf_loss = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(seq[1:]), reduction="none")
our_loss = torch.tensor([p["loss"] for p in dump[:-1]], dtype=torch.float64)
e = float((our_loss - hf_loss).abs().max())
report(f"{TAG}_eval_token_losses_match_hf", e <= 1e-5 and len(dump) == len(seq),
       f"{len(seq) - 1} token losses, max |mtrain - transformers| {e:.3g}")

# KV-cache logits (step i predicts token len(prompt)+i) against the full forward's
worst_kv = worst_hf = 0.0
same_top = True
for i, step in enumerate(gen["steps"]):
    full = dump[len(prompt) - 1 + i]
    same_top &= step["top_ids"][0] == full["top_ids"][0]
    a = dict(zip(full["top_ids"], full["top_logits"]))
    for tid, lg in zip(step["top_ids"], step["top_logits"]):
        worst_kv = max(worst_kv, abs(lg - a[tid]) if tid in a else float("inf"))
        worst_hf = max(worst_hf, abs(lg - float(logits[len(prompt) - 1 + i, tid])))
report(f"{TAG}_kv_cache_logits_match_full_forward", worst_kv <= 1e-5 and same_top,
       f"top-5 logits of {len(gen['steps'])} steps: max |kv - full| {worst_kv:.3g}")
report(f"{TAG}_kv_cache_logits_match_hf", worst_hf <= 1e-5, f"max |kv - transformers| {worst_hf:.3g}")
sys.exit(1 if ref_common.failures else 0)
