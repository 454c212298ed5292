# Checkpoints, exact resume, async save, rewind-on-failure and signals.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail ckpt_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 257, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 32, micro_batch: 4, global_batch: 8, steps: 40, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3}
data: {path: data}
checkpoint: {dir: ck, interval: 10, keep_last: 3}
log: {dir: run, interval: 10}
YAML
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
rankfile() { echo "$1/step-$(printf %09d "$2")/rank-00000.safetensors"; }
# same_state NAME DIR_A DIR_B STEP: bitwise-equal parameters and optimizer state
same_state() {
    if cmp -s "$(rankfile "$2" "$4")" "$(rankfile "$3" "$4")"; then pass "$1"; else fail "$1" "rank files of step $4 differ"; fi
}

# reference: 40 uninterrupted steps
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=ref --set log.dir=refrun >/dev/null 2>&1 || fail ckpt_reference_run "exit $?"

# 20 steps, stop, resume, 20 steps: identical losses, bitwise identical state
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=a --set log.dir=a_run --stop-after 20 >"$TMP/out" 2>&1
expect_output ckpt_stop_after_saves 'checkpoint step 20'
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=a --set log.dir=a_run >"$TMP/out" 2>&1
expect_output ckpt_resume_message 'resumed from a/step-000000020 at step 20'
if [ "$(losses refrun/metrics.jsonl)" = "$(losses a_run/metrics.jsonl)" ] && [ "$(losses a_run/metrics.jsonl | wc -l)" = 40 ]; then
    pass ckpt_resume_same_losses; else fail ckpt_resume_same_losses "loss sequences differ"; fi
same_state ckpt_resume_bitwise_state ref a 40
[ "$(cat a/latest)" = "step-000000040" ] && pass ckpt_latest_file || fail ckpt_latest_file "latest = $(cat a/latest)"
[ "$(ls -d a/step-* | wc -l)" = 3 ] && pass ckpt_keep_last || fail ckpt_keep_last "$(ls a)"
grep -q '"xxh3"' a/step-000000040/manifest.json && grep -q '"consumed_samples": 320' a/step-000000040/manifest.json &&
    pass ckpt_manifest_fields || fail ckpt_manifest_fields "$(head -c 300 a/step-000000040/manifest.json)"
# the rank file is plain safetensors
if ${PYTHON:-/usr/bin/python3} -c "
from safetensors.numpy import load_file; t = load_file('$(rankfile a 40)')
assert 'model.norm.weight' in t and 'optimizer.exp_avg.model.norm.weight' in t" 2>/dev/null; then
    pass ckpt_rank_file_is_safetensors; else fail ckpt_rank_file_is_safetensors "python safetensors could not read it"; fi

# async save gives the same checkpoints
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=as --set checkpoint.async=true --set log.dir=as_run >/dev/null 2>&1
same_state ckpt_async_same_state ref as 40
grep -q '"event":"checkpoint_committed"' as_run/metrics.jsonl && grep -q '"stall_ms"' as_run/metrics.jsonl &&
    pass ckpt_async_reports_stall || fail ckpt_async_reports_stall "no checkpoint events"

# crash@25: resume from 20, end equal to the uninterrupted run
expect_exit ckpt_crash_exits_nonzero 134 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=c --set log.dir=c_run --inject crash@25
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=c --set log.dir=c_run >"$TMP/out" 2>&1
expect_output ckpt_crash_resumes_from_20 'resumed from c/step-000000020'
same_state ckpt_crash_final_state ref c 40

