# MTRAIN_TIMELINE=N (parallel/timeline.h) on CPU ranks under mpiexec with
# the MPI communicator: every rank writes LOG_DIR/timeline-rank-NNNNN.json,
# a Chrome trace whose summary check_timeline.py recomputes from its spans;
# with gradient buckets the data-parallel reductions begin during backward,
# without overlap none does; ZeRO-1's started gathers of the update are
# followed into the next step; tensor and pipeline groups get lanes of their
# own; tracing changes no loss (bitwise); the last step is written at the
# run's end; a step the run never reaches (or stops before) is said, a step
# a rewind rolls back is marked so, and a malformed value exits 2 with one
# message, a dry run's too. (The NCCL path's spans: nccl_mock.sh; on a GPU:
# gpu_pretrain.sh.)
source "$(dirname "$0")/../lib.sh"
CHECK="$(cd "$(dirname "$0")" && pwd)/check_timeline.py"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TMP"
"$MTRAIN" data generate --out data >/dev/null || { fail timeline_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 16, steps: 6, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
log: {interval: 100}
YAML
export OMP_NUM_THREADS=1
losses() { grep '"loss"' "$1" 2>/dev/null | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
# traced NAME NP STEP CHECK_FLAGS KEY=VALUE...: a run tracing STEP, then check_timeline.py on each rank's file
traced() {
    local name=$1 np=$2 step=$3 flags=$4 kv sets=() r ok=1 why=""
    shift 4
    for kv in "$@"; do sets+=(--set "$kv"); done
    MTRAIN_TIMELINE=$step run_np "$np" pretrain r.yaml "${sets[@]}" --set log.dir=$name >$name.out 2>&1 ||
        { fail timeline_${name} "exit $?: $(tail -3 $name.out)"; return 1; }
    for ((r = 0; r < np; r++)); do
        f=$(printf '%s/timeline-rank-%05d.json' $name $r)
        "$PY" "$CHECK" "$f" $flags >>$name.check 2>&1 || ok=0
    done
    grep -q "^timeline of step $step in $name/timeline-rank-\*.json" $name.out &&
        grep -q "\"event\":\"timeline\",\"step\":$step," $name/metrics.jsonl || { ok=0; why="no summary line or event"; }
    [ $ok = 1 ] && pass timeline_${name} || fail timeline_${name} "$why $(head -c 600 $name.check)"
}
traced dp2_buckets 2 3 "--clock host --lanes compute,dp --overlap --finished" parallel.grad_bucket_mb=0.02
traced dp2_after_backward 2 3 "--lanes compute,dp --no-overlap --finished" parallel.overlap_grad_reduce=false
traced dp2_zero_gathers 2 3 "--lanes compute,dp --overlap --gather --finished" optimizer.distributed=true \
    parallel.grad_bucket_mb=0.02
traced tp2_pp2 4 2 "--lanes compute,tp,pp --finished" parallel.tp=2 parallel.pp=2
traced last_step 1 6 "--lanes compute" # written at the end of the run

# tracing changes nothing: the same losses, bitwise, as the run without it
run_np 2 pretrain r.yaml --set parallel.grad_bucket_mb=0.02 --set log.dir=plain >plain.out 2>&1
a=$(losses plain/metrics.jsonl) b=$(losses dp2_buckets/metrics.jsonl)
[ "$(echo "$a" | grep -c .)" = 6 ] && [ "$a" = "$b" ] && pass timeline_same_losses ||
    fail timeline_same_losses "plain: $(echo $a | head -c 80) / traced: $(echo $b | head -c 80)"
# only the traced step: the files are not rewritten by later steps (one event)
[ "$(grep -c '"event":"timeline"' dp2_buckets/metrics.jsonl)" = 1 ] && pass timeline_one_event ||
    fail timeline_one_event "$(grep -c '"event":"timeline"' dp2_buckets/metrics.jsonl) timeline events"

# a step the run never reaches: said once, exit 0, no file
MTRAIN_TIMELINE=99 "$MTRAIN" pretrain r.yaml --set log.dir=never >never.out 2>&1
rc=$?
[ $rc = 0 ] && grep -q "MTRAIN_TIMELINE=99: this run did not run step 99" never.out && ! ls never/timeline-* >/dev/null 2>&1 &&
    pass timeline_step_not_reached || fail timeline_step_not_reached "exit $rc: $(tail -2 never.out)"
# stopped before it (--stop-after, as a signal stops): said too
MTRAIN_TIMELINE=5 "$MTRAIN" pretrain r.yaml --set log.dir=stopped --set checkpoint.dir=ck_stopped --stop-after 2 \
    >stopped.out 2>&1
rc=$?
[ $rc = 0 ] && grep -q "MTRAIN_TIMELINE=5: this run did not run step 5" stopped.out && pass timeline_stopped_before_the_step ||
    fail timeline_stopped_before_the_step "exit $rc: $(tail -2 stopped.out)"
# a traced step that a rewind rolls back (a NaN injected at it) is marked so
MTRAIN_TIMELINE=4 "$MTRAIN" pretrain r.yaml --set log.dir=rw --set checkpoint.dir=ck_rw --set checkpoint.interval=2 \
    --set rewind.enabled=true --inject nan@4 >rw.out 2>&1
rc=$?
[ $rc = 0 ] && grep -q "^timeline of step 4 (rolled back by a rewind)" rw.out &&
    "$PY" "$CHECK" rw/timeline-rank-00000.json --rewound >rw.check 2>&1 && pass timeline_rewound_step ||
    fail timeline_rewound_step "exit $rc: $(tail -2 rw.out) $(cat rw.check 2>/dev/null)"
# a malformed value: exit 2, one message from rank 0, before anything runs (a dry run too)
MTRAIN_TIMELINE=" 3" "$MTRAIN" pretrain r.yaml --dry-run >dry.out 2>&1
rc=$?
[ $rc = 2 ] && grep -q 'MTRAIN_TIMELINE is " 3"' dry.out && pass timeline_bad_value_dry_run ||
    fail timeline_bad_value_dry_run "exit $rc: $(head -c 300 dry.out)"
MTRAIN_TIMELINE=three run_np 2 pretrain r.yaml --set log.dir=bad >bad.out 2>&1
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'MTRAIN_TIMELINE is "three": expected the step to trace, a positive integer' bad.out)" = 1 ] &&
    pass timeline_bad_value_exit_2 || fail timeline_bad_value_exit_2 "exit $rc: $(head -c 300 bad.out)"
# scripts/bench/overlap.sh (make bench) runs on CPU ranks and reports both runs
OVERLAP_DEVICE=cpu MTRAIN="$MTRAIN" BENCH_DIR="$TMP/ob" JSON="$TMP/overlap.json" bash "$ROOT/scripts/bench/overlap.sh" >"$TMP/ob.out" 2>&1 &&
    "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))["rows"]; sys.exit(not (len(r) == 2 and r[0]["grad_calls"] > r[1]["grad_calls"] >= 1))' \
        "$TMP/overlap.json" && pass timeline_overlap_bench || fail timeline_overlap_bench "$(tail -5 "$TMP/ob.out")"
exit $FAILED
