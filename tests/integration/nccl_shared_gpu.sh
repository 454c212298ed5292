# Several ranks over real NCCL on one GPU (scripts/mpirun.sh --shared-gpu:
# each rank presents itself as its own host through NCCL_HOSTID, NCCL talks
# over loopback sockets), from one command: test_comm on 2 and 4 ranks;
# mtrain pretrain over NCCL in tp2 + SP, pp2 (1F1B, interleaved and zb-h1), dp2 +
# ZeRO-1 with overlapped gradient reduction and parameter gathers, Mixtral
# ep2 and tp2 x ep2, DeepSeek-V3 tp2 x ep2 with MTP, and tp2 x pp2 on 4
# ranks, context parallelism (cp 2, and DeepSeek-V3 cp 2 with MTP) and
# Mixtral's experts split over tp 2 (etp 2), in fp32 and (a subset) bf16, each run's losses against the same
# layout over MPI (fp32 within 1e-6, bf16 within 1e-3 per step) and, fp32,
# against one rank (1e-5, as the layout tests); on a GPU, cp 2 on the flash
# kernels' block form (head dim 64) in bf16 against one rank; a checkpoint written over
# NCCL resumes bitwise; the timeline over NCCL shows the data-parallel
# buckets beginning during backward; kill -9 of one of 4 ranks ends every
# rank within train.abort_timeout_s.
#
# With a GPU and libnccl (scripts/device/gpu_checks.sh, phase nccl1gpu) this
# is the real check. Without one it runs the same script under the CPU
# stand-ins (tests/mock: NCCL over MPI, the CUDA runtime on host memory, one
# "GPU" that every rank sees), which checks the launcher, the same-GPU
# refusal keyed on NCCL's host identity, and this script, not NCCL itself.
source "$(dirname "$0")/../lib.sh"
CHECK_TL="$(cd "$(dirname "$0")" && pwd)/check_timeline.py"
LAUNCH="$TEST_ROOT/scripts/mpirun.sh"
TEST_COMM=$(build_path tests/test_comm)
MOCK=$(build_path mock)
cd "$TMP"
export OMP_NUM_THREADS=1 MTRAIN
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    DEVICE=cuda
    GPU_ENV=()
elif [ -f "$MOCK/libnccl.so.2" ] && [ -f "$MOCK/libcudart_mock.so" ]; then
    DEVICE=cpu # the stand-ins: every rank's buffers in the mock's device memory, one device for all
    export MOCK_NCCL_DIR=$TMP LD_LIBRARY_PATH=$MOCK${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # sanitized builds: the preloaded mock comes before the sanitizer's runtime
    export ASAN_OPTIONS=verify_asan_link_order=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}
    GPU_ENV=(MTRAIN_TEST_GPU_COMM_ON_CPU=1 MOCK_CUDA_DEVICES=1 LD_PRELOAD=$MOCK/libcudart_mock.so)
else
    skip nccl_shared_gpu "no GPU and no CUDA stand-ins in this build (CUDA=0)"
    exit 0
fi
"$MTRAIN" data generate --out data --docs 200 --frame-tokens 4096 >/dev/null || { fail nccl_shared_setup "data"; exit 1; }
comm_layout_recipes $DEVICE ', mtp_depth: 1'

# shared NP ARGS...: mtrain pretrain ARGS on NP ranks sharing the GPU (over NCCL, or MPI with parallel.comm mpi)
shared() {
    local np=$1
    shift
    env "${GPU_ENV[@]}" timeout "${LIMIT:-300}" bash "$LAUNCH" --shared-gpu "$np" "$@"
}

# test_comm: every comm.h call over NCCL on 2 and 4 ranks sharing the GPU
for np in 2 4; do
    env "${GPU_ENV[@]}" NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 300 \
        mpiexec -n $np bash -c 'export NCCL_HOSTID=rank-$PMI_RANK; exec "$@"' test-comm "$TEST_COMM" >comm$np.out 2>&1
    rc=$?
    [ $rc = 0 ] && ! grep -q '^FAIL' comm$np.out && grep -q '^PASS comm_nccl' comm$np.out && pass nccl_shared_test_comm_np$np ||
        fail nccl_shared_test_comm_np$np "exit $rc: $(grep -E '^(FAIL|SKIP)' comm$np.out | head -3)"
