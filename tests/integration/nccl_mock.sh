# parallel/comm_nccl.c run on the CPU: test_comm's NCCL pass (every comm.h
# call, the pipeline's grouped exchange, started reductions and gathers with
# their tickets, the grid's groups each with a communicator of their own)
# on 1, 2 and 4 ranks, against a libnccl.so.2 over MPI (tests/mock/nccl_mock.c,
# found first on LD_LIBRARY_PATH by comm_nccl.c's dlopen) and CUDA runtime
# memory, stream and event calls on host memory (tests/mock/cudart_mock.c,
# preloaded). Then mtrain pretrain itself over NCCL in nine layouts (dp with
# gradient buckets, tp with sequence parallelism, interleaved pp with tied
# embeddings, zb-h1, ZeRO-1 with parameter gathers, tp x pp in bf16, MoE expert
# parallelism, DeepSeek-V3, FP8), its CPU ranks' buffers in the mock's
# device memory (MTRAIN_TEST_GPU_COMM_ON_CPU), over NCCL and over MPI staged
# through host buffers as GPU ranks do: both bitwise the losses of the plain
# CPU run of the layout. Every buffer NCCL is handed must come from
# cudaMalloc, and every cudaMemcpy's device side too, so a host pointer
# reaching an NCCL group or the staging fails here as on a GPU. A ZeRO-1
# run over NCCL stopped, resumed and rewound, evaluating as it goes, matches
# the same sequence on plain CPU ranks. zbv (and dualpipev with ep 2) over staged MPI equals plain
# CPU ranks too. Last, the bad configurations of GPU ranks (two ranks on one
# GPU under NCCL, fp8 on a GPU without FP8 tensor cores, zbv over NCCL)
# exit 2 with one message. What it
# checks: the NCCL code path's bootstrap, arguments (counts, types, roots,
# peers, in-place forms, group brackets), bookkeeping and which buffers go
# where; what it cannot: stream ordering on a GPU and NCCL itself
# (tests/unit/test_comm.c runs against the real library where each rank
# has a GPU; scripts/device/gpu_checks.sh).
source "$(dirname "$0")/../lib.sh"
CHECK_TL="$(cd "$(dirname "$0")" && pwd)/check_timeline.py"
MOCK=$(build_path mock)
BENCH_COMM=$(build_path bench/bench_comm)
TEST_COMM=$(build_path tests/test_comm)
if [ ! -f "$MOCK/libnccl.so.2" ] || [ ! -f "$MOCK/libcudart_mock.so" ]; then
    skip nccl_mock "this build has no CUDA backend (CUDA=0): no NCCL path to run"
    exit 0
fi
export MOCK_NCCL_DIR=$TMP LD_LIBRARY_PATH=$MOCK${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# sanitized builds: the preloaded mock comes before the sanitizer's runtime
export ASAN_OPTIONS=verify_asan_link_order=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}
for n in 1 2 4; do
    LD_PRELOAD=$MOCK/libcudart_mock.so timeout 300 mpiexec -n $n "$TEST_COMM" >"$TMP/np$n.out" 2>&1
    rc=$?
    lines=$(grep -E '^(PASS|FAIL|SKIP) [a-z_0-9]*nccl' "$TMP/np$n.out")
    echo "$lines" | grep -E '^(PASS|FAIL|SKIP) ' | sed -E "s/^(PASS|FAIL|SKIP) ([a-z_0-9]+)/\1 \2_mock_np$n/"
    # the NCCL pass ran whole: its last check (and, on several ranks, the grid's groups) reported, nothing failed
    grid=1
    [ $n -gt 1 ] && grid=$(echo "$lines" | grep -c '^PASS comm_nccl_grid_groups')
    [ "$rc" = 0 ] && echo "$lines" | grep -q '^PASS comm_nccl_counts_payload' && [ "$grid" = 1 ] &&
        ! echo "$lines" | grep -qE '^(FAIL|SKIP)' && pass nccl_mock_np${n}_all_ran ||
        fail nccl_mock_np${n}_all_ran "exit $rc: $(tail -3 "$TMP/np$n.out")"
done

