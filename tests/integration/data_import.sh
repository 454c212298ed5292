#!/usr/bin/env bash
# mtrain data import: Megatron-LM .bin/.idx pairs written here by an
# independent numpy writer that follows Megatron's published layout (uint16,
# int32 and every other dtype code), imported token for token with document
# boundaries; damaged index files give one line naming the file and offset.
source "$(dirname "$0")/../lib.sh"
D=$TMP/d
mkdir -p "$D"
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import numpy" 2>/dev/null; then skip data_import "numpy not available"; exit 0; fi

# writer: PREFIX CODE VOCAB SEED -> PREFIX.bin/.idx and PREFIX.expect (tokens, boundaries as numpy)
cat >"$TMP/mmwriter.py" <<'PY'
import struct, sys
import numpy as np
prefix, code, vocab, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dtypes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
rng = np.random.default_rng(seed)
docs, seqs = [], []
for d in range(rng.integers(50, 120)):
    parts = [rng.integers(0, vocab, size=rng.integers(1, 400)) for _ in range(rng.integers(1, 4))]  # sentences
    docs.append(len(parts))
    seqs += parts
with open(prefix + ".bin", "wb") as f:
    for s in seqs:
        f.write(s.astype(dtypes[code]).tobytes(order="C"))
lens = np.array([len(s) for s in seqs], dtype=np.int32)
item = np.dtype(dtypes[code]).itemsize
ptrs = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * item)]).astype(np.int64)
doc_idx = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", code))
    f.write(struct.pack("<Q", len(seqs)))
    f.write(struct.pack("<Q", len(doc_idx)))
    f.write(lens.tobytes(order="C"))
    f.write(ptrs.tobytes(order="C"))
    f.write(doc_idx.tobytes(order="C"))
tokens = np.concatenate(seqs).astype(np.int64)
ends = np.cumsum([sum(len(seqs[i]) for i in range(doc_idx[d], doc_idx[d + 1])) for d in range(len(docs))])
np.save(prefix + ".tokens.npy", tokens)
np.save(prefix + ".ends.npy", np.concatenate([[0], ends]).astype(np.int64))
PY
# reader of an mtrain dataset (the published index layout + zstd -dc), compared with the writer's truth
cat >"$TMP/check.py" <<'PY'
import glob, subprocess, struct, sys
import numpy as np
prefix, ds = sys.argv[1], sys.argv[2]
idx = open(ds + "/index.mtd", "rb").read()
width, vocab = struct.unpack_from("<II", idx, 12)
frames, docs, ntok = struct.unpack_from("<QQQ", idx, 32)
bounds = np.frombuffer(idx, dtype="<u8", count=docs + 1, offset=64 + 32 * frames).astype(np.int64)
raw = b"".join(subprocess.run(["zstd", "-q", "-dc", s], capture_output=True, check=True).stdout
               for s in sorted(glob.glob(ds + "/shard-*.zst")))
got = np.frombuffer(raw, dtype="<u2" if width == 2 else "<u4").astype(np.int64)
want, ends = np.load(prefix + ".tokens.npy"), np.load(prefix + ".ends.npy")
ok = np.array_equal(got, want) and np.array_equal(bounds, ends) and vocab == want.max() + 1
print("ok" if ok else "mismatch: %d vs %d tokens, %d vs %d docs, vocab %d" % (len(got), len(want), len(bounds), len(ends), vocab))
PY

for spec in "8 uint16 30000" "4 int32 128256" "1 uint8 200" "2 int8 100" "3 int16 20000" "5 int64 70000" "6 float64 5000" "7 float32 5000"; do
    set -- $spec
    "$PY" "$TMP/mmwriter.py" "$D/$2" "$1" "$3" "$1"
    expect_exit "import_$2" 0 "$MTRAIN" data import "$D/$2" --out "$D/ds_$2" --frame-tokens 1000
    r=$("$PY" "$TMP/check.py" "$D/$2" "$D/ds_$2" 2>&1)
    if [ "$r" = ok ]; then pass "import_$2_token_for_token"; else fail "import_$2_token_for_token" "$r"; fi
done
expect_exit import_verify 0 "$MTRAIN" data verify "$D/ds_int32"
expect_exit import_vocab_option 0 "$MTRAIN" data import "$D/uint16" --vocab-size 32000 --eod 0 --out "$D/v"
expect_exit import_vocab_inspect 0 "$MTRAIN" data inspect "$D/v"
expect_output import_records_unknown_tokenizer "tokenizer: +unknown \(megatron:$D/uint16\)"
expect_output import_records_vocab_eod "ids: +vocab 32000, bos none eos 0 eod 0"
expect_output import_vocab_recorded "vocab 32000, eod 0"
expect_exit import_vocab_too_small 1 "$MTRAIN" data import "$D/uint16" --vocab-size 100 --out "$D/small"
expect_output import_vocab_too_small_message "uint16.bin: document 0: token [0-9]+ is outside --vocab-size 100"

# damage: one line naming the file and offset, exit 1
bad() { rm -f "$D/bad.idx" "$D/bad.bin"; cp "$D/uint16.idx" "$D/bad.idx"; cp "$D/uint16.bin" "$D/bad.bin"; }
one_line() {
    local n; n=$(wc -l <"$TMP/out")
    if [ "$n" = 1 ] && grep -qE -- "$2" "$TMP/out"; then pass "$1"; else fail "$1" "want one line /$2/, got $n: $(head -c 300 "$TMP/out")"; fi
}
bad; printf 'X' | dd of="$D/bad.idx" bs=1 seek=0 conv=notrunc status=none
expect_exit import_bad_magic 1 "$MTRAIN" data import "$D/bad" --out "$D/x"
one_line import_bad_magic_message "^mtrain: error: $D/bad.idx: bad magic at offset 0"
bad; printf '\002' | dd of="$D/bad.idx" bs=1 seek=9 conv=notrunc status=none
expect_exit import_bad_version 1 "$MTRAIN" data import "$D/bad" --out "$D/x"
one_line import_bad_version_message "bad.idx: unsupported version 2 at offset 9"
bad; printf '\011' | dd of="$D/bad.idx" bs=1 seek=17 conv=notrunc status=none
expect_exit import_bad_dtype 1 "$MTRAIN" data import "$D/bad" --out "$D/x"
one_line import_bad_dtype_message "bad.idx: unknown dtype code 9 at offset 17"
bad; truncate -s -4 "$D/bad.idx"
expect_exit import_truncated_idx 1 "$MTRAIN" data import "$D/bad" --out "$D/x"
one_line import_truncated_idx_message "bad.idx: size [0-9]+, expected [0-9]+ for"
bad; truncate -s -10 "$D/bad.bin"
expect_exit import_truncated_bin 1 "$MTRAIN" data import "$D/bad" --out "$D/x"
one_line import_truncated_bin_message "bad.idx: sequence [0-9]+ at offset [0-9]+: bytes .* past the end of $D/bad.bin"
expect_exit import_missing 1 "$MTRAIN" data import "$D/nothere" --out "$D/x"
one_line import_missing_message "nothere.idx: No such file"
if ! ls -d "$D"/x "$D"/x.tmp-* >/dev/null 2>&1; then pass import_failures_leave_nothing; else fail import_failures_leave_nothing "$(ls "$D")"; fi
expect_exit import_usage 2 "$MTRAIN" data import --out "$D/x"
exit $FAILED
