# The hang watchdog: a SIGSTOPped rank of a 4-rank job makes the others end
# the job (exit non-zero, one line naming the collective they wait in) within
# the timeout; the rerun resumes and matches an uninterrupted run; a rank
# killed with kill -9 ends the job within 30 s and the rerun resumes bitwise; a normal
# run with a short timeout is not stopped; the automatic timeout is reported.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
HANG=wd_hang_$$ # unique in the command lines, to find this job's processes
# (the model and batch make a step take ~0.1 s on 2 cores: the tests act on a rank while steps 10-19 run)
# never leave a stopped rank behind
cleanup() {
    local pids
    pids=$(pgrep -f -- "$HANG|wd_kill_$$" 2>/dev/null)
    [ -n "$pids" ] && { kill -CONT $pids; kill -9 $pids; } 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail wd_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 128, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 256}
train: {seq_len: 64, micro_batch: 2, global_batch: 32, steps: 40, seed: 7, hang_timeout_s: 5}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
checkpoint: {dir: ck_ref, interval: 5}
log: {dir: ref, interval: 100}
YAML
TP2PP2=(--set parallel.tp=2 --set parallel.pp=2)

# a normal run with a 5 s timeout completes: no spurious firing (also the reference)
run_np 4 pretrain r.yaml "${TP2PP2[@]}" >"$TMP/out" 2>&1
rc=$?
if [ $rc = 0 ] && ! grep -q 'hang timeout' "$TMP/out"; then pass wd_normal_run_completes
else fail wd_normal_run_completes "exit $rc: $(tail -3 "$TMP/out")"; fi

# SIGSTOP world rank 2 once step 10 is logged: the other ranks end the job
run_np 4 pretrain r.yaml "${TP2PP2[@]}" --set checkpoint.dir=ck_$HANG --set log.dir=$HANG >"$TMP/hang" 2>&1 &
job=$!
victim=$(rank_process "$HANG" 2 $HANG/metrics.jsonl '"step":1[0-9],' $job)
if [ -z "$victim" ]; then
    fail wd_sigstop_setup "no rank 2 process found at step 10: $(tail -3 "$TMP/hang")"
    wait $job
else
    kill -STOP "$victim"
    stopped=$(date +%s)
    wait $job
    rc=$?
    took=$(( $(date +%s) - stopped ))
    if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 15 ]; then pass wd_sigstop_ends_job
    else fail wd_sigstop_ends_job "exit $rc ${took}s after the stop: $(tail -3 "$TMP/hang")"; fi
    line='rank [0-9] \(tp [0-9], pp [0-9], dp [0-9]\): (step|checkpoint save at step) [0-9]+ has waited [0-9.]+ s in [a-z_0-9]+ on group [a-z]+ \(rank [0-9] of [24]\), over the hang timeout of 5 s'
    if grep -qE "$line" "$TMP/hang"; then pass wd_sigstop_message
    else fail wd_sigstop_message "no watchdog line: $(grep -v '^step\|^checkpoint' "$TMP/hang" | head -5)"; fi
    kill -CONT "$victim" 2>/dev/null; kill -9 "$victim" 2>/dev/null
fi

# the rerun (--resume auto) continues from the last checkpoint and ends where
# the uninterrupted run did
run_np 4 pretrain r.yaml "${TP2PP2[@]}" --set checkpoint.dir=ck_$HANG --set log.dir=$HANG >"$TMP/out" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "resumed from ck_$HANG/step-" "$TMP/out" &&
    "$PY" "$COMPARE" ck_ref/step-000000040 ck_$HANG/step-000000040 1e-5 >"$TMP/cmp" 2>&1; then
    pass wd_sigstop_resumes
else fail wd_sigstop_resumes "exit $rc: $(grep -E 'resumed|error|warning' "$TMP/out" | head -4) $(cat "$TMP/cmp" 2>/dev/null)"; fi

# kill -9 of world rank 1 once step 10 is logged: the launcher ends the other three within 30 s (a killed
# rank cannot name itself: the launcher names its process, which LOG_DIR/ranks.json maps to the rank), and
# the rerun resumes and ends where the uninterrupted run did, bitwise
KILLED=wd_kill_$$
run_np 4 pretrain r.yaml "${TP2PP2[@]}" --set checkpoint.dir=ck_$KILLED --set log.dir=$KILLED >"$TMP/killed" 2>&1 &
job=$!
victim=$(rank_process "$KILLED" 1 $KILLED/metrics.jsonl '"step":1[0-9],' $job)
if [ -z "$victim" ]; then
    fail wd_kill9_setup "no rank 1 process found at step 10: $(tail -3 "$TMP/killed")"
    wait $job
else
    t0=$(date +%s)
    kill -9 "$victim"
    wait $job
    rc=$? took=$(( $(date +%s) - t0 )) left=$(pgrep -f -- "$KILLED" | wc -l)
    [ $rc != 0 ] && [ $took -le 30 ] && [ "$left" = 0 ] && pass wd_kill9_ends_job ||
        fail wd_kill9_ends_job "exit $rc ${took}s after the kill, $left processes left: $(tail -3 "$TMP/killed")"
    # the launcher names the killed process by its pid (Hydra, when it gets to: "PID ... RUNNING AT");
    # LOG_DIR/ranks.json maps that pid to world rank 1
    grep -q "{\"rank\":1,\"pid\":$victim," $KILLED/ranks.json && pass wd_kill9_pid_maps_to_rank ||
        fail wd_kill9_pid_maps_to_rank "pid $victim; ranks.json: $(head -c 300 $KILLED/ranks.json 2>/dev/null | tr '\n' ' ')"
    run_np 4 pretrain r.yaml "${TP2PP2[@]}" --set checkpoint.dir=ck_$KILLED --set log.dir=$KILLED >"$TMP/out" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q "resumed from ck_$KILLED/step-" "$TMP/out" &&
        "$PY" "$COMPARE" ck_ref/step-000000040 ck_$KILLED/step-000000040 0 >"$TMP/cmp" 2>&1 && pass wd_kill9_resumes_bitwise ||
        fail wd_kill9_resumes_bitwise "exit $rc: $(grep -E 'resumed|error|warning' "$TMP/out" | head -4) $(cat "$TMP/cmp" 2>/dev/null)"
fi

# automatic timeout (0): 300 s until five steps, then reported (tiny steps: the floor)
"$MTRAIN" pretrain r.yaml --set train.hang_timeout_s=0 --set log.dir=auto --set checkpoint.dir= \
    --set checkpoint.interval=0 >"$TMP/out" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q '"event":"start".*"hang_timeout_s":0' auto/metrics.jsonl &&
    grep -q '{"event":"watchdog","step":5,"hang_timeout_s":300.0}' auto/metrics.jsonl; then pass wd_auto_timeout_reported
else fail wd_auto_timeout_reported "exit $rc: $(grep -E 'event":"(start|watchdog)' auto/metrics.jsonl 2>/dev/null | head -2)"; fi
exit $FAILED
