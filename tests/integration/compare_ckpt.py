"""Compare the parameters of two mtrain checkpoints saved with any layouts.

Each step directory's manifest says which file holds which shard of which
tensor; the shards are assembled into global tensors and compared tensor by
tensor: error = max|a - b| / max|b|. Prints the worst tensor and exits 1 if
it is above the tolerance.

usage: compare_ckpt.py STEP_DIR_A STEP_DIR_B TOL
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def load_params(step_dir):
    man = json.load(open(os.path.join(step_dir, "manifest.json")))
    files = {}
    pieces = {}
    for e in man["tensors"]:
        if e["name"].startswith("optimizer."):
            continue
        if e["file"] not in files:
            files[e["file"]] = load_file(os.path.join(step_dir, e["file"]))
        # block `part` of `parts` along the split dim (older manifests: tp_rank of tp);
        # kv-head blocks shared by several TP ranks are stored once per sharer
        part = e.get("part", e["tp_rank"])
        pieces.setdefault(e["name"], {})[part] = (part, e["shard"], files[e["file"]][e["name"]])
    out = {}
    for name, blocks in pieces.items():
        parts = sorted(blocks.values(), key=lambda p: p[0])
        shard = parts[0][1]
        if shard == "replicated":
            out[name] = parts[0][2]
        else:
            out[name] = np.concatenate([p[2] for p in parts], axis=0 if shard == "tp_rows" else 1)
    return out


a, b, tol = load_params(sys.argv[1]), load_params(sys.argv[2]), float(sys.argv[3])
if sorted(a) != sorted(b):
    print(f"tensor sets differ: {sorted(set(a) ^ set(b))[:5]}")
    sys.exit(1)
worst, worst_name = 0.0, ""
for name in a:
    if a[name].shape != b[name].shape:
        print(f"{name}: shape {a[name].shape} vs {b[name].shape}")
        sys.exit(1)
    err = float(np.abs(a[name].astype(np.float64) - b[name]).max() / max(np.abs(b[name]).max(), 1e-30))
    if err > worst:
        worst, worst_name = err, name
print(f"worst {worst_name} max rel err {worst:.3g} (tol {tol:g})")
sys.exit(0 if worst <= tol else 1)
