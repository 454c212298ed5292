# PyTorch reference for the CPU DeepSeek-V3 MLA + YaRN attention (see deepseek_ref.py).
source "$(dirname "$0")/../lib.sh"
require_python reference_python_deps torch safetensors
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$PY" "$(dirname "$0")/deepseek_ref.py" "$(build_path tools/ref_driver)" "$TMP/ref"
