# PyTorch / Hugging Face reference for the CPU Llama (see llama_ref.py).
source "$(dirname "$0")/../lib.sh"
PY=${PYTHON:-/usr/bin/python3}
DRIVER=$(cd "$(dirname "$0")/../.." && pwd)/${BUILD:-build/rel}/tools/llama_driver
if ! "$PY" -c "import torch, transformers, safetensors" 2>"$TMP/err"; then
    fail reference_python_deps "$PY cannot import torch/transformers/safetensors (run scripts/install-deps.sh): $(tail -1 "$TMP/err")"
    exit 1
fi
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$PY" "$(dirname "$0")/llama_ref.py" "$DRIVER" "$TMP/ref"
