"""mtrain's CPU DeepSeek-V3 attention (MLA + YaRN) against an independent
PyTorch reference written from the published architecture (DeepSeek-V3
technical report; Hugging Face DeepseekV3 config keys). The CI machine's
transformers 4.44 has no DeepseekV3ForCausalLM, so the reference model is
written here; it was checked once against transformers 5.23 / 4.57
DeepseekV3ForCausalLM by tests/reference/deepseek_hf_check.py (docs/model.md).

A tiny DeepSeek-V3: 4 layers of MLA with both low-rank paths (q_lora_rank >
0; a second model checks the full-rank q_proj), YaRN RoPE with factor 4 over
8 original positions (both the kept and the interpolated frequencies occur),
mscale != mscale_all_dim so both YaRN corrections (cos/sin amplitude and
softmax scale) are exercised. Layers 0-1 are dense SwiGLU (intermediate_size),
layers 2-3 MoE: 8 routed experts in 4 groups, sigmoid scores, a random
initial expert bias used only for the choice, the best 2 groups (scored by
the sum of their top-2 biased scores), top 2 experts, gate weights = unbiased
scores normalised over the chosen x routed_scaling_factor, one shared expert,
the sequence-wise balance loss, and the aux-loss-free bias update after each
optimizer step. One MTP module (depth 1, weight 0.3): RMSNorm of the next
token's embedding and of the main model's last hidden state (before its final
norm), concatenated [embedding | hidden], projected by eh_proj, one more MLA +
MoE block, its own norm and the shared output head, predicting two tokens
ahead; its loss is the mean over the predictable positions.

1. Same weights and batch (2 micro batches of 2 sequences): the same expert
   choices, logits and loss within 1e-5, the balance loss and the MTP loss
   within 1e-5, every gradient (of main + balance + weighted MTP loss) within
   1e-4 (max|diff| / max|torch| per tensor).
2. 50 AdamW steps from the same weights on the same batches: every step's
   loss and MTP loss within 1e-4 relative, the final expert bias equal (1e-6).
   AdamW's eps is 1e-6 here: with 1e-8 the first steps' update of elements
   whose gradient is ~1e-8 is the sign of float rounding noise, which sends
   two correct implementations apart; routing near-ties then amplify it.

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
V, C, L, H, FF, T = 256, 64, 4, 4, 96, 16
DENSE, E, K, FM, GROUPS, TOPK_GROUPS, SHARED = 2, 8, 2, 32, 4, 2, 1
SCALING, BIAS_RATE, SEQ_AUX = 2.5, 1e-3, 1e-2
MTP_D, MTP_W = 1, 0.3
QR, KR, DN, DR, DV = 24, 16, 8, 4, 12
THETA, FACTOR, ORIG, BETA_FAST, BETA_SLOW, MSCALE, MSCALE_ALL = 10000.0, 4.0, 8, 32.0, 1.0, 1.0, 0.8
EPS = 1e-6
GLOBAL_BATCH, MICRO_BATCH, STEPS = 4, 2, 50
OPT = dict(lr=1e-3, min_lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1, grad_clip=1.0, warmup_steps=5)


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


def swiglu(x, w, prefix):
    return (F.silu(x @ w[prefix + "gate_proj.weight"].t()) * (x @ w[prefix + "up_proj.weight"].t())) @ \
        w[prefix + "down_proj.weight"].t()


def route(logits, bias):
    """DeepSeek-V3 routing of tokens [n, E]: (scores, chosen experts [n, K], gate weights [n, K])."""
    s = logits.sigmoid()
    biased = (s + bias).detach()
    per = E // GROUPS
    group_score = biased.view(-1, GROUPS, per).topk(2, dim=-1).values.sum(-1)
    best_groups = group_score.topk(TOPK_GROUPS, dim=-1).indices
    eligible = torch.zeros_like(group_score, dtype=torch.bool).scatter(1, best_groups, True)
    choice = biased.masked_fill(~eligible.repeat_interleave(per, dim=1), float("-inf"))
    idx = choice.topk(K, dim=-1).indices
    chosen = s.gather(1, idx)
    return s, idx, chosen / chosen.sum(-1, keepdim=True) * SCALING


class Model(torch.nn.Module):
    """Embedding, L x (RMSNorm, MLA, RMSNorm, SwiGLU or MoE), RMSNorm, output head; Hugging Face tensor names."""

    def __init__(self, q_lora):
        super().__init__()
        self.q_lora = q_lora
        p = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
        for l in range(L + MTP_D):
            a = f"model.layers.{l}."
            if l >= L:  # MTP module l - L + 1
                p[a + "enorm.weight"] = (C,)
                p[a + "hnorm.weight"] = (C,)
                p[a + "eh_proj.weight"] = (C, 2 * C)
                p[a + "shared_head.norm.weight"] = (C,)
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
            if l < DENSE:
                mlps = [("mlp.", FF)]
            else:
                p[a + "mlp.gate.weight"] = (E, C)
                mlps = [(f"mlp.experts.{e}.", FM) for e in range(E)] + [("mlp.shared_experts.", FM * SHARED)]
            for prefix, width in mlps:
                p[a + prefix + "gate_proj.weight"] = (width, C)
                p[a + prefix + "up_proj.weight"] = (width, C)
                p[a + prefix + "down_proj.weight"] = (C, width)
        torch.manual_seed(0)
        self.names = list(p)
        self.params = torch.nn.ParameterList()
        for n, shape in p.items():
            w = 1.0 + 0.1 * torch.randn(shape) if "norm" in n else 0.08 * torch.randn(shape)
            self.params.append(torch.nn.Parameter(w))
        # the expert bias: state, not a parameter; random so that it visibly changes the choices
        self.bias = {l: 0.05 * torch.randn(E) for l in range(DENSE, L + MTP_D)}
        self.cos, self.sin = yarn_cos_sin()
        self.scale = (DN + DR) ** -0.5 * yarn_get_mscale(FACTOR, MSCALE_ALL) ** 2

    def named(self):
        return dict(zip(self.names, self.params))

    def state(self):
        return {f"model.layers.{l}.mlp.gate.e_score_correction_bias": b for l, b in self.bias.items()}

    def moe(self, x, w, a, l):
        """Routed experts + shared expert of layer l; records the choices, loads and balance loss."""
        B = x.shape[0]
        xf = x.reshape(-1, C)
        s, idx, gate = route(xf @ w[a + "mlp.gate.weight"].t(), self.bias[l])
        out = swiglu(xf, w, a + "mlp.shared_experts.")
        for e in range(E):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if len(rows):
                out = out.index_add(0, rows, gate[rows, slot, None] * swiglu(xf[rows], w, a + f"mlp.experts.{e}."))
        counts = F.one_hot(idx, E).sum(1).view(B, T, E).sum(1).double()   # [B, E] selections per sequence
        share = (s / s.sum(-1, keepdim=True)).view(B, T, E).mean(1)        # P_e per sequence
        self.balance.append(((counts * E / (K * T)).float() * share).sum(-1))  # [B]
        self.choices.append(idx.view(B, T, K))
        self.loads[l] = self.loads.get(l, 0) + counts.sum(0)
        return out.view(B, T, C)

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

    def block(self, h, w, l):
        a = f"model.layers.{l}."
        h = h + self.attention(rms_norm(h, w[a + "input_layernorm.weight"]), w, a + "self_attn.")
        x = rms_norm(h, w[a + "post_attention_layernorm.weight"])
        return h + (swiglu(x, w, a + "mlp.") if l < DENSE else self.moe(x, w, a, l))

    def forward(self, seq):
        """seq [B, T+1]: main logits [B, T, V] and the MTP depths' logits (targets: mtp_targets)."""
        w = self.named()
        self.balance, self.choices = [], []
        emb = w["model.embed_tokens.weight"]
        h = emb[seq[:, :T]]
        for l in range(L):
            h = self.block(h, w, l)
        logits = rms_norm(h, w["model.norm.weight"]) @ w["lm_head.weight"].t()
        mtp_logits = []
        for d in range(1, MTP_D + 1):
            a = f"model.layers.{L + d - 1}."
            ahead = torch.zeros_like(seq[:, :T])
            ahead[:, :T + 1 - d] = seq[:, d:]  # token i + d (0 past the sequence: never predicted from)
            x = torch.cat((rms_norm(emb[ahead], w[a + "enorm.weight"]), rms_norm(h, w[a + "hnorm.weight"])), -1)
            h = self.block(x @ w[a + "eh_proj.weight"].t(), w, L + d - 1)
            mtp_logits.append(rms_norm(h, w[a + "shared_head.norm.weight"]) @ w["lm_head.weight"].t())
        return logits, mtp_logits

    def balance_loss(self):
        """The sequence-wise balance loss, mean over sequences and MoE layers (before its coefficient)."""
        return torch.cat(self.balance).mean()

    def update_bias(self):
        """Aux-loss-free balancing after an optimizer step, from the step's loads."""
        for l, load in self.loads.items():
            step = torch.sign(load.mean() - load).to(torch.float32) * torch.tensor(BIAS_RATE, dtype=torch.float32)
            self.bias[l] += step
        self.loads = {}

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
  first_k_dense: {DENSE}
  num_experts: {E}
  experts_per_token: {K}
  moe_intermediate_size: {FM}
  moe_shared_experts: {SHARED}
  moe_score_func: sigmoid
  moe_n_group: {GROUPS}
  moe_topk_group: {TOPK_GROUPS}
  moe_routed_scaling: {SCALING}
  moe_bias_update_rate: {BIAS_RATE}
  moe_seq_aux_loss_coef: {SEQ_AUX}
  moe_aux_loss_coef: 0
  mtp_depth: {MTP_D}
  mtp_loss_weight: {MTP_W}
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
    tensors = {n: p.detach().contiguous() for n, p in model.named().items()}
    tensors.update({n: b.clone() for n, b in model.state().items()})
    save_file(tensors, os.path.join(work, "init.safetensors"))
    return model


