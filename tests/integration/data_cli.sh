#!/usr/bin/env bash
# mtrain data build/inspect/verify/generate end to end: the shards are plain
# zstd (zstd -dc gives the exact token bytes), damage is reported in one line
# naming the file and frame, and a failed or killed build leaves no output.
source "$(dirname "$0")/../lib.sh"
D=$TMP/d

# --- usage --------------------------------------------------------------------
for sub in "" build generate inspect verify; do
    expect_exit "data_help_${sub:-top}" 0 "$MTRAIN" data $sub --help
    expect_output "data_help_${sub:-top}_text" "usage: mtrain data"
done
expect_exit data_no_subcommand 2 "$MTRAIN" data
expect_exit data_unknown_subcommand 2 "$MTRAIN" data frobnicate
expect_exit data_build_no_inputs 2 "$MTRAIN" data build --tokenizer bytes --out "$D/x"
expect_output data_build_no_inputs_usage "usage: mtrain data build"
expect_exit data_build_bad_flag 2 "$MTRAIN" data build --bogus --out "$D/x" a.txt
expect_exit data_build_bad_number 2 "$MTRAIN" data build --tokenizer bytes --frame-tokens 0 --out "$D/x" a.txt
expect_exit data_build_bad_tokenizer 2 "$MTRAIN" data build --tokenizer gpt9 --out "$D/x" a.txt
expect_exit data_inspect_no_dir 2 "$MTRAIN" data inspect

# --- inputs -------------------------------------------------------------------
mkdir -p "$D"
printf 'The cat sat on the mat.\nA second line.\n\nafter a blank line\n' >"$D/a.txt"
printf 'caf\xc3\xa9 \x00\xff bytes, no newline' >"$D/b.txt"
: >"$D/empty.txt"
HAVE_PY=0
command -v python3 >/dev/null && HAVE_PY=1
if [ $HAVE_PY = 1 ]; then
    # 1.5 MB of seeded random bytes: incompressible, so shards roll over at 1 MiB
    python3 -c 'import random,sys; r=random.Random(7); sys.stdout.buffer.write(bytes(r.getrandbits(8) for _ in range(1500000)))' >"$D/r.bin"
    INPUTS=("$D/a.txt" "$D/empty.txt" "$D/b.txt" "$D/r.bin")
else
    INPUTS=("$D/a.txt" "$D/empty.txt" "$D/b.txt")
fi

# expected stream: bytes as uint16 LE, EOD 256 after every non-empty file
expected_tokens() {
    python3 - "$@" <<'PY'
import struct, sys
out = bytearray()
for p in sys.argv[1:]:
    data = open(p, 'rb').read()
    if data:
        out += b''.join(struct.pack('<H', b) for b in data) + struct.pack('<H', 256)
sys.stdout.buffer.write(out)
PY
}

# --- build + zstd -dc ---------------------------------------------------------
expect_exit data_build 0 "$MTRAIN" data build --tokenizer bytes --append-eod --frame-tokens 4096 \
    --shard-size-mb 1 --out "$D/ds" "${INPUTS[@]}"
expect_output data_build_summary "built .*: [0-9]+ docs, [0-9]+ tokens, [0-9]+ shards, .*ratio .*MB/s"
if [ $HAVE_PY = 1 ]; then
    expect_output data_build_multi_shard " [2-9] shards"
    expected_tokens "${INPUTS[@]}" >"$TMP/expected.bin"
    for s in "$D"/ds/shard-*.zst; do zstd -q -dc "$s"; done >"$TMP/actual.bin"
    if cmp -s "$TMP/expected.bin" "$TMP/actual.bin"; then pass data_zstd_dc_matches_tokens
    else fail data_zstd_dc_matches_tokens "$(cmp "$TMP/expected.bin" "$TMP/actual.bin" 2>&1 | head -c 200)"; fi
else
    skip data_zstd_dc_matches_tokens "python3 not found"
