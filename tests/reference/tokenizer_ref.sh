# Byte-level BPE against Hugging Face `tokenizers` (see tokenizer_ref.py).
source "$(dirname "$0")/../lib.sh"
require_python tokenizer_ref_python_deps tokenizers
"$PY" "$(dirname "$0")/tokenizer_ref.py" "$(build_path tools/bpe_tool)" "$MTRAIN" "$TMP/work"
