# ZeRO-1's memory (model/optimizer.c): the gradient reduce-scatter and the
# parameter all-gather work in place in the gradient and parameter buffers,
# with no full-size scratch. The same arithmetic as without ZeRO-1: at dp 2
# (any sum of two is the same bits in either order) bf16 and fp8 runs with
# and without optimizer.distributed, over tp2 x pp2 x dp2 with overlapped and
# unoverlapped reduction and over a Mixtral ep2 x dp4 (experts over edp 2),
# give bitwise the same losses and final parameters. The 8B
# recipe's dry run at 8 ranks fits 80 GiB with buffers under 5% of the total.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 300 >/dev/null || { fail zero_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 16, steps: 6, seed: 7}
optimizer: {lr: 3e-3, warmup_steps: 2}
data: {path: data}
checkpoint: {interval: 6}
log: {interval: 100}
YAML
cat >moe.yaml <<'YAML'
model: {arch: mixtral, vocab_size: 264, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 64, num_experts: 4, experts_per_token: 2}
train: {seq_len: 16, micro_batch: 2, global_batch: 16, steps: 6, seed: 7}
optimizer: {lr: 3e-3, warmup_steps: 2}
data: {path: data}
checkpoint: {interval: 6}
log: {interval: 100}
YAML
# same NAME RECIPE NP SETTINGS...: ZeRO-1 against the same run without it, bitwise
same() {
    local name=$1 recipe=$2 np=$3; shift 3
    layout_run zero_$name $np $recipe plain_$name optimizer.distributed=false "$@" || return
    layout_run zero_$name $np $recipe zero_$name optimizer.distributed=true "$@" || return
    [ "$(metric plain_$name/metrics.jsonl loss)" = "$(metric zero_$name/metrics.jsonl loss)" ] &&
        pass zero_${name}_losses_bitwise || fail zero_${name}_losses_bitwise \
        "$(paste <(metric plain_$name/metrics.jsonl loss) <(metric zero_$name/metrics.jsonl loss) | head -3 | tr '\n' ' ')"
    "$PY" "$COMPARE" ck_plain_$name/step-000000006 ck_zero_$name/step-000000006 0 >"$TMP/cmp" 2>&1 &&
        pass zero_${name}_state_bitwise || fail zero_${name}_state_bitwise "$(cat "$TMP/cmp")"
}
for p in bf16 fp8; do
    same tp2_pp2_dp2_$p r.yaml 8 parallel.tp=2 parallel.pp=2 train.precision=$p
    same tp2_pp2_dp2_no_overlap_$p r.yaml 8 parallel.tp=2 parallel.pp=2 train.precision=$p parallel.overlap_grad_reduce=false \
        parallel.overlap_param_gather=false
done
same moe_ep2_dp4_bf16 moe.yaml 4 parallel.ep=2 train.precision=bf16
# the 8B recipe at 8 ranks: fits, and buffers (no ZeRO scratch left) under 5% of the total
ROOT=$TEST_ROOT
recipe_fits zero_llama3_8b_fits "$ROOT/recipes/llama3-8b.yaml"
SLURM_NTASKS=8 "$MTRAIN" pretrain "$ROOT/recipes/llama3-8b.yaml" --set data.path=/tmp --set train.precision=bf16 \
    --dry-run >"$TMP/dry" 2>&1
line=$(grep '^memory_per_rank:' "$TMP/dry")
total=$(echo "$line" | sed 's/^memory_per_rank: *\([0-9.]*\) GiB.*/\1/')
buffers=$(echo "$line" | sed 's/.*buffers \([0-9.]*\);.*/\1/')
awk -v t="$total" -v b="$buffers" 'BEGIN {exit (t > 0 && b < 0.05 * t) ? 0 : 1}' && pass zero_llama3_8b_buffers_under_5_percent ||
    fail zero_llama3_8b_buffers_under_5_percent "$line"
exit $FAILED