fi
if zstd -q -t "$D"/ds/shard-*.zst 2>"$TMP/out"; then pass data_zstd_t; else fail data_zstd_t "$(head -c 300 "$TMP/out")"; fi

expect_exit data_inspect 0 "$MTRAIN" data inspect "$D/ds"
expect_output data_inspect_docs "documents: +3$"
expect_output data_inspect_shards "shards: +[0-9]+"
expect_output data_inspect_frames "frames: +[0-9]+"
expect_output data_inspect_ratio "ratio [0-9.]+x"
expect_output data_inspect_first_tokens "first 64 tokens: 84 104 101 32 99 97 116 "
expect_output data_inspect_format_version "format version 2"
expect_output data_inspect_tokenizer_record "tokenizer: +bytes$"
expect_output data_inspect_tokenizer_ids "ids: +vocab 257, bos none eos 256 eod 256"
# a build that finds no document at all is an error naming the input
expect_exit data_build_empty_input 1 "$MTRAIN" data build --tokenizer bytes --out "$D/none" "$D/empty.txt"
expect_output data_build_empty_input_message "$D/empty.txt: no documents"
if [ -e "$D/none" ]; then fail data_build_empty_input_no_output "$D/none was created"; else pass data_build_empty_input_no_output; fi
expect_exit data_verify_good 0 "$MTRAIN" data verify "$D/ds"
expect_output data_verify_good_text "ok, [0-9]+ frames"

expect_exit data_build_split_lines 0 "$MTRAIN" data build --tokenizer bytes --split-lines --append-eod \
    --out "$D/lines" "$D/a.txt" "$D/b.txt"
expect_output data_build_split_lines_docs " 4 docs, "

# --- corruption: each is one line naming the file and frame/offset, exit 1 ----
# a small dataset with many frames, so a damaged one sits among good ones
expect_exit data_build_small_frames 0 "$MTRAIN" data build --tokenizer bytes --append-eod --frame-tokens 16 \
    --out "$D/small" "$D/a.txt" "$D/b.txt"
fresh() { rm -rf "$D/$1"; cp -r "$D/small" "$D/$1"; echo "$D/$1"; }
u64_at() { od -An -tu8 -j "$2" -N8 "$1" | tr -d ' '; }
one_line() {  # NAME: the last output is exactly one line matching PATTERN
    local n; n=$(wc -l <"$TMP/out")
    if [ "$n" = 1 ] && grep -qE -- "$2" "$TMP/out"; then pass "$1"
    else fail "$1" "want one line /$2/, got $n: $(head -c 400 "$TMP/out")"; fi
}

c=$(fresh trunc)
truncate -s -5 "$c/shard-00000.zst"
expect_exit data_truncated_verify 1 "$MTRAIN" data verify "$c"
one_line data_truncated_message "^mtrain: error: $c/shard-00000.zst: truncated: .*frame [0-9]+ at offset [0-9]+"
expect_exit data_truncated_inspect 1 "$MTRAIN" data inspect "$c"

c=$(fresh flip)
off=$(u64_at "$c/index.mtd" $((64 + 32 * 4 + 8)))
csize=$(u64_at "$c/index.mtd" $((64 + 32 * 4 + 16)))
pos=$((off + csize / 2))
byte=$(od -An -tu1 -j $pos -N1 "$c/shard-00000.zst" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 0x5a)))" | dd of="$c/shard-00000.zst" bs=1 seek=$pos conv=notrunc status=none
expect_exit data_flipped_verify 1 "$MTRAIN" data verify "$c"
bad=$(grep -c ': frame [0-9]* at offset' "$TMP/out")
if [ "$bad" = 1 ] && grep -qE "^mtrain: error: $c/shard-00000.zst: frame 4 at offset $off: " "$TMP/out" \
    && grep -q "1 of [0-9]* frames bad" "$TMP/out"; then pass data_flipped_lists_that_frame
