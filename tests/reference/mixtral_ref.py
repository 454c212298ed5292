"""mtrain's CPU Mixtral (MoE) against Hugging Face transformers' MixtralForCausalLM.

1. Same weights and batch (2 micro batches of 2 sequences): the same top-2
   expert choices in every MoE layer, logits and loss within 1e-5, the
   load-balancing loss within 1e-5, and every gradient of
   CE + aux_coef * aux + z_coef * z within 1e-4 (max|diff| / max|torch| per
   tensor). mtrain's aux loss is HF's load_balancing_loss_func applied to one
   layer and one sequence at a time, averaged (HF concatenates all layers of
   the whole batch into one; per layer and sequence is what pipeline stages,
   gradient accumulation and any data-parallel layout compute alike); the
   z-loss is mean(logsumexp(router logits)^2).
2. 50 AdamW steps from the same weights on the same batches: every step's
   loss within 1e-4 relative.

Layer 1 is dense (moe_layer_freq 2 makes layers 0 and 2 MoE), so both block
kinds are exercised; HF Mixtral has only MoE layers, so the reference model
replaces layer 1's block_sparse_moe with a dense SwiGLU MLP (Llama's).

usage: mixtral_ref.py DRIVER WORKDIR   (prints PASS/FAIL lines)
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, MixtralConfig, MixtralForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

import ref_common
from ref_common import adamw, optimizer_yaml, rel_err, report

DRIVER, WORK = sys.argv[1], sys.argv[2]
V, C, L, H, KV, FF, FM, E, K, T = 256, 64, 3, 4, 2, 96, 80, 4, 2, 16
GLOBAL_BATCH, MICRO_BATCH, STEPS = 4, 2, 50
AUX, ZC = 0.02, 0.001
OPT = dict(lr=1e-3, min_lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0, warmup_steps=5)


def make_model():
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=V, hidden_size=C, intermediate_size=FM, num_hidden_layers=L, num_attention_heads=H,
                        num_key_value_heads=KV, num_local_experts=E, num_experts_per_tok=K, max_position_embeddings=8 * T,
                        rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False, router_aux_loss_coef=AUX,
                        sliding_window=None)
    cfg._attn_implementation = "eager"
    model = MixtralForCausalLM(cfg).float()
    dense_cfg = LlamaConfig(hidden_size=C, intermediate_size=FF, hidden_act="silu")
    model.model.layers[1].block_sparse_moe = LlamaMLP(dense_cfg)  # layer 1: dense (moe_layer_freq 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif p.dim() == 2:
                p.normal_(0.0, 0.05 if "gate.weight" not in name else 0.5)  # decisive routing
    return model


def hf_name(name):
    """Our dense layer's names (mlp.*) from the reference's module path."""
    return name.replace("layers.1.block_sparse_moe.", "layers.1.mlp.")


def state(model):
    return {hf_name(k): v.contiguous() for k, v in model.state_dict().items()}


def write_recipe(path):
    with open(path, "w") as f:
        f.write(f"""model:
  arch: mixtral
  vocab_size: {V}
  hidden_size: {C}
  num_layers: {L}
  num_heads: {H}
  num_kv_heads: {KV}
  intermediate_size: {FF}
  num_experts: {E}
  experts_per_token: {K}
  moe_intermediate_size: {FM}
  moe_layer_freq: 2
  moe_aux_loss_coef: {AUX}
  moe_z_loss_coef: {ZC}
  rope_theta: 1000000
  norm_eps: 1e-5
train:
  seq_len: {T}
  micro_batch: {MICRO_BATCH}
  global_batch: {GLOBAL_BATCH}
  steps: {STEPS}
