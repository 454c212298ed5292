#!/usr/bin/env bash
# mtrain data build inputs: JSON lines (--json-key), zstd-compressed inputs,
# gzip refused, --workers gives byte-identical output, errors name file:line.
source "$(dirname "$0")/../lib.sh"
D=$TMP/d
mkdir -p "$D"
ids() { for s in "$1"/shard-*.zst; do zstd -q -dc "$s"; done | od -An -tu2 -v | tr -s ' \n' ' ' | sed 's/^ //;s/ $//'; }

printf '{"text": "ab", "id": 1}\n\n{"id": 2, "text": "c\\u00e9"}\r\n{"text": ""}\n{"text": "d"}' >"$D/a.jsonl"
expect_exit build_jsonl 0 "$MTRAIN" data build --tokenizer bytes --append-eod --quiet --out "$D/j" "$D/a.jsonl"
expect_output build_jsonl_docs " 3 docs, "
got=$(ids "$D/j")
if [ "$got" = "97 98 256 99 195 169 256 100 256" ]; then pass build_jsonl_tokens; else fail build_jsonl_tokens "$got"; fi

printf '{"body": "xy"}\n{"body": "z"}\n' >"$D/b.json"
expect_exit build_json_key 0 "$MTRAIN" data build --tokenizer bytes --json-key body --quiet --out "$D/k" "$D/b.json"
got=$(ids "$D/k")
if [ "$got" = "120 121 122" ]; then pass build_json_key_tokens; else fail build_json_key_tokens "$got"; fi

printf '{"text": "ok"}\n{"text": broken}\n' >"$D/bad.jsonl"
expect_exit build_bad_json 1 "$MTRAIN" data build --tokenizer bytes --quiet --out "$D/bad" "$D/bad.jsonl"
expect_output build_bad_json_names_line "^mtrain: error: $D/bad.jsonl:2:[0-9]+: bad JSON"
if [ ! -e "$D/bad" ] && ! ls -d "$D"/bad.tmp-* >/dev/null 2>&1; then pass build_bad_json_leaves_nothing
else fail build_bad_json_leaves_nothing "$(ls "$D")"; fi
printf '{"text": "ok"}\n{"txt": "no"}\n' >"$D/nokey.jsonl"
expect_exit build_missing_key 1 "$MTRAIN" data build --tokenizer bytes --quiet --out "$D/nk" "$D/nokey.jsonl"
expect_output build_missing_key_message "nokey.jsonl:2: no string field 'text'"

# zstd inputs, plain text and JSON lines, against the uncompressed build
printf 'hello zstd world\n' >"$D/t.txt"
zstd -q -f "$D/t.txt" -o "$D/t.txt.zst"
zstd -q -f "$D/a.jsonl" -o "$D/a.jsonl.zst"
expect_exit build_zst 0 "$MTRAIN" data build --tokenizer bytes --append-eod --quiet --out "$D/z" "$D/t.txt.zst" "$D/a.jsonl.zst"
expect_exit build_plain 0 "$MTRAIN" data build --tokenizer bytes --append-eod --quiet --out "$D/p" "$D/t.txt" "$D/a.jsonl"
if [ "$(ids "$D/z")" = "$(ids "$D/p")" ] && [ -n "$(ids "$D/z")" ]; then pass build_zst_same_tokens
else fail build_zst_same_tokens "$(ids "$D/z" | head -c 100) vs $(ids "$D/p" | head -c 100)"; fi
head -c 10 "$D/t.txt.zst" >"$D/trunc.txt.zst"
expect_exit build_truncated_zst 1 "$MTRAIN" data build --tokenizer bytes --quiet --out "$D/tz" "$D/trunc.txt.zst"
expect_output build_truncated_zst_message "trunc.txt.zst: truncated zstd stream"
gzip -c "$D/t.txt" >"$D/t.txt.gz"
expect_exit build_gz_refused 2 "$MTRAIN" data build --tokenizer bytes --out "$D/g" "$D/t.txt.gz"
expect_output build_gz_message "gzip input is not supported.*decompress"
cp "$D/t.txt.gz" "$D/sneaky.txt"
expect_exit build_gz_magic_refused 1 "$MTRAIN" data build --tokenizer bytes --out "$D/g" "$D/sneaky.txt"

# many documents over many chunks: workers 1 and 3 give identical files
python3 - "$D/big.jsonl" <<'PY'
import json, random, sys
r = random.Random(3)
words = ["alpha", "beta", "gamma", "caf\u00e9", "\u65e5\u672c", "42", "  ", "\n"]
with open(sys.argv[1], "w") as f:
    for i in range(6000):
        f.write(json.dumps({"text": " ".join(r.choice(words) for _ in range(r.randrange(0, 120)))}) + "\n")
PY
expect_exit build_workers_1 0 "$MTRAIN" data build --tokenizer bytes --append-eod --quiet --workers 1 --frame-tokens 5000 --out "$D/w1" "$D/big.jsonl"
expect_exit build_workers_3 0 "$MTRAIN" data build --tokenizer bytes --append-eod --quiet --workers 3 --frame-tokens 5000 --out "$D/w3" "$D/big.jsonl"
if cmp -s "$D/w1/index.mtd" "$D/w3/index.mtd" && cmp -s "$D/w1/shard-00000.zst" "$D/w3/shard-00000.zst"; then
    pass build_workers_deterministic; else fail build_workers_deterministic "outputs differ"; fi
expect_exit build_workers_verify 0 "$MTRAIN" data verify "$D/w3"

expect_exit build_bad_special_mode 2 "$MTRAIN" data build --tokenizer bytes --special-tokens maybe --out "$D/x" "$D/t.txt"
expect_exit build_bad_workers 2 "$MTRAIN" data build --tokenizer bytes --workers 0 --out "$D/x" "$D/t.txt"
expect_exit build_missing_tokenizer_file 1 "$MTRAIN" data build --tokenizer hf:"$D/nope.json" --out "$D/x" "$D/t.txt"
expect_output build_missing_tokenizer_file_message "nope.json"
# inspect: histogram and --tokenizer decoding
expect_exit inspect_histogram 0 "$MTRAIN" data inspect "$D/j" --tokens 4 --tokenizer bytes
expect_output inspect_histogram_rows "^    2-3 +2  #{40}$"
expect_output inspect_decoded 'decoded: +"ab<eod>c"'
expect_exit inspect_bad_tokenizer 2 "$MTRAIN" data inspect "$D/j" --tokenizer gpt9
exit $FAILED
