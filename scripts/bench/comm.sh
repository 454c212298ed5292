#!/usr/bin/env bash
# Collective bandwidth through mtrain's comm layer (scripts/bench/bench_comm.c):
# 2 ranks over MPI on this machine's host memory, and over NCCL where at least
# two GPUs are visible (one per rank). Prints a table and writes
# build/bench/comm.json. Shared-memory MPI on one machine measures memory
# copies, not a network: it is the floor the CPU path pays per collective.
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
out=build/bench/comm.jsonl
mkdir -p build/bench
: >"$out"
OMP_NUM_THREADS=1 timeout 300 mpiexec -n 2 "$BUILD/bench/bench_comm" mpi 16 >>"$out" || exit 1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
    timeout 300 mpiexec -n "$gpus" "$BUILD/bench/bench_comm" nccl 256 >>"$out"
else
    echo '{"skipped":"nccl: fewer than 2 GPUs visible"}' >>"$out"
fi
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| comm | ranks | collective | bytes | time (us) | algbw (GB/s) | busbw (GB/s) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    if "skipped" in r:
        print("| %s |" % r["skipped"])
        continue
    print("| %s | %d | %s | %d | %.1f | %.2f | %.2f |" % (r["comm"], r["ranks"], r["collective"], r["bytes"], r["us"],
                                                        r["algbw_gbs"], r["busbw_gbs"]))
json.dump(rows, open("build/bench/comm.json", "w"), indent=1)
PY
