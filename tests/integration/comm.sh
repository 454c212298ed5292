# The comm layer's collectives under mpiexec with 4 ranks (see tests/unit/test_comm.c),
# also with MPI calls cut into small pieces (counts past an int), and parallel.comm's checks.
source "$(dirname "$0")/../lib.sh"
OMP_NUM_THREADS=1 timeout 120 mpiexec -n 4 "$(build_path tests/test_comm)" || FAILED=1
# again with MPI calls cut into pieces of 100000 elements (MTRAIN_TEST_MPI_CHUNK; 2^30 otherwise, where MPI's int
# counts end): the million-float checks then go in pieces
MTRAIN_TEST_MPI_CHUNK=100000 OMP_NUM_THREADS=1 timeout 120 mpiexec -n 4 "$(build_path tests/test_comm)" >"$TMP/chunked" 2>&1 ||
    FAILED=1
grep -E '^(PASS|FAIL|SKIP) comm_large' "$TMP/chunked" | sed -E 's/^(PASS|FAIL|SKIP) ([a-z_0-9]+)/\1 \2_mpi_pieces/'
[ "$FAILED" = 0 ] || tail -5 "$TMP/chunked"

# parallel.comm nccl where NCCL cannot run (CPU ranks) stops before training:
# exit 2, one message from rank 0 naming the key (docs/parallelism.md)
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 >/dev/null || { fail comm_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 4, steps: 2, device: cpu}
data: {path: data}
log: {dir: run}
YAML
expect_exit comm_nccl_on_cpu 2 "$MTRAIN" pretrain r.yaml --set parallel.comm=nccl
expect_output comm_nccl_on_cpu_message "r.yaml: parallel.comm nccl: train.device resolved to the CPU"
OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 "$MTRAIN" pretrain r.yaml --set parallel.comm=nccl >"$TMP/out" 2>&1
rc=$?
[ $rc = 2 ] && [ "$(grep -c 'parallel.comm nccl' "$TMP/out")" = 1 ] && [ ! -s run/metrics.jsonl ] &&
    pass comm_nccl_on_cpu_two_ranks_one_message || fail comm_nccl_on_cpu_two_ranks_one_message "exit $rc: $(cat "$TMP/out")"
# auto on CPU ranks is MPI, and says so
OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 "$MTRAIN" pretrain r.yaml --set log.dir=auto >"$TMP/out" 2>&1 &&
    grep -q '"comm":"mpi"' auto/metrics.jsonl && grep -q 'cp 1; mpi)' "$TMP/out" && pass comm_auto_on_cpu_is_mpi ||
    fail comm_auto_on_cpu_is_mpi "$(tail -2 "$TMP/out")"
# a run whose gradient all-reduce goes to MPI in pieces (of 1000 floats) trains as the same run in one piece
# (two ranks: a sum of two is the same in any order)
for chunk in 0 1000; do
    MTRAIN_TEST_MPI_CHUNK=$chunk OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 "$MTRAIN" pretrain r.yaml \
        --set parallel.overlap_grad_reduce=false --set train.steps=4 --set log.dir=pieces$chunk >/dev/null 2>&1
done
a=$(grep -o '"loss":[^,]*' pieces0/metrics.jsonl 2>/dev/null) b=$(grep -o '"loss":[^,]*' pieces1000/metrics.jsonl 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && pass comm_gradient_in_mpi_pieces_same_losses ||
    fail comm_gradient_in_mpi_pieces_same_losses "$(echo $a | head -c 100) / $(echo $b | head -c 100)"
exit $FAILED