# the trainer over NCCL, layout by layout, against the same layout over MPI
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 --frame-tokens 4096 >/dev/null || { fail nccl_mock_setup "data generate failed"; exit 1; }
comm_layout_recipes cpu
export OMP_NUM_THREADS=1
layouts=(
    "dp2 r.yaml 2"
    "tp2_sp r.yaml 2 parallel.tp=2 parallel.sequence_parallel=true"
    "pp2_vpp2_tied r.yaml 2 parallel.pp=2 parallel.vpp=2 model.tie_embeddings=true"
    "pp2_zb_h1 r.yaml 2 parallel.pp=2 parallel.schedule=zb-h1"
    "dp4_zero r.yaml 4 optimizer.distributed=true parallel.grad_bucket_mb=0.02"
    "bf16_tp2_pp2 r.yaml 4 parallel.tp=2 parallel.pp=2 train.precision=bf16"
    "moe_ep2_dp2 moe.yaml 2 parallel.ep=2"
    "deepseek_ep2_tp2 ds.yaml 4 parallel.ep=2 parallel.tp=2"
    "fp8_tp2_dp2 r.yaml 4 parallel.tp=2 train.precision=fp8 train.fp8_skip_layers=0"
)
losses() { grep '"loss"' "$1" 2>/dev/null | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
# as_gpu_ranks NP ARGS...: `mtrain ARGS` on NP ranks that communicate as GPU ranks do, through the
# stand-in runtime (MTRAIN_TEST_GPU_COMM_ON_CPU); LIMIT seconds at most (default 300)
as_gpu_ranks() {
    local np=$1
    shift
    MTRAIN_TEST_GPU_COMM_ON_CPU=1 LD_PRELOAD=$MOCK/libcudart_mock.so timeout "${LIMIT:-300}" mpiexec -n "$np" "$MTRAIN" "$@"
}
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 recipe=$2 np=$3; shift 3
    sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    # plain: CPU ranks over MPI on host memory; staged and nccl: as GPU ranks, through the stand-in runtime
    OMP_NUM_THREADS=1 timeout 300 mpiexec -n $np "$MTRAIN" pretrain $recipe "${sets[@]}" --set log.dir=${name}_plain \
        >${name}_plain.out 2>&1 || echo "exit $?" >>${name}_plain.out
    for comm in mpi nccl; do
        # the NCCL runs trace step 3 (parallel/timeline.h; checked below): the same losses all the same
        tl=; [ $comm = nccl ] && tl=3
        MTRAIN_TIMELINE=$tl MOCK_CUDA_REPORT=${name}_$comm.mallocs as_gpu_ranks $np pretrain $recipe "${sets[@]}" \
            --set parallel.comm=$comm --set log.dir=${name}_$comm >${name}_$comm.out 2>&1 || echo "exit $?" >>${name}_$comm.out
    done
    a=$(losses ${name}_plain/metrics.jsonl) b=$(losses ${name}_mpi/metrics.jsonl) c=$(losses ${name}_nccl/metrics.jsonl)
    # the hook really ran: every rank allocated through the stand-in's cudaMalloc
    for comm in mpi nccl; do
        [ "$(awk '$2 > 0' ${name}_$comm.mallocs 2>/dev/null | wc -l)" = "$np" ] || b="$b (no cudaMalloc: hook off?)"
    done
    [ "$(echo "$a" | grep -c .)" = 6 ] && [ "$a" = "$b" ] && pass nccl_mock_pretrain_${name}_staged_mpi_same_losses ||
        fail nccl_mock_pretrain_${name}_staged_mpi_same_losses "plain: $(echo $a | head -c 80) / staged: $(echo $b | head -c 80): $(tail -2 ${name}_mpi.out)"
    grep -q "; nccl)" ${name}_nccl.out && [ -n "$a" ] && [ "$a" = "$c" ] && pass nccl_mock_pretrain_${name}_nccl_same_losses ||
        fail nccl_mock_pretrain_${name}_nccl_same_losses "plain: $(echo $a | head -c 80) / nccl: $(echo $c | head -c 80): $(tail -2 ${name}_nccl.out)"
done

# the timelines of step 3 over NCCL (comm_nccl.c's spans, on the host's clock here, where the stand-in runs
# each call at once): ZeRO-1's buckets begin during backward, its gathers are recorded in the update as
# started calls, and tp, pp and ep get lanes of their own
check_tl() { # NAME NP FLAGS...
    local name=$1 np=$2 r out=""
    shift 2
    for ((r = 0; r < np; r++)); do
        out+=$("$PY" "$CHECK_TL" "$(printf '%s_nccl/timeline-rank-%05d.json' $name $r)" "$@" 2>&1) ||
            out+=" (rank $r)"
    done
    [ -z "$out" ] && pass nccl_mock_timeline_$name || fail nccl_mock_timeline_$name "$out"
}
check_tl dp4_zero 4 --lanes compute,dp --overlap --gather --finished
check_tl bf16_tp2_pp2 4 --lanes compute,tp,pp --finished
check_tl moe_ep2_dp2 2 --lanes compute,ep --finished
# checkpoints, evaluation and a rewind over NCCL (ZeRO-1 on 2 ranks: the moments gather and scatter through NCCL):
# a run stopped at step 4, resumed, and rewound by a NaN injected at step 5, evaluating every 2 steps, gives the
# losses the same sequence gives on plain CPU ranks over MPI
ck=(train.steps=8 train.eval_interval=2 data.valid_fraction=0.1 optimizer.distributed=true checkpoint.interval=2
    rewind.enabled=true)
ck_pretrain() { # NAME plain|nccl ARGS...: mtrain pretrain r.yaml on 2 ranks, checkpoints in ck_NAME
    local name=$1 how=$2 kv sets=()
    shift 2
    for kv in "${ck[@]}"; do sets+=(--set "$kv"); done
    if [ "$how" = nccl ]; then
        as_gpu_ranks 2 pretrain r.yaml "${sets[@]}" --set parallel.comm=nccl --set checkpoint.dir=ck_$name \
            --set log.dir=$name "$@" >>$name.out 2>&1
    else
        timeout 300 mpiexec -n 2 "$MTRAIN" pretrain r.yaml "${sets[@]}" --set checkpoint.dir=ck_$name \
            --set log.dir=$name "$@" >>$name.out 2>&1
    fi
}
for how in plain nccl; do
    ck_pretrain ck_$how $how --stop-after 4
    ck_pretrain ck_$how $how --inject nan@5
done
a=$(step_metric ck_plain/metrics.jsonl 1 | tr '\n' ' ') b=$(step_metric ck_nccl/metrics.jsonl 1 | tr '\n' ' ')
v=$(grep -c '"val_loss"' ck_nccl/metrics.jsonl 2>/dev/null)
grep -q "; nccl)" ck_nccl.out && grep -q '"event":"rewind"' ck_nccl/metrics.jsonl && [ "$(echo $a | wc -w)" = 16 ] &&
    [ "$a" = "$b" ] && [ "$v" -ge 4 ] && pass nccl_mock_checkpoint_resume_rewind_eval ||
    fail nccl_mock_checkpoint_resume_rewind_eval "plain: $(echo $a | head -c 120) / nccl: $(echo $b | head -c 120); $v evals: $(tail -2 ck_nccl.out)"

# zbv as GPU ranks: over MPI its sends go from host copies of their own without waiting (comm_exchange_start
# staged), the same losses as plain CPU ranks; over NCCL (where a started send waits) it is refused, exit 2
zbv=(--set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=zbv)
timeout 300 mpiexec -n 2 "$MTRAIN" pretrain r.yaml "${zbv[@]}" --set log.dir=zbv_plain >zbv_plain.out 2>&1
MOCK_CUDA_REPORT=zbv_mpi.mallocs as_gpu_ranks 2 pretrain r.yaml "${zbv[@]}" --set parallel.comm=mpi \
    --set log.dir=zbv_mpi >zbv_mpi.out 2>&1
a=$(losses zbv_plain/metrics.jsonl) b=$(losses zbv_mpi/metrics.jsonl)
[ "$(echo "$a" | grep -c .)" = 6 ] && [ "$a" = "$b" ] && [ "$(awk '$2 > 0' zbv_mpi.mallocs 2>/dev/null | wc -l)" = 2 ] &&
    pass nccl_mock_pretrain_zbv_staged_mpi_same_losses ||
    fail nccl_mock_pretrain_zbv_staged_mpi_same_losses "plain: $(echo $a | head -c 80) / staged: $(echo $b | head -c 80): $(tail -2 zbv_mpi.out)"
LIMIT=120 as_gpu_ranks 2 pretrain r.yaml "${zbv[@]}" --set parallel.comm=nccl --set log.dir=zbv_nccl >zbv_nccl.out 2>&1
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'parallel.schedule zbv: its pipeline sends must not wait' zbv_nccl.out)" -ge 1 ] &&
    pass nccl_mock_zbv_over_nccl_refused || fail nccl_mock_zbv_over_nccl_refused "exit $rc: $(tail -2 zbv_nccl.out)"