done

layouts=(
    "tp2_sp r.yaml 2 parallel.tp=2 parallel.sequence_parallel=true"
    "pp2 r.yaml 2 parallel.pp=2"
    "pp2_vpp2 r.yaml 2 parallel.pp=2 parallel.vpp=2" "pp2_zb_h1 r.yaml 2 parallel.pp=2 parallel.schedule=zb-h1"
    "dp2_zero r.yaml 2 optimizer.distributed=true parallel.grad_bucket_mb=0.02 parallel.overlap_param_gather=true"
    "moe_ep2 moe.yaml 2 parallel.ep=2"
    "moe_tp2_ep2 moe.yaml 4 parallel.tp=2 parallel.ep=2"
    "deepseek_tp2_ep2_mtp ds.yaml 4 parallel.tp=2 parallel.ep=2"
    "tp2_pp2 r.yaml 4 parallel.tp=2 parallel.pp=2"
    # context parallelism (on a GPU: the CUDA block kernels, the ring's hops over NCCL) and expert
    # tensor parallelism (the etp gather and per-member reduce over NCCL)
    "cp2 r.yaml 2 parallel.cp=2" "deepseek_cp2_mtp ds.yaml 2 parallel.cp=2" "moe_tp2_etp2 moe.yaml 2 parallel.tp=2 parallel.etp=2"
)
for precision in fp32 bf16; do
    for spec in "${layouts[@]}"; do
        set -- $spec
        name=${1}_$precision recipe=$2 np=$3
        shift 3
        # bf16: the layouts that reduce, gather and exchange differently
        [ $precision = bf16 ] && case $name in tp2_sp* | dp2_zero* | moe_tp2_ep2* | tp2_pp2* | cp2* | moe_tp2_etp2*) ;; *) continue ;; esac
        sets=(--set train.precision=$precision)
        for kv in "$@"; do sets+=(--set "$kv"); done
        tl=
        [ "$name" = dp2_zero_fp32 ] && tl=3
        MTRAIN_TIMELINE=$tl shared $np $recipe "${sets[@]}" --set parallel.comm=nccl --set log.dir=${name}_nccl \
            >${name}_nccl.out 2>&1 || echo "exit $?" >>${name}_nccl.out
        shared $np $recipe "${sets[@]}" --set parallel.comm=mpi --set log.dir=${name}_mpi >${name}_mpi.out 2>&1 ||
            echo "exit $?" >>${name}_mpi.out
        tol=1e-6
        [ $precision = bf16 ] && tol=1e-3
        grep -q "; nccl)" ${name}_nccl.out && close_metrics ${name}_mpi/metrics.jsonl ${name}_nccl/metrics.jsonl 1 6 loss $tol &&
            pass nccl_shared_${name}_nccl_equals_mpi ||
            fail nccl_shared_${name}_nccl_equals_mpi "$(worst_metric ${name}_mpi/metrics.jsonl ${name}_nccl/metrics.jsonl 1): $(tail -2 ${name}_nccl.out)"
        if [ $precision = fp32 ]; then
            [ -f one_$recipe/metrics.jsonl ] || env "${GPU_ENV[@]}" "$MTRAIN" pretrain $recipe --set log.dir=one_$recipe \
                >one_$recipe.out 2>&1
            close_metrics one_$recipe/metrics.jsonl ${name}_nccl/metrics.jsonl 1 6 loss 1e-5 &&
                pass nccl_shared_${name}_equals_one_rank ||
                fail nccl_shared_${name}_equals_one_rank "$(worst_metric one_$recipe/metrics.jsonl ${name}_nccl/metrics.jsonl 1)"
        fi
    done
done