def ce_of(model, batch):
    """logits, the main loss, the MTP loss, and what backward differentiates (main + balance + weighted MTP)."""
    seq = torch.from_numpy(batch).long()
    model.loads = {}
    logits, mtp_logits = model(seq)
    ce = F.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1))
    mtp = 0
    for d, lg in enumerate(mtp_logits, 1):
        target = torch.full_like(seq[:, :T], -100)
        target[:, :T - d] = seq[:, d + 1:]  # token i + d + 1
        mtp = mtp + F.cross_entropy(lg.reshape(-1, V), target.reshape(-1), ignore_index=-100) / MTP_D
    return logits, ce, mtp, ce + SEQ_AUX * model.balance_loss() + MTP_W * mtp


def check_forward_backward(model, work, tag):
    batch = ref_common.make_batches(1, 1, GLOBAL_BATCH, T, V)
    ref_common.run_driver(DRIVER, work, "grad", batch, os.path.join(work, "grad"))
    logits, ce, mtp, total = ce_of(model, batch[0])
    for p in model.params:
        p.grad = None
    total.backward()
    # expert choices per MoE layer [layer, sequence, t, k], compared as sets (the order within k is free)
    want = torch.stack(model.choices[:L - DENSE]).sort(-1).values  # the main model's MoE layers
    got = load_file(os.path.join(work, "grad", "experts.safetensors"))["experts"].long().sort(-1).values
    same = got.shape == want.shape and bool((got == want).all())
    report(f"deepseek_{tag}_expert_choices", same, f"{int((got != want).sum()) if got.shape == want.shape else got.shape}"
           f" of {want.numel()} choices differ")
    balance = model.balance_loss().item()
    got_balance = float(open(os.path.join(work, "grad", "aux.txt")).read().split()[0])
    e = abs(got_balance - balance) / abs(balance)
    report(f"deepseek_{tag}_balance_loss", e <= 1e-5, f"mtrain {got_balance:.8g} torch {balance:.8g} rel err {e:.3g}")
    got_mtp = float(open(os.path.join(work, "grad", "mtp_loss.txt")).read())
    e = abs(got_mtp - mtp.item()) / abs(mtp.item())
    report(f"deepseek_{tag}_mtp_loss", e <= 1e-5, f"mtrain {got_mtp:.8f} torch {mtp.item():.8f} rel err {e:.3g}")
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
    state = [n for n in grads if n.endswith("e_score_correction_bias")]
    report(f"deepseek_{tag}_grads_present", not missing and len(grads) == len(model.names) + len(state),
           f"missing {missing}, {len(grads)} tensors")
    report(f"deepseek_{tag}_bias_untrained", len(state) == L + MTP_D - DENSE and all(float(grads[n].abs().max()) == 0 for n in state),
           f"expert bias gradients {state}: must exist per MoE layer and stay zero")
    report(f"deepseek_{tag}_grads", worst <= 1e-4, f"worst {worst_name} max rel err {worst:.3g} (tol 1e-4)")