else fail data_flipped_lists_that_frame "$(head -c 400 "$TMP/out")"; fi
expect_exit data_flipped_inspect_reads_first_frames 0 "$MTRAIN" data inspect "$c"

c=$(fresh flip0)
printf 'X' | dd of="$c/shard-00000.zst" bs=1 seek=20 conv=notrunc status=none
expect_exit data_flipped_read 1 "$MTRAIN" data inspect "$c"
one_line data_flipped_read_message "^mtrain: error: $c/shard-00000.zst: frame 0 at offset 0: "

c=$(fresh index)
printf 'X' | dd of="$c/index.mtd" bs=1 seek=100 conv=notrunc status=none
expect_exit data_damaged_index 1 "$MTRAIN" data verify "$c"
one_line data_damaged_index_message "^mtrain: error: $c/index.mtd: checksum mismatch"

c=$(fresh shortindex)
truncate -s -3 "$c/index.mtd"
expect_exit data_truncated_index 1 "$MTRAIN" data inspect "$c"
one_line data_truncated_index_message "^mtrain: error: $c/index.mtd: "

expect_exit data_not_a_dataset 1 "$MTRAIN" data inspect "$D"
one_line data_not_a_dataset_message "^mtrain: error: $D/index.mtd: cannot read"

if [ $HAVE_PY = 1 ]; then
    rm -rf "$D/miss"; cp -r "$D/ds" "$D/miss"; rm "$D/miss/shard-00001.zst"
    expect_exit data_missing_shard 1 "$MTRAIN" data verify "$D/miss"
    one_line data_missing_shard_message "^mtrain: error: $D/miss/shard-00001.zst: missing"
fi

# --- failed and interrupted builds leave no OUT -------------------------------
expect_exit data_build_missing_input 1 "$MTRAIN" data build --tokenizer bytes --out "$D/failed" "$D/a.txt" "$D/nope.txt"
expect_output data_build_missing_input_message "nope.txt"
if [ ! -e "$D/failed" ] && ! ls -d "$D"/failed.tmp-* >/dev/null 2>&1; then pass data_failed_build_leaves_nothing
else fail data_failed_build_leaves_nothing "$(ls "$D")"; fi

# The build reads a FIFO that never ends, so it is mid-build when killed.
mkfifo "$D/fifo"
exec 3<>"$D/fifo"
printf 'partial document\n' >&3
"$MTRAIN" data build --tokenizer bytes --out "$D/killed" "$D/a.txt" "$D/fifo" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do [ -d "$D/killed.tmp-$pid" ] && break; sleep 0.05; done
sleep 0.2
kill -9 $pid; wait $pid 2>/dev/null
exec 3>&-
if [ ! -e "$D/killed" ] && [ -d "$D/killed.tmp-$pid" ]; then pass data_killed_build_leaves_no_out
else fail data_killed_build_leaves_no_out "$(ls "$D")"; fi
expect_exit data_rebuild_after_kill 0 "$MTRAIN" data build --tokenizer bytes --out "$D/killed" "$D/a.txt"
if [ ! -e "$D/killed.tmp-$pid" ]; then pass data_stale_tmp_removed; else fail data_stale_tmp_removed "$(ls "$D")"; fi

# --- --force rules -------------------------------------------------------------
expect_exit data_refuse_overwrite 1 "$MTRAIN" data build --tokenizer bytes --out "$D/small" "$D/b.txt"
one_line data_refuse_overwrite_message "exists and is not empty; pass --force"
expect_exit data_refused_kept_old 0 "$MTRAIN" data inspect "$D/small"
expect_output data_refused_kept_old_docs "documents: +2$"
expect_exit data_force_replaces 0 "$MTRAIN" data build --tokenizer bytes --force --out "$D/small" "$D/b.txt"
expect_exit data_forced_is_new 0 "$MTRAIN" data inspect "$D/small"
expect_output data_forced_is_new_docs "documents: +1$"
if ! ls -d "$D"/small.old-* "$D"/small.tmp-* >/dev/null 2>&1; then pass data_force_cleans_up
else fail data_force_cleans_up "$(ls "$D")"; fi
mkdir -p "$D/notds"; echo keep >"$D/notds/file"
expect_exit data_force_refuses_non_dataset 1 "$MTRAIN" data build --tokenizer bytes --force --out "$D/notds" "$D/b.txt"
if [ -f "$D/notds/file" ]; then pass data_force_kept_non_dataset; else fail data_force_kept_non_dataset; fi
mkdir -p "$D/emptydir"
expect_exit data_build_into_empty_dir 0 "$MTRAIN" data build --tokenizer bytes --out "$D/emptydir" "$D/b.txt"

