# Mixture of experts on CPU under mpiexec (oversubscribed): expert parallelism
# alone and with tp (the EP group drawn from tp x dp), expert tensor
# parallelism (etp 2: each expert's width split), pp, dp, sequence
# parallel and ZeRO-1 trains the same model as one rank; capacity drops are the
# same; checkpoints move across EP and TP layouts directly and through `mtrain
# convert --ep`, each expert stored once; the all-to-all payload equals its
# analytic count.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail moe_setup "data generate failed"; exit 1; }
# layers 0 and 2 are MoE (moe_layer_freq 2), 1 and 3 dense; eps 1e-4 as in parallel.sh
cat >r.yaml <<'YAML'
model: {arch: mixtral, vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 64, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48, moe_layer_freq: 2,
        moe_z_loss_coef: 0.001}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 20, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
checkpoint: {dir: ck_ref, interval: 20}
log: {dir: ref, interval: 100}
YAML
"$MTRAIN" pretrain r.yaml >/dev/null 2>&1 || fail moe_reference_run "exit $?"
"$MTRAIN" pretrain r.yaml --set model.moe_capacity_factor=1.0 --set log.dir=cap_ref --set checkpoint.dir=ck_cap_ref \
    >/dev/null 2>&1 || fail moe_capacity_reference_run "exit $?"
awk -F'"dropped":' 'NF > 1 {split($2, a, ","); s += a[1]} END {exit s > 0 ? 0 : 1}' cap_ref/metrics.jsonl &&
    pass moe_capacity_drops_tokens || fail moe_capacity_drops_tokens "no dropped tokens at capacity factor 1"

# name tp pp dp ep extra-args...
layouts=(
    "ep2 1 1 2 2" "ep4 1 1 4 4" "ep2_tp2 2 1 2 2" "ep2_pp2 1 2 2 2" "ep2_dp4 1 1 4 2"
    "ep2_dp4_zero 1 1 4 2 optimizer.distributed=true" "ep4_zero 1 1 4 4 optimizer.distributed=true"
    "ep2_tp2_sp 2 1 2 2 parallel.sequence_parallel=true" "ep2_tp2_pp2_zero 2 2 2 2 optimizer.distributed=true"
    # expert buffers sized for the mean rows only: the busier ranks' grow (model/moe.c reserve_rows)
    "ep4_grown_selective 1 1 4 4 model.moe_rows_headroom=1 train.recompute=selective"
    "ep2_pp2_grown_full 1 2 2 2 model.moe_rows_headroom=1 train.recompute=full"
    # etp 1 (parallel/grid.h): the EP group drawn from tp x dp, so TP peers own different experts
    # (tp2_ep2: dp 1, the EP group is the TP group; tp2_ep4: it spans TP and DP), and with ep 1 the
    # experts' replicas over TP are their edp group (ZeRO-1 shards them there although dp is 1)
    "tp2_ep2 2 1 1 2" "tp2_ep4 2 1 2 4" "tp2_ep4_sp_zero 2 1 2 4 parallel.sequence_parallel=true optimizer.distributed=true"
    "tp2_pp2_ep2 2 2 1 2" "tp2_ep1_zero 2 1 1 1 optimizer.distributed=true"
    "tp2_ep2_full 2 1 1 2 train.recompute=full"
    # etp 2: each expert's FFN width split over 2 ranks, which gather each other's rows before the
    # experts and sum the partial outputs after (model/moe.c): the TP pair (ep 1), TP pair x ep 2 with
    # full recompute and grown buffers, the DP pair under ZeRO-1 (dp 2, tp 1), and with pp 2 and SP
    "tp2_etp2 2 1 1 1 parallel.etp=2" "tp2_etp2_ep2_full_grown 2 1 2 2 parallel.etp=2 train.recompute=full model.moe_rows_headroom=1"
    "dp2_etp2_zero 1 1 2 1 parallel.etp=2 optimizer.distributed=true"
    "tp2_pp2_etp2_sp 2 2 1 1 parallel.etp=2 parallel.sequence_parallel=true"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 tp=$2 pp=$3 dp=$4 ep=$5; shift 5
    layout_run moe_$name $((tp * pp * dp)) r.yaml $name parallel.tp=$tp parallel.pp=$pp parallel.ep=$ep "$@" || continue
    case $name in *grown*) grep -q "expert buffers grow" "$TMP/out" && pass moe_${name}_buffers_grew ||
        fail moe_${name}_buffers_grew "no rank's expert buffers grew: $(tail -2 "$TMP/out")" ;; esac
    close_metrics ref/metrics.jsonl $name/metrics.jsonl 1 20 && pass "moe_${name}_losses" ||
        fail "moe_${name}_losses" "$(paste <(metric ref/metrics.jsonl loss) <(metric $name/metrics.jsonl loss) | head -4 | tr '\n' ' ')"
    params_close moe_$name ck_ref/step-000000020 ck_$name/step-000000020
