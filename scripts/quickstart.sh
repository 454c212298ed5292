#!/usr/bin/env bash
# The default job: install what is missing, build, make a dataset (synthetic
# English-like text that mtrain generates, byte tokenizer) and train the tiny
# Llama 3 recipe on the CPU. About a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --build-only
make -j"$(nproc)" mtrain
[ -f data/tiny/index.mtd ] || ./mtrain data generate --out data/tiny
# --force: running it again starts a new run; the previous run's metrics move
# to runs/tiny-llama3/metrics.jsonl.N
./mtrain pretrain recipes/tiny-llama3.yaml --force "$@"
