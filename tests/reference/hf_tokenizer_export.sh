# The dataset's tokenizer reaches the Hugging Face export: AutoTokenizer and
# generate() on `mtrain convert --hf` output (see hf_tokenizer_export.py).
source "$(dirname "$0")/../lib.sh"
require_python hf_tokenizer_export_python_deps tokenizers,transformers,torch
"$PY" "$(dirname "$0")/hf_tokenizer_export.py" "$MTRAIN" "$TMP/work"
