# The comm layer's collectives under mpiexec with 4 ranks (see tests/unit/test_comm.c).
source "$(dirname "$0")/../lib.sh"
OMP_NUM_THREADS=1 timeout 120 mpiexec -n 4 "$(build_path tests/test_comm)"
