"""An HF Mixtral export of an mtrain checkpoint loads in transformers'
MixtralForCausalLM with identical weights and gives the same loss on a batch
as mtrain on the exported weights (tolerance 1e-5 relative). mtrain reads
the export as a Hugging Face model directory, the way model.init_from does.

usage: mixtral_export.py DRIVER RECIPE STEP_DIR HF_DIR WORKDIR
"""
import glob
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import MixtralForCausalLM

import ref_common
from ref_common import report

DRIVER, RECIPE, STEP, HF, WORK = sys.argv[1:6]

model = MixtralForCausalLM.from_pretrained(HF, torch_dtype=torch.float32).eval()
saved = {}
for f in glob.glob(os.path.join(STEP, "rank-*.safetensors")):
    saved.update({k: v for k, v in load_file(f).items() if not k.startswith("optimizer.")})
hf = model.state_dict()
diff = [k for k in saved if k not in hf or not torch.equal(hf[k], saved[k])]
report("mixtral_export_identical_weights", not diff and len(saved) == len(hf),
       f"{len(saved)} checkpoint tensors, {len(hf)} in transformers, differing or missing: {diff[:3]}")

cfg = model.config
T, B = 16, 4
rng = np.random.default_rng(3)
batch = rng.integers(cfg.vocab_size, size=(1, B, T + 1)).astype("<i4")
os.makedirs(WORK, exist_ok=True)
batch.tofile(os.path.join(WORK, "batch.i32"))
subprocess.run([DRIVER, "grad", RECIPE, HF, os.path.join(WORK, "batch.i32"), WORK],
               check=True)
ours = float(open(os.path.join(WORK, "loss.txt")).read())
x = torch.from_numpy(batch[0, :, :T]).long()
y = torch.from_numpy(batch[0, :, 1:]).long()
with torch.no_grad():
    theirs = F.cross_entropy(model(input_ids=x).logits.reshape(-1, cfg.vocab_size), y.reshape(-1)).item()
e = abs(ours - theirs) / abs(theirs)
report("mixtral_export_same_loss", e <= 1e-5, f"mtrain {ours:.8f} transformers {theirs:.8f} rel err {e:.3g}")
sys.exit(1 if ref_common.failures else 0)
