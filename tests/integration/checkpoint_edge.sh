# Checkpoint edge cases: the manifest's own checksum, a stale or garbled
# `latest`, unwritable directories found at start-up, leftovers of an
# interrupted commit, and the error line of a failed async save.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail edge_setup "data generate failed"; exit 1; }
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
manifest() { echo "$1/step-$(printf %09d "$2")/manifest.json"; }
same_state() {
    if cmp -s "$(rankfile "$2" "$4")" "$(rankfile "$3" "$4")"; then pass "$1"; else fail "$1" "rank files of step $4 differ"; fi
}
# check NAME CONDITION-COMMAND... : pass if it succeeds, else fail with $TMP/out's head
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "$(head -c 400 "$TMP/out" 2>/dev/null)"; fi; }
no_output() { ! grep -qE -- "$1" "$TMP/out"; }

# reference: 40 uninterrupted steps (checkpoints 20, 30, 40)
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=ref --set log.dir=refrun >/dev/null 2>&1 || fail edge_reference_run "exit $?"

# ---- 1. the manifest's own checksum ----
check edge_manifest_has_checksum grep -q '"manifest_xxh3": "[0-9a-f]\{16\}"' "$(manifest ref 40)"
cp -r ref m
sed -i 's/"consumed_samples": 320/"consumed_samples": 328/' "$(manifest m 40)"
grep -q '"consumed_samples": 328' "$(manifest m 40)" || fail edge_manifest_edit_setup "sed did not change the manifest"
expect_exit edge_manifest_edit_explicit_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=m --set log.dir=m_x \
    --resume m/step-000000040
expect_output edge_manifest_edit_names_file '^mtrain: error: cannot resume: m/step-000000040/manifest.json: manifest checksum mismatch'
check edge_manifest_edit_no_steps no_output '^step '
expect_exit edge_manifest_edit_auto_exit0 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=m --set log.dir=m_run
expect_output edge_manifest_edit_auto_warns 'warning: m/step-000000040/manifest.json: manifest checksum mismatch.*falling back'
expect_output edge_manifest_edit_auto_resumes_30 'resumed from m/step-000000030 at step 30 \(240 samples'
if [ "$(losses refrun/metrics.jsonl | tail -10)" = "$(losses m_run/metrics.jsonl)" ]; then pass edge_manifest_edit_same_losses
else fail edge_manifest_edit_same_losses "steps 31-40 differ from the uninterrupted run"; fi
same_state edge_manifest_edit_continues_bitwise ref m 40
# the recipe text and the optimizer step are covered too
cp -r ref m2
sed -i 's/lr: 0.003\\n/lr: 0.004\\n/' "$(manifest m2 40)"
sed -i 's/"optimizer_step": 30,/"optimizer_step": 31,/' "$(manifest m2 30)"
expect_exit edge_manifest_recipe_edit_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=m2 --set log.dir=m2_x --resume m2/step-000000040
expect_output edge_manifest_recipe_edit_message 'm2/step-000000040/manifest.json: manifest checksum mismatch'
expect_exit edge_manifest_optstep_edit_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=m2 --set log.dir=m2_x --resume m2/step-000000030
expect_exit edge_manifest_two_bad_auto_exit0 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=m2 --set log.dir=m2_run
expect_output edge_manifest_two_bad_auto_resumes_20 'resumed from m2/step-000000020 at step 20'
same_state edge_manifest_two_bad_continues_bitwise ref m2 40
# a manifest from before the checksum (no manifest_xxh3) still loads, with a warning
cp -r ref o
sed -i '/"manifest_xxh3"/d' "$(manifest o 40)"
expect_exit edge_manifest_old_loads 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=o --set log.dir=o_run --resume o/step-000000040
expect_output edge_manifest_old_warns 'warning: o/step-000000040/manifest.json carries no checksum'
# ... but its training state must still be in range: a negative data position or step is refused by name, on
# resume and by convert (which would have written a step directory named step--0000005)
cp -r ref ob
sed -i '/"manifest_xxh3"/d; s/"consumed_samples": 320/"consumed_samples": -7/' "$(manifest ob 40)"
expect_exit edge_manifest_old_bad_state_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=ob --set log.dir=ob_x \
    --resume ob/step-000000040
expect_output edge_manifest_old_bad_state_message \
    "ob/step-000000040/manifest.json: bad training state: 'consumed_samples' must be an integer from 0"
