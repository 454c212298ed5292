"""Shared pieces of the PyTorch / Hugging Face reference tests: PASS/FAIL
reporting, the error measure, the documented LR schedule, learnable batches,
the ref_driver call and the optimizer part of the recipe."""
import math
import os
import subprocess
import sys

import numpy as np
import torch

failures = 0


def report(name, ok, detail):
    """One PASS/FAIL line on stdout (counted by tests/run.sh), the detail on stderr."""
    global failures
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail), flush=True)
    print(f"  {name}: {detail}", file=sys.stderr)
    failures += 0 if ok else 1


def rel_err(got, want):
    """max|got - want| / max|want|, so near-zero entries do not dominate."""
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30))


def lr_at(opt, steps, step):
    """The documented schedule (docs/recipe.md): linear warmup, then cosine to min_lr."""
    lr, lo, w = opt["lr"], opt["min_lr"], opt["warmup_steps"]
    if step < w:
        return lr * (step + 1) / w
    p = min(1.0, (step - w) / (steps - w))
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * p))


def make_batches(steps, seed, batch, seq_len, vocab):
    """Learnable sequences (a noisy affine walk over the vocabulary) so the loss moves."""
    rng = np.random.default_rng(seed)
    out = np.empty((steps, batch, seq_len + 1), dtype=np.int32)
    for s in range(steps):
        for b in range(batch):
            x = rng.integers(vocab)
            for t in range(seq_len + 1):
                out[s, b, t] = x
                x = (7 * x + 3) % vocab if rng.random() < 0.8 else rng.integers(vocab)
    return out


def run_driver(driver, work, mode, batches, outdir):
    """tests/reference/ref_driver.c on WORK/recipe.yaml and WORK/init.safetensors."""
    os.makedirs(outdir, exist_ok=True)
    bpath = os.path.join(outdir, "batches.i32")
    batches.astype("<i4").tofile(bpath)
    subprocess.run([driver, mode, os.path.join(work, "recipe.yaml"), os.path.join(work, "init.safetensors"), bpath,
                    outdir], check=True)


def optimizer_yaml(opt):
    """The recipe's optimizer section for the settings of adamw() and lr_at()."""
    return "optimizer:\n" + "".join(f"  {k}: {opt[k]}\n" for k in (
        "lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "warmup_steps")) + "  schedule: cosine\n"


def adamw(model, opt):
    """torch AdamW with mtrain's grouping: no weight decay on norm weights."""
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n]
    return torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
