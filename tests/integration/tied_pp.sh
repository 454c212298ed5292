# Tied embeddings under pipeline parallelism (CPU, mpiexec oversubscribed):
# the last stage keeps a copy of the embedding as its output head, the two
# copies' gradients are summed over the embedding group, so every layout
# trains the same model as one rank (every step's loss within 1e-5 relative,
# final parameters within 1e-5). Checkpoints store the embedding once and
# move between pipeline and single-rank layouts, directly and via convert.
source "$(dirname "$0")/../lib.sh"
GRID_TEST=$(build_path tests/test_grid_embed)
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail tied_setup "data generate failed"; exit 1; }
# the embedding groups themselves (tests/unit/test_grid_embed.c), 4 ranks: pp 2, tp 2 x pp 2, pp 4
timeout 120 mpiexec -n 4 "$GRID_TEST" || fail tied_grid_embed_groups "exit $?"
# eps 1e-4 as in parallel.sh: AdamW steps of near-zero gradients do not amplify rounding
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
        tie_embeddings: true}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 20, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
checkpoint: {dir: ck_ref, interval: 20}
log: {dir: ref, interval: 100}
YAML
"$MTRAIN" pretrain r.yaml >"$TMP/out" 2>&1 || fail tied_reference_run "exit $?: $(tail -2 "$TMP/out")"
# the reference really is tied: no separate output head in its checkpoint
grep -q '"lm_head.weight"' ck_ref/step-000000020/manifest.json && fail tied_reference_has_no_head "lm_head.weight saved" ||
    pass tied_reference_has_no_head

# name tp pp dp extra-args...
layouts=(
    "pp2 1 2 1" "tp2_pp2 2 2 1" "pp2_dp2_zero 1 2 2 optimizer.distributed=true" "pp2_vpp2 1 2 1 parallel.vpp=2"
    "pp3_uneven_1_2_1 1 3 1 parallel.first_stage_layers=1 parallel.last_stage_layers=1"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 tp=$2 pp=$3 dp=$4; shift 4
    layout_run tied_$name $((tp * pp * dp)) r.yaml $name parallel.tp=$tp parallel.pp=$pp "$@" || continue
    close_metrics ref/metrics.jsonl $name/metrics.jsonl 1 20 && pass "tied_${name}_losses" ||
        fail "tied_${name}_losses" "$(paste <(step_metric ref/metrics.jsonl 1) <(step_metric $name/metrics.jsonl 1) | head -4 | tr '\n' ' ')"
    # the same tensor set as one rank: the last stage's copy of the embedding is not saved
    params_close tied_$name ck_ref/step-000000020 ck_$name/step-000000020
done

# save at tp 2 x pp 2, resume at pp 1 (directly and after convert); save at pp 1, resume at pp 2
"$MTRAIN" pretrain r.yaml --set train.steps=30 --set checkpoint.dir=long --set log.dir=long >/dev/null 2>&1 ||
    fail tied_long_run "exit $?"
run_np 4 pretrain r.yaml --set train.steps=30 --set parallel.tp=2 --set parallel.pp=2 --set checkpoint.dir=s_pp2 \
    --set log.dir=s_pp2 --stop-after 20 >/dev/null 2>&1 || fail tied_save_tp2_pp2 "exit $?"
"$MTRAIN" pretrain r.yaml --set train.steps=30 --set checkpoint.dir=s_pp1 --set log.dir=s_pp1 --stop-after 20 \
    >/dev/null 2>&1 || fail tied_save_pp1 "exit $?"
cp -r s_pp2 direct_pp1
"$MTRAIN" convert s_pp2 convert_pp1 --tp 1 --pp 1 --dp 1 >"$TMP/out" 2>&1 || fail tied_convert_pp1 "$(cat "$TMP/out")"
cp -r s_pp1 direct_pp2
for target in direct_pp1 convert_pp1 direct_pp2; do
    np=1 pp=1
    [ $target = direct_pp2 ] && np=2 pp=2
    run_np $np pretrain r.yaml --set train.steps=30 --set parallel.pp=$pp --set checkpoint.dir=$target \
        --set log.dir=$target >"$TMP/out" 2>&1
    if grep -q "resumed from $target/step-000000020" "$TMP/out" && close_metrics long/metrics.jsonl $target/metrics.jsonl 21 10; then
        pass tied_resume_$target
    else fail tied_resume_$target "$(grep -E 'resumed|error' "$TMP/out" | head -2)"; fi
    "$PY" "$COMPARE" long/step-000000030 $target/step-000000030 1e-5 >"$TMP/cmp" 2>&1 &&
        pass tied_resume_${target}_params || fail tied_resume_${target}_params "$(cat "$TMP/cmp")"
done
# the embedding group's traffic is counted: each step both ends all-reduce the
# embedding's gradient, 4 x vocab x hidden bytes (r.yaml: 264 x 32)
"$PY" - pp2/metrics.jsonl <<'PY' >"$TMP/cmp" 2>&1 && pass tied_pp2_embed_comm_counted || fail tied_pp2_embed_comm_counted "$(cat "$TMP/cmp")"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"comm"' in l][-1]
got = [e["embed"] for e in ev["bytes_per_step"]]
assert got == [4 * 264 * 32] * 2, got
PY
exit $FAILED
