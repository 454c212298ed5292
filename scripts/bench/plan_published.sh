#!/usr/bin/env bash
# mtrain plan against published multi-GPU training speeds (issue 32): each
# published run's model, GPU count, precision, global batch, sequence length
# and layout, predicted with `mtrain plan --layout` on the shipped H100
# system (recipes/systems/h100.yaml), against its published model TFLOP/s per
# GPU (../shared/reference/moe-scale.md, megatron.md: Megatron-Bridge's
# DGX-H100 tables, Megatron-MoE-ModelZoo). Where mtrain cannot take the
# published layout as it is, the row says what it runs instead. CPU only,
# a second; prints a markdown table (docs/benchmarks.md has it, with why
# each gap is what it is).
set -euo pipefail
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-./mtrain}
GPU=${GPU:-h100}
echo "| model, GPUs, precision | published layout | mtrain's layout | TFLOP/s/GPU published | predicted | predicted / published | tokens/s/GPU published | predicted | predicted memory (GiB) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
# row NAME PUBLISHED_LAYOUT MTRAIN_LAYOUT_TEXT PUBLISHED_TFLOPS PUBLISHED_TOKENS RECIPE GPUS LAYOUT SETS...
# (the plan's table: column 13 tokens/s per GPU, 14 TFLOP/s per GPU)
row() {
    local name=$1 pub=$2 ours=$3 tflops=$4 tokens=$5 recipe=$6 gpus=$7 layout=$8 out
    shift 8
    local sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    out=$("$MTRAIN" plan "$recipe" --gpus "$gpus" --gpu "$GPU" --layout "$layout" "${sets[@]}" 2>&1) ||
        { echo "plan_published: $name: $out" >&2; exit 1; }
    local line mem
    line=$(echo "$out" | awk '$1 == 1 && NF >= 18')
    mem=$(echo "$out" | sed -n 's/^predicted_memory_gib: \([0-9.]*\) (\(.*\))$/\1 (\2)/p')
    [ -n "$line" ] || { echo "plan_published: $name: no prediction in: $out" >&2; exit 1; }
    echo "$line" | awk -v name="$name" -v pub="$pub" -v ours="$ours" -v t="$tflops" -v tok="$tokens" -v mem="$mem" \
        '{printf "| %s | %s | %s | %s | %.0f | %.2f | %s | %.0f | %s |\n", name, pub, ours, t, $14, $14 / t, tok, $13, mem}'
}
row "Llama 3 8B, 8, FP8" "TP1 PP1, FSDP 8, GBS 128 x 8192" "tp 1 pp 1, dp 8 + ZeRO-1, mb 1" 744 14451 \
    recipes/llama3-8b.yaml 8 1,1,1,1,1,1,none train.precision=fp8 train.global_batch=128 train.seq_len=8192
row "Llama 3 70B, 64, FP8" "TP4 PP8 VP5, GBS 128 x 8192" "tp 4 pp 8 vpp 5, dp 2 + ZeRO-1, mb 1" 719 1602 \
    recipes/llama3-70b.yaml 64 4,8,5,1,1,1,none train.precision=fp8 train.global_batch=128 train.seq_len=8192
row "DeepSeek-V3, 1024, FP8" "TP2 PP8 VP4 EP64, GBS 8192 x 4096" "tp 2 pp 8 (stages of 7, 6 x 8, 6 layers: 61 layers take no vpp), ep 64, mb 1" 338 1297 \
    recipes/deepseek-v3.yaml 1024 2,8,1,1,64,1,none train.precision=fp8 train.global_batch=8192 train.seq_len=4096
row "Mixtral 8x22B, 128, bf16" "TP2 PP8 EP8 VP7, GBS 256 x 4096" "tp 2 pp 8 vpp 7, ep 8, mb 1" 445 - \
    recipes/mixtral-8x22b.yaml 128 2,8,7,1,8,1,none train.precision=bf16 train.global_batch=256 train.seq_len=4096
