#!/usr/bin/env bash
# On the lent GPU machine, in the repository root with build/device.tar.gz
# carried (scripts/device/pack.sh made it here): unpack it with Python's
# tarfile, put its libraries and MPICH's launcher on the paths, and run
# phases of scripts/device/gpu_checks.sh (default quick) in turn, each
# within its own budget in seconds where one is given (PHASE:BUDGET; else
# BUDGET, default 480). gpu_checks.sh adds PyTorch's NCCL, cuDNN and NVRTC
# itself. One call of the device tool, OUT its output folder:
#
#   bash scripts/device/device_run.sh quick
#   bash scripts/device/device_run.sh moe:330 nccl1gpu:200   # the first call of a session (timeout_s 580)
#
# Exits with the last failing phase's status (0 if all passed).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f build/device.tar.gz ] || { echo "device_run: no build/device.tar.gz (run scripts/device/pack.sh and carry it)" >&2; exit 2; }
python3 -c "import tarfile; tarfile.open('build/device.tar.gz').extractall('.')" || exit 2
export LD_LIBRARY_PATH=$PWD/build/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PATH=$PWD/build/devbin:$PATH
rc=0
for spec in "${@:-quick}"; do
    phase=${spec%%:*} budget=${BUDGET:-480}
    [ "$spec" != "$phase" ] && budget=${spec#*:}
    echo "== device_run: $phase (budget ${budget}s)"
    BUDGET=$budget bash scripts/device/gpu_checks.sh "$phase" || rc=$?
done
exit $rc