# context parallelism on the flash kernels' block form (head dim 64; r.yaml's 8 takes the widening kernels): cp 2 in
# bf16 over NCCL against one rank's bf16 run on whole-sequence flash attention (MTRAIN_ATTENTION=flash, not cuDNN's), within 2e-3 per step (GPU only: the
# stand-ins run the CPU backend)
if [ $DEVICE = cuda ]; then
    sed 's/hidden_size: 32, num_layers: 4/hidden_size: 256, num_layers: 2/; s/seq_len: 16, micro_batch: 2/seq_len: 160, micro_batch: 1/' \
        r.yaml >r64.yaml
    MTRAIN_ATTENTION=flash shared 2 r64.yaml --set train.precision=bf16 --set parallel.cp=2 --set parallel.comm=nccl \
        --set log.dir=cp2_flash >cp2_flash.out 2>&1 || echo "exit $?" >>cp2_flash.out
    MTRAIN_ATTENTION=flash "$MTRAIN" pretrain r64.yaml --set train.precision=bf16 --set log.dir=one_flash >one_flash.out 2>&1
    close_metrics one_flash/metrics.jsonl cp2_flash/metrics.jsonl 1 6 loss 2e-3 && pass nccl_shared_cp2_flash_bf16_equals_one_rank ||
        fail nccl_shared_cp2_flash_bf16_equals_one_rank "$(worst_metric one_flash/metrics.jsonl cp2_flash/metrics.jsonl 1): $(tail -2 cp2_flash.out)"
fi

# the data-parallel buckets begin during backward, over NCCL (step 3's timeline)
out=""
for r in 0 1; do
    out+=$("$PY" "$CHECK_TL" "$(printf 'dp2_zero_fp32_nccl/timeline-rank-%05d.json' $r)" --lanes compute,dp --overlap \
        --gather --finished 2>&1) || out+=" (rank $r)"
done
[ -z "$out" ] && pass nccl_shared_timeline_buckets_during_backward || fail nccl_shared_timeline_buckets_during_backward "$out"

# a checkpoint written over NCCL (ZeRO-1: the master and moment shards gathered through NCCL) resumes bitwise
shared 2 r.yaml --set optimizer.distributed=true --set parallel.comm=nccl --set checkpoint.dir=ck_full \
    --set checkpoint.interval=3 --set log.dir=full >full.out 2>&1
shared 2 r.yaml --set optimizer.distributed=true --set parallel.comm=nccl --set checkpoint.dir=ck_stop \
    --set checkpoint.interval=3 --set log.dir=stop --stop-after 3 >stop.out 2>&1
shared 2 r.yaml --set optimizer.distributed=true --set parallel.comm=nccl --set checkpoint.dir=ck_stop \
    --set checkpoint.interval=3 --set log.dir=stop >resume.out 2>&1
grep -q "resumed from ck_stop/step-000000003" resume.out &&
    "$PY" "$COMPARE" ck_full/step-000000006 ck_stop/step-000000006 0 >cmp.out 2>&1 &&
    pass nccl_shared_checkpoint_resumes_bitwise ||
    fail nccl_shared_checkpoint_resumes_bitwise "$(grep -E 'resumed|error' resume.out | head -2) $(cat cmp.out)"

# kill -9 of one of 4 ranks: every rank is gone within train.abort_timeout_s (30 s)
sed 's/steps: 6/steps: 100000/' r.yaml >long.yaml
shared 4 long.yaml --set parallel.tp=2 --set parallel.pp=2 --set parallel.comm=nccl --set log.dir=killed_$$ \
    >killed.out 2>&1 &
job=$!
victim=$(rank_process "log.dir=killed_$$" 2 killed_$$/metrics.jsonl '"step":3,' $job)
if [ -z "$victim" ]; then
    fail nccl_shared_kill9_setup "no rank 2 found running: $(tail -3 killed.out)"
    kill $job 2>/dev/null
    wait $job
else
    t0=$(date +%s)
    kill -9 "$victim"
    wait $job
    rc=$? took=$(( $(date +%s) - t0 ))
    left=$(pgrep -f -- "log.dir=killed_$$" | wc -l)
    [ $rc != 0 ] && [ $took -le 30 ] && [ "$left" = 0 ] && pass nccl_shared_kill9_ends_job ||
        fail nccl_shared_kill9_ends_job "exit $rc after ${took}s, $left processes left: $(tail -3 killed.out)"
    pkill -9 -f -- "log.dir=killed_$$" 2>/dev/null
fi
exit $FAILED