# crash in the middle of saving step 30: the partial step is never used
expect_exit ckpt_crash_in_save_exits 134 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=d --set log.dir=d_run --set checkpoint.async=true --inject crash-in-save@30
[ "$(cat d/latest)" = "step-000000020" ] && [ ! -e d/step-000000030 ] && pass ckpt_partial_not_committed ||
    fail ckpt_partial_not_committed "latest=$(cat d/latest); $(ls d)"
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=d --set log.dir=d_run >"$TMP/out" 2>&1
expect_output ckpt_crash_in_save_resumes_from_20 'resumed from d/step-000000020'
same_state ckpt_crash_in_save_final_state ref d 40
[ -z "$(ls d | grep tmp)" ] && pass ckpt_partial_cleaned || fail ckpt_partial_cleaned "$(ls d)"

# a flipped byte in a shard: explicit load fails naming tensor and file; auto falls back
cp -r ref e
size=$(stat -c %s "$(rankfile e 40)")
printf '\x55' | dd of="$(rankfile e 40)" bs=1 seek=$((size - 100)) conv=notrunc status=none
expect_exit ckpt_corrupt_explicit_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=e --set log.dir=e_run --resume e/step-000000040
expect_output ckpt_corrupt_names_tensor_and_file 'e/step-000000040/rank-00000.safetensors: tensor [a-z_.0-9]+: checksum mismatch'
expect_exit ckpt_corrupt_auto_falls_back 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=e --set log.dir=e_run --set train.steps=41
expect_output ckpt_corrupt_auto_warns 'warning: .*checksum mismatch.*falling back'
expect_output ckpt_corrupt_auto_resumes_30 'resumed from e/step-000000030'

# a different model shape is refused (exit 2)
expect_exit ckpt_shape_change_refused 2 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=ref --set log.dir=x --set model.intermediate_size=96
expect_output ckpt_shape_change_message 'different model shape'
# a longer run and a new schedule tail are fine
expect_exit ckpt_longer_run_allowed 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=ref --set log.dir=x --set train.steps=45 --set optimizer.min_lr=1e-4

# rewind on NaN and on a loss spike
for kind in nan spike; do
    "$MTRAIN" pretrain r.yaml --set checkpoint.dir=rw_$kind --set log.dir=rw_$kind --set rewind.enabled=true \
        --set rewind.window=5 --set rewind.lr_scale=0.5 --set rewind.lr_scale_steps=5 --inject $kind@25 >"$TMP/out" 2>&1
    rc=$?
    expect_output ckpt_rewind_${kind}_console "rewind: step 25 .* back to step 20, skipping 80 samples"
    m=rw_$kind/metrics.jsonl
    grep -q "\"event\":\"rewind\",\"step\":25,\"reason\":\"$( [ $kind = nan ] && echo nonfinite || echo loss_spike)\",\"to_step\":20" $m &&
        pass ckpt_rewind_${kind}_event || fail ckpt_rewind_${kind}_event "$(grep rewind $m)"
    first=$(losses $m | head -1); last=$(losses $m | tail -1)
    if [ $rc = 0 ] && awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a && b == b + 0)}'; then pass ckpt_rewind_${kind}_finishes
    else fail ckpt_rewind_${kind}_finishes "exit $rc, loss $first -> $last"; fi
    # the replayed step 21 reads the batch after the bad step's plus skip_margin (5) batches:
    # samples 240..247, so 248 are consumed after it
    grep '"step":21,' $m | tail -1 | grep -q '"consumed_samples":248}' && pass ckpt_rewind_${kind}_skips_data ||
        fail ckpt_rewind_${kind}_skips_data "$(grep '"step":21,' $m | tail -1)"
done
# without rewind, NaN is fatal
expect_exit ckpt_nan_without_rewind_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=n --set log.dir=n --inject nan@5
# giving up after max_rewinds: a spike that never goes away (factor barely above 1)
expect_exit ckpt_rewind_gives_up 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=g --set log.dir=g --set rewind.enabled=true \
    --set rewind.window=3 --set rewind.spike_factor=1.0001 --set rewind.max_rewinds=2
[ -s g/rewind-diagnostics.json ] && pass ckpt_rewind_diagnostics || fail ckpt_rewind_diagnostics "no g/rewind-diagnostics.json"

