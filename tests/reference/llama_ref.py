"""mtrain's CPU Llama against Hugging Face transformers' LlamaForCausalLM.

1. Same weights (moved as safetensors) and batch: logits and loss within 1e-5
   and every parameter gradient within 1e-4 (error = max|mtrain - torch| /
   max|torch| per tensor, so near-zero entries do not dominate).
2. 50 AdamW steps (warmup + cosine, weight decay off for norms, global-norm
   clipping, gradient accumulation over 2 micro batches) from the same initial
   weights on the same batches: every step's loss within 1e-4 relative.

usage: llama_ref.py DRIVER WORKDIR   (prints PASS/FAIL lines)
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import ref_common
from ref_common import adamw, optimizer_yaml, rel_err, report

DRIVER, WORK = sys.argv[1], sys.argv[2]
V, C, L, H, KV, FF, T = 300, 64, 2, 4, 2, 160, 16
GLOBAL_BATCH, MICRO_BATCH, STEPS = 4, 2, 50
OPT = dict(lr=3e-3, min_lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=0.5, warmup_steps=5)
ROPE = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)


def make_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, max_position_embeddings=8 * T, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, rope_scaling=dict(rope_type="llama3", **ROPE))
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # non-trivial norm weights, so their gradients are exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def write_recipe(path):
    with open(path, "w") as f:
        f.write(f"""model:
  vocab_size: {V}
  hidden_size: {C}
  num_layers: {L}
  num_heads: {H}
  num_kv_heads: {KV}
  intermediate_size: {FF}
  rope_theta: 500000
  rope_scaling_factor: {ROPE['factor']}
  rope_low_freq_factor: {ROPE['low_freq_factor']}
  rope_high_freq_factor: {ROPE['high_freq_factor']}
  rope_original_max_pos: {ROPE['original_max_position_embeddings']}
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


def loss_of(model, batch):
    x, y = torch.from_numpy(batch[:, :T]).long(), torch.from_numpy(batch[:, 1:]).long()
    logits = model(input_ids=x).logits
    return logits, F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def check_forward_backward(model):
    batch = make_batches(1, 1)
    run_driver("grad", batch, os.path.join(WORK, "grad"))
    logits, loss = loss_of(model, batch[0])
    model.zero_grad()
    loss.backward()
    got_logits = load_file(os.path.join(WORK, "grad", "logits.safetensors"))["logits"]
    got_loss = float(open(os.path.join(WORK, "grad", "loss.txt")).read())
    e = rel_err(got_logits, logits.detach())
    report("reference_logits", e <= 1e-5, f"max rel err {e:.3g} (tol 1e-5)")
    e = abs(got_loss - loss.item()) / abs(loss.item())
    report("reference_loss", e <= 1e-5, f"mtrain {got_loss:.8f} torch {loss.item():.8f} rel err {e:.3g}")
    grads = load_file(os.path.join(WORK, "grad", "grads.safetensors"))
    worst, worst_name, missing = 0.0, "", []
    for name, p in model.named_parameters():
        if name not in grads:
            missing.append(name)
            continue
        e = rel_err(grads[name], p.grad)
        worst, worst_name = max((worst, worst_name), (e, name))
    report("reference_grads_present", not missing, f"missing {missing}")
    report("reference_grads", worst <= 1e-4, f"worst {worst_name} max rel err {worst:.3g} (tol 1e-4)")


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
        _, loss = loss_of(model, batches[step])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPT["grad_clip"])
        opt.step()
        e = abs(ours[step][0] - loss.item()) / abs(loss.item())
        if e > worst:
            worst, worst_step = e, step
    report("reference_training_steps", len(ours) == STEPS, f"{len(ours)} loss lines, want {STEPS}")
    report("reference_training_50_steps", worst <= 1e-4,
           f"worst step {worst_step} rel err {worst:.3g} (tol 1e-4); loss {ours[0][0]:.4f} -> {ours[-1][0]:.4f}")
    report("reference_training_loss_falls", ours[-1][0] < ours[0][0] - 0.5, f"{ours[0][0]:.4f} -> {ours[-1][0]:.4f}")
    params = load_file(os.path.join(WORK, "train", "params.safetensors"))
    e = max(rel_err(params[n], p.detach()) for n, p in model.named_parameters())
    print(f"  final parameters after {STEPS} steps: max rel err {e:.3g} (informational)", file=sys.stderr)


def main():
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    model = make_model()
    os.makedirs(WORK, exist_ok=True)
    write_recipe(os.path.join(WORK, "recipe.yaml"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(WORK, "init.safetensors"))
    check_forward_backward(model)
    check_training(model)
    sys.exit(1 if ref_common.failures else 0)


if __name__ == "__main__":
    main()