done

# capacity: the same drops per step whatever the layout
for spec in "cap_ep2_tp2 2 1 2 2" "cap_ep4 1 1 4 4"; do
    set -- $spec
    name=$1 tp=$2 pp=$3 dp=$4 ep=$5
    run_np $((tp * pp * dp)) pretrain r.yaml --set model.moe_capacity_factor=1.0 --set parallel.tp=$tp --set parallel.ep=$ep \
        --set log.dir=$name --set checkpoint.dir=ck_$name >"$TMP/out" 2>&1 || { fail "moe_${name}_runs" "exit $?"; continue; }
    if [ "$(metric cap_ref/metrics.jsonl dropped)" = "$(metric $name/metrics.jsonl dropped)" ] && close_metrics cap_ref/metrics.jsonl $name/metrics.jsonl 1 20; then
        pass "moe_${name}_dropped"
    else fail "moe_${name}_dropped" "$(paste <(metric cap_ref/metrics.jsonl dropped) <(metric $name/metrics.jsonl dropped) | head -4 | tr '\n' ' ')"; fi
done

# all-to-all payload per step over the EP group: each rank sends every routed
# row (micro_batch * seq_len * experts_per_token of hidden_size floats) four
# times (dispatch and combine, forward and backward; what one rank returns
# depends on the routing, the group's total does not) plus the per-expert
# counts (E floats), per MoE layer and micro batch
rows=$(( 2 * 16 * 2 ))
want=$(( 2 * 2 * 2 * (4 * rows * 32 + 4) * 4 )) # ranks * MoE layers * micro batches per rank * floats * 4 bytes
got=$(grep '"event":"comm"' ep2/metrics.jsonl | grep -o '"ep":[0-9]*' | cut -d: -f2 | awk '{s += $1} END {print s}')
[ "$got" = "$want" ] && pass moe_all_to_all_bytes || fail moe_all_to_all_bytes "ep bytes per step $got, analytic $want"

# checkpoints across EP layouts: save at ep 4 (tp 1, then tp 2), resume at other ep and tp, directly and
# through convert (target source ranks tp ep)
"$MTRAIN" pretrain r.yaml --set train.steps=40 --set checkpoint.dir=long --set log.dir=long >/dev/null 2>&1
run_np 4 pretrain r.yaml --set train.steps=40 --set parallel.ep=4 --set checkpoint.dir=s_ep4 --set log.dir=s_ep4 \
    --stop-after 20 >/dev/null 2>&1 || fail moe_save_ep4 "exit $?"
run_np 4 pretrain r.yaml --set train.steps=40 --set parallel.tp=2 --set parallel.ep=4 --set checkpoint.dir=s_tp2_ep4 \
    --set log.dir=s_tp2_ep4 --stop-after 20 >/dev/null 2>&1 || fail moe_save_tp2_ep4 "exit $?"
run_np 4 pretrain r.yaml --set train.steps=40 --set parallel.tp=2 --set parallel.ep=2 --set parallel.etp=2 \
    --set checkpoint.dir=s_tp2_etp2_ep2 --set log.dir=s_tp2_etp2_ep2 --stop-after 20 >/dev/null 2>&1 ||
    fail moe_save_tp2_etp2_ep2 "exit $?"
