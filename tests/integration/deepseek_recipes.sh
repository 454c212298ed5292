# The shipped DeepSeek-V3 recipes. deepseek-v3's dry run prints the published
# sizes: the main model 671B total (rounded to 1B) and 37B activated per token
# (37.55B with the embedding and head: the published figure without its
# fraction), the MTP module as Hugging Face stores it (with its copies of the
# embedding and output head) 14B within the rounding of 685B - 671B. The tiny
# recipe's counts are checked against an independent count from its shapes;
# it trains on the CPU (loss and MTP loss fall).
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TMP"
"$MTRAIN" pretrain "$ROOT/recipes/deepseek-v3.yaml" --set data.path=/tmp --dry-run >out 2>&1 ||
    fail deepseek_v3_dry_run "exit $?: $(tail -2 out)"
main=$(sed -n 's/^main_parameters: *\([0-9]*\).*/\1/p' out)
active=$(sed -n 's/^active_parameters: *\([0-9]*\).*/\1/p' out)
mtp=$(sed -n 's/^mtp_parameters: *\([0-9]*\).*/\1/p' out)
mtp_hf=$(sed -n 's/^mtp_parameters:.*; \([0-9]*\) as Hugging Face.*/\1/p' out)
[ -n "$main" ] && [ $(( (main + 500000000) / 1000000000 )) = 671 ] && pass deepseek_v3_total_params ||
    fail deepseek_v3_total_params "got '$main', want 671B"
[ -n "$active" ] && [ $(( active / 1000000000 )) = 37 ] && pass deepseek_v3_activated_params ||
    fail deepseek_v3_activated_params "got '$active', want 37B"
[ -n "$mtp_hf" ] && [ "$mtp_hf" -ge 13000000000 ] && [ "$mtp_hf" -lt 15000000000 ] && pass deepseek_v3_mtp_params ||
    fail deepseek_v3_mtp_params "got '$mtp_hf' (HF storage), want 14B +- 1B"
# an independent count of the shapes (python), for both recipes' main model and MTP module
count() { # C V L H QR KR DN DR DV F FM E K SHARED KDENSE MTP
    "$PY" - "$@" <<'PY'
import sys
C, V, L, H, QR, KR, DN, DR, DV, F, FM, E, K, S, KD, D = map(int, sys.argv[1:])
attn = (QR * C + QR + H * (DN + DR) * QR if QR else H * (DN + DR) * C) + (KR + DR) * C + KR + H * (DN + DV) * KR + C * H * DV
dense = 3 * C * F
router = E * C + E  # weights + the aux-loss-free bias
moe = router + E * 3 * C * FM + S * 3 * C * FM
moe_act = router + K * 3 * C * FM + S * 3 * C * FM
block = lambda l, act: attn + 2 * C + (dense if l < KD else (moe_act if act else moe))
main = 2 * V * C + C + sum(block(l, False) for l in range(L))
active = 2 * V * C + C + sum(block(l, True) for l in range(L))
mtp = D * (2 * C + 2 * C * C + C + block(L, False))
print(main, active, mtp)
PY
}
read want_main want_active want_mtp < <(count 7168 129280 61 128 1536 512 128 64 128 18432 2048 256 8 1 3 1)
[ "$main $active $mtp" = "$want_main $want_active $want_mtp" ] && pass deepseek_v3_counts_match_shapes ||
    fail deepseek_v3_counts_match_shapes "mtrain $main $active $mtp, independent count $want_main $want_active $want_mtp"
recipe_fits deepseek_v3_fits "$ROOT/recipes/deepseek-v3.yaml"
"$MTRAIN" pretrain "$ROOT/recipes/tiny-deepseek-v3.yaml" --set data.path=/tmp --dry-run >out 2>&1 ||
    fail deepseek_tiny_dry_run "exit $?: $(tail -2 out)"
got="$(sed -n 's/^main_parameters: *\([0-9]*\).*/\1/p' out) $(sed -n 's/^active_parameters: *\([0-9]*\).*/\1/p' out) $(sed -n 's/^mtp_parameters: *\([0-9]*\).*/\1/p' out)"
want=$(count 96 264 4 4 48 32 16 8 16 192 48 8 2 1 2 1)
[ "$got" = "$want" ] && pass deepseek_tiny_counts_match_shapes || fail deepseek_tiny_counts_match_shapes "mtrain $got, want $want"
# the tiny recipe trains on the CPU: MLA, sigmoid group-limited routing with the expert bias, shared expert, MTP
"$MTRAIN" data generate --out data >/dev/null || { fail deepseek_tiny_setup "data generate failed"; exit 1; }
OMP_NUM_THREADS=2 "$MTRAIN" pretrain "$ROOT/recipes/tiny-deepseek-v3.yaml" --set data.path=data --set train.steps=40 \
    --set train.eval_interval=40 --set log.dir=run >out 2>&1 || fail deepseek_tiny_trains "exit $?: $(tail -2 out)"
first=$(grep '"loss"' run/metrics.jsonl | head -1 | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(grep '"loss"' run/metrics.jsonl | tail -1 | sed 's/.*"loss":\([^,]*\),.*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN {exit b < a - 1 ? 0 : 1}' && pass deepseek_tiny_loss_falls ||
    fail deepseek_tiny_loss_falls "$first -> $last"
# the MTP loss is recorded every step and falls too (it predicts one token further)
mfirst=$(grep '"mtp_loss"' run/metrics.jsonl | head -1 | sed 's/.*"mtp_loss":\([^,}]*\).*/\1/')
mlast=$(grep '"mtp_loss"' run/metrics.jsonl | tail -1 | sed 's/.*"mtp_loss":\([^,}]*\).*/\1/')
[ "$(grep -c '"mtp_loss"' run/metrics.jsonl)" = 40 ] && awk -v a="$mfirst" -v b="$mlast" 'BEGIN {exit b < a - 1 ? 0 : 1}' &&
    pass deepseek_tiny_mtp_loss_recorded || fail deepseek_tiny_mtp_loss_recorded "mtp_loss $mfirst -> $mlast"
grep -q "| mtp " out && pass deepseek_tiny_mtp_loss_printed || fail deepseek_tiny_mtp_loss_printed "$(grep step out | tail -1)"
# mtrain eval runs DeepSeek-V3 through the training forward: its valid split
# equals the run's own validation at step 40 (same samples, same forward)
want=$("$PY" -c "import json; print([json.loads(l)['val_loss'] for l in open('run/metrics.jsonl') if '\"eval\"' in l][-1])")
OMP_NUM_THREADS=2 "$MTRAIN" eval run --data data --split valid --batches 4 --batch-size 8 --json >ev.json 2>err ||
    fail deepseek_eval_runs "$(tail -2 err)"
"$PY" -c "import json,sys; g=json.load(open('ev.json'))['loss']; sys.exit(0 if abs(g-$want)<=2e-6*abs($want)+1e-6 else 1)" &&
    pass deepseek_eval_equals_training_eval || fail deepseek_eval_equals_training_eval "eval $(cat ev.json), training $want"
# generate decodes it (its KV cache against the full forward: generate_eval.sh)
ids=$("$MTRAIN" generate run --prompt-ids 1,2 --max-tokens 8 --stop-id -1 --print-ids 2>err | tail -1)
[ "$(echo "$ids" | tr ',' '\n' | grep -c '^[0-9][0-9]*$')" = 8 ] && pass deepseek_generate_runs ||
    fail deepseek_generate_runs "'$ids' $(tail -2 err)"
exit $FAILED
