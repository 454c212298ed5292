"""One-off check of mtrain's DeepSeek-V3 against a recent Hugging Face
transformers' DeepseekV3ForCausalLM (issue #13). Not part of the CI suite (no
.sh wrapper): the CI machine's transformers 4.44 has no DeepseekV3.

How to run (CPU, a minute; needs transformers >= 4.57, torch >= 2.x):
    python3 -m venv /tmp/hfv && /tmp/hfv/bin/pip install torch transformers safetensors numpy pyyaml
    make CUDA=0 BUILD=build/hfc build/hfc/mtrain build/hfc/tools/ref_driver
    /tmp/hfv/bin/python tests/reference/deepseek_hf_check.py build/hfc/mtrain build/hfc/tools/ref_driver /tmp/dshf
An older transformers over the same venv (checked: 4.57.1):
    /tmp/hfv/bin/pip install --target /tmp/tf457 --no-deps transformers==4.57.1 'tokenizers<0.23' \
        'huggingface-hub<1.0' requests urllib3 charset-normalizer certifi
    PYTHONPATH=/tmp/tf457 /tmp/hfv/bin/python tests/reference/deepseek_hf_check.py ...

For each of the two models of tests/reference/deepseek_export.sh (a: MLA with
q and kv LoRA, trained nonzero e_score_correction_bias, untied head; b: full
rank q_proj, zero bias, tied embeddings; both YaRN factor 4 with mscale !=
mscale_all_dim, 1 dense + 2 MoE layers with 2 groups / top-1 group / top-2
sigmoid routing, a shared expert, one MTP module): train 5 steps with `mtrain
pretrain`, export with `mtrain convert CKPT --hf DIR`, and on one fixed batch
of 4 x 17 tokens compare
  - mtrain (tests/reference/ref_driver `grad` on the checkpoint: logits, loss,
    expert choices, MTP loss),
  - transformers' DeepseekV3ForCausalLM.from_pretrained(DIR) in fp32, eager
    attention (logits, loss, the routers' top-k indices), and
  - tests/reference/deepseek_ref.py's independent PyTorch model (the one the
    CI test compares mtrain with) on the checkpoint's tensors.
transformers has no MTP module (the layer is dropped at load time as an
unexpected key), so the MTP loss is recomputed from transformers' own modules
(RMSNorm, DeepseekV3DecoderLayer) loaded with the exported layer-L tensors,
in the DeepSeek-V3 arrangement: eh_proj(cat[enorm(embed(t+1)), hnorm(h)]),
h the main model's last hidden state before its final norm.

Prints PASS/FAIL lines and the measured numbers.
usage: deepseek_hf_check.py MTRAIN REF_DRIVER WORKDIR
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MTRAIN, DRIVER, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
torch.set_num_threads(1)

import transformers  # noqa: E402
from transformers import DeepseekV3ForCausalLM  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hfm  # noqa: E402

sys.argv = [sys.argv[0], DRIVER, WORK]  # deepseek_ref reads DRIVER WORKDIR at import
import deepseek_ref as ref  # noqa: E402
import ref_common  # noqa: E402
from ref_common import rel_err, report  # noqa: E402

MODEL = dict(arch="deepseek_v3", vocab_size=264, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=4, intermediate_size=64,
             q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
             rope_theta=10000, rope_scaling_type="yarn", rope_scaling_factor=4, rope_original_max_pos=8,
             yarn_beta_fast=32, yarn_beta_slow=1, yarn_mscale=1.0, yarn_mscale_all_dim=0.8, norm_eps=1e-6,
             first_k_dense=1, num_experts=4, experts_per_token=2, moe_intermediate_size=24, moe_shared_experts=1,
             moe_score_func="sigmoid", moe_n_group=2, moe_topk_group=1, moe_routed_scaling=2.5,
             moe_bias_update_rate=1e-2, moe_seq_aux_loss_coef=1e-4, moe_aux_loss_coef=0, mtp_depth=1,
             mtp_loss_weight=0.3)
T, NB = 16, 4
VARIANTS = {"a": {}, "b": {"q_lora_rank": 0, "moe_bias_update_rate": 0, "tie_embeddings": True}}


def yaml_of(model, train):
    def val(v):
        return ("true" if v else "false") if isinstance(v, bool) else v
    return ("model: {" + ", ".join(f"{k}: {val(v)}" for k, v in model.items()) + "}\n"
            "train: {" + ", ".join(f"{k}: {v}" for k, v in train.items()) + "}\n")


def run(*cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=WORK)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}")


def reference_model(m, ck):
    """deepseek_ref.Model with this recipe's sizes, loaded with the checkpoint's tensors (mtrain's layout)."""
    g = dict(V=m["vocab_size"], C=m["hidden_size"], L=m["num_layers"], H=m["num_heads"], FF=m["intermediate_size"],
             T=T, DENSE=m["first_k_dense"], E=m["num_experts"], K=m["experts_per_token"],
             FM=m["moe_intermediate_size"], GROUPS=m["moe_n_group"], TOPK_GROUPS=m["moe_topk_group"],
             SHARED=m["moe_shared_experts"], SCALING=m["moe_routed_scaling"], MTP_D=m["mtp_depth"],
             QR=m["q_lora_rank"], KR=m["kv_lora_rank"], DN=m["qk_nope_head_dim"], DR=m["qk_rope_head_dim"],
             DV=m["v_head_dim"], THETA=float(m["rope_theta"]), FACTOR=float(m["rope_scaling_factor"]),
             ORIG=m["rope_original_max_pos"], BETA_FAST=float(m["yarn_beta_fast"]),
             BETA_SLOW=float(m["yarn_beta_slow"]), MSCALE=m["yarn_mscale"], MSCALE_ALL=m["yarn_mscale_all_dim"],
             EPS=m["norm_eps"])
    for k, v in g.items():
        setattr(ref, k, v)
    model = ref.Model(bool(m["q_lora_rank"]))
    with torch.no_grad():
        for n, p in model.named().items():
            src = n
            if n == "lm_head.weight" and m.get("tie_embeddings"):
                src = "model.embed_tokens.weight"
            p.copy_(ck[src])
    for l in model.bias:
        model.bias[l] = ck.get(f"model.layers.{l}.mlp.gate.e_score_correction_bias",
                               torch.zeros(m["num_experts"])).clone()
    return model


def hf_mtp_loss(hf, cfg, tensors, seq, h_last):
    """The MTP depth-1 loss from transformers' modules holding the exported layer-L tensors."""
    L, C = cfg.num_hidden_layers, cfg.hidden_size
    a = f"model.layers.{L}."
    enorm, hnorm, fnorm = (hfm.DeepseekV3RMSNorm(C, cfg.rms_norm_eps) for _ in range(3))
    block = hfm.DeepseekV3DecoderLayer(cfg, layer_idx=L).eval()
    eh = torch.nn.Linear(2 * C, C, bias=False)
    sub = {k[len(a):]: v for k, v in tensors.items() if k.startswith(a)}
    enorm.weight.data.copy_(sub["enorm.weight"])
    hnorm.weight.data.copy_(sub["hnorm.weight"])
    fnorm.weight.data.copy_(sub["shared_head.norm.weight"])
    eh.weight.data.copy_(sub["eh_proj.weight"])
    state = {k: v for k, v in sub.items() if not k.startswith(
        ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"))}
    if "mlp.experts.gate_up_proj" in block.state_dict():  # transformers 5: routed experts fused, 3-D
        E = cfg.n_routed_experts
        state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat(
            (sub[f"mlp.experts.{e}.gate_proj.weight"], sub[f"mlp.experts.{e}.up_proj.weight"])) for e in range(E)])
        state["mlp.experts.down_proj"] = torch.stack([sub[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)])
        state = {k: v for k, v in state.items() if not k.startswith("mlp.experts.") or k.count(".") == 2}
    missing, unexpected = block.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    emb = tensors[f"{a}embed_tokens.weight"]
    head = tensors[f"{a}shared_head.head.weight"]
    B = seq.shape[0]
    ahead = torch.zeros_like(seq[:, :T])
    ahead[:, :T] = seq[:, 1:]
    x = eh(torch.cat((enorm(F.embedding(ahead, emb)), hnorm(h_last)), -1))
    pos = torch.arange(T)[None].expand(B, T)
    cos_sin = hf.model.rotary_emb(x, pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
    out = block(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out
    logits = fnorm(out) @ head.t()
    target = torch.full_like(seq[:, :T], -100)
    target[:, :T - 1] = seq[:, 2:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)


def check(variant):
    m = dict(MODEL, **VARIANTS[variant])
    name = f"deepseek_hf_{variant}"
    with open(os.path.join(WORK, f"train_{variant}.yaml"), "w") as f:
        f.write(yaml_of(m, dict(seq_len=T, micro_batch=NB, global_batch=NB, steps=5, device="cpu")) +
                "optimizer: {lr: 1e-2, warmup_steps: 1}\ndata: {path: data}\n"
                f"checkpoint: {{dir: ck_{variant}, interval: 5}}\nlog: {{dir: run_{variant}}}\n")
    with open(os.path.join(WORK, f"recipe_{variant}.yaml"), "w") as f:
        f.write(yaml_of(m, dict(seq_len=T, micro_batch=NB, global_batch=NB, steps=1, device="cpu")))
    run(MTRAIN, "pretrain", f"train_{variant}.yaml")
    hfdir = os.path.join(WORK, f"hf_{variant}")
    run(MTRAIN, "convert", f"ck_{variant}", "--hf", hfdir)
    ckfile = glob.glob(os.path.join(WORK, f"ck_{variant}", "step-*", "rank-*.safetensors"))[0]
    ck = {k: v for k, v in load_file(ckfile).items() if not k.startswith("optimizer.")}
    bias = [v for k, v in ck.items() if k.endswith("e_score_correction_bias")]
    bias_info = f"max |e_score_correction_bias| {max((float(b.abs().max()) for b in bias), default=0.0):.3g}"

    # one fixed batch, random tokens
    seq = np.random.default_rng(7).integers(m["vocab_size"], size=(1, NB, T + 1)).astype("<i4")
    seq.tofile(os.path.join(WORK, f"batch_{variant}.i32"))
    out = os.path.join(WORK, f"mtrain_{variant}")
    os.makedirs(out, exist_ok=True)
    run(DRIVER, "grad", f"recipe_{variant}.yaml", ckfile, f"batch_{variant}.i32", out)
    mt_logits = load_file(os.path.join(out, "logits.safetensors"))["logits"]
    mt_loss = float(open(os.path.join(out, "loss.txt")).read())
    mt_mtp = float(open(os.path.join(out, "mtp_loss.txt")).read())
    mt_experts = load_file(os.path.join(out, "experts.safetensors"))
    mt_experts = next(iter(mt_experts.values())).long()  # [moe layers, NB, T, K]
    seq = torch.from_numpy(seq[0]).long()
    ids, targets = seq[:, :T], seq[:, 1:]

    # transformers
    cfg_json = json.load(open(os.path.join(hfdir, "config.json")))
    try:
        hf = DeepseekV3ForCausalLM.from_pretrained(hfdir, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        hf = DeepseekV3ForCausalLM.from_pretrained(hfdir, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    hf_choices = []

    def record(idx):
        hf_choices.append(idx.detach().view(NB, T, -1).sort(-1).values)
        return idx

    def recording(method):
        return lambda *a, **kw: record(method(*a, **kw))

    for layer in hf.model.layers:
        if isinstance(layer.mlp, hfm.DeepseekV3MoE):
            gate = layer.mlp.gate
            if hasattr(gate, "get_topk_indices"):  # transformers 4.5x: the router returns only the logits
                gate.get_topk_indices = recording(gate.get_topk_indices)
            else:  # 5.x: (router_logits, topk_weights, topk_indices)
                gate.register_forward_hook(lambda mod, args, out: record(out[2]))
    h_last = []
    hf.model.norm.register_forward_hook(lambda mod, args, out: h_last.append(args[0].detach()))
    with torch.no_grad():
        hf_logits = hf(input_ids=ids).logits.float()
        hf_loss = float(F.cross_entropy(hf_logits.reshape(-1, hf_logits.shape[-1]), targets.reshape(-1)))
        tensors = load_file(os.path.join(hfdir, "model.safetensors"))
        hf_mtp = float(hf_mtp_loss(hf, hf.config, tensors, seq, h_last[0]))
    hf_experts = torch.stack(hf_choices)
    unexpected = sorted({k.split(".")[2] for k in tensors if k.startswith("model.layers.")
                         and int(k.split(".")[2]) >= hf.config.num_hidden_layers})

    # deepseek_ref.py's model on the checkpoint tensors
    rm = reference_model(m, ck)
    with torch.no_grad():
        rm.loads = {}
        r_logits, r_mtp_logits = rm(seq)
        r_loss = float(F.cross_entropy(r_logits.reshape(-1, r_logits.shape[-1]), targets.reshape(-1)))
        tgt = torch.full_like(ids, -100)
        tgt[:, :T - 1] = seq[:, 2:]
        r_mtp = float(F.cross_entropy(r_mtp_logits[0].reshape(-1, r_logits.shape[-1]), tgt.reshape(-1),
                                      ignore_index=-100))
    r_experts = torch.stack([c.sort(-1).values for c in rm.choices[:len(hf_choices)]])

    mt_sorted = mt_experts.sort(-1).values
    e_hf_mt, e_hf_ref, e_ref_mt = rel_err(hf_logits, mt_logits), rel_err(hf_logits, r_logits), rel_err(r_logits,
                                                                                                      mt_logits)
    print(f"  [{name}] rope_scaling {cfg_json.get('rope_scaling')}, {bias_info}; MTP layer(s) {unexpected} "
          f"not built by transformers", file=sys.stderr)
    report(f"{name}_logits", max(e_hf_mt, e_hf_ref) <= 1e-5,
           f"max|diff|/max|ref| HF vs mtrain {e_hf_mt:.3g}, HF vs deepseek_ref {e_hf_ref:.3g}, "
           f"deepseek_ref vs mtrain {e_ref_mt:.3g}")
    report(f"{name}_loss", abs(hf_loss - mt_loss) <= 1e-5 * abs(mt_loss) and abs(hf_loss - r_loss) <= 1e-5 * r_loss,
           f"HF {hf_loss:.8f}  mtrain {mt_loss:.8f}  deepseek_ref {r_loss:.8f}")
    n_tok = mt_sorted[..., 0].numel()
    same_mt = int((hf_experts == mt_sorted).all(-1).sum())
    same_ref = int((hf_experts == r_experts).all(-1).sum())
    report(f"{name}_experts", same_mt == same_ref == n_tok,
           f"identical top-{m['experts_per_token']} sets: HF vs mtrain {same_mt}/{n_tok}, HF vs deepseek_ref "
           f"{same_ref}/{n_tok} ({hf_experts.shape[0]} MoE layers x {NB} x {T} tokens)")
    report(f"{name}_mtp_loss", abs(hf_mtp - mt_mtp) <= 1e-5 * mt_mtp and abs(r_mtp - mt_mtp) <= 1e-5 * mt_mtp,
           f"HF modules {hf_mtp:.8f}  mtrain {mt_mtp:.8f}  deepseek_ref {r_mtp:.8f}")


def main():
    os.makedirs(WORK, exist_ok=True)
    print(f"  transformers {transformers.__version__}, torch {torch.__version__}", file=sys.stderr)
    run(MTRAIN, "data", "generate", "--out", "data", "--docs", "200")
    for v in VARIANTS:
        check(v)
    sys.exit(1 if ref_common.failures else 0)


if __name__ == "__main__":
    main()
