#!/usr/bin/env bash
# mtrain plan against mtrain on one GPU (scripts/device/gpu_checks.sh plan):
# with SYSTEM calibrated on this GPU (`mtrain plan --calibrate FILE --device
# cuda --base recipes/systems/h100.yaml`), predict the step of the 8B-shaped
# stack (Llama 3 8B's layer shapes, 4 layers, vocab 128256, 1 x 8192 tokens,
# bf16) and measure it with `mtrain pretrain` (mean step_ms of steps 3-6):
# the plan issue's target is within 10%. Then the predictions for the full
# 32-layer Llama 3 8B on 8 of these GPUs in bf16 and FP8 (the best layouts).
#   bash scripts/bench/plan_gpu.sh SYSTEM_FILE
cd "$(dirname "$0")/../.."
SYSTEM=${1:?usage: plan_gpu.sh SYSTEM_FILE}
MTRAIN=${MTRAIN:-$PWD/mtrain}
TMP=$(mktemp -d /tmp/mtrain-plan-gpu.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
"$MTRAIN" data generate --out "$TMP/data" --docs 2000 --frame-tokens 65536 >/dev/null || exit 1
cat >"$TMP/stack.yaml" <<YAML
model: {vocab_size: 128256, hidden_size: 4096, num_layers: 4, num_heads: 32, num_kv_heads: 8, intermediate_size: 14336,
        rope_theta: 500000}
train: {seq_len: 8192, micro_batch: 1, global_batch: 1, steps: 6, seed: 7, device: cuda, precision: bf16}
optimizer: {lr: 3e-4, min_lr: 3e-5, warmup_steps: 2}
data: {path: $TMP/data}
log: {interval: 100}
YAML
pred=$("$MTRAIN" plan "$TMP/stack.yaml" --gpus 1 --gpu "$SYSTEM" --layout 1,1,1,1,1,1,none | sed -n 's/^predicted_step_ms: //p')
"$MTRAIN" pretrain "$TMP/stack.yaml" --set log.dir="$TMP/run" >"$TMP/out" 2>&1 || { tail -5 "$TMP/out"; echo "FAIL plan_gpu_8b_stack: the run failed"; exit 1; }
meas=$(grep '"loss"' "$TMP/run/metrics.jsonl" | sed -n 's/.*"step":\([0-9]*\),.*"step_ms":\([0-9.]*\).*/\1 \2/p' |
    awk '$1 >= 3 {s += $2; n++} END {printf "%.2f", s / n}')
err=$(awk -v p="$pred" -v m="$meas" 'BEGIN {printf "%.1f", 100 * (p - m) / m}')
echo "8B-shaped stack, 1 x 8192 tokens, bf16: predicted $pred ms, measured $meas ms ($err%)"
awk -v e="$err" 'BEGIN {exit (e <= 10 && e >= -10) ? 0 : 1}' && echo "PASS plan_gpu_8b_stack_within_10pct" ||
    echo "FAIL plan_gpu_8b_stack_within_10pct: $err%"
for p in bf16 fp8; do
    echo "== Llama 3 8B (32 layers) on 8 GPUs, $p"
    "$MTRAIN" plan recipes/llama3-8b.yaml --gpus 8 --gpu "$SYSTEM" --set train.precision=$p --top 3
done
