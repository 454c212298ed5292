#!/usr/bin/env bash
# make bench: every benchmark in scripts/bench, each printing a table and
# writing JSON under build/bench/. Ratios are measured in one run, since the
# machine is shared and absolute CPU timings are noisy.
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
mkdir -p build/bench
rc=0
for b in scripts/bench/train.sh scripts/bench/plan.sh scripts/bench/plan_published.sh scripts/bench/recompute.sh scripts/bench/moe.sh scripts/bench/train_gpu.sh scripts/bench/moe_gpu.sh scripts/bench/data.sh scripts/bench/data_stream.sh scripts/bench/checkpoint.sh scripts/bench/parallel.sh scripts/bench/comm.sh scripts/bench/overlap.sh scripts/bench/pipeline_schedules.sh scripts/bench/cp_balance.sh; do
    [ -f "$b" ] || continue
    echo "== $b"
    BUILD=$BUILD bash "$b" || rc=1
    # the planner also against 4 ranks sharing the cores (oversubscribed where the machine has fewer)
    if [ "$b" = scripts/bench/plan.sh ]; then echo "== NP=4 $b"; NP=4 BUILD=$BUILD bash "$b" || rc=1; fi
    # the schedules also where the linears outweigh the rest (the zero-bubble papers' F = B = W case)
    if [ "$b" = scripts/bench/pipeline_schedules.sh ]; then
        echo "== SHAPE=gemm $b"
        SHAPE=gemm JSON=build/bench/pipeline_schedules_gemm.json BUILD=$BUILD bash "$b" || rc=1
    fi
done
exit $rc
