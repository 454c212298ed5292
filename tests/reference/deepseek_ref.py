"""mtrain's CPU DeepSeek-V3 attention (MLA + YaRN) against an independent
PyTorch reference written from the published architecture (DeepSeek-V3
technical report; Hugging Face DeepseekV3 config keys). The CI machine's
transformers 4.44 has no DeepseekV3ForCausalLM, so the reference model is
written here; checking it once against a recent transformers'
DeepseekV3ForCausalLM is left to a machine with a recent PyTorch (docs/model.md).

A tiny dense-only DeepSeek-V3 (MoE routing and MTP are not implemented yet):
2 layers of MLA with both low-rank paths (q_lora_rank > 0; a second model
checks the full-rank q_proj) and a dense SwiGLU, YaRN RoPE with factor 4 over
8 original positions (both the kept and the interpolated frequencies occur),
mscale != mscale_all_dim so both YaRN corrections (cos/sin amplitude and
softmax scale) are exercised.

1. Same weights and batch (2 micro batches of 2 sequences): logits and loss
   within 1e-5, every gradient within 1e-4 (max|diff| / max|torch| per tensor).
2. 50 AdamW steps from the same weights on the same batches: every step's
   loss within 1e-4 relative.

RoPE layout: mtrain stores the rotary rows in rotate_half order (pairs i,
i + d/2). Hugging Face's DeepSeek-V3 checkpoints store them interleaved
(rope_interleave), which the importer permutes (docs/model.md).

usage: deepseek_ref.py DRIVER WORKDIR   (prints PASS/FAIL lines)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import ref_common
from ref_common import adamw, optimizer_yaml, rel_err, report

DRIVER, WORK = sys.argv[1], sys.argv[2]
V, C, L, H, FF, T = 256, 64, 2, 4, 96, 16
QR, KR, DN, DR, DV = 24, 16, 8, 4, 12
THETA, FACTOR, ORIG, BETA_FAST, BETA_SLOW, MSCALE, MSCALE_ALL = 10000.0, 4.0, 8, 32.0, 1.0, 1.0, 0.8
EPS = 1e-6
GLOBAL_BATCH, MICRO_BATCH, STEPS = 4, 2, 50
OPT = dict(lr=1e-3, min_lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0, warmup_steps=5)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def yarn_get_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_cos_sin():
    """YaRN (Peng et al., as configured by DeepSeek-V3's rope_scaling): per frequency, a ramp between
    extrapolation (dims turning > beta_fast times over the original context) and interpolation (< beta_slow)."""
    def corr_dim(rot):
        return DR * math.log(ORIG / (rot * 2 * math.pi)) / (2 * math.log(THETA))
    low, high = max(math.floor(corr_dim(BETA_FAST)), 0), min(math.ceil(corr_dim(BETA_SLOW)), DR - 1)
    if low == high:
        high += 0.001
    extra = 1.0 / (THETA ** (torch.arange(0, DR, 2, dtype=torch.float32) / DR))
    inter = extra / FACTOR
    ramp = ((torch.arange(DR // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    inv_freq = inter * (1 - keep) + extra * keep
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    amp = yarn_get_mscale(FACTOR, MSCALE) / yarn_get_mscale(FACTOR, MSCALE_ALL)
    return emb.cos() * amp, emb.sin() * amp


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Model(torch.nn.Module):
    """Embedding, L x (RMSNorm, MLA, RMSNorm, SwiGLU), RMSNorm, output head; Hugging Face tensor names."""

    def __init__(self, q_lora):
        super().__init__()
        self.q_lora = q_lora
        p = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
        for l in range(L):
            a = f"model.layers.{l}."
            p[a + "input_layernorm.weight"] = (C,)
            if q_lora:
                p[a + "self_attn.q_a_proj.weight"] = (QR, C)
                p[a + "self_attn.q_a_layernorm.weight"] = (QR,)
                p[a + "self_attn.q_b_proj.weight"] = (H * (DN + DR), QR)
            else:
                p[a + "self_attn.q_proj.weight"] = (H * (DN + DR), C)
            p[a + "self_attn.kv_a_proj_with_mqa.weight"] = (KR + DR, C)
            p[a + "self_attn.kv_a_layernorm.weight"] = (KR,)
            p[a + "self_attn.kv_b_proj.weight"] = (H * (DN + DV), KR)
            p[a + "self_attn.o_proj.weight"] = (C, H * DV)
            p[a + "post_attention_layernorm.weight"] = (C,)
            p[a + "mlp.gate_proj.weight"] = (FF, C)
            p[a + "mlp.up_proj.weight"] = (FF, C)
            p[a + "mlp.down_proj.weight"] = (C, FF)
        torch.manual_seed(0)
        self.names = list(p)
        self.params = torch.nn.ParameterList()
        for n, shape in p.items():
            w = 1.0 + 0.1 * torch.randn(shape) if "norm" in n else 0.08 * torch.randn(shape)
            self.params.append(torch.nn.Parameter(w))
        self.cos, self.sin = yarn_cos_sin()
        self.scale = (DN + DR) ** -0.5 * yarn_get_mscale(FACTOR, MSCALE_ALL) ** 2

    def named(self):
        return dict(zip(self.names, self.params))

    def attention(self, x, w, a):
        B = x.shape[0]
        if self.q_lora:
            q = rms_norm(x @ w[a + "q_a_proj.weight"].t(), w[a + "q_a_layernorm.weight"]) @ w[a + "q_b_proj.weight"].t()
        else:
            q = x @ w[a + "q_proj.weight"].t()
        q = q.view(B, T, H, DN + DR).transpose(1, 2)
        q_nope, q_pe = q[..., :DN], q[..., DN:]
        kv_a = x @ w[a + "kv_a_proj_with_mqa.weight"].t()
        latent, k_pe = kv_a[..., :KR], kv_a[..., KR:].view(B, 1, T, DR)
        kv = (rms_norm(latent, w[a + "kv_a_layernorm.weight"]) @ w[a + "kv_b_proj.weight"].t())
        kv = kv.view(B, T, H, DN + DV).transpose(1, 2)
        k_nope, v = kv[..., :DN], kv[..., DN:]
        q_pe = q_pe * self.cos + rotate_half(q_pe) * self.sin
        k_pe = k_pe * self.cos + rotate_half(k_pe) * self.sin
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(B, H, T, DR)), dim=-1)
        s = (q @ k.transpose(-1, -2)) * self.scale
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * DV)
        return o @ w[a + "o_proj.weight"].t()

    def forward(self, tokens):
        w = self.named()
        h = w["model.embed_tokens.weight"][tokens]
        for l in range(L):
            a = f"model.layers.{l}."
            h = h + self.attention(rms_norm(h, w[a + "input_layernorm.weight"]), w, a + "self_attn.")
            x = rms_norm(h, w[a + "post_attention_layernorm.weight"])
            h = h + (F.silu(x @ w[a + "mlp.gate_proj.weight"].t()) * (x @ w[a + "mlp.up_proj.weight"].t())) @ \
                w[a + "mlp.down_proj.weight"].t()
        return rms_norm(h, w["model.norm.weight"]) @ w["lm_head.weight"].t()

    def named_parameters(self, *args, **kw):  # ref_common.adamw groups by name
        return iter(self.named().items())


def write_recipe(path, q_lora):
    with open(path, "w") as f:
        f.write(f"""model:
  arch: deepseek_v3
  vocab_size: {V}
  hidden_size: {C}
  num_layers: {L}
  num_heads: {H}
  num_kv_heads: {H}
  intermediate_size: {FF}
  q_lora_rank: {QR if q_lora else 0}
  kv_lora_rank: {KR}
  qk_nope_head_dim: {DN}
  qk_rope_head_dim: {DR}
  v_head_dim: {DV}
  rope_theta: {THETA}
  rope_scaling_type: yarn
  rope_scaling_factor: {FACTOR}
  rope_original_max_pos: {ORIG}
  yarn_beta_fast: {BETA_FAST}
  yarn_beta_slow: {BETA_SLOW}
  yarn_mscale: {MSCALE}
  yarn_mscale_all_dim: {MSCALE_ALL}
  norm_eps: {EPS}
train:
  seq_len: {T}
  micro_batch: {MICRO_BATCH}
  global_batch: {GLOBAL_BATCH}
  steps: {STEPS}
""" + optimizer_yaml(OPT))


def setup(work, q_lora):
    model = Model(q_lora)
    os.makedirs(work, exist_ok=True)
    write_recipe(os.path.join(work, "recipe.yaml"), q_lora)
    save_file({n: p.detach().contiguous() for n, p in model.named().items()}, os.path.join(work, "init.safetensors"))
    return model


def ce_of(model, batch):
    x, y = torch.from_numpy(batch[:, :T]).long(), torch.from_numpy(batch[:, 1:]).long()
    logits = model(x)
    return logits, F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def check_forward_backward(model, work, tag):
    batch = ref_common.make_batches(1, 1, GLOBAL_BATCH, T, V)
    ref_common.run_driver(DRIVER, work, "grad", batch, os.path.join(work, "grad"))
    logits, ce = ce_of(model, batch[0])
    for p in model.params:
        p.grad = None
    ce.backward()
    got_logits = load_file(os.path.join(work, "grad", "logits.safetensors"))["logits"]
    got_loss = float(open(os.path.join(work, "grad", "loss.txt")).read())
    e = rel_err(got_logits, logits.detach())
    report(f"deepseek_{tag}_logits", e <= 1e-5, f"max rel err {e:.3g} (tol 1e-5)")
    e = abs(got_loss - ce.item()) / abs(ce.item())
    report(f"deepseek_{tag}_loss", e <= 1e-5, f"mtrain {got_loss:.8f} torch {ce.item():.8f} rel err {e:.3g}")
    grads = load_file(os.path.join(work, "grad", "grads.safetensors"))
    worst, worst_name, missing = 0.0, "", []
    for name, p in model.named().items():
        if name not in grads:
            missing.append(name)
            continue
        e = rel_err(grads[name], p.grad)
        worst, worst_name = max((worst, worst_name), (e, name))
    report(f"deepseek_{tag}_grads_present", not missing and len(grads) == len(model.names),
           f"missing {missing}, {len(grads)} tensors")
    report(f"deepseek_{tag}_grads", worst <= 1e-4, f"worst {worst_name} max rel err {worst:.3g} (tol 1e-4)")


def check_training(model, work, tag):
    batches = ref_common.make_batches(STEPS, 2, GLOBAL_BATCH, T, V)
    ref_common.run_driver(DRIVER, work, "train", batches, os.path.join(work, "train"))
    opt = adamw(model, OPT)
    ours = [list(map(float, line.split())) for line in open(os.path.join(work, "train", "losses.txt"))]
    worst, worst_step = 0.0, -1
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = ref_common.lr_at(OPT, STEPS, step)
        opt.zero_grad()
        _, ce = ce_of(model, batches[step])
        ce.backward()
        torch.nn.utils.clip_grad_norm_(list(model.params), OPT["grad_clip"])
        opt.step()
        if step < len(ours):
            e = abs(ours[step][0] - ce.item()) / abs(ce.item())
            if e > worst:
                worst, worst_step = e, step
    report(f"deepseek_{tag}_training_steps", len(ours) == STEPS, f"{len(ours)} loss lines, want {STEPS}")
    report(f"deepseek_{tag}_training_50_steps", worst <= 1e-4,
           f"worst step {worst_step} rel err {worst:.3g} (tol 1e-4); loss {ours[0][0]:.4f} -> {ours[-1][0]:.4f}")
    report(f"deepseek_{tag}_training_loss_falls", ours[-1][0] < ours[0][0] - 0.2, f"{ours[0][0]:.4f} -> {ours[-1][0]:.4f}")


def main():
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    model = setup(os.path.join(WORK, "mla"), True)
    check_forward_backward(model, os.path.join(WORK, "mla"), "mla")
    check_training(model, os.path.join(WORK, "mla"), "mla")
    model = setup(os.path.join(WORK, "mla_full_q"), False)
    check_forward_backward(model, os.path.join(WORK, "mla_full_q"), "mla_full_q")
    sys.exit(1 if ref_common.failures else 0)


if __name__ == "__main__":
    main()
