# Byte-level BPE against Hugging Face `tokenizers` (see tokenizer_ref.py).
source "$(dirname "$0")/../lib.sh"
PY=${PYTHON:-/usr/bin/python3}
TOOL=$(cd "$(dirname "$0")/../.." && pwd)/${BUILD:-build/rel}/tools/bpe_tool
if ! "$PY" -c "import tokenizers" 2>"$TMP/err"; then
    fail tokenizer_ref_python_deps "$PY cannot import tokenizers (pip install tokenizers; see scripts/install-deps.sh): $(tail -1 "$TMP/err")"
    exit 1
fi
"$PY" "$(dirname "$0")/tokenizer_ref.py" "$TOOL" "$MTRAIN" "$TMP/work"
