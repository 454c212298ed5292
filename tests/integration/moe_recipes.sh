# The shipped MoE recipes: mixtral-8x7b's dry run prints the published
# parameter counts (46.7B total, 12.9B active per token); tiny-mixtral trains
# on the CPU and its loss falls; the step line and metrics carry the MoE stats.
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TMP"
"$MTRAIN" pretrain "$ROOT/recipes/mixtral-8x7b.yaml" --set data.path=/tmp --dry-run >out 2>&1
total=$(sed -n 's/^parameters: *\([0-9]*\).*/\1/p' out)
active=$(sed -n 's/^active_parameters: *\([0-9]*\).*/\1/p' out)
# published: 46.7B / 12.9B (rounded to 0.1B)
[ -n "$total" ] && [ $(( (total + 50000000) / 100000000 )) = 467 ] && pass moe_mixtral_8x7b_total_params ||
    fail moe_mixtral_8x7b_total_params "got '$total', want 46.7B"
[ -n "$active" ] && [ $(( (active + 50000000) / 100000000 )) = 129 ] && pass moe_mixtral_8x7b_active_params ||
    fail moe_mixtral_8x7b_active_params "got '$active', want 12.9B"
# mixtral-8x22b: the published 141B / 39B active
"$MTRAIN" pretrain "$ROOT/recipes/mixtral-8x22b.yaml" --set data.path=/tmp --dry-run >out 2>&1
total=$(sed -n 's/^parameters: *\([0-9]*\).*/\1/p' out)
active=$(sed -n 's/^active_parameters: *\([0-9]*\).*/\1/p' out)
[ -n "$total" ] && [ $(( (total + 500000000) / 1000000000 )) = 141 ] && [ $(( (active + 500000000) / 1000000000 )) = 39 ] &&
    pass moe_mixtral_8x22b_params || fail moe_mixtral_8x22b_params "got '$total' / '$active', want 141B / 39B"
# each fits 80 GiB per GPU at the GPU count its header states
recipe_fits moe_mixtral_8x7b_fits "$ROOT/recipes/mixtral-8x7b.yaml"
recipe_fits moe_mixtral_8x22b_fits "$ROOT/recipes/mixtral-8x22b.yaml"
"$MTRAIN" data generate --out data >/dev/null || { fail moe_tiny_setup "data generate failed"; exit 1; }
OMP_NUM_THREADS=2 "$MTRAIN" pretrain "$ROOT/recipes/tiny-mixtral.yaml" --set data.path=data --set train.steps=60 \
    --set train.eval_interval=60 --set log.dir=run >out 2>&1 || fail moe_tiny_mixtral_trains "exit $?: $(tail -2 out)"
first=$(grep '"loss"' run/metrics.jsonl | head -1 | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(grep '"loss"' run/metrics.jsonl | tail -1 | sed 's/.*"loss":\([^,]*\),.*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN {exit b < a - 1 ? 0 : 1}' && pass moe_tiny_mixtral_loss_falls ||
    fail moe_tiny_mixtral_loss_falls "$first -> $last"
# a capacity factor too large to drop anything trains as dropless (it overflowed the buffers' bound before)
OMP_NUM_THREADS=2 "$MTRAIN" pretrain "$ROOT/recipes/tiny-mixtral.yaml" --set data.path=data --set train.steps=3 \
    --set optimizer.warmup_steps=1 --set model.moe_capacity_factor=1e300 --set log.dir=huge_cap >huge 2>&1 &&
    grep -q '"loss"' huge_cap/metrics.jsonl && ! grep '"loss"' huge_cap/metrics.jsonl | grep -qv '"dropped":0[,}]' && pass moe_huge_capacity_factor_trains ||
    fail moe_huge_capacity_factor_trains "$(tail -2 huge)"
grep -q '| aux [0-9.]* | load max [0-9.]*' out && pass moe_step_line_stats || fail moe_step_line_stats "$(grep '^step' out | tail -1)"
grep -q '"expert_load":\[\[' run/metrics.jsonl && grep -q '"aux_loss":' run/metrics.jsonl && pass moe_metrics_expert_load ||
    fail moe_metrics_expert_load "$(tail -c 300 run/metrics.jsonl)"
exit $FAILED
