# Shared helpers for shell integration tests: each check prints PASS/FAIL/SKIP
# lines that tests/run.sh counts. Source this, then call pass/fail/expect_*.
set -u
TEST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) # resolved now: tests cd into $TMP
MTRAIN=${MTRAIN:-$TEST_ROOT/mtrain}
TMP=$(mktemp -d /tmp/mtrain-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILED=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: ${2:-}"; FAILED=1; }
skip() { echo "SKIP $1: ${2:-}"; }
# expect_exit NAME CODE CMD...: run CMD, check its exit code; output in $TMP/out
expect_exit() {
    local name=$1 code=$2; shift 2
    "$@" >"$TMP/out" 2>&1
    local rc=$?
    if [ "$rc" = "$code" ]; then pass "$name"; else fail "$name" "exit $rc, want $code: $(head -c 400 "$TMP/out")"; fi
}
# expect_output NAME PATTERN: grep -E PATTERN in the last command's output
expect_output() {
    if grep -qE -- "$2" "$TMP/out"; then pass "$1"; else fail "$1" "output lacks /$2/: $(head -c 400 "$TMP/out")"; fi
}
# The Python that has the test references (Debian's python3-torch + pip packages).
PY=${PYTHON:-/usr/bin/python3}
# require_python NAME MODULES...: fail NAME and exit unless $PY imports them all
require_python() {
    local name=$1; shift
    local imports
    imports=$(IFS=,; echo "$*")
    if ! "$PY" -c "import $imports" 2>"$TMP/err"; then
        fail "$name" "$PY cannot import $imports (run scripts/install-deps.sh): $(tail -1 "$TMP/err")"
        exit 1
    fi
}
# A build product (tools are built by `make test`).
build_path() { echo "$TEST_ROOT/${BUILD:-build/rel}/$1"; }
# Multi-rank tests (oversubscribed on 2 cores): run_np N ARGS... runs mtrain
# on N ranks with a time limit; COMPARE checks two checkpoints' parameters.
COMPARE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/integration/compare_ckpt.py"
run_np() { local n=$1; shift; timeout 300 mpiexec -n "$n" "$MTRAIN" "$@"; }
# layout_run CHECK NP RECIPE NAME KEY=VALUE...: `mtrain pretrain RECIPE` on NP ranks
# with log.dir NAME, checkpoint.dir ck_NAME and each KEY=VALUE as --set; if it
# fails, fails CHECK_runs and returns 1 (the layout tests' runs)
layout_run() {
    local check=$1 np=$2 recipe=$3 name=$4 kv; shift 4
    local sets=(--set log.dir="$name" --set checkpoint.dir=ck_"$name")
    for kv in "$@"; do sets+=(--set "$kv"); done
    run_np "$np" pretrain "$recipe" "${sets[@]}" >"$TMP/out" 2>&1 ||
        { fail "${check}_runs" "exit $?: $(tail -3 "$TMP/out")"; return 1; }
}
# layout_matches CHECK NP RECIPE REF NAME KEY=VALUE...: layout_run, then CHECK_losses (20 steps' losses
# within 1e-5 of the run logged in REF) and CHECK_params (the final parameters against ck_REF's)
layout_matches() {
    local check=$1 np=$2 recipe=$3 ref=$4 name=$5; shift 5
    layout_run "$check" "$np" "$recipe" "$name" "$@" || return 1
    close_metrics "$ref/metrics.jsonl" "$name/metrics.jsonl" 1 20 && pass "${check}_losses" ||
        fail "${check}_losses" "$(worst_metric "$ref/metrics.jsonl" "$name/metrics.jsonl" 1)"
    params_close "$check" "ck_$ref/step-000000020" "ck_$name/step-000000020"
}
# params_close CHECK STEP_DIR_A STEP_DIR_B: CHECK_params, every parameter within 1e-5 (compare_ckpt.py)
params_close() {
    "$PY" "$COMPARE" "$2" "$3" 1e-5 >"$TMP/cmp" 2>&1 && pass "${1}_params" || fail "${1}_params" "$(cat "$TMP/cmp")"
}
# Loss curves of metrics.jsonl files (the parallel-layout tests):
# metric FILE KEY: KEY's value on every step line, in order
metric() { grep '"loss"' "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }
# step_metric FILE FROM [KEY]: "step value" of steps >= FROM (the last line of a
# step wins, as after a resume), KEY default loss
step_metric() {
    grep '"loss"' "$1" | sed -n "s/{\"step\":\([0-9]*\),.*\"${3:-loss}\":\([^,}]*\).*/\1 \2/p" |
        awk -v from="$2" '$1 >= from {v[$1] = $2} END {for (s in v) print s, v[s]}' | sort -n
}
# close_metrics A B FROM MIN [KEY] [TOL]: at least MIN steps from FROM in both,
# each value within TOL (default 1e-5) relative; a KEY other than loss that
# neither run records (e.g. mtp_loss without MTP) has nothing to compare and passes
close_metrics() {
    join <(step_metric "$1" "$3" "${5:-loss}") <(step_metric "$2" "$3" "${5:-loss}") 2>/dev/null |
        awk -v min="$4" -v tol="${6:-1e-5}" -v empty_ok="$([ "${5:-loss}" = loss ] && echo 0 || echo 1)" \
            '{n++; d=$2-$3; if (d<0) d=-d; if (d/$2 > tol) bad=1} END{exit (n >= min && !bad) || (n == 0 && empty_ok) ? 0 : 1}'
}
# worst_metric A B FROM [KEY]: the largest relative difference of KEY (default loss) and its step
worst_metric() {
    join <(step_metric "$1" "$3" "${4:-loss}") <(step_metric "$2" "$3" "${4:-loss}") 2>/dev/null |
        awk '{d=($2-$3)/$2; if (d<0) d=-d; if (d>=w) {w=d; s=$1}} END{printf "%.3g at step %d", w, s}'
}
# rank_process PATTERN RANK METRICS STEP_RE JOB: once METRICS logs a line
# matching STEP_RE (grep -E), the pid of world rank RANK's mtrain among the
# processes whose command line holds PATTERN (empty if JOB ended first or
# after a minute)
rank_process() {
    local pattern=$1 rank=$2 metrics=$3 step=$4 job=$5 p
    for _ in $(seq 1200); do
        if grep -qE "$step" "$metrics" 2>/dev/null; then
            for p in $(pgrep -f -- "$pattern"); do
                tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "PMI_RANK=$rank" &&
                    [ "$(cat /proc/$p/comm 2>/dev/null)" = mtrain ] && { echo "$p"; return; }
            done
            return
        fi
        kill -0 "$job" 2>/dev/null || return
        sleep 0.05
    done
}
# comm_layout_recipes DEVICE [DEEPSEEK_EXTRA]: the communication tests' tiny
# recipes, 6 steps on train.device DEVICE: r.yaml (Llama), moe.yaml (Mixtral: 4
# experts, top 2), ds.yaml (DeepSeek-V3: MLA, sigmoid routing with the bias, a
# shared expert; DEEPSEEK_EXTRA appended to its model keys, e.g. ', mtp_depth: 1')
comm_layout_recipes() {
    cat >r.yaml <<YAML
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 6, seed: 7, device: $1, threads: 1}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 2, eps: 1e-4}
data: {path: data}
log: {interval: 100}
YAML
    sed 's/vocab_size: 264/arch: mixtral, vocab_size: 264/; s/intermediate_size: 64}/intermediate_size: 64, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48}/' \
        r.yaml >moe.yaml
    sed "s/vocab_size: 264, .*intermediate_size: 64}/arch: deepseek_v3, vocab_size: 264, hidden_size: 32, num_layers: 3, num_heads: 4, num_kv_heads: 4, intermediate_size: 64, q_lora_rank: 16, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 8, v_head_dim: 8, first_k_dense: 1, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 24, moe_shared_experts: 1, moe_score_func: sigmoid, moe_n_group: 2, moe_topk_group: 1, moe_aux_loss_coef: 0, moe_bias_update_rate: 1e-3${2:-}}/" \
        r.yaml >ds.yaml
}
# family_recipes PRECISION: the precision tests' tiny recipes, 20 steps at
# PRECISION with checkpoints every 10 (ck_ref) and logs in ref: r.yaml (Llama),
# moe.yaml (Mixtral: 4 experts, top 2) and deepseek.yaml (DeepSeek-V3: MLA
# with its row offsets into the latent and rotary parts, sigmoid routing
# with the fp32 expert bias, a shared expert, MTP; layers 0-1 dense)
family_recipes() {
    cat >r.yaml <<YAML
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 20, seed: 7, precision: $1}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
checkpoint: {dir: ck_ref, interval: 10}
log: {dir: ref, interval: 100}
YAML
    sed 's/vocab_size: 264/arch: mixtral, vocab_size: 264/; s/intermediate_size: 64}/intermediate_size: 64, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48}/' \
        r.yaml >moe.yaml
    {
        cat <<'YAML'
model: {arch: deepseek_v3, vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 4,
        intermediate_size: 64, q_lora_rank: 16, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4,
        v_head_dim: 8, first_k_dense: 2, num_experts: 8, experts_per_token: 2, moe_intermediate_size: 16,
        moe_shared_experts: 1, moe_score_func: sigmoid, moe_n_group: 4, moe_topk_group: 2, moe_routed_scaling: 2.5,
        moe_bias_update_rate: 1e-3, moe_seq_aux_loss_coef: 1e-3, moe_aux_loss_coef: 0, mtp_depth: 1}
YAML
        sed '1d' r.yaml
    } >deepseek.yaml
}
# recipe_fits CHECK RECIPE: the recipe's header names "Fits 80 GiB per GPU on N GPUs"; its
# dry run at N ranks says every pipeline stage fits, in bf16 and in fp8 (CHECK_bf16, CHECK_fp8)
recipe_fits() {
    local check=$1 recipe=$2 n p
    n=$(sed -n 's/^# Fits 80 GiB per GPU on \([0-9]*\) GPUs.*/\1/p' "$recipe")
    [ -n "$n" ] || { fail "${check}_header" "no 'Fits 80 GiB per GPU on N GPUs' line"; return; }
    grep -q '^  device_memory_gib: 80' "$recipe" || fail "${check}_device_memory" "train.device_memory_gib is not 80"
    for p in bf16 fp8; do
        SLURM_NTASKS=$n "$MTRAIN" pretrain "$recipe" --set data.path=/tmp --set train.precision=$p --dry-run >"$TMP/fit" 2>&1
        grep -q '^verdict: *fits on every rank' "$TMP/fit" && pass "${check}_${p}_${n}_gpus" ||
            fail "${check}_${p}_${n}_gpus" "$(grep -E 'verdict|error' "$TMP/fit" | head -2)"
    done
}