# SIGTERM mid-run: checkpoint at the next step boundary, exit 0, resumable exactly
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=s --set log.dir=s_run --set train.steps=400 --set checkpoint.interval=1000 \
    >"$TMP/sig.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '"step":5,' s_run/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
step=$(cat s/latest 2>/dev/null | sed 's/step-0*//')
if [ $rc = 0 ] && [ -n "$step" ] && grep -q '"event":"signal","signal":"SIGTERM"' s_run/metrics.jsonl; then pass ckpt_sigterm_saves_exit0
else fail ckpt_sigterm_saves_exit0 "exit $rc, latest '$step'"; fi
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=sref --set log.dir=sref_run --set train.steps=400 --set checkpoint.interval=1000 \
    --stop-after $((step + 3)) >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=s --set log.dir=s_run --set train.steps=400 --set checkpoint.interval=1000 \
    --stop-after $((step + 3)) >/dev/null 2>&1
same_state ckpt_sigterm_resumes_exactly sref s $((step + 3))
# a resume from an earlier step drops everything the abandoned run logged after it, its comm event too
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=cm --set log.dir=cm_run --set train.steps=12 --set checkpoint.interval=5 \
    --set checkpoint.keep_last=5 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=cm --set log.dir=cm_run --set train.steps=7 --set checkpoint.interval=5 \
    --set checkpoint.keep_last=5 --resume cm/step-000000005 >/dev/null 2>&1
[ "$(grep -c '"event":"comm"' cm_run/metrics.jsonl)" = 1 ] && grep '"event":"comm"' cm_run/metrics.jsonl | grep -q '"step":7,' &&
    pass ckpt_resume_drops_abandoned_comm_event || fail ckpt_resume_drops_abandoned_comm_event "$(grep '"event":"comm"' cm_run/metrics.jsonl | cut -c1-60)"
# SIGTERM without checkpoint.dir: the message says what is saved (the final weights, no checkpoint)
"$MTRAIN" pretrain r.yaml --set checkpoint.dir= --set checkpoint.interval=0 --set log.dir=nock_run --set train.steps=400 \
    >"$TMP/sig.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '"step":5,' nock_run/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
if [ $rc = 0 ] && grep -q 'SIGTERM: no checkpoint.dir, so no checkpoint to resume from: saving the weights of step' "$TMP/sig.out" &&
    ! grep -q 'saving a checkpoint' "$TMP/sig.out" && [ -s nock_run/model.safetensors ]; then
    pass ckpt_sigterm_without_checkpoint_dir_says_so
else fail ckpt_sigterm_without_checkpoint_dir_says_so "exit $rc: $(grep -i sigterm "$TMP/sig.out" | head -2)"; fi
# Ctrl-C (SIGINT) like SIGTERM: a message, a checkpoint at the next step boundary, the final
# weights, exit 0, an exact resume; a second Ctrl-C ends the run at once (exit 130)
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=si --set log.dir=si_run --set train.steps=400 --set checkpoint.interval=1000 \
    >"$TMP/sig.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '"step":5,' si_run/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -INT $pid; wait $pid; rc=$?
step=$(cat si/latest 2>/dev/null | sed 's/step-0*//')
if [ $rc = 0 ] && [ -n "$step" ] && grep -q '"event":"signal","signal":"SIGINT"' si_run/metrics.jsonl &&
    grep -q 'Ctrl-C: stopping at the next step boundary' "$TMP/sig.out" && [ -s si_run/model.safetensors ]; then
    pass ckpt_sigint_saves_exit0
else fail ckpt_sigint_saves_exit0 "exit $rc, latest '$step': $(head -c 300 "$TMP/sig.out")"; fi
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=siref --set log.dir=siref_run --set train.steps=400 \
    --set checkpoint.interval=1000 --stop-after $((step + 3)) >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=si --set log.dir=si_run --set train.steps=400 --set checkpoint.interval=1000 \
    --stop-after $((step + 3)) >/dev/null 2>&1