sed -i 's/"consumed_samples": -7/"consumed_samples": 320/; s/"step": 40,/"step": -5,/' "$(manifest ob 40)"
expect_exit edge_manifest_old_bad_step_convert_exit1 1 "$MTRAIN" convert ob/step-000000040 ob_conv --tp 1 --pp 1
expect_output edge_manifest_old_bad_step_message "bad training state: 'step' must be an integer from 0 to 999999999"
check edge_manifest_old_bad_step_nothing_written test ! -e ob_conv/latest
# ... and its recipe must match its tensors: a recipe naming a vocabulary of 2^30 is refused by tensor before
# convert, convert --hf or generate allocates the embedding's 128 GiB (found by tests/fuzz/fuzz_checkpoint.c)
sed -i 's/"step": -5,/"step": 40,/; s/vocab_size: 257\\n/vocab_size: 1073741824\\n/' "$(manifest ob 40)"
grep -q 'vocab_size: 1073741824' "$(manifest ob 40)" || fail edge_manifest_old_big_recipe_setup "sed did not change it"
expect_exit edge_manifest_old_big_recipe_exit1 1 "$MTRAIN" convert ob/step-000000040 ob_conv2 --tp 1 --pp 1
expect_output edge_manifest_old_big_recipe_message \
    "tensor model.embed_tokens.weight is missing or has another shape or shard rule: the manifest's tensors do not match"
expect_exit edge_manifest_old_big_recipe_hf_exit1 1 "$MTRAIN" convert ob/step-000000040 --hf ob_hf
expect_output edge_manifest_old_big_recipe_hf_message "tensor model.embed_tokens.weight is missing or has another shape"
expect_exit edge_manifest_old_big_recipe_generate_exit1 1 "$MTRAIN" generate ob/step-000000040 --prompt-ids 1
expect_output edge_manifest_old_big_recipe_generate_message "tensor model.embed_tokens.weight is missing or has another"

# ---- 2. `latest` does not decide: the newest committed, verified step does ----
for kind in stale garbled missing ahead; do
    cp -r ref l_$kind
    case $kind in
        stale) echo step-000000010 >l_$kind/latest; want='latest names step-000000010 but the newest committed checkpoint is step-000000040' ;;
        garbled) printf 'st\x01ep-0' >l_$kind/latest; want='latest is unreadable or garbled' ;;
        missing) rm l_$kind/latest; want='latest is missing' ;;
        ahead) echo step-000000090 >l_$kind/latest; want='latest names step-000000090 but the newest committed checkpoint is step-000000040' ;;
    esac
    expect_exit edge_latest_${kind}_exit0 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=l_$kind --set log.dir=l_${kind}_run \
        --set train.steps=42
    expect_output edge_latest_${kind}_resumes_newest 'resumed from l_'$kind'/step-000000040 at step 40'
    expect_output edge_latest_${kind}_warns "warning: l_$kind/$want"
    [ "$(cat l_$kind/latest 2>/dev/null)" = step-000000042 ] && pass edge_latest_${kind}_rewritten ||
        fail edge_latest_${kind}_rewritten "latest = $(cat l_$kind/latest 2>/dev/null)"
done
# an intact `latest` is not warned about
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=ref --set log.dir=x_run >"$TMP/out" 2>&1
check edge_latest_intact_no_warning no_output 'warning'
# stale `latest` and a damaged newest step: the next older one that verifies
cp -r ref ld
echo step-000000010 >ld/latest
size=$(stat -c %s "$(rankfile ld 40)")
printf '\x55' | dd of="$(rankfile ld 40)" bs=1 seek=$((size - 100)) conv=notrunc status=none
expect_exit edge_latest_stale_damaged_exit0 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=ld --set log.dir=ld_run
expect_output edge_latest_stale_damaged_resumes_30 'resumed from ld/step-000000030 at step 30'
same_state edge_latest_stale_damaged_bitwise ref ld 40

# ---- 3. unwritable checkpoint.dir / log.dir: found before step 1 ----
# (tests run as root, where permissions do not stop writes: a path under a regular file does)
touch afile
expect_exit edge_unwritable_ckdir_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=afile/ck --set log.dir=u_run
expect_output edge_unwritable_ckdir_message '^mtrain: error: checkpoint.dir afile/ck: not writable \(cannot create it: Not a directory\)$'
check edge_unwritable_ckdir_before_step1 no_output '^step |resumed'
check edge_unwritable_ckdir_no_metrics test ! -s u_run/metrics.jsonl
expect_exit edge_ckdir_is_file_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=afile --set log.dir=u_run
expect_output edge_ckdir_is_file_message '^mtrain: error: checkpoint.dir afile: not writable \(cannot create a file in it: Not a directory\)$'
expect_exit edge_unwritable_logdir_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=u_ck --set log.dir=afile/run
expect_output edge_unwritable_logdir_message '^mtrain: error: log.dir afile/run: not writable \(cannot create it: Not a directory\)$'
check edge_unwritable_logdir_before_step1 no_output '^step '
expect_exit edge_unwritable_logdir_no_ckpt_exit1 1 "$MTRAIN" pretrain r.yaml --set checkpoint.dir= --set checkpoint.interval=0 \
    --set log.dir=afile/run
expect_output edge_unwritable_logdir_no_ckpt_message '^mtrain: error: log.dir afile/run: not writable'
# the probe leaves nothing behind
check edge_probe_leaves_nothing test -z "$(ls -A ref refrun x_run | grep -i probe)"

