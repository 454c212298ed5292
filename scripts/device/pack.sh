#!/usr/bin/env bash
# Pack a build for a GPU machine that has CUDA, PyTorch and Python but none of
# mtrain's Debian libraries (the project's lent device machine): builds with
# -march=x86-64-v3 into build/rel-dev, then writes build/device.tar.gz holding
#   mtrain, build/rel/{tests,tools,bench}/*   (the paths tests and benchmarks use)
#   build/devlib/*   the shared libraries ldd resolves outside glibc and CUDA
#                    (MPICH, OpenBLAS, libyaml, zstd, jansson, xxhash, pcre2,
#                    their gfortran/gomp/... dependencies)
#   build/devbin/*   MPICH's hydra launcher (mpiexec, hydra_pmi_proxy)
# and prints how to use it there (unpack with Python's tarfile, no tar needed):
#   python3 -c "import tarfile; tarfile.open('build/device.tar.gz').extractall('.')"
#   export LD_LIBRARY_PATH=$PWD/build/devlib PATH=$PWD/build/devbin:$PATH
#   build/rel/tests/test_cuda_ops; bash tests/integration/gpu_pretrain.sh
# CUDA's own libraries (cudart, cuBLAS) are the device's: the build links CUDA
# 13 from /usr/local/cuda, so the device needs the same major version.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEV=build/rel-dev
make -j"$(nproc)" BUILD=$DEV OPT="-O3 -march=x86-64-v3" $DEV/mtrain unit-tests \
    $(ls scripts/bench/*.c | sed "s|scripts/bench/\(.*\)\.c|$DEV/bench/\1|") >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/rel/tests" "$stage/build/rel/tools" "$stage/build/rel/bench" "$stage/build/devlib" \
    "$stage/build/devbin"
cp $DEV/mtrain "$stage/mtrain"
cp $DEV/tests/test_* "$stage/build/rel/tests/"
cp $DEV/tools/* "$stage/build/rel/tools/"
cp $DEV/bench/* "$stage/build/rel/bench/"
cp "$(readlink -f "$(command -v mpiexec)")" "$stage/build/devbin/mpiexec"
cp "$(command -v hydra_pmi_proxy)" "$stage/build/devbin/"
# every library a packed program needs, except glibc's and CUDA's (the device has both)
for f in "$stage/mtrain" "$stage"/build/rel/*/* "$stage"/build/devbin/*; do ldd "$f" 2>/dev/null; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
    grep -vE '^(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^ ]*|libcuda|libcudart|libcublas[^ ]*|libnvrtc)\.so' |
    while read -r soname path; do cp -L "$path" "$stage/build/devlib/$soname"; done
strip --strip-debug "$stage/mtrain" "$stage"/build/rel/*/* 2>/dev/null || true
tar -C "$stage" -czf build/device.tar.gz mtrain build
echo "wrote build/device.tar.gz ($(du -h build/device.tar.gz | cut -f1)); on the device, carrying it:"
echo "  bash scripts/device/device_run.sh quick   # unpacks, sets the paths, runs gpu_checks.sh; or by hand:"
echo "  python3 -c \"import tarfile; tarfile.open('build/device.tar.gz').extractall('.')\""
echo "  export LD_LIBRARY_PATH=\$PWD/build/devlib PATH=\$PWD/build/devbin:\$PATH"
echo "  # NCCL (parallel.comm) and cuDNN (attention) are loaded at run time; PyTorch's wheels have them"
echo "  # (scripts/device/gpu_checks.sh adds them itself):"
echo "  for l in nccl cudnn; do export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:\$(python3 -c \"import nvidia.\$l as m; print(list(m.__path__)[0] + '/lib')\" 2>/dev/null); done"
