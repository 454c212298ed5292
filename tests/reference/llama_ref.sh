# PyTorch / Hugging Face reference for the CPU Llama (see llama_ref.py).
source "$(dirname "$0")/../lib.sh"
require_python reference_python_deps torch transformers safetensors
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$PY" "$(dirname "$0")/llama_ref.py" "$(build_path tools/ref_driver)" "$TMP/ref"
