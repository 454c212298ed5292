#!/usr/bin/env python3
"""The GPU speed targets of issues 9 and 12, read off train_gpu.sh's JSON
(build/bench/train_gpu*.json, one or more files of one run or one warm
machine): one PASS / FAIL / SKIP line per target, so a short device session
knows at once where it stands. SKIP: not measured in these files.

  8b bf16     mtrain bf16 >= 50% MFU (bf16 dense peak)
  8b vs torch mtrain bf16 step <= the faster PyTorch bf16 step / 1.25
  8b memory   mtrain bf16 device memory <= PyTorch bf16 eager's peak
  124m        mtrain bf16 step <= PyTorch bf16 + torch.compile step
  attention   mtrain's default attention fwd+bwd (D 128; cuDNN where it agreed
              with the flash kernels, deterministic) <= PyTorch SDPA flash backend's
  8b fp8      mtrain fp8 (current scaling) step <= mtrain bf16 step / 1.3

usage: acceptance.py FILE.json...
"""
import json
import os
import sys


def load(paths):
    rows, peak = [], 989.0
    for p in paths:
        if not os.path.exists(p):  # an unexpanded glob: nothing measured
            continue
        d = json.load(open(p))
        peak = d.get("peak_bf16_tflops", peak)
        rows += d.get("rows", [])
    return rows, peak


def step(rows, shape, run):
    """(step_s, record) of the row of shape and run (train_gpu.sh's names)"""
    for r in rows:
        if r.get("shape") == shape and r.get("run") == run and r.get("r") and "step_s" in r["r"]:
            return r["r"]["step_s"], r["r"]
    return None, None


def verdict(name, ok, detail):
    word = "SKIP" if ok is None else "PASS" if ok else "FAIL"
    print(f"{word} accept_{name}: {detail}")
    return ok


def main(paths):
    rows, peak = load(paths)
    results = []
    bf, rec = step(rows, "8b", "mtrain bf16")
    tb, trec = step(rows, "8b", "PyTorch bf16 autocast, SDPA, fused AdamW")
    tc, _ = step(rows, "8b", "PyTorch bf16 autocast, SDPA, fused AdamW, compile")
    if tb is not None and tc is not None and tc < tb:
        tb = tc
    if bf is not None and rec.get("flops_per_step"):
        mfu = rec["flops_per_step"] / bf / 1e12 / peak
        results.append(verdict("8b_bf16_mfu", mfu >= 0.50, f"{100 * mfu:.1f}% MFU (target 50%)"))
    else:
        results.append(verdict("8b_bf16_mfu", None, "mtrain bf16 on the 8b shape not measured"))
    if bf is not None and tb is not None:
        results.append(verdict("8b_bf16_vs_pytorch", tb / bf >= 1.25, f"{tb / bf:.2f}x the faster PyTorch bf16 step (target 1.25x)"))
        mem, tmem = rec.get("mem_mib"), trec.get("peak_mem_mib") if trec else None
        if mem and tmem:
            results.append(verdict("8b_bf16_memory", mem <= tmem, f"{mem:.0f} MiB vs PyTorch's {tmem:.0f} MiB"))
        else:
            results.append(verdict("8b_bf16_memory", None, "memory of one side not recorded"))
    else:
        results.append(verdict("8b_bf16_vs_pytorch", None, "one side not measured"))
    s, _ = step(rows, "124m", "mtrain bf16")
    c, _ = step(rows, "124m", "PyTorch bf16 autocast, SDPA, fused AdamW, compile")
    results.append(verdict("124m_bf16_vs_compile", None if s is None or c is None else c / s >= 1.0,
                           "one side not measured" if s is None or c is None else f"{c / s:.2f}x torch.compile (target 1.0x)"))
    att = [r["attention"] for r in rows if "attention" in r]
    # the default mode's row (auto, deterministic); files before it had only the flash kernels' row
    ours = [a for a in att if a.get("D") == 128 and a.get("mode") == "auto" and "atomic" not in a.get("impl", "")
            and "fwd_bwd_ms" in a] or \
        [a for a in att if a.get("D") == 128 and a.get("impl") == "mtrain flash attention" and "fwd_bwd_ms" in a]
    theirs = [a for a in att if a.get("D") == 128 and a.get("backend") == "flash" and "fwd_bwd_ms" in a]
    if ours and theirs:
        ratio = theirs[0]["fwd_bwd_ms"] / ours[0]["fwd_bwd_ms"]
        results.append(verdict("attention_d128_vs_flash", ratio >= 1.0,
                               f"{ours[0]['impl']}: {ratio:.2f}x PyTorch's flash backend (target 1.0x)"))
    else:
        results.append(verdict("attention_d128_vs_flash", None, "one side not measured"))
    f8, _ = step(rows, "8b", "mtrain fp8")
    results.append(verdict("8b_fp8_vs_bf16", None if f8 is None or bf is None else bf / f8 >= 1.3,
                           "one side not measured" if f8 is None or bf is None else f"{bf / f8:.2f}x mtrain bf16 (target 1.3x)"))
    return 1 if any(r is False for r in results) else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
