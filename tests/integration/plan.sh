# mtrain plan (cli/plan.c, model/plan.c): the parts of its model against
# what mtrain itself does. The bytes each group moves per step (tensor
# parallel with and without sequence parallel and under full recompute, data
# parallel with and without ZeRO-1, pipeline 1F1B and interleaved, the
# context-parallel ring under every recompute mode) equal a real run's comm
# accounting on CPU ranks; the predicted memory is the dry run's estimate;
# the ranked table, --emit (whose recipe the dry run accepts and fits) and
# bad input; the published runs' predictions are the table docs/benchmarks.md
# shows. Timing accuracy is a benchmark (scripts/bench/plan.sh), not a
# test.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 200 --frame-tokens 4096 >/dev/null || { fail plan_setup "data generate failed"; exit 1; }
cat >p.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 24, micro_batch: 2, global_batch: 8, steps: 4, seed: 7, device: cpu}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 1, eps: 1e-4}
data: {path: data}
log: {interval: 100}
YAML
# a system file for the CPU: its numbers do not matter for bytes and memory
cat >cpu.yaml <<'YAML'
name: cpu
per_node: 8
tflops_fp32: 0.1
tflops_bf16: 0.05
mem_gib: 24
mem_gbps: 10
intra_gbps: 5
inter_gbps: 5
YAML

# total bytes of the comm event's rank 0 for GROUP over the run (bytes per step x steps)
total() { grep '"event":"comm"' "$1/metrics.jsonl" |
    sed -n "s/.*\"steps\":\([0-9]*\).*{\"rank\":0,[^}]*\"$2\":\([0-9]*\).*/\1 \2/p" | awk '{print $1 * $2}'; }
# bytes NAME LAYOUT KEY=VALUE...: the training bytes per step of dp, pp and cp (the difference of an
# 8-step and a 4-step run: the end of a run gathers the final weights) against plan --layout's
for spec in "dp2 1,1,1,1,1,2,none" "dp2_zero 1,1,1,1,1,2,none optimizer.distributed=true" \
    "dp2_zero_bf16 1,1,1,1,1,2,none optimizer.distributed=true train.precision=bf16" \
    "pp2 1,2,1,1,1,2,none" "pp2_vpp2 1,2,2,1,1,2,none" "pp2_zbv 1,2,2,1,1,2,none parallel.schedule=zbv" \
    "pp2_dualpipev 1,2,2,1,1,2,none parallel.schedule=dualpipev" \
    "cp2 1,1,1,2,1,2,none" "cp2_full 1,1,1,2,1,2,full" \
    "cp2_selective 1,1,1,2,1,1,selective" "tp2 2,1,1,1,1,2,none" \
    "tp2_sp 2,1,1,1,1,2,none parallel.sequence_parallel=true" "tp2_full 2,1,1,1,1,2,full"; do
    set -- $spec
    name=$1 lay=$2
    shift 2
    IFS=, read -r tp pp vpp cp ep mb rc <<<"$lay"
    sets=(--set parallel.tp=$tp --set parallel.pp=$pp --set parallel.vpp=$vpp --set parallel.cp=$cp
          --set train.micro_batch=$mb --set train.recompute=$rc)
    for kv in "$@"; do sets+=(--set "$kv"); done
    ok=1
    for steps in 4 8; do
        run_np 2 pretrain p.yaml "${sets[@]}" --set train.steps=$steps --set log.dir=${name}_$steps >"$TMP/out" 2>&1 ||
            { fail plan_bytes_$name "run failed: $(tail -2 "$TMP/out")"; ok=0; }
    done
    [ $ok = 1 ] || continue
    predicted=$("$MTRAIN" plan p.yaml --gpus 2 --gpu cpu.yaml --layout "$lay" "${sets[@]:12}" |
        sed -n 's/^predicted_bytes_per_step: tp \([0-9]*\) dp \([0-9]*\) pp \([0-9]*\) ep [0-9]* cp \([0-9]*\).*/\1 \2 \3 \4/p')
    measured=""
    for g in tp dp pp cp; do
        measured="$measured $(( ($(total ${name}_8 $g) - $(total ${name}_4 $g)) / 4 ))"
    done
    [ -n "$predicted" ] && [ "$predicted" = "${measured# }" ] && pass plan_bytes_$name ||
        fail plan_bytes_$name "tp dp pp cp bytes per step: predicted '$predicted', measured '${measured# }'"
done

# the predicted memory is the dry run's estimate (the busiest stage)
for spec in "llama3-8b.yaml 8 2,1,1,1,1,1,none" "llama3-70b.yaml 64 8,4,1,1,1,1,selective" \
    "mixtral-8x7b.yaml 64 1,4,1,1,8,1,selective"; do
    set -- $spec
    recipe=$TEST_ROOT/recipes/$1 n=$2 lay=$3
    IFS=, read -r tp pp vpp cp ep mb rc <<<"$lay"
    plan=$("$MTRAIN" plan "$recipe" --gpus $n --layout "$lay" --set train.precision=bf16 |
        sed -n 's/^predicted_memory_gib: \([0-9.]*\).*/\1/p')
    dry=$(SLURM_NTASKS=$n "$MTRAIN" pretrain "$recipe" --set data.path=/tmp --set train.precision=bf16 \
        --set parallel.tp=$tp --set parallel.pp=$pp --set parallel.vpp=$vpp --set parallel.cp=$cp --set parallel.ep=$ep \
        --set train.micro_batch=$mb --set train.recompute=$rc --set parallel.first_stage_layers=0 \
        --set parallel.last_stage_layers=0 --set parallel.sequence_parallel=$([ $tp -gt 1 ] && echo true || echo false) \
        --dry-run 2>&1 | sed -n 's/^  stage [0-9]* (ranks [0-9-]*) needs \([0-9.]*\) GiB.*/\1/p' | sort -g | tail -1)
    [ -n "$plan" ] && [ "$plan" = "$dry" ] && pass plan_memory_${1%.yaml} ||
        fail plan_memory_${1%.yaml} "plan $plan GiB, dry run $dry GiB"
