# 3D parallelism on CPU under mpiexec (oversubscribed): every layout trains
# the same model as one rank; checkpoints move between layouts; bad layouts
# and dead ranks fail cleanly.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail par_setup "data generate failed"; exit 1; }
# optimizer.eps 1e-4: with eps 1e-8 Adam's first steps move every weight by about
# lr * sign(g), so on near-zero gradients the fp32 reduction-order noise between
# layouts (~1e-6 of a gradient) becomes up to 5e-5 of a weight after one step
# (measured). A larger eps keeps the parameter comparison about the layouts.
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 20, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
checkpoint: {dir: ck_ref, interval: 20}
log: {dir: ref, interval: 100}
YAML

"$MTRAIN" pretrain r.yaml >/dev/null 2>&1 || fail par_reference_run "exit $?"

# name tp pp dp extra-args...
layouts=(
    "tp2 2 1 1" "pp2 1 2 1" "dp2 1 1 2" "tp2_pp2 2 2 1" "tp2_dp2 2 1 2" "pp2_dp2 1 2 2" "tp2_pp2_dp2 2 2 2"
    "dp2_zero 1 1 2 optimizer.distributed=true" "tp2_dp2_zero 2 1 2 optimizer.distributed=true"
    "pp2_dp2_zero 1 2 2 optimizer.distributed=true"
    "pp2_vpp2 1 2 1 parallel.vpp=2" "tp2_sp 2 1 1 parallel.sequence_parallel=true"
    "tp4_kv_heads_replicated 4 1 1"
    "pp2_uneven_1_3 1 2 1 parallel.first_stage_layers=1 parallel.last_stage_layers=3"
    "pp3_uneven_1_2_1 1 3 1 parallel.first_stage_layers=1 parallel.last_stage_layers=1"
    "tp2_pp2_dp2_sp_vpp2_zero 2 2 2 parallel.sequence_parallel=true parallel.vpp=2 optimizer.distributed=true"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 tp=$2 pp=$3 dp=$4; shift 4
    layout_run par_$name $((tp * pp * dp)) r.yaml $name parallel.tp=$tp parallel.pp=$pp "$@" || continue
    close_metrics ref/metrics.jsonl $name/metrics.jsonl 1 20 && pass "par_${name}_losses" ||
        fail "par_${name}_losses" "$(paste <(metric ref/metrics.jsonl loss) <(metric $name/metrics.jsonl loss) | head -4 | tr '\n' ' ')"
    params_close par_$name ck_ref/step-000000020 ck_$name/step-000000020
done

# interleaved with every forward in the warm-up (m = pp = 3): no steady phase,
# one exchange per item (pairing the last forward with the first backward hangs)
sed 's/num_layers: 4/num_layers: 6/' r.yaml >r6.yaml
"$MTRAIN" pretrain r6.yaml --set train.global_batch=6 --set log.dir=ref6 --set checkpoint.dir=ck_ref6 >/dev/null 2>&1 ||
    fail par_reference_run_6_layers "exit $?"
layout_run par_pp3_vpp2_m3 3 r6.yaml pp3_vpp2_m3 parallel.pp=3 parallel.vpp=2 train.global_batch=6 &&
    close_metrics ref6/metrics.jsonl pp3_vpp2_m3/metrics.jsonl 1 20 && pass par_pp3_vpp2_m3_losses ||
    fail par_pp3_vpp2_m3_losses "$(paste <(metric ref6/metrics.jsonl loss) <(metric pp3_vpp2_m3/metrics.jsonl loss) | head -4 | tr '\n' ' ')"

# weights in through model.init_from: every rank keeps its block of each tensor
"$MTRAIN" pretrain r.yaml --set checkpoint.dir= --set checkpoint.interval=0 --set train.steps=3 --set optimizer.warmup_steps=1 \
    --set log.dir=init_src >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set model.init_from=init_src/model.safetensors --set log.dir=init_1 --set checkpoint.dir=ck_init_1 >/dev/null 2>&1
run_np 4 pretrain r.yaml --set model.init_from=init_src/model.safetensors --set parallel.tp=2 --set parallel.pp=2 \
    --set log.dir=init_4 --set checkpoint.dir=ck_init_4 >"$TMP/out" 2>&1 || fail par_init_from_tp2_pp2 "exit $?: $(tail -2 "$TMP/out")"
close_metrics init_1/metrics.jsonl init_4/metrics.jsonl 1 20 && pass par_init_from_tp2_pp2 ||
    fail par_init_from_tp2_pp2 "$(paste <(metric init_1/metrics.jsonl loss) <(metric init_4/metrics.jsonl loss) | head -3 | tr '\n' ' ')"

# save at (2,2,2), resume at (1,1,1) and (1,2,4), directly and after mtrain convert
"$MTRAIN" pretrain r.yaml --set train.steps=40 --set checkpoint.dir=long --set log.dir=long >/dev/null 2>&1
run_np 8 pretrain r.yaml --set train.steps=40 --set parallel.tp=2 --set parallel.pp=2 --set checkpoint.dir=s222 \
    --set log.dir=s222 --stop-after 20 >/dev/null 2>&1 || fail par_save_222 "exit $?"
for target in direct_111 direct_124 convert_111 convert_124; do
    cp -r s222 $target
    tp=1; pp=1; np=1
    case $target in *124) pp=2; np=8 ;; esac
    if [ "${target%%_*}" = convert ]; then
        rm -rf $target && "$MTRAIN" convert s222 $target --tp $tp --pp $pp --dp $((np / pp)) >"$TMP/out" 2>&1 ||
            fail par_${target}_convert "$(cat "$TMP/out")"
    fi
    run_np $np pretrain r.yaml --set train.steps=40 --set parallel.pp=$pp --set checkpoint.dir=$target \
        --set log.dir=$target >"$TMP/out" 2>&1
    if grep -q "resumed from $target/step-000000020" "$TMP/out" && close_metrics long/metrics.jsonl $target/metrics.jsonl 21 20; then
        pass par_resume_$target
    else fail par_resume_$target "$(grep -E 'resumed|error' "$TMP/out" | head -2)"; fi
    "$PY" "$COMPARE" long/step-000000040 $target/step-000000040 1e-5 >"$TMP/cmp" 2>&1 &&
        pass par_resume_${target}_params || fail par_resume_${target}_params "$(cat "$TMP/cmp")"