same_state ckpt_sigint_resumes_exactly siref si $((step + 3))
# (steps of a wider model take long enough for the second Ctrl-C to land inside one)
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=si2 --set log.dir=si2_run --set train.steps=100000 \
    --set checkpoint.interval=100000 --set model.hidden_size=512 --set model.intermediate_size=2048 \
    --set train.seq_len=256 >"$TMP/sig.out" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '"step":2,' si2_run/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -INT $pid; sleep 0.05; kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && pass ckpt_second_sigint_exits_now || fail ckpt_second_sigint_exits_now "exit $rc"
# the dataset sampler's version is part of what a checkpoint's data position
# means: another version is refused (exit 2, naming the key), the same resumes
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=sv --set log.dir=sv --set data.sampler_version=1 --stop-after 10 >/dev/null 2>&1
expect_exit ckpt_sampler_version_refused 2 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=sv --set log.dir=sv
expect_output ckpt_sampler_version_message 'saved with data.sampler_version 1 .* --set data.sampler_version=1'
expect_exit ckpt_sampler_version_same_resumes 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=sv --set log.dir=sv \
    --set data.sampler_version=1
# a manifest of an mtrain before sampler versions (no key, no manifest checksum) counts as version 1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=sold --set log.dir=sold --stop-after 10 >/dev/null 2>&1
"$PY" - sold/step-000000010/manifest.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m.pop("manifest_xxh3", None)
m["recipe"] = "\n".join(l for l in m["recipe"].split("\n") if "sampler_version" not in l)
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
expect_exit ckpt_sampler_version_old_manifest_refused 2 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=sold --set log.dir=sold
expect_output ckpt_sampler_version_old_manifest_message 'saved with data.sampler_version 1'
# --resume takes a step directory or a checkpoint root; a typo is one clear error (exit 2)
expect_exit ckpt_resume_root 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=rr --set log.dir=rr2 --resume sv \
    --set data.sampler_version=1 --stop-after 11
expect_output ckpt_resume_root_newest "resumed from sv/step-0+[0-9]+ "
expect_exit ckpt_resume_typo 2 "$MTRAIN" pretrain r.yaml --set log.dir=rr3 --resume nevr
expect_output ckpt_resume_typo_message "mtrain: error: cannot resume: --resume nevr: no such directory; expected a checkpoint step"
# a changed seq_len or batch would silently read other samples: refused naming the keys, unless allowed
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=dc --set log.dir=dc --stop-after 5 >/dev/null 2>&1
expect_exit ckpt_data_change_refused 2 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=dc --set log.dir=dc \
    --set train.seq_len=16 --set train.global_batch=16
expect_output ckpt_data_change_names_keys "train.seq_len 16 \(checkpoint 32\); train.global_batch 16 \(checkpoint 8\)\. .*--allow-data-change"
expect_exit ckpt_data_change_allowed 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=dc --set log.dir=dc \
    --set train.seq_len=16 --set train.global_batch=16 --allow-data-change --stop-after 6
# after a crash and a resume, metrics.jsonl holds every step once (the crashed run's steps past
# the checkpoint are dropped, the resumed run logs them again)
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=mdup --set log.dir=mdup --set checkpoint.interval=10 --inject crash@15 \
    >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=mdup --set log.dir=mdup --set checkpoint.interval=10 >/dev/null 2>&1
steps=$(grep -c '^{"step":' mdup/metrics.jsonl); distinct=$(grep -o '^{"step":[0-9]*' mdup/metrics.jsonl | sort -u | wc -l)
[ "$steps" = 40 ] && [ "$distinct" = 40 ] && pass ckpt_metrics_no_duplicates_after_resume ||
    fail ckpt_metrics_no_duplicates_after_resume "$steps step lines, $distinct distinct"
exit $FAILED
