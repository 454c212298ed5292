#!/usr/bin/env bash
# Launch `mtrain pretrain` on NP ranks of this machine (or of the hosts named
# in MPI_ARGS) with MPICH's mpiexec or Open MPI's mpirun.
#
#   scripts/mpirun.sh [--shared-gpu] NP RECIPE [mtrain pretrain args...]
#   scripts/mpirun.sh 8 recipes/tiny-llama3.yaml --set parallel.tp=2 --set parallel.pp=2 --set train.micro_batch=4
#
# --shared-gpu: a test technique, not a way to go fast. NP ranks share one
# GPU over real NCCL: each rank presents itself as its own host (NCCL_HOSTID
# rank-R), and NCCL talks over sockets on loopback (NCCL_NET=Socket,
# NCCL_SOCKET_IFNAME=lo, NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1; a value
# already set is kept). Every call then takes milliseconds, but the results
# are NCCL's, so every layout can run over NCCL on a machine with one GPU
# (scripts/device/nccl_shared_gpu.sh).
#
# Environment:
#   OMP_NUM_THREADS  threads per rank; when unset: cores / ranks on this node
#                    (at least 1), cores from nproc (it honours cpusets)
#   RANKS_PER_NODE   ranks per node for that division (default NP: one node)
#   MPIEXEC          launcher (default: mpiexec, else mpirun, from PATH)
#   MPI_ARGS         extra launcher arguments, e.g. "-hosts h1,h2 -ppn 8" (MPICH)
#                    or "--host h1:8,h2:8" (Open MPI)
#   MTRAIN           the binary (default: ./mtrain of this checkout, else PATH)
#
# The launcher replaces this shell (exec), so SIGTERM / SIGUSR1 sent to it
# reach every rank through the launcher: mtrain saves a checkpoint at the next
# step boundary and exits 0, and a rerun of the same command resumes from it.
# A rank that dies makes the launcher end the others (MPI_Abort or the
# launcher's own cleanup); the exit code is non-zero.
set -euo pipefail

usage() {
    sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "$0"
}
shared_gpu=0
if [ "${1:-}" = --shared-gpu ]; then
    shared_gpu=1
    shift
fi
if [ $# -lt 2 ] || [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    usage >&2
    [ "${1:-}" = -h ] || [ "${1:-}" = --help ] && exit 0
    exit 2
fi
NP=$1 RECIPE=$2
shift 2
case $NP in '' | *[!0-9]* | 0) echo "mpirun.sh: NP must be a positive integer, got '$NP'" >&2; exit 2 ;; esac

here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${MTRAIN:-}" ]; then
    if [ -x "$here/mtrain" ]; then MTRAIN=$here/mtrain; else MTRAIN=$(command -v mtrain || true); fi
fi
[ -n "$MTRAIN" ] && [ -x "$MTRAIN" ] || { echo "mpirun.sh: no mtrain binary (build with make, or set MTRAIN)" >&2; exit 2; }

if [ -z "${MPIEXEC:-}" ]; then
    MPIEXEC=$(command -v mpiexec || command -v mpirun || true)
    [ -n "$MPIEXEC" ] || { echo "mpirun.sh: neither mpiexec nor mpirun is on PATH" >&2; exit 2; }
fi

cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
local_ranks=${RANKS_PER_NODE:-$NP}
if [ -z "${OMP_NUM_THREADS:-}" ]; then
    OMP_NUM_THREADS=$((cores / local_ranks))
    [ "$OMP_NUM_THREADS" -ge 1 ] || OMP_NUM_THREADS=1
fi
export OMP_NUM_THREADS

# MPICH's Hydra passes the whole environment to the ranks and binds nothing by
# default. Open MPI needs: -x to export variables to other hosts, no binding
# (it binds each rank to one core by default, which would stack a rank's
# OpenMP threads on that core), --oversubscribe to start more ranks than
# cores, and --allow-run-as-root in root containers.
launcher=()
read -r -a extra <<<"${MPI_ARGS:-}"
if "$MPIEXEC" --version 2>&1 | grep -qiE 'open mpi|openrte|open-mpi'; then
    launcher=("$MPIEXEC" -n "$NP" --bind-to none -x OMP_NUM_THREADS)
    [ "$NP" -le "$cores" ] || [ -n "${MPI_ARGS:-}" ] || launcher+=(--oversubscribe)
    [ "$(id -u)" != 0 ] || launcher+=(--allow-run-as-root)
else
    launcher=("$MPIEXEC" -n "$NP")
fi
launcher+=("${extra[@]}")

if [ $shared_gpu = 1 ]; then
    export NCCL_NET=${NCCL_NET:-Socket} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
    export NCCL_P2P_DISABLE=${NCCL_P2P_DISABLE:-1} NCCL_SHM_DISABLE=${NCCL_SHM_DISABLE:-1}
    # the rank from the launcher's environment (MPICH, Open MPI, PMIx, Slurm), as each rank's own host id
    # shellcheck disable=SC2016
    rank_host='export NCCL_HOSTID=rank-${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}}; exec "$@"'
    echo "mpirun.sh: shared GPU (NCCL_HOSTID per rank, NCCL over loopback sockets): OMP_NUM_THREADS=$OMP_NUM_THREADS" \
        "${launcher[*]} $MTRAIN pretrain $RECIPE $*" >&2
    exec "${launcher[@]}" bash -c "$rank_host" mtrain-rank "$MTRAIN" pretrain "$RECIPE" "$@"
fi
echo "mpirun.sh: OMP_NUM_THREADS=$OMP_NUM_THREADS ${launcher[*]} $MTRAIN pretrain $RECIPE $*" >&2
exec "${launcher[@]}" "$MTRAIN" pretrain "$RECIPE" "$@"
