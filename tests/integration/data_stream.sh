# Data tools stream. `mtrain data build` of one 256 MB document (a plain text
# file is one document) keeps its peak resident memory under 512 MiB (it held
# the text and its tokens whole: ~1.3 GB before; scripts/bench/data_stream.sh
# measures a 1 GB one). `mtrain data import` of a Megatron index whose one
# document is 40 sequences all pointing at the same 40 MB range of the .bin
# (a 530-byte .idx, 800 M tokens) keeps its peak resident memory under
# 512 MiB (it held each document whole: 1.54 GiB before); the imported
# dataset holds the right number of tokens. Peak memory is the child's
# ru_maxrss, measured from Python.
source "$(dirname "$0")/../lib.sh"
require_python data_stream_python numpy
cd "$TMP"
"$PY" - <<'PY' || { fail data_stream_setup "writing the .idx failed"; exit 1; }
import struct
import numpy as np
n = 20 * 1024 * 1024                       # uint16 tokens: 40 MB
np.arange(n, dtype=np.uint16).tofile("adv.bin")
seqs = 40
with open("adv.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
    f.write(struct.pack("<Q", seqs) + struct.pack("<Q", 2))
    f.write(np.full(seqs, n, dtype=np.int32).tobytes())
    f.write(np.zeros(seqs, dtype=np.int64).tobytes())   # every sequence reads the same range
    f.write(np.array([0, seqs], dtype=np.int64).tobytes())
PY
"$PY" - "$MTRAIN" <<'PY' >"$TMP/out" 2>&1
import resource, subprocess, sys
r = subprocess.run([sys.argv[1], "data", "import", "adv", "--out", "ds", "--vocab-size", "65536"], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"rc {r.returncode} peak {peak:.0f} MiB")
print(r.stdout[-300:], r.stderr[-300:])
PY
rc=$(sed -n 's/^rc \([0-9-]*\) .*/\1/p' "$TMP/out"); peak=$(sed -n 's/.* peak \([0-9]*\) MiB/\1/p' "$TMP/out")
[ "$rc" = 0 ] && pass data_import_adversarial_idx_runs || fail data_import_adversarial_idx_runs "$(cat "$TMP/out")"
[ -n "$peak" ] && [ "$peak" -lt 512 ] && pass data_import_adversarial_idx_memory ||
    fail data_import_adversarial_idx_memory "peak ${peak:-?} MiB (limit 512)"
echo "  data import of 800 M tokens in one document: peak $peak MiB" >&2
"$MTRAIN" data inspect ds >"$TMP/out" 2>&1
expect_output data_import_adversarial_idx_tokens '838,?860,?800 tokens|838860800'

# one long document through `data build`
"$PY" -c "
line = b'the quick brown fox jumps over the lazy dog; 0123456789 ' * 16 + b'\\n'
with open('one.txt', 'wb') as f:
    for _ in range(256 * 1024 * 1024 // len(line)): f.write(line)
"
"$PY" - "$MTRAIN" <<'PY' >"$TMP/out" 2>&1
import resource, subprocess, sys
r = subprocess.run([sys.argv[1], "data", "build", "--tokenizer", "bytes", "--workers", "2", "--quiet", "--out", "one",
                    "one.txt"], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"rc {r.returncode} peak {peak:.0f} MiB")
print(r.stdout[-300:], r.stderr[-300:])
PY
rc=$(sed -n 's/^rc \([0-9-]*\) .*/\1/p' "$TMP/out"); peak=$(sed -n 's/.* peak \([0-9]*\) MiB/\1/p' "$TMP/out")
[ "$rc" = 0 ] && pass data_build_one_long_document_runs || fail data_build_one_long_document_runs "$(cat "$TMP/out")"
[ -n "$peak" ] && [ "$peak" -lt 512 ] && pass data_build_one_long_document_memory ||
    fail data_build_one_long_document_memory "peak ${peak:-?} MiB (limit 512)"
echo "  data build of one 256 MB document: peak $peak MiB" >&2
"$MTRAIN" data inspect one >"$TMP/out" 2>&1
expect_output data_build_one_long_document_is_one 'documents: +1\b|1 documents|docs: +1\b'
exit $FAILED