""" + optimizer_yaml(OPT))


def lr_at(step):
    return ref_common.lr_at(OPT, STEPS, step)


def make_batches(steps, seed):
    return ref_common.make_batches(steps, seed, GLOBAL_BATCH, T, V)


def run_driver(mode, batches, outdir):
    ref_common.run_driver(DRIVER, WORK, mode, batches, outdir)


def losses_of(model, batch):
    """logits, CE, aux (per layer and micro batch, averaged), z-loss, router logits per MoE layer."""
    x, y = torch.from_numpy(batch[:, :T]).long(), torch.from_numpy(batch[:, 1:]).long()
    out = model.model(input_ids=x, output_router_logits=True)  # the base model: HF's own aux sum cannot skip layer 1
    logits = model.lm_head(out.last_hidden_state)
    ce = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    routers = [out.router_logits[i] for i in (0, 2)]  # the MoE layers (layer 1 returns none)
    aux, z, n = 0.0, 0.0, 0
    for r in routers:
        for seq in range(GLOBAL_BATCH):
            part = r[seq * T:(seq + 1) * T]
            aux = aux + load_balancing_loss_func((part,), E, K)
            z = z + (torch.logsumexp(part, dim=-1) ** 2).mean()
            n += 1
    return logits, ce, aux / n, z / n, routers


def patch_router_logits(model):
    """HF Mixtral collects router logits from every layer; layer 1 is our dense MLP, so give its output the
    (hidden, router_logits) shape the decoder layer expects."""
    mlp = model.model.layers[1].block_sparse_moe
    forward = mlp.forward
    mlp.forward = lambda h: (forward(h), None)


def check_forward_backward(model):
    batch = make_batches(1, 1)
    run_driver("grad", batch, os.path.join(WORK, "grad"))
    logits, ce, aux, z, routers = losses_of(model, batch[0])
    model.zero_grad()
    (ce + AUX * aux + ZC * z).backward()
    got_logits = load_file(os.path.join(WORK, "grad", "logits.safetensors"))["logits"]
    got_loss = float(open(os.path.join(WORK, "grad", "loss.txt")).read())
    got_aux, got_z = map(float, open(os.path.join(WORK, "grad", "aux.txt")).read().split())
    got_experts = load_file(os.path.join(WORK, "grad", "experts.safetensors"))["experts"]
    want_experts = torch.stack([torch.topk(F.softmax(r, dim=-1), K, dim=-1).indices for r in routers])
    same = torch.equal(got_experts.long().reshape(want_experts.shape), want_experts)
    report("mixtral_expert_choices", same,
           f"{int((got_experts.long().reshape(want_experts.shape) != want_experts).sum())} of {want_experts.numel()} differ")
    e = rel_err(got_logits, logits.detach())
    report("mixtral_logits", e <= 1e-5, f"max rel err {e:.3g} (tol 1e-5)")
    e = abs(got_loss - ce.item()) / abs(ce.item())
    report("mixtral_loss", e <= 1e-5, f"mtrain {got_loss:.8f} torch {ce.item():.8f} rel err {e:.3g}")
    e = abs(got_aux - aux.item()) / abs(aux.item())
    report("mixtral_aux_loss", e <= 1e-5, f"mtrain {got_aux:.8f} torch {aux.item():.8f} rel err {e:.3g}")
    e = abs(got_z - z.item()) / abs(z.item())
    report("mixtral_z_loss", e <= 1e-5, f"mtrain {got_z:.8f} torch {z.item():.8f} rel err {e:.3g}")
    grads = load_file(os.path.join(WORK, "grad", "grads.safetensors"))
    worst, worst_name, missing = 0.0, "", []
    for name, p in model.named_parameters():
        name = hf_name(name)
        if name not in grads:
            missing.append(name)
            continue
        e = rel_err(grads[name], p.grad)
        worst, worst_name = max((worst, worst_name), (e, name))
    report("mixtral_grads_present", not missing and len(grads) == len(list(model.parameters())),
           f"missing {missing}, {len(grads)} tensors")
    report("mixtral_grads", worst <= 1e-4, f"worst {worst_name} max rel err {worst:.3g} (tol 1e-4)")


def check_training(model):
    batches = make_batches(STEPS, 2)
    run_driver("train", batches, os.path.join(WORK, "train"))
    opt = adamw(model, OPT)
    ours = [list(map(float, line.split())) for line in open(os.path.join(WORK, "train", "losses.txt"))]
    worst, worst_step = 0.0, -1
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad()
        _, ce, aux, z, _ = losses_of(model, batches[step])
        (ce + AUX * aux + ZC * z).backward()
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), OPT["grad_clip"]))
        opt.step()
        if os.environ.get("MIXTRAL_REF_VERBOSE") and step < len(ours):
            print(f"  step {step} grad norm ours {ours[step][1]:.7f} torch {gn:.7f}", file=sys.stderr)
        if step < len(ours):
            e = abs(ours[step][0] - ce.item()) / abs(ce.item())
            if os.environ.get("MIXTRAL_REF_VERBOSE"):
                print(f"  step {step} ours {ours[step][0]:.7f} torch {ce.item():.7f} rel {e:.2e}", file=sys.stderr)
            if e > worst:
                worst, worst_step = e, step
    report("mixtral_training_steps", len(ours) == STEPS, f"{len(ours)} loss lines, want {STEPS}")
    report("mixtral_training_50_steps", worst <= 1e-4,
           f"worst step {worst_step} rel err {worst:.3g} (tol 1e-4); loss {ours[0][0]:.4f} -> {ours[-1][0]:.4f}")
    report("mixtral_training_loss_falls", ours[-1][0] < ours[0][0] - 0.2, f"{ours[0][0]:.4f} -> {ours[-1][0]:.4f}")


def main():
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    model = make_model()
    patch_router_logits(model)
    os.makedirs(WORK, exist_ok=True)
    write_recipe(os.path.join(WORK, "recipe.yaml"))
    save_file(state(model), os.path.join(WORK, "init.safetensors"))
    check_forward_backward(model)
    check_training(model)
    sys.exit(1 if ref_common.failures else 0)


if __name__ == "__main__":
    main()
