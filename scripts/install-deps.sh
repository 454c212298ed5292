#!/usr/bin/env bash
# Installs what mtrain needs on Debian/Ubuntu, only what is missing:
#   build: gcc, make, MPICH, libyaml, zstd, OpenBLAS (OpenMP build), jansson, PCRE2, xxHash
#   tests: PyTorch (Debian python3-torch), matplotlib (scripts/plot_metrics.py) and,
#          through pip for that Python, transformers, safetensors, tokenizers and
#          tensorboard (references and readers only; never at run time)
# Usage: scripts/install-deps.sh [--build-only]
set -euo pipefail
build_pkgs=(gcc g++ make libc6-dev libmpich-dev mpich libyaml-dev libzstd-dev zstd libopenblas-openmp-dev
            libjansson-dev libpcre2-dev libxxhash-dev)
test_pkgs=(python3 python3-torch python3-numpy python3-pip python3-matplotlib)
pip_pkgs=("transformers==4.44.2" "safetensors" "tokenizers" "tensorboard==2.21.0")
PY=/usr/bin/python3

want=("${build_pkgs[@]}")
[ "${1:-}" = "--build-only" ] || want+=("${test_pkgs[@]}")
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" ||
        { $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; }
fi
[ "${1:-}" = "--build-only" ] && exit 0
if ! "$PY" -c "import torch, transformers, safetensors, tokenizers, tensorboard" 2>/dev/null; then
    echo "install-deps: installing ${pip_pkgs[*]} for $PY"
    $sudo "$PY" -m pip install -q --break-system-packages "${pip_pkgs[@]}" ||
        $sudo "$PY" -m pip install -q "${pip_pkgs[@]}"
    "$PY" -c "import torch, transformers, safetensors, tokenizers, tensorboard"
fi