# ---- 4. leftovers of an interrupted commit are removed at the next start ----
cp -r ref lo
sh -c 'exit 0' & dead=$!; wait $dead
echo step-000000090 >lo/latest.tmp.$dead                  # a dead writer's `latest` update
echo step-000000090 >lo/latest.tmp.$$                     # a live process's (this shell's): kept
sleep 60 & reused=$!                                      # a live PID that did not write it:
echo step-000000090 >lo/latest.tmp.$reused && touch -d '-2 hours' lo/latest.tmp.$reused # older than the process
mkdir lo/step-000000050.tmp-save && echo x >lo/step-000000050.tmp-save/rank-00000.safetensors.tmp.$dead
mkdir lo/step-000000015 && echo x >lo/step-000000015/rank-00000.safetensors  # an interrupted removal
echo >lo/.mtrain-probe-r0.tmp.$dead                       # a start-up probe of a killed run
expect_exit edge_leftovers_run_exit0 0 "$MTRAIN" pretrain r.yaml --set checkpoint.dir=lo --set log.dir=lo_run --resume never \
    --set train.steps=5 --set checkpoint.interval=0
check edge_leftover_latest_tmp_removed test ! -e lo/latest.tmp.$dead
check edge_leftover_live_pid_kept test -e lo/latest.tmp.$$
check edge_leftover_reused_pid_removed test ! -e lo/latest.tmp.$reused
kill $reused; wait $reused 2>/dev/null
check edge_leftover_tmp_save_removed test ! -e lo/step-000000050.tmp-save
check edge_leftover_no_manifest_removed test ! -e lo/step-000000015
check edge_leftover_probe_removed test ! -e lo/.mtrain-probe-r0.tmp.$dead
expect_output edge_leftovers_warned "warning: removing lo/latest.tmp.$dead, left by an interrupted save"
check edge_leftovers_committed_kept test "$(ls -d lo/step-* | tr '\n' ' ')" = "lo/step-000000020 lo/step-000000030 lo/step-000000040 " -a \
    "$(cat lo/latest)" = step-000000040
rm -f lo/latest.tmp.$$

# ---- 5. a failed async save: one clean error line, from the main thread ----
# The file-size limit (set once the run is going: MPI's start-up needs large
# files) makes the background writer's rank file fail with EFBIG.
if command -v prlimit >/dev/null 2>&1; then
    # (a) the writer thread fails alone (a SIGUSR1 save)
    (trap '' XFSZ; exec "$MTRAIN" pretrain r.yaml --set checkpoint.dir=af --set log.dir=af_run --set checkpoint.async=true \
        --set train.steps=100000 --set checkpoint.interval=1000000) >"$TMP/out" 2>&1 &
    pid=$!
    for _ in $(seq 200); do grep -q '"step":5,' af_run/metrics.jsonl 2>/dev/null && break; sleep 0.05; done
    prlimit --pid $pid --fsize=300000:300000
    kill -USR1 $pid
    for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -9 $pid 2>/dev/null; wait $pid; rc=$?
    [ $rc = 1 ] && pass edge_async_fail_exit1 || fail edge_async_fail_exit1 "exit $rc: $(tail -c 400 "$TMP/out")"
    check edge_async_fail_one_error_line test "$(grep -c 'mtrain: error' "$TMP/out")" = 1
    expect_output edge_async_fail_clean_line \
        '^mtrain: error: checkpoint step [0-9]+: cannot write af/step-0+[0-9]+\.tmp-save/rank-00000\.safetensors\.tmp\.[0-9]+: File too large$'
    check edge_async_fail_not_committed test ! -e af/latest
    # the next start removes what the failed save left
    "$MTRAIN" pretrain r.yaml --set checkpoint.dir=af --set log.dir=af_run --set train.steps=5 --set checkpoint.interval=0 \
        >"$TMP/out" 2>&1
    check edge_async_fail_cleaned_next_start test -z "$(ls -A af | grep tmp)"
    # (b) the final save's writer and the main thread (final weights) both fail: still one line
    (trap '' XFSZ; exec "$MTRAIN" pretrain r.yaml --set checkpoint.dir=ag --set log.dir=ag_run --set checkpoint.async=true \
        --set train.steps=100000 --set checkpoint.interval=1000000) >"$TMP/out" 2>&1 &
    pid=$!
    for _ in $(seq 200); do grep -q '"step":5,' ag_run/metrics.jsonl 2>/dev/null && break; sleep 0.02; done
    prlimit --pid $pid --fsize=100000:100000
    kill -USR1 $pid # its last save, then the end of the run (the final weights too fail to write)
    for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -9 $pid 2>/dev/null; wait $pid; rc=$?
    [ $rc = 1 ] && [ "$(grep -c 'mtrain: error' "$TMP/out")" = 1 ] && grep -qE '^mtrain: error: .*File too large( \(the partial file is removed; .*\))?$' "$TMP/out" &&
        pass edge_async_final_fail_one_line || fail edge_async_final_fail_one_line "exit $rc: $(grep -A1 'mtrain: error' "$TMP/out" | head -c 600)"
else
    fail edge_async_fail "prlimit (util-linux) is missing"
fi
exit $FAILED