# --- generate --------------------------------------------------------------------
expect_exit data_generate 0 "$MTRAIN" data generate --out "$D/g1" --docs 200 --seed 3
expect_exit data_generate_again 0 "$MTRAIN" data generate --out "$D/g2" --docs 200 --seed 3
expect_exit data_generate_seed4 0 "$MTRAIN" data generate --out "$D/g3" --docs 200 --seed 4
if cmp -s "$D/g1/shard-00000.zst" "$D/g2/shard-00000.zst" && cmp -s "$D/g1/index.mtd" "$D/g2/index.mtd"; then
    pass data_generate_deterministic; else fail data_generate_deterministic "two runs differ"; fi
if ! cmp -s "$D/g1/shard-00000.zst" "$D/g3/shard-00000.zst"; then pass data_generate_seed_matters
else fail data_generate_seed_matters "seed 3 and 4 gave the same corpus"; fi
expect_exit data_generate_verify 0 "$MTRAIN" data verify "$D/g1"
expect_exit data_generate_inspect 0 "$MTRAIN" data inspect "$D/g1"
expect_output data_generate_docs "documents: +200$"
expect_output data_generate_text 'as text: +"[A-Z][a-z]+ '
# a shard or index that is not a regular file (a FIFO would block the open, a directory
# read as 4096 bytes) is named as such by verify and inspect, within a time limit
"$MTRAIN" data generate --out "$D/g" --docs 50 >/dev/null
for kind in fifo dir; do
    for what in shard index; do
        rm -rf "$D/$kind$what" && cp -r "$D/g" "$D/$kind$what"
        f="$D/$kind$what/$([ $what = shard ] && echo shard-00000.zst || echo index.mtd)"
        rm "$f" && { [ $kind = fifo ] && mkfifo "$f" || mkdir "$f"; }
        for sub in verify inspect; do
            timeout 20 "$MTRAIN" data $sub "$D/$kind$what" >"$TMP/out" 2>&1
            rc=$?
            want=$([ $kind = fifo ] && echo "a FIFO" || echo "a directory")
            [ $rc != 0 ] && [ $rc != 124 ] && grep -q "not a regular file ($want)" "$TMP/out" &&
                pass data_${sub}_${kind}_${what}_refused || fail data_${sub}_${kind}_${what}_refused "exit $rc: $(head -c 200 "$TMP/out")"
        done
    done
done
# a tokenizer record that inspect refuses (behind a valid index checksum) fails verify too
rm -rf "$D/badrec" && cp -r "$D/g" "$D/badrec"
"$PY" -c "
import sys
p = sys.argv[1]; d = open(p, 'rb').read(); a = b'\"tokenizer\":\"bytes\"'
assert a in d; open(p, 'wb').write(d.replace(a, b'\"tokenizer\":\"bytez\"', 1))" "$D/badrec/index.mtd" &&
    "$(build_path tools/index_reseal)" "$D/badrec/index.mtd"
expect_exit data_inspect_bad_tokenizer_record 1 "$MTRAIN" data inspect "$D/badrec"
expect_exit data_verify_bad_tokenizer_record 1 "$MTRAIN" data verify "$D/badrec"
expect_output data_verify_bad_tokenizer_record_named "index.mtd: tokenizer record lacks a known tokenizer kind"
exit $FAILED