# dualpipev as GPU ranks over MPI (Mixtral, ep 2): its pairs' all-to-alls over staged device memory complete
# as they begin (comm_all_to_all_v_start), the second exchange scratch comes from the device: the same losses as
# plain CPU ranks, whose all-to-alls overlap; over NCCL it is refused as zbv is
dv=(--set parallel.pp=2 --set parallel.vpp=2 --set parallel.ep=2 --set parallel.schedule=dualpipev --set train.micro_batch=1)
timeout 300 mpiexec -n 4 "$MTRAIN" pretrain moe.yaml "${dv[@]}" --set log.dir=dv_plain >dv_plain.out 2>&1
as_gpu_ranks 4 pretrain moe.yaml "${dv[@]}" --set parallel.comm=mpi --set log.dir=dv_mpi >dv_mpi.out 2>&1
a=$(losses dv_plain/metrics.jsonl) b=$(losses dv_mpi/metrics.jsonl)
[ "$(echo "$a" | grep -c .)" = 6 ] && [ "$a" = "$b" ] && pass nccl_mock_pretrain_dualpipev_moe_staged_mpi_same_losses ||
    fail nccl_mock_pretrain_dualpipev_moe_staged_mpi_same_losses "plain: $(echo $a | head -c 80) / staged: $(echo $b | head -c 80): $(tail -2 dv_mpi.out)"
