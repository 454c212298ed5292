# mtrain env: the build, BLAS, MPI and NCCL lines, then one line per rank in
# rank order with its GPU binding: none on this machine; through the CUDA
# runtime stand-in (tests/mock/cudart_mock.c: MOCK_CUDA_DEVICES GPUs of
# compute capability MOCK_CUDA_CC) one GPU per rank (local rank modulo the
# GPUs), FP8 by compute capability, and a note when two ranks share a GPU.
source "$(dirname "$0")/../lib.sh"
MOCK=$(build_path mock)
"$MTRAIN" env >"$TMP/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q '^mtrain [0-9]' "$TMP/out" && grep -q '^build: ' "$TMP/out" && grep -q '^cpu: .*OpenBLAS' "$TMP/out" &&
    grep -q '^mpi: .*; 1 rank$' "$TMP/out" && grep -q '^nccl: ' "$TMP/out" &&
    grep -q '^rank 0 on .*, local rank 0 of 1: ' "$TMP/out" && pass env_lines || fail env_lines "exit $rc: $(cat "$TMP/out")"
expect_exit env_bad_argument 2 "$MTRAIN" env extra
OMP_NUM_THREADS=1 timeout 60 mpiexec -n 2 "$MTRAIN" env >"$TMP/out" 2>&1
[ "$(grep -c '^rank ' "$TMP/out")" = 2 ] && [ "$(grep '^rank ' "$TMP/out" | cut -d' ' -f2 | tr '\n' ' ')" = "0 1 " ] &&
    grep -q '; 2 ranks$' "$TMP/out" && pass env_two_ranks_in_order || fail env_two_ranks_in_order "$(cat "$TMP/out")"
if [ ! -f "$MOCK/libcudart_mock.so" ]; then
    skip env_gpu_binding "this build has no CUDA backend (CUDA=0)"
    exit $FAILED
fi
# sanitized builds: the preloaded stand-in comes before the sanitizer's runtime
export ASAN_OPTIONS=verify_asan_link_order=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}
# two GPUs, two ranks: GPU 0 and GPU 1, Hopper: FP8
LD_PRELOAD=$MOCK/libcudart_mock.so MOCK_CUDA_DEVICES=2 OMP_NUM_THREADS=1 timeout 60 mpiexec -n 2 "$MTRAIN" env \
    >"$TMP/out" 2>&1
grep -q '^rank 0 .*: GPU 0 of 2: .*compute capability 9.0.*PCI 0000:10:00.0; FP8 tensor cores: yes$' "$TMP/out" &&
    grep -q '^rank 1 .*: GPU 1 of 2: .*PCI 0000:11:00.0; FP8 tensor cores: yes$' "$TMP/out" && ! grep -q '^note:' "$TMP/out" &&
    pass env_one_gpu_per_rank || fail env_one_gpu_per_rank "$(cat "$TMP/out")"
# one Ampere GPU, two ranks: both on GPU 0, no FP8, and the note
LD_PRELOAD=$MOCK/libcudart_mock.so MOCK_CUDA_DEVICES=1 MOCK_CUDA_CC=80 OMP_NUM_THREADS=1 timeout 60 mpiexec -n 2 \
    "$MTRAIN" env >"$TMP/out" 2>&1
[ "$(grep -c 'GPU 0 of 1: .*compute capability 8.0.*FP8 tensor cores: no$' "$TMP/out")" = 2 ] &&
    [ "$(grep -c '^note: .*1 other rank on a node drives the same GPU' "$TMP/out")" = 1 ] &&
    pass env_shared_gpu_note || fail env_shared_gpu_note "$(cat "$TMP/out")"
exit $FAILED