# target source ranks tp ep [etp]
for spec in "direct_ep1 s_ep4 1 1 1" "direct_ep2 s_ep4 2 1 2" "convert_ep1 s_ep4 1 1 1" "convert_ep2 s_ep4 2 1 2" \
    "direct_tp2_ep2 s_ep4 2 2 2" "direct_tp2_to_ep2 s_tp2_ep4 2 1 2" "convert_tp2_to_tp2_ep2 s_tp2_ep4 2 2 2" \
    "direct_tp2_to_ep1 s_tp2_ep4 1 1 1" "direct_etp2_to_ep4 s_tp2_etp2_ep2 4 1 4" \
    "convert_etp2_to_dp2_etp2 s_tp2_etp2_ep2 2 1 1 2" "direct_ep4_to_tp2_etp2 s_ep4 2 2 1 2"; do
    set -- $spec
    target=$1 src=$2 np=$3 tp=$4 ep=$5 etp=${6:-1}
    cp -r $src $target
    if [ "${target%%_*}" = convert ]; then
        rm -rf $target && "$MTRAIN" convert $src $target --tp $tp --dp $((np / tp)) --ep $ep --etp $etp >"$TMP/out" 2>&1 ||
            fail moe_${target}_convert "$(cat "$TMP/out")"
    fi
    run_np $np pretrain r.yaml --set train.steps=40 --set parallel.tp=$tp --set parallel.ep=$ep --set parallel.etp=$etp \
        --set checkpoint.dir=$target --set log.dir=$target >"$TMP/out" 2>&1
    if grep -q "resumed from $target/step-000000020" "$TMP/out" &&
        paste <(metric long/metrics.jsonl loss | tail -20) <(metric $target/metrics.jsonl loss | tail -20) |
        awk '{n++; d=$1-$2; if (d<0) d=-d; if (d/$1 > 1e-5) bad=1} END{exit (n == 20 && !bad) ? 0 : 1}'; then
        pass moe_resume_$target
    else fail moe_resume_$target "$(grep -E 'resumed|error' "$TMP/out" | head -2)"; fi
    "$PY" "$COMPARE" long/step-000000040 $target/step-000000040 1e-5 >"$TMP/cmp" 2>&1 &&
        pass moe_resume_${target}_params || fail moe_resume_${target}_params "$(cat "$TMP/cmp")"
done
# each routed expert is stored once, by the expert-DP rank 0 of its EP rank: 4 experts x 3 matrices x 2
# MoE layers, each with its two moments, at tp 2 x ep 4 (dp 2) and at tp 2 x ep 1 (the experts' replica
# on TP rank 1, a DP rank 0 that writes its dense tensors, is not stored)
for ck in s_tp2_ep4/step-000000020 ck_tp2_ep1_zero/step-000000020; do
    n=$("$PY" -c "
import json, sys
names = [t['name'] for t in json.load(open(sys.argv[1]))['tensors'] if 'experts' in t['name']]
print(len(names), len(set(names)))" $ck/manifest.json 2>&1)
    [ "$n" = "72 72" ] && pass moe_experts_stored_once_${ck%%/*} ||
        fail moe_experts_stored_once_${ck%%/*} "expert tensors (entries, distinct names) $n, want 72 72"
done
# at etp 2 each expert tensor is stored as two slices, each once: 144 entries of 72 names, 144 (name, part)
n=$("$PY" -c "
import json, sys
ts = [t for t in json.load(open(sys.argv[1]))['tensors'] if 'experts' in t['name']]
print(len(ts), len({t['name'] for t in ts}), len({(t['name'], t['part']) for t in ts}), {t['parts'] for t in ts})" \
    s_tp2_etp2_ep2/step-000000020/manifest.json 2>&1)
[ "$n" = "144 72 144 {2}" ] && pass moe_experts_etp2_slices_stored_once ||
    fail moe_experts_etp2_slices_stored_once "expert tensors (entries, names, slices, parts) $n, want 144 72 144 {2}"
"$MTRAIN" convert --info s_tp2_etp2_ep2 >"$TMP/out" 2>&1
long_params=$("$MTRAIN" convert --info long | sed -n 's/^parameters: *//p')
grep -qE "layout: +tp 2, pp 1, vpp 1, dp 2, ep 2, etp 2, cp 1 \(4 ranks\)" "$TMP/out" &&
    [ "$(sed -n 's/^parameters: *//p' "$TMP/out")" = "$long_params" ] && pass moe_convert_info_etp2 ||
    fail moe_convert_info_etp2 "$(grep -E '^(layout|parameters)' "$TMP/out") (one rank's: $long_params)"

# one MoE layer's blocking copies to the host at ep 2 and 4 (tests/unit/test_moe_plan.c run
# on N ranks): one, the per-expert counts that size the all-to-all, and none in backward
for np in 2 4; do
    OMP_NUM_THREADS=1 timeout 120 mpiexec -n $np "$(build_path tests/test_moe_plan)" >"$TMP/copies" 2>&1
    grep '^[A-Z]* moe_layer_host_copies' "$TMP/copies" | grep -q . || fail moe_layer_host_copies_np$np "$(tail -3 "$TMP/copies")"
    grep '^[A-Z]* moe_layer_host_copies' "$TMP/copies"
done
exit $FAILED