LIMIT=120 as_gpu_ranks 4 pretrain moe.yaml "${dv[@]}" --set parallel.comm=nccl --set log.dir=dv_nccl >dv_nccl.out 2>&1
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'parallel.schedule dualpipev: its pipeline sends must not wait' dv_nccl.out)" -ge 1 ] &&
    pass nccl_mock_dualpipev_over_nccl_refused || fail nccl_mock_dualpipev_over_nccl_refused "exit $rc: $(tail -2 dv_nccl.out)"

# bad configurations of GPU ranks stop before training with exit 2 and one message from rank 0 (issue 12):
# more ranks on a node than GPUs under parallel.comm nccl (auto falls back to staged MPI with one warning),
# and fp8 on a GPU without FP8 tensor cores (compute capability 8.0)
gpu_run() { # NAME NP VAR=VALUE ARGS...: mtrain pretrain r.yaml as GPU ranks with VAR set for the stand-in runtime
    local name=$1 np=$2 var=$3
    shift 3
    (export "$var" LIMIT=120; as_gpu_ranks $np pretrain r.yaml --set log.dir=$name "$@" >$name.out 2>&1)
}
gpu_run shared_nccl 2 MOCK_CUDA_DEVICES=1 --set parallel.comm=nccl
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'drives the same GPU' shared_nccl.out)" = 1 ] && [ ! -s shared_nccl/metrics.jsonl ] &&
    pass nccl_mock_ranks_sharing_a_gpu_exit_2 || fail nccl_mock_ranks_sharing_a_gpu_exit_2 "exit $rc: $(tail -2 shared_nccl.out)"
gpu_run shared_auto 2 MOCK_CUDA_DEVICES=1 --set parallel.comm=auto
rc=$?
[ $rc = 0 ] && grep -q '; mpi)' shared_auto.out && [ "$(grep -c 'communicate over MPI' shared_auto.out)" = 1 ] &&
    pass nccl_mock_ranks_sharing_a_gpu_auto_falls_back ||
    fail nccl_mock_ranks_sharing_a_gpu_auto_falls_back "exit $rc: $(grep -m2 -E 'warning|ranks' shared_auto.out)"
# mpirun inside a Slurm allocation: every rank inherits one srun task's SLURM_LOCALID (0); taken at its word,
# both ranks would drive GPU 0 and NCCL would be refused. The ranks' order on the node picks the GPUs instead,
# said once
gpu_run slurm_localid 2 SLURM_LOCALID=0 --set parallel.comm=nccl
rc=$?
[ $rc = 0 ] && grep -q '; nccl)' slurm_localid.out && [ "$(grep -c 'SLURM_LOCALID does not number' slurm_localid.out)" = 1 ] &&
    pass nccl_mock_inherited_slurm_localid_gpu_per_rank ||
    fail nccl_mock_inherited_slurm_localid_gpu_per_rank "exit $rc: $(grep -m3 -E 'warning|error|ranks' slurm_localid.out)"
