#!/usr/bin/env bash
# Training throughput: mtrain's CPU backend against PyTorch (Hugging Face
# LlamaForCausalLM, same shape, same threads) on a ~124M-parameter Llama
# (12 layers, hidden 768, 12 heads, 4 kv heads, FFN 2048, vocab 32768),
# micro batch 4 x seq 256, fp32; plus OpenBLAS sgemm measured in the same run.
# Writes build/bench/train.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
mkdir -p build/bench
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-3}
SHAPE="12 768 12 4 2048 32768 4 256 $STEPS"
PY=${PYTHON:-/usr/bin/python3}
export OMP_NUM_THREADS=$THREADS
ours=$("$BUILD/bench/bench_train" $SHAPE)
theirs=$("$PY" scripts/bench/torch_llama_step.py $SHAPE)
"$PY" - "$ours" "$theirs" <<'PYEOF'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
sgemm = max(ours["sgemm_gflops_ffn"], ours["sgemm_gflops_head"])
rows = [
    ("model", f'Llama {ours["params"]/1e6:.1f}M params, micro batch {ours["micro_batch"]} x seq {ours["seq_len"]}, fp32, {ours["threads"]} threads'),
    ("mtrain step (median)", f'{ours["step_s"]:.3f} s  ({ours["tokens_per_s"]:.1f} tokens/s)'),
    ("PyTorch step (median)", f'{theirs["step_s"]:.3f} s  ({theirs["tokens_per_s"]:.1f} tokens/s, torch {theirs["torch"]})'),
    ("mtrain / PyTorch", f"{ratio:.2f}x  (target >= 1.5x)"),
    ("mtrain achieved", f'{ours["gflops"]:.1f} GFLOP/s'),
    ("OpenBLAS sgemm", f'{ours["sgemm_gflops_ffn"]:.1f} GFLOP/s (1024x768x2048), {ours["sgemm_gflops_head"]:.1f} (1024x768x32768)'),
    ("mtrain / sgemm", f'{ours["gflops"] / sgemm:.2f}'),
]
print("| metric | value |\n| --- | --- |")
for k, v in rows:
    print(f"| {k} | {v} |")
json.dump({"mtrain": ours, "pytorch": theirs, "ratio": ratio, "fraction_of_sgemm": ours["gflops"] / sgemm},
          open("build/bench/train.json", "w"), indent=1)
print("wrote build/bench/train.json")
PYEOF