done
expect_exit par_convert_info 0 "$MTRAIN" convert --info s222
expect_output par_convert_info_layout 'layout: +tp 2, pp 2, vpp 1, dp 2, ep 1, etp 1, cp 1 \(8 ranks\)'
expect_exit par_convert_bad_layout 2 "$MTRAIN" convert s222 bad --tp 3
# convert never writes into its source, and into an existing non-empty DST only with --force
sum_before=$(cat s222/step-000000020/*.safetensors | md5sum)
expect_exit par_convert_into_source_refused 2 "$MTRAIN" convert s222 s222 --tp 1 --pp 1
expect_output par_convert_into_source_says_why "source checkpoint's own directory"
expect_exit par_convert_into_source_step_refused 2 "$MTRAIN" convert s222/step-000000020 s222 --tp 1 --pp 1
[ "$(cat s222/step-000000020/*.safetensors | md5sum)" = "$sum_before" ] && pass par_convert_source_untouched ||
    fail par_convert_source_untouched "the source checkpoint changed"
expect_exit par_convert_existing_dst_refused 2 "$MTRAIN" convert s222 convert_111 --tp 1 --pp 1
expect_output par_convert_existing_dst_says_force "pass --force"
expect_exit par_convert_existing_dst_forced 0 "$MTRAIN" convert s222 convert_111 --tp 1 --pp 1 --force

# bad layouts: one message (rank 0), every rank exits 2, no hang
bad() {
    local name=$1 np=$2; shift 2
    run_np $np pretrain r.yaml "$@" >"$TMP/out" 2>&1
    local rc=$? count
    count=$(grep -c 'mtrain: error' "$TMP/out")
    if [ $rc = 2 ] && [ "$count" = 1 ]; then pass $name; else fail $name "exit $rc, $count error lines: $(head -c 300 "$TMP/out")"; fi
}
bad par_bad_tp_heads 3 --set parallel.tp=3
bad par_bad_world_size 3 --set parallel.tp=2
bad par_bad_pp_layers 8 --set parallel.pp=8
expect_output par_bad_pp_layers_message "pp 8 does not divide model.num_layers 4"
bad par_bad_uneven_stages 2 --set parallel.pp=2 --set parallel.first_stage_layers=3 --set parallel.last_stage_layers=3

# a rank that dies mid-step: the job exits non-zero in bounded time, then resumes
start=$(date +%s)
run_np 4 pretrain r.yaml --set train.steps=40 --set parallel.tp=2 --set parallel.pp=2 --set checkpoint.dir=die \
    --set checkpoint.interval=10 --set log.dir=die --inject crash@15:3 >"$TMP/out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -lt 120 ]; then pass par_dead_rank_fails_fast; else fail par_dead_rank_fails_fast "exit $rc after ${took}s"; fi
run_np 4 pretrain r.yaml --set train.steps=40 --set parallel.tp=2 --set parallel.pp=2 --set checkpoint.dir=die \
    --set checkpoint.interval=10 --set log.dir=die >"$TMP/out" 2>&1
if grep -q "resumed from die/step-000000010" "$TMP/out" && "$PY" "$COMPARE" long/step-000000040 die/step-000000040 1e-5 >"$TMP/cmp" 2>&1; then
    pass par_dead_rank_resumes
else fail par_dead_rank_resumes "$(grep -E 'resumed|error' "$TMP/out" | head -2) $(cat "$TMP/cmp" 2>/dev/null)"; fi
exit $FAILED