# the bus-bandwidth benchmark's NCCL path (scripts/bench/bench_comm.c): rows from two ranks with a GPU each,
# skipped with the reason where they would share one
if [ -x "$BENCH_COMM" ]; then
    LD_PRELOAD=$MOCK/libcudart_mock.so timeout 120 mpiexec -n 2 "$BENCH_COMM" nccl 1 >bench_nccl.out 2>&1
    MOCK_CUDA_DEVICES=1 LD_PRELOAD=$MOCK/libcudart_mock.so timeout 120 mpiexec -n 2 "$BENCH_COMM" nccl 1 \
        >bench_shared.out 2>&1
    grep -q '"comm":"nccl","ranks":2,"collective":"all_reduce"' bench_nccl.out &&
        grep -q '"skipped":"nccl: needs a GPU per rank"' bench_shared.out && pass nccl_mock_bench_comm ||
        fail nccl_mock_bench_comm "$(head -c 300 bench_nccl.out) / $(head -c 200 bench_shared.out)"
fi
gpu_run fp8_ampere 2 MOCK_CUDA_CC=80 --set train.device=cuda --set train.precision=fp8
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'no FP8 tensor cores' fp8_ampere.out)" = 1 ] && pass nccl_mock_fp8_without_fp8_gpu_exit_2 ||
    fail nccl_mock_fp8_without_fp8_gpu_exit_2 "exit $rc: $(tail -2 fp8_ampere.out)"

# A failed rank ends the whole job at once and names itself (parallel/grid.c, parallel/watchdog.c): rank 1
# of a dp2 run over NCCL fails in its 9th all-reduce (step 2), as an NCCL call that returns an error (die:
# the line naming the rank, MPI_Abort), as NCCL's asynchronous error while the call hangs (the watchdog's
# poll of ncclCommGetAsyncError: one line with the rank, the step, the collective and the group; the
# communicators aborted), and as an exit inside the call (the exit handler names it). Each ends every rank
# within the 30 s train.abort_timeout_s (the hang timeout of 300 s is not what ends them); rerun, the job
# resumes from its checkpoint and ends bitwise where an uninterrupted run does.
as_gpu_ranks 2 pretrain r.yaml --set parallel.comm=nccl --set log.dir=fail_ref --set checkpoint.dir=ck_fail_ref \
    --set checkpoint.interval=1 >fail_ref.out 2>&1 || fail nccl_mock_failure_reference "$(tail -2 fail_ref.out)"
for kind in error async exit; do
    t0=$(date +%s)
    MOCK_NCCL_FAIL=1:9:$kind LIMIT=60 as_gpu_ranks 2 pretrain r.yaml --set parallel.comm=nccl --set log.dir=fail_$kind \
        --set checkpoint.dir=ck_fail_$kind --set checkpoint.interval=1 >fail_$kind.out 2>&1
    rc=$? took=$(( $(date +%s) - t0 ))
    case $kind in
    error) named='rank 1 of 2 \(tp 0, pp 0, dp 1\) failed: ending the whole job \(MPI_Abort\)' ;;
    async) named='rank 1 of 2 \(tp 0, pp 0, dp 1\) failed at step [0-9]+, in all_reduce_sum(_start)? on group dp \(rank 1 of 2\): NCCL reported an asynchronous error on group dp' ;;
    exit) named='rank 1 of 2 \(tp 0, pp 0, dp 1\) is exiting at step [0-9]+, in all_reduce_sum(_start)? on group dp \(rank 1 of 2\) before the run ended' ;;
    esac
    [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 30 ] && grep -qE "$named" fail_$kind.out &&
        pass nccl_mock_failed_rank_${kind}_ends_job_named ||
        fail nccl_mock_failed_rank_${kind}_ends_job_named "exit $rc after ${took}s: $(grep -v '^step\|^checkpoint' fail_$kind.out | tail -4)"
    as_gpu_ranks 2 pretrain r.yaml --set parallel.comm=nccl --set log.dir=fail_$kind --set checkpoint.dir=ck_fail_$kind \
        --set checkpoint.interval=1 >fail_${kind}_resume.out 2>&1 && grep -q "resumed from ck_fail_$kind/step-" fail_${kind}_resume.out &&
        "$PY" "$COMPARE" ck_fail_ref/step-000000006 ck_fail_$kind/step-000000006 0 >fail_$kind.cmp 2>&1 &&
        pass nccl_mock_failed_rank_${kind}_resumes_bitwise ||
        fail nccl_mock_failed_rank_${kind}_resumes_bitwise "$(grep -E 'resumed|error' fail_${kind}_resume.out | head -2) $(cat fail_$kind.cmp 2>/dev/null)"
done
exit $FAILED
