#!/usr/bin/env bash
# On the lent GPU machine, in the repository root with build/device.tar.gz
# carried (scripts/device/pack.sh made it here): unpack it with Python's
# tarfile, put its libraries and MPICH's launcher on the paths, and run a
# phase of scripts/device/gpu_checks.sh (default quick), which adds
# PyTorch's NCCL, cuDNN and NVRTC itself. One call of the device tool:
#
#   bash scripts/device/device_run.sh quick     # OUT is the tool's output folder
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f build/device.tar.gz ] || { echo "device_run: no build/device.tar.gz (run scripts/device/pack.sh and carry it)" >&2; exit 2; }
python3 -c "import tarfile; tarfile.open('build/device.tar.gz').extractall('.')" || exit 2
export LD_LIBRARY_PATH=$PWD/build/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PATH=$PWD/build/devbin:$PATH
exec bash scripts/device/gpu_checks.sh "${1:-quick}"
