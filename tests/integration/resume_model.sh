# A resume must continue the same model: every model key that changes what
# the network computes is compared with the checkpoint's recipe, and a
# difference exits 2 naming the key, before any step (a 4-layer checkpoint
# resumed by a 2-layer recipe, or 4/2 heads as 8/4: the same tensor shapes).
# Keys that only start a run or size buffers may change.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 >/dev/null || { fail resume_model_setup "data generate failed"; exit 1; }
R="$TEST_ROOT/recipes/tiny-mixtral.yaml"
base=(--set data.path=data --set train.steps=4 --set optimizer.warmup_steps=1 --set checkpoint.dir=ck
      --set checkpoint.interval=2)
OMP_NUM_THREADS=2 "$MTRAIN" pretrain "$R" "${base[@]}" --set train.steps=2 --set log.dir=a >out 2>&1 ||
    { fail resume_model_first_run "exit $?: $(tail -2 out)"; exit 1; }
layers=$(sed -n 's/^ *num_layers: *\([0-9]*\).*/\1/p' "$R" | head -1)
expect_exit resume_model_fewer_layers_refused 2 "$MTRAIN" pretrain "$R" "${base[@]}" --set model.num_layers=$((layers / 2))
expect_output resume_model_fewer_layers_named "model.num_layers $((layers / 2)) \(checkpoint $layers\)"
heads=$(sed -n 's/^ *num_heads: *\([0-9]*\).*/\1/p' "$R" | head -1)
kv=$(sed -n 's/^ *num_kv_heads: *\([0-9]*\).*/\1/p' "$R" | head -1)
expect_exit resume_model_other_heads_refused 2 "$MTRAIN" pretrain "$R" "${base[@]}" \
    --set model.num_heads=$((heads * 2)) --set model.num_kv_heads=$((kv * 2))
expect_output resume_model_other_heads_named "model.num_heads $((heads * 2)) \(checkpoint $heads\).*model.num_kv_heads"
expect_exit resume_model_routing_refused 2 "$MTRAIN" pretrain "$R" "${base[@]}" --set model.moe_capacity_factor=1.5
expect_output resume_model_says_init_from "model.init_from"
[ ! -d ck/step-000000004 ] && pass resume_model_refused_before_training ||
    fail resume_model_refused_before_training "a refused resume trained on"
# init_std (only the first run's initialisation) may differ
OMP_NUM_THREADS=2 "$MTRAIN" pretrain "$R" "${base[@]}" --set model.init_std=0.5 --set log.dir=b >out 2>&1 &&
    grep -q "resumed from ck/step-000000002" out && pass resume_model_init_std_may_differ ||
    fail resume_model_init_std_may_differ "$(tail -2 out)"
exit $FAILED