done

# the ranked table and --emit: the best layout's recipe passes the dry run and fits 80 GiB on 8 GPUs
"$MTRAIN" plan "$TEST_ROOT/recipes/llama3-8b.yaml" --gpus 8 --set train.precision=bf16 --top 3 --emit em >"$TMP/out" 2>&1
rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ ' "$TMP/out")
[ "$rows" = 3 ] && grep -q 'wrote em/recipe.yaml' "$TMP/out" && pass plan_table_emit ||
    fail plan_table_emit "$(head -c 600 "$TMP/out")"
SLURM_NTASKS=8 "$MTRAIN" pretrain em/recipe.yaml --set data.path=/tmp --dry-run 2>&1 | grep -q '^verdict: *fits on every rank' &&
    grep -q 'sbatch --nodes=1 --ntasks-per-node=8' em/submit.sh && pass plan_emit_fits ||
    fail plan_emit_fits "$(cat em/submit.sh)"
# every shipped system file loads
for g in h100 h200 a100 b200; do
    "$MTRAIN" plan "$TEST_ROOT/recipes/llama3-8b.yaml" --gpus 8 --gpu $g --top 1 >"$TMP/out" 2>&1 &&
        grep -q "x $g " "$TMP/out" && pass plan_system_$g || fail plan_system_$g "$(head -c 300 "$TMP/out")"
done

# --calibrate on 2 CPU ranks writes a system file the planner loads
mpiexec -n 2 "$MTRAIN" plan --calibrate cal.yaml >"$TMP/out" 2>&1 &&
    "$MTRAIN" plan p.yaml --gpus 2 --gpu cal.yaml --layout 1,1,1,1,1,2,none | grep -q '^predicted_step_ms: [0-9]' &&
    grep -q '^per_node: 2' cal.yaml && pass plan_calibrate_cpu || fail plan_calibrate_cpu "$(head -c 400 "$TMP/out")"
# more ranks than cores (4 on CI's 2): rank 0 times alone, the others wait at a sleeping barrier, and the
# peaks it writes are its share; with 4 or more cores, 8 ranks
nr=4; [ "$(nproc)" -ge 4 ] && nr=$((2 * $(nproc)))
mpiexec -n $nr "$MTRAIN" plan --calibrate cal_over.yaml >"$TMP/out" 2>&1 && grep -q "^per_node: $nr" cal_over.yaml &&
    grep -q "is its share" cal_over.yaml && "$MTRAIN" plan p.yaml --gpus 2 --gpu cal_over.yaml \
    --layout 1,1,1,1,1,2,none | grep -q '^predicted_step_ms: [0-9]' && pass plan_calibrate_oversubscribed ||
    fail plan_calibrate_oversubscribed "$(head -c 400 "$TMP/out")"
expect_exit plan_calibrate_gpu_needs_base 2 "$MTRAIN" plan --calibrate x.yaml --device cuda

# bad input: exit 2, one message naming what is wrong
expect_exit plan_unknown_gpu 2 "$MTRAIN" plan p.yaml --gpus 2 --gpu nosuch
expect_output plan_unknown_gpu_says "neither a file nor a shipped system"
printf 'name: x\ntflops_bf16: fast\n' >bad.yaml
expect_exit plan_bad_system 2 "$MTRAIN" plan p.yaml --gpus 2 --gpu bad.yaml
expect_output plan_bad_system_says "bad.yaml:2: tflops_bf16: expected a number"
expect_exit plan_no_gpus 2 "$MTRAIN" plan p.yaml
expect_exit plan_bad_layout 2 "$MTRAIN" plan p.yaml --gpus 2 --gpu cpu.yaml --layout 3,1,1,1,1,2,none
expect_exit plan_layout_zero 2 "$MTRAIN" plan p.yaml --gpus 2 --gpu cpu.yaml --layout 1,1,1,1,0,2,none
expect_output plan_layout_zero_says "parallel.ep=0: key 'parallel.ep': value 0 out of range"
expect_exit plan_layout_short 2 "$MTRAIN" plan p.yaml --gpus 2 --gpu cpu.yaml --layout 1,1,1,1,1,2
expect_output plan_layout_short_says "expected tp,pp,vpp,cp,ep,micro_batch,recompute"

# the published runs' predictions (docs/benchmarks.md): the script predicts all four, and the table in the docs is
# what it prints now (a change to the planner's model updates both)
MTRAIN=$MTRAIN bash "$TEST_ROOT/scripts/bench/plan_published.sh" >published.md 2>"$TMP/out"
rc=$?
rows=$(grep -cE '^\| [A-Z].*\| [0-9]+\.[0-9]{2} \|' published.md)
[ $rc = 0 ] && [ "$rows" = 4 ] && pass plan_published_predicts_four ||
    fail plan_published_predicts_four "exit $rc, $rows rows: $(head -c 300 "$TMP/out")"
missing=$(grep -E '^\| [A-Z]' published.md | grep -vxFf "$TEST_ROOT/docs/benchmarks.md" | head -2)
[ -z "$missing" ] && pass plan_published_table_in_docs || fail plan_published_table_in_docs "not in docs/benchmarks.md: $missing"
exit $FAILED
