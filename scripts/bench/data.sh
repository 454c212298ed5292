#!/usr/bin/env bash
# Data benchmarks: build throughput (MB/s of JSON-lines text with a byte-level
# BPE tokenizer, per worker), compression ratio against raw uint16/uint32, and
# random-sample read throughput against an uncompressed memory-mapped token
# file (the Megatron .bin layout). Prints a table; writes build/bench/data.json.
# The BPE tokenizer is trained at run time by tests/reference/tokenizer_ref.py
# (Hugging Face tokenizers, no download).
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
PY=${PYTHON:-/usr/bin/python3}
W=build/bench/data-work
rm -rf "$W"; mkdir -p "$W"
MB=${DATA_BENCH_MB:-40}
"$PY" tests/reference/tokenizer_ref.py "$BUILD/tools/bpe_tool" ./mtrain "$W/tok" >"$W/ref.log" 2>&1
[ -f "$W/tok/tokenizer.json" ] || { echo "data bench: could not train the tokenizer (pip install tokenizers)"; tail -3 "$W/ref.log"; exit 1; }
# ~MB megabytes of multilingual JSON lines (the held-out sample, repeated)
"$PY" - "$W/tok/held.jsonl" "$W/corpus.jsonl" "$MB" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines(True)
target, n = int(sys.argv[3]) << 20, 0
with open(sys.argv[2], "w") as f:
    while n < target:
        for l in lines:
            f.write(l); n += len(l)
PY
TEXT=$(stat -c %s "$W/corpus.jsonl")
build() {  # WORKERS -> seconds
    local t0 t1; t0=$(date +%s.%N)
    ./mtrain data build --tokenizer hf:"$W/tok/tokenizer.json" --quiet --append-eod --workers "$1" --force \
        --out "$W/ds" "$W/corpus.jsonl" >"$W/build$1.log" || exit 1
    t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l
}
s1=$(build 1); s2=$(build 2)
tokens=$(sed -E 's/.* ([0-9]+) tokens.*/\1/' "$W/build1.log")
comp=$(sed -E 's/.* ([0-9]+) compressed bytes.*/\1/' "$W/build1.log")
# random samples of 2048+1 tokens from datasets with 4096-, 16384- (default)
# and 65536-token frames: page cache warm, and cold at pretraining scale (the
# corpus repeated to ~0.5 GB of uint16 tokens, evicted from the page cache)
for ft in 4096 65536; do
    ./mtrain data build --tokenizer hf:"$W/tok/tokenizer.json" --quiet --append-eod --workers 2 --frame-tokens $ft \
        --force --out "$W/ds$ft" "$W/corpus.jsonl" >"$W/build$ft.log" || exit 1
done
mv "$W/ds" "$W/ds16384"
comp4k=$(sed -E 's/.* ([0-9]+) compressed bytes.*/\1/' "$W/build4096.log")
comp64k=$(sed -E 's/.* ([0-9]+) compressed bytes.*/\1/' "$W/build65536.log")
REPEAT=${DATA_BENCH_REPEAT:-$(( (1600 + MB - 1) / MB ))}
reads="{"
for ft in 4096 16384 65536; do
    warm=$("$BUILD/bench/bench_data" "$W/ds$ft" 2048 $((20000 * 4096 / ft))) || exit 1
    cold=$("$BUILD/bench/bench_data" --cold "$W/cold" "$REPEAT" "$W/ds$ft" 2048 2000) || exit 1
    reads="$reads\"$ft\": {\"warm\": $warm, \"cold\": $cold},"
done
reads="${reads%,}}"
"$PY" - "$TEXT" "$s1" "$s2" "$tokens" "$comp" "$comp4k" "$comp64k" "$reads" <<'PY'
import json, sys
text, s1, s2, tokens, comp, comp4k, comp64k = (int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]),
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
reads = json.loads(sys.argv[8])
out = {
    "text_bytes": text, "tokens": tokens,
    "build_mb_s_1_worker": text / 1e6 / s1, "build_mb_s_2_workers": text / 1e6 / s2,
    "ratio_vs_uint16": 2 * tokens / comp, "ratio_vs_uint32": 4 * tokens / comp,
    "ratio_vs_uint16_4k_frames": 2 * tokens / comp4k, "ratio_vs_uint16_64k_frames": 2 * tokens / comp64k,
    "random_read": reads,
}
json.dump(out, open("build/bench/data.json", "w"), indent=1)
rows = [
    ("corpus", "%.1f MB JSON lines, %d tokens (trained BPE, vocab 3000)" % (text / 1e6, tokens)),
    ("build, 1 worker", "%.1f MB/s  (target >= 20 MB/s per worker)" % out["build_mb_s_1_worker"]),
    ("build, 2 workers", "%.1f MB/s  (2-core machine; includes reading and compressing)" % out["build_mb_s_2_workers"]),
    ("compression vs uint16", "%.2fx (16384-token frames, default), %.2fx (4096), %.2fx (65536)"
     % (out["ratio_vs_uint16"], out["ratio_vs_uint16_4k_frames"], out["ratio_vs_uint16_64k_frames"])),
    ("compression vs uint32", "%.2fx" % out["ratio_vs_uint32"]),
]
for ft in ("4096", "16384", "65536"):
    c, w = reads[ft]["cold"], reads[ft]["warm"]
    best = max(c["mmap_tokens_per_s"], c["mmap_random_tokens_per_s"])
    rows.append(("random read, %s-token frames, cold" % ft,
                 "%.3g tokens/s vs mmap %.3g = %.0f%%  (target >= 50%%; %.0f MB .bin, %.2f%% resident after drop)"
                 % (c["zstd_tokens_per_s"], best, 100 * c["ratio"], c["bin_bytes"] / 1e6, 100 * c["resident_after_drop"])))
    rows.append(("random read, %s-token frames, warm" % ft, "%.3g tokens/s vs mmap %.3g = %.1f%%"
                 % (w["zstd_tokens_per_s"], w["mmap_tokens_per_s"], 100 * w["ratio"])))
print("| metric | value |\n| --- | --- |")
for k, v in rows:
    print("| %s | %s |" % (k, v))
PY
