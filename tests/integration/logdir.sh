# log.dir protection: a run refuses (exit 2, one message naming the dir and
# the ways out) to start in a log.dir whose metrics.jsonl holds another run's
# training steps, unless it resumes that run or is given --force (the old
# metrics move to metrics.jsonl.N, byte for byte).
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 >/dev/null || { fail logdir_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 257, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 32, micro_batch: 4, global_batch: 4, steps: 4}
data: {path: data}
log: {dir: run, interval: 100}
YAML
steps() { grep -v '"event"' "$1" | sed -n 's/.*"step":\([0-9]*\),.*/\1/p' | tr '\n' ' '; }

expect_exit logdir_first_run 0 "$MTRAIN" pretrain r.yaml
cp run/metrics.jsonl first.jsonl
expect_exit logdir_second_run_refused 2 "$MTRAIN" pretrain r.yaml
expect_output logdir_refusal_names_dir_and_ways_out \
    "^mtrain: error: log.dir run already holds another run's metrics \(run/metrics.jsonl, steps 1..4\).*Resume that run.*--force"
[ "$(grep -c . "$TMP/out")" = 1 ] && pass logdir_refusal_one_line || fail logdir_refusal_one_line "$(cat "$TMP/out")"
cmp -s first.jsonl run/metrics.jsonl && pass logdir_refusal_keeps_metrics || fail logdir_refusal_keeps_metrics "metrics changed"
expect_exit logdir_resume_never_refused 2 "$MTRAIN" pretrain r.yaml --resume never

# --force: the old metrics move to metrics.jsonl.1, then .2; the new run writes its own
expect_exit logdir_force_runs 0 "$MTRAIN" pretrain r.yaml --force --set train.steps=2
expect_output logdir_force_says_where 'moved to run/metrics.jsonl.1'
if cmp -s first.jsonl run/metrics.jsonl.1 && [ "$(steps run/metrics.jsonl)" = "1 2 " ]; then pass logdir_force_moves_aside
else fail logdir_force_moves_aside "new steps: $(steps run/metrics.jsonl)"; fi
"$MTRAIN" pretrain r.yaml --force >/dev/null 2>&1
[ "$(steps run/metrics.jsonl.2)" = "1 2 " ] && [ "$(steps run/metrics.jsonl)" = "1 2 3 4 " ] &&
    pass logdir_force_numbers_next || fail logdir_force_numbers_next "$(ls run)"

# a metrics.jsonl without training steps (a run that died before its first) is not protected
mkdir -p early && head -1 first.jsonl >early/metrics.jsonl
expect_exit logdir_no_steps_is_free 0 "$MTRAIN" pretrain r.yaml --set log.dir=early

# resuming the run that wrote the metrics continues them: stopped after step 2, resumed to 4
"$MTRAIN" pretrain r.yaml --set log.dir=res --set checkpoint.dir=ck --set checkpoint.interval=1 --stop-after 2 \
    >/dev/null 2>&1
expect_exit logdir_resume_same_run 0 "$MTRAIN" pretrain r.yaml --set log.dir=res --set checkpoint.dir=ck \
    --set checkpoint.interval=1
[ "$(steps res/metrics.jsonl)" = "1 2 3 4 " ] && [ ! -e res/metrics.jsonl.1 ] && pass logdir_resume_continues_metrics ||
    fail logdir_resume_continues_metrics "steps $(steps res/metrics.jsonl)"
# ... but resuming another run's checkpoint into this log.dir is refused
"$MTRAIN" pretrain r.yaml --set log.dir=other --set checkpoint.dir=ck_other --set checkpoint.interval=1 \
    --set train.steps=3 >/dev/null 2>&1
cp run/metrics.jsonl before.jsonl
expect_exit logdir_resume_other_run_refused 2 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=ck_other \
    --set checkpoint.interval=1
expect_output logdir_resume_other_run_says_why 'ck_other/step-000000003, is not one that run saved'
cmp -s before.jsonl run/metrics.jsonl && pass logdir_resume_other_keeps_metrics ||
    fail logdir_resume_other_keeps_metrics "metrics changed"

# two ranks: every rank stops, one message
OMP_NUM_THREADS=1 run_np 2 pretrain r.yaml --set train.micro_batch=2 >"$TMP/out" 2>&1
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'already holds' "$TMP/out")" = 1 ] && pass logdir_refusal_two_ranks ||
    fail logdir_refusal_two_ranks "exit $rc: $(head -c 300 "$TMP/out")"
exit $FAILED
