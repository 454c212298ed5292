"""A Hugging Face DeepseekV3 export (`mtrain convert --hf`) of an mtrain
DeepSeek-V3 checkpoint, checked without transformers (4.44 here has no
DeepseekV3; loading in a recent transformers is untested, docs/checkpoints.md):

1. config.json has DeepseekV3Config's keys with the recipe's values.
2. Every checkpoint tensor is in the export under its name: equal, except the
   rotary rows (the last qk_rope_head_dim rows of each q_b_proj / q_proj head
   and of kv_a_proj_with_mqa), which Hugging Face stores interleaved: undoing
   that with transformers' run-time de-interleave (view(d/2, 2).transpose)
   gives mtrain's rows exactly. Independently of any permutation code, the
   rotary q.k of layer 0 computed the original DeepSeek way (complex pairs
   2i, 2i+1 of the exported rows) equals mtrain's rotate_half form on the
   checkpoint rows (1e-5 relative). The MTP layer has embed_tokens and
   shared_head.head copies equal to the main model's; a run without expert
   bias gets zero e_score_correction_bias tensors; nothing else is extra.
3. The export from the run's final weights file is identical; re-exporting
   the Hugging Face directory (config.json read back) gives the same config.
4. mtrain on the export (read as a Hugging Face directory, rotary rows put
   back) gives the same loss as on the checkpoint (ref_driver, equal to 1e-6
   relative); the same file without config.json beside it (read as mtrain's
   layout) does not; one training step with model.init_from of the export and
   of the final weights file logs the same loss.

usage: deepseek_export.py DRIVER RECIPE VARIANT STEP_DIR HF HF_FINAL HF_AGAIN INIT_HF INIT_FILE WORK
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import yaml
from safetensors.torch import load_file

import ref_common
from ref_common import report

DRIVER, RECIPE, VARIANT, STEP, HF, HF_FINAL, HF_AGAIN, INIT_HF, INIT_FILE, WORK = sys.argv[1:11]
name = f"deepseek_export_{VARIANT}"
m = yaml.safe_load(open(RECIPE))["model"]
for k, v in m.items():  # PyYAML (YAML 1.1) reads 1e-6 as a string
    try:
        m[k] = float(v) if isinstance(v, str) else v
    except ValueError:
        pass
if VARIANT == "b":
    m.update(q_lora_rank=0, moe_bias_update_rate=0, tie_embeddings=True)
L, H, DN, R = m["num_layers"], m["num_heads"], m["qk_nope_head_dim"], m["qk_rope_head_dim"]
D = m["mtp_depth"]

# 1. config.json
cfg = json.load(open(os.path.join(HF, "config.json")))
want = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": m["vocab_size"],
    "hidden_size": m["hidden_size"], "intermediate_size": m["intermediate_size"],
    "moe_intermediate_size": m["moe_intermediate_size"], "num_hidden_layers": L, "num_attention_heads": H,
    "num_key_value_heads": H, "n_shared_experts": m["moe_shared_experts"], "n_routed_experts": m["num_experts"],
    "routed_scaling_factor": m["moe_routed_scaling"], "kv_lora_rank": m["kv_lora_rank"],
    "q_lora_rank": m["q_lora_rank"] or None, "qk_rope_head_dim": R, "v_head_dim": m["v_head_dim"],
    "qk_nope_head_dim": DN, "n_group": m["moe_n_group"], "topk_group": m["moe_topk_group"],
    "num_experts_per_tok": m["experts_per_token"], "first_k_dense_replace": m["first_k_dense"],
    "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_nextn_predict_layers": D,
    "rope_theta": m["rope_theta"], "rms_norm_eps": m["norm_eps"], "tie_word_embeddings": m.get("tie_embeddings", False),
    "rope_interleave": True, "hidden_act": "silu", "attention_bias": False,
    "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": m["rope_scaling_factor"],
                     "original_max_position_embeddings": m["rope_original_max_pos"], "beta_fast": m["yarn_beta_fast"],
                     "beta_slow": m["yarn_beta_slow"], "mscale": m["yarn_mscale"],
                     "mscale_all_dim": m["yarn_mscale_all_dim"]},
}
bad = [f"{k}: {cfg.get(k)!r} != {v!r}" for k, v in want.items() if cfg.get(k) != v]
report(f"{name}_config", not bad, "; ".join(bad[:4]) or "all keys match")

# 2. tensors
ck = {}
for f in glob.glob(os.path.join(STEP, "rank-*.safetensors")):
    ck.update({k: v for k, v in load_file(f).items() if not k.startswith("optimizer.")})
hf = load_file(os.path.join(HF, "model.safetensors"))


def deinterleave(rows):
    """transformers' apply_rotary_pos_emb_interleave: [.., d] pairs (2i, 2i+1) -> (i, i + d/2)."""
    d = rows.shape[-2]
    return rows.reshape(*rows.shape[:-2], d // 2, 2, rows.shape[-1]).transpose(-3, -2).reshape(rows.shape)


def to_mtrain(key, w):
    if key.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
        h = w.reshape(H, DN + R, -1).clone()
        h[:, DN:] = deinterleave(h[:, DN:])
        return h.reshape(w.shape)
    if key.endswith("self_attn.kv_a_proj_with_mqa.weight"):
        w = w.clone()
        w[-R:] = deinterleave(w[-R:])
    return w


rope_keys = [k for k in ck if k.endswith(("q_b_proj.weight", "q_proj.weight", "kv_a_proj_with_mqa.weight"))]
moved = [k for k in rope_keys if not torch.equal(hf[k], ck[k])]
diff = [k for k in ck if k not in hf or not torch.equal(to_mtrain(k, hf[k]), ck[k])]
report(f"{name}_tensors", not diff and len(moved) == len(rope_keys) == 2 * (L + D),
       f"{len(ck)} checkpoint tensors, differing or missing: {diff[:3]}; rotary tensors permuted {len(moved)}"
       f"/{len(rope_keys)}")

head = ck["model.embed_tokens.weight"] if m.get("tie_embeddings") else ck["lm_head.weight"]
extra_want = {f"model.layers.{L + d}.embed_tokens.weight": ck["model.embed_tokens.weight"] for d in range(D)}
extra_want.update({f"model.layers.{L + d}.shared_head.head.weight": head for d in range(D)})
if not m["moe_bias_update_rate"]:
    extra_want.update({f"model.layers.{l}.mlp.gate.e_score_correction_bias": torch.zeros(m["num_experts"])
                       for l in range(m["first_k_dense"], L + D)})
extra = set(hf) - set(ck)
bad = [k for k in extra_want if k not in hf or not torch.equal(hf[k], extra_want[k])]
report(f"{name}_mtp_copies", extra == set(extra_want) and not bad,
       f"extra {sorted(extra)[:4]}, want {sorted(extra_want)[:4]}, differing {bad[:2]}")

# rotary q.k, layer 0, the original DeepSeek way (complex pairs of the exported rows) vs rotate_half on mtrain's
g = torch.Generator().manual_seed(0)
qname = "model.layers.0.self_attn." + ("q_b_proj.weight" if m["q_lora_rank"] else "q_proj.weight")
kname = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
xq = torch.randn(ck[qname].shape[1], generator=g, dtype=torch.float64)
xk = torch.randn(ck[kname].shape[1], generator=g, dtype=torch.float64)
inv = 1.0 / (m["rope_theta"] ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
pq, pk = 5, 2


def complex_rope(v, pos):
    c = torch.view_as_complex(v.reshape(-1, 2).contiguous())
    return torch.view_as_real(c * torch.polar(torch.ones_like(inv), pos * inv)).reshape(-1)


def half_rope(v, pos):
    cos, sin = torch.cos(pos * inv).repeat(2), torch.sin(pos * inv).repeat(2)
    return v * cos + torch.cat([-v[R // 2:], v[:R // 2]]) * sin


err = 0.0
for h in range(H):
    q_hf = (hf[qname].double() @ xq).reshape(H, DN + R)[h, DN:]
    q_mt = (ck[qname].double() @ xq).reshape(H, DN + R)[h, DN:]
    k_hf, k_mt = (hf[kname].double() @ xk)[-R:], (ck[kname].double() @ xk)[-R:]
    ours, theirs = half_rope(q_mt, pq) @ half_rope(k_mt, pk), complex_rope(q_hf, pq) @ complex_rope(k_hf, pk)
    err = max(err, abs(ours - theirs).item() / max(abs(theirs).item(), 1e-12))
report(f"{name}_rope_qk", err <= 1e-5, f"max rel err over heads {err:.3g}")

# 3. the other export paths
final = load_file(os.path.join(HF_FINAL, "model.safetensors"))
same = set(final) == set(hf) and all(torch.equal(final[k], hf[k]) for k in hf)
report(f"{name}_final_weights_export", same, f"{len(final)} tensors vs {len(hf)}")
again = json.load(open(os.path.join(HF_AGAIN, "config.json")))
bad = [f"{k}: {again.get(k)!r} != {v!r}" for k, v in want.items() if again.get(k) != v]
report(f"{name}_config_read_back", not bad, "; ".join(bad[:4]) or "hf_config_read -> config.json round trip")

# 4. mtrain loads the export: same loss as the checkpoint
os.makedirs(WORK, exist_ok=True)
with open(os.path.join(WORK, "recipe.yaml"), "w") as f:
    yaml.safe_dump({"model": m, "train": {"seq_len": 16, "micro_batch": 4, "global_batch": 4, "steps": 1,
                                          "device": "cpu"}}, f)
bare = os.path.join(WORK, "bare")
os.makedirs(bare, exist_ok=True)
shutil.copy(os.path.join(HF, "model.safetensors"), bare)
batch = np.random.default_rng(3).integers(m["vocab_size"], size=(1, 4, 17)).astype("<i4")
batch.tofile(os.path.join(WORK, "batch.i32"))
loss = {}
for tag, weights in (("ckpt", glob.glob(os.path.join(STEP, "rank-*.safetensors"))[0]), ("hf", HF),
                     ("bare", os.path.join(bare, "model.safetensors"))):
    out = os.path.join(WORK, tag)
    os.makedirs(out, exist_ok=True)
    subprocess.run([DRIVER, "grad", os.path.join(WORK, "recipe.yaml"), weights, os.path.join(WORK, "batch.i32"),
                    out], check=True, stdout=subprocess.DEVNULL)
    loss[tag] = float(open(os.path.join(out, "loss.txt")).read())
e = abs(loss["hf"] - loss["ckpt"]) / abs(loss["ckpt"])
report(f"{name}_same_loss", e <= 1e-6, f"checkpoint {loss['ckpt']:.8f} export {loss['hf']:.8f} rel err {e:.3g}")
report(f"{name}_layout_matters", abs(loss["bare"] - loss["ckpt"]) > 1e-6,
       f"export read as mtrain's layout: {loss['bare']:.8f} (must differ from {loss['ckpt']:.8f})")


def first_loss(log_dir):
    for line in open(os.path.join(log_dir, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("step") == 1 and "loss" in j:
            return j["loss"]
    return None


a, b = first_loss(INIT_HF), first_loss(INIT_FILE)
report(f"{name}_init_from", a is not None and a == b, f"step 1 loss from the export {a}, from the final weights {b}")
sys.exit(1 if ref_common.failures else 0)
