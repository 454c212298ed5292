#!/usr/bin/env bash
# mtrain plan against measurement on this machine's CPU ranks: calibrate the
# machine (`mpiexec -n NP mtrain plan --calibrate`; with NP=4 on 2 cores
# rank 0 times compute alone and scales it by its share of the cores),
# predict the step time of nine layouts of a small model on NP ranks (2 by
# default, or 4) with `mtrain plan --layout`, run
# each and compare with its measured mean step time (steps 3-8). Targets
# (the plan issue): every prediction within 25% of measured, and the layout
# predicted best within 10% of the measured best. Writes
# build/bench/plan.json. Run it on an idle machine: the calibration and the
# runs share its cores.
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-$PWD/mtrain}
OUT=$PWD/build/bench
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/mtrain-bench-plan.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 8192 >/dev/null || exit 1
cat >p.yaml <<'YAML'
model: {vocab_size: 2048, hidden_size: 256, num_layers: 4, num_heads: 8, num_kv_heads: 4, intermediate_size: 768}
train: {seq_len: 256, micro_batch: 2, global_batch: 16, steps: 8, seed: 7, device: cpu, threads: 1}
optimizer: {lr: 3e-4, min_lr: 3e-5, warmup_steps: 2}
data: {path: data}
log: {interval: 100}
YAML
NP=${NP:-2}
mpiexec -n $NP "$MTRAIN" plan --calibrate cpu.yaml || exit 1
# name layout (tp,pp,vpp,cp,ep,micro_batch,recompute) extra settings
if [ "$NP" = 4 ]; then
    layouts=(
        "dp4 1,1,1,1,1,2,none" "dp4_zero 1,1,1,1,1,2,none optimizer.distributed=true" "tp2_dp2 2,1,1,1,1,2,none"
        "pp2_dp2 1,2,1,1,1,2,none" "cp2_dp2 1,1,1,2,1,2,none" "tp4 4,1,1,1,1,2,none" "pp4 1,4,1,1,1,2,none"
        "tp2_pp2 2,2,1,1,1,2,none" "pp2_dp2_zbv 1,2,2,1,1,2,none parallel.schedule=zbv"
    )
else
    layouts=(
        "dp2 1,1,1,1,1,2,none" "dp2_zero 1,1,1,1,1,2,none optimizer.distributed=true" "tp2 2,1,1,1,1,2,none"
        "pp2 1,2,1,1,1,2,none" "cp2 1,1,1,2,1,2,none" "dp2_full 1,1,1,1,1,2,full"
        "pp2_zb_h1 1,2,1,1,1,2,none parallel.schedule=zb-h1" "pp2_zbv 1,2,2,1,1,2,none parallel.schedule=zbv"
        "pp2_dualpipev 1,2,2,1,1,2,none parallel.schedule=dualpipev"
    )
fi
printf '%-10s %12s %12s %8s\n' layout predicted_ms measured_ms error
json="["
best_pred="" best_meas=""
worst=0
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 lay=$2
    shift 2
    IFS=, read -r tp pp vpp cp ep mb rc <<<"$lay"
    sets=(--set parallel.tp=$tp --set parallel.pp=$pp --set parallel.vpp=$vpp --set parallel.cp=$cp
          --set train.micro_batch=$mb --set train.recompute=$rc)
    for kv in "$@"; do sets+=(--set "$kv"); done
    pred=$("$MTRAIN" plan p.yaml --gpus $NP --gpu cpu.yaml --layout "$lay" "${sets[@]}" | sed -n 's/^predicted_step_ms: //p')
    mpiexec -n $NP "$MTRAIN" pretrain p.yaml "${sets[@]}" --set log.dir=$name >/dev/null 2>&1 || { echo "$name: run failed"; exit 1; }
    meas=$(grep '"loss"' $name/metrics.jsonl | sed -n 's/.*"step":\([0-9]*\),.*"step_ms":\([0-9.]*\).*/\1 \2/p' |
        awk '$1 >= 3 {s += $2; n++} END {printf "%.2f", s / n}')
    err=$(awk -v p="$pred" -v m="$meas" 'BEGIN {printf "%.3f", (p - m) / m}')
    printf '%-10s %12.2f %12.2f %7.1f%%\n' $name "$pred" "$meas" "$(awk -v e=$err 'BEGIN {print 100 * e}')"
    worst=$(awk -v w=$worst -v e=$err 'BEGIN {e = e < 0 ? -e : e; print (e > w ? e : w)}')
    json="$json{\"layout\":\"$name\",\"predicted_ms\":$pred,\"measured_ms\":$meas},"
    if [ -z "$best_pred" ] || awk -v a="$pred" -v b="${best_pred#* }" 'BEGIN {exit !(a < b)}'; then best_pred="$name $pred"; fi
    if [ -z "$best_meas" ] || awk -v a="$meas" -v b="${best_meas#* }" 'BEGIN {exit !(a < b)}'; then best_meas="$name $meas"; fi
    eval "meas_$name=$meas"
done
chosen=${best_pred%% *}
chosen_meas=$(eval echo "\$meas_$chosen")
gap=$(awk -v c="$chosen_meas" -v b="${best_meas#* }" 'BEGIN {printf "%.3f", c / b - 1}')
echo "predicted best: $chosen (measured ${chosen_meas} ms); measured best: ${best_meas% *} (${best_meas#* } ms): ${gap} slower"
ok_all=$(awk -v w=$worst 'BEGIN {print w <= 0.25 ? "met" : "missed"}')
ok_best=$(awk -v g=$gap 'BEGIN {print g <= 0.10 ? "met" : "missed"}')
echo "targets: every prediction within 25% ($ok_all: worst $(awk -v w=$worst 'BEGIN {printf "%.1f%%", 100 * w}')); predicted best within 10% of the measured best ($ok_best)"
echo "${json%,}]" | sed "s/^/{\"date\":\"$(date -u +%F)\",\"ranks\":$NP,\"worst_error\":$worst,\"best_gap\":$gap,\"layouts\":/; s/\$/}/" >"$OUT/plan$([ "$NP" = 2 ] || echo "-np$NP").json"
cp cpu.yaml "$OUT/plan-cpu-system.yaml"