def check_training(model, work, tag):
    batches = ref_common.make_batches(STEPS, 2, GLOBAL_BATCH, T, V)
    ref_common.run_driver(DRIVER, work, "train", batches, os.path.join(work, "train"))
    opt = adamw(model, OPT)
    model.initial_bias = {n: b.clone() for n, b in model.state().items()}
    ours = [list(map(float, line.split())) for line in open(os.path.join(work, "train", "losses.txt"))]
    worst, worst_step = 0.0, -1
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = ref_common.lr_at(OPT, STEPS, step)
        opt.zero_grad()
        _, ce, mtp, total = ce_of(model, batches[step])
        total.backward()
        torch.nn.utils.clip_grad_norm_(list(model.params), OPT["grad_clip"])
        opt.step()
        model.update_bias()
        if step < len(ours):
            e = max(abs(ours[step][0] - ce.item()) / abs(ce.item()), abs(ours[step][3] - mtp.item()) / abs(mtp.item()))
            if e > worst:
                worst, worst_step = e, step
    report(f"deepseek_{tag}_training_steps", len(ours) == STEPS, f"{len(ours)} loss lines, want {STEPS}")
    report(f"deepseek_{tag}_training_50_steps", worst <= 1e-4,
           f"worst step {worst_step} rel err {worst:.3g} (tol 1e-4); loss {ours[0][0]:.4f} -> {ours[-1][0]:.4f}")
    report(f"deepseek_{tag}_training_loss_falls", ours[-1][0] < ours[0][0] - 0.2, f"{ours[0][0]:.4f} -> {ours[-1][0]:.4f}")
    final = load_file(os.path.join(work, "train", "params.safetensors"))
    worst, moved = 0.0, 0.0
    for name, b in model.state().items():
        worst = max(worst, float((final[name] - b).abs().max()))
        moved = max(moved, float((b - model.initial_bias[name]).abs().max()))
    report(f"deepseek_{tag}_final_bias", worst <= 1e-6 and moved > 0,
           f"max |mtrain - torch| {worst:.3g} (tol 1e-6); the bias moved up to {moved:.3g}")


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
