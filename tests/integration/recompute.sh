# Activation recompute (train.recompute: selective, full) changes memory, not
# numbers: after 5 steps the checkpoint files are bitwise those of a run that
# keeps every activation, on one rank and in two parallel layouts, for a
# model with dense and MoE layers; and the dry run's activation estimate
# shrinks in the documented order.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 300 >/dev/null || { fail recompute_setup "data generate failed"; exit 1; }
# layers 0 and 2 MoE, 1 and 3 dense
cat >r.yaml <<'YAML'
model: {arch: mixtral, vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 64, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48, moe_layer_freq: 2,
        moe_z_loss_coef: 0.001}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 5, seed: 7}
optimizer: {lr: 3e-3, warmup_steps: 2}
data: {path: data}
checkpoint: {interval: 5}
log: {interval: 100}
YAML
# same_files NAME A B: every rank file of step 5 identical
same_files() {
    local f ok=1
    for f in "$2"/step-000000005/rank-*.safetensors; do cmp -s "$f" "$3/step-000000005/$(basename "$f")" || ok=0; done
    [ -f "$2/step-000000005/rank-00000.safetensors" ] || ok=0
    [ $ok = 1 ] && pass "$1" || fail "$1" "checkpoint files of $2 and $3 differ"
}
# name np settings...
layouts=("one 1" "tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true"
         "tp2_pp2_ep2_zero 8 parallel.tp=2 parallel.pp=2 parallel.ep=2 optimizer.distributed=true")
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 np=$2; shift 2
    sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    for mode in none selective full; do
        run_np "$np" pretrain r.yaml "${sets[@]}" --set train.recompute=$mode --set log.dir=$name-$mode \
            --set checkpoint.dir=ck-$name-$mode >"$TMP/out" 2>&1 || fail "recompute_${name}_${mode}_runs" "exit $?: $(tail -2 "$TMP/out")"
    done
    same_files "recompute_${name}_selective_bitwise" ck-$name-none ck-$name-selective
    same_files "recompute_${name}_full_bitwise" ck-$name-none ck-$name-full
done

# the estimate: full < selective < none
act() { "$MTRAIN" pretrain r.yaml --set train.recompute=$1 --set checkpoint.interval=0 --set model.hidden_size=256 \
        --set train.seq_len=256 --set train.micro_batch=8 --dry-run 2>/dev/null | sed -n 's/.*activations \([0-9.]*\),.*/\1/p'; }
none=$(act none) sel=$(act selective) full=$(act full)
awk -v a="$full" -v b="$sel" -v c="$none" 'BEGIN {exit (a < b && b < c) ? 0 : 1}' && pass recompute_estimate_order ||
    fail recompute_estimate_order "full $full, selective $sel, none $none GiB"
exit $FAILED
