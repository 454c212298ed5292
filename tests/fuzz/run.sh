#!/usr/bin/env bash
# Runs every fuzz harness in $BUILD/fuzz/ for FUZZ_SECONDS each (default 40)
# on seeds made here from the project's own outputs (nothing binary is kept
# in the repository): recipes/*.yaml, a tiny training run's model.safetensors
# and checkpoint rank file and manifest, its Hugging Face config.json, a byte-level tokenizer.json and tiktoken rank
# file, `mtrain data generate` datasets (their indexes and shards) and
# Megatron .idx/.bin pairs, recipes/systems/*.yaml, and `mtrain data build`
# inputs (JSON lines, plain text, zstd).
# Prints one PASS/FAIL line per harness; inputs that fail are copied to
# $BUILD/fuzz/crashes/ (replay: $BUILD/fuzz/fuzz_NAME --replay FILE).
# FUZZ_SEED fixes the mutation seed (default: the clock; printed on PASS).
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FZ=$ROOT/${BUILD:-build/rel}/fuzz
export FUZZ_SECONDS=${FUZZ_SECONDS:-40}
export OMP_NUM_THREADS=1
S=$TMP/seeds
mkdir -p "$S"

if [ ! -x "$MTRAIN" ]; then fail fuzz_setup "no $MTRAIN binary"; exit 1; fi
for h in recipe safetensors checkpoint hf_config tokenizer_hf tiktoken dataset_index megatron shard system data_build; do
    [ -x "$FZ/fuzz_$h" ] || { fail fuzz_setup "no $FZ/fuzz_$h (make unit-tests BUILD=${BUILD:-build/rel})"; exit 1; }
done

# --- seeds ---------------------------------------------------------------------
cp "$ROOT"/recipes/*.yaml "$S/"
(cd "$S" && "$MTRAIN" data generate --out ds1 --docs 40 --frame-tokens 512 >/dev/null &&
    "$MTRAIN" data generate --out ds2 --docs 3 --seed 2 --frame-tokens 64 --shard-size-mb 1 >/dev/null) ||
    { fail fuzz_setup "mtrain data generate failed"; exit 1; }
cat >"$S/tiny.yaml" <<YAML
model: {vocab_size: 258, hidden_size: 16, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 32}
train: {seq_len: 16, micro_batch: 2, global_batch: 2, steps: 2, seed: 1}
optimizer: {lr: 1e-3, warmup_steps: 0}
data: {path: $S/ds1}
checkpoint: {dir: $S/ck, interval: 2}
log: {dir: $S/run, interval: 1}
YAML
(cd "$S" && timeout 120 "$MTRAIN" pretrain tiny.yaml >"$S/train.log" 2>&1) ||
    { fail fuzz_setup "tiny training run failed: $(tail -2 "$S/train.log")"; exit 1; }
ST_SEEDS=("$S/run/model.safetensors" "$S"/ck/step-*/rank-00000.safetensors)
"$MTRAIN" convert "$S/run" --hf "$S/hf" >/dev/null 2>&1 || { fail fuzz_setup "mtrain convert --hf failed"; exit 1; }
# the checkpoint resharded for tp 2 x pp 2 (four rank files, tensors in parts): a second manifest seed
"$MTRAIN" convert "$S/ck" "$S/ck_tp2" --tp 2 --pp 2 >/dev/null 2>&1 || { fail fuzz_setup "mtrain convert --tp 2 failed"; exit 1; }
# and a tiny Mixtral's, resharded for tp 2 x dp 2 with ep 2 and etp 2 (experts split two ways): a third
sed 's/^model: {/model: {arch: mixtral, num_experts: 4, experts_per_token: 2, /; s#/ck,#/ckm,#; s#/run,#/runm,#' \
    "$S/tiny.yaml" >"$S/moe.yaml"
(cd "$S" && timeout 120 "$MTRAIN" pretrain moe.yaml >"$S/train.log" 2>&1 &&
    "$MTRAIN" convert ckm ckm_ep2 --tp 2 --pp 1 --dp 2 --ep 2 --etp 2 >>"$S/train.log" 2>&1) ||
    { fail fuzz_setup "tiny Mixtral run or its convert failed: $(tail -2 "$S/train.log")"; exit 1; }

python3 - "$S" <<'PY' || { fail fuzz_setup "python3 seed writer failed"; exit 1; }
import base64, json, struct, sys
d = sys.argv[1]
# GPT-2 byte alphabet: printable Latin-1 bytes are themselves, the rest U+0100 + n
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
enc = {b: chr(c) for b, c in zip(bs, cs)}
tok = lambda s: "".join(enc[b] for b in s.encode())
vocab = {enc[b]: b for b in range(256)}
merges = []
for pair in ["t h", "th e", "Ġ t", "Ġ th", "Ġth e", "a t", "c at", "i n", "o n", "Ġ c", "Ġc at", "1 2", "e r"]:
    l, r = pair.split(" ")
    merges.append(pair); vocab.setdefault(l + r, len(vocab))
added = [{"id": len(vocab), "content": "<|endoftext|>", "special": True},
         {"id": len(vocab) + 1, "content": "[PAD]", "special": True}]
ws = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
for i, pt in enumerate([ws, {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        dict(ws, use_regex=False)]}]):
    json.dump({"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": pt,
               "model": {"type": "BPE", "vocab": vocab, "merges": merges if i == 0 else [m.split(" ") for m in merges]}},
              open(f"{d}/tokenizer{i}.json", "w"), ensure_ascii=False)
ranks = [bytes([b]) for b in range(256)] + [b"th", b"the", b" t", b" the", b"at", b"cat", b" cat", b"in", b"on", b"12"]
with open(f"{d}/ranks.tiktoken", "w") as f:
    for i, t in enumerate(ranks):
        f.write(base64.b64encode(t).decode() + " " + str(i) + "\n")
# Megatron: uint16 and int32 token files
for name, code, fmt in [("mm16", 8, "H"), ("mm32", 4, "i")]:
    seqs = [[(i * 7 + j) % 300 for j in range(1 + (i * 13) % 40)] for i in range(12)]
    docs = [0, 3, 5, 9, 12]
    item = struct.calcsize(fmt)
    with open(f"{d}/{name}.bin", "wb") as f:
        for s in seqs: f.write(struct.pack("<%d%s" % (len(s), fmt), *s))
    ptrs, p = [], 0
    for s in seqs: ptrs.append(p); p += len(s) * item
    with open(f"{d}/{name}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, code) + struct.pack("<QQ", len(seqs), len(docs)))
        f.write(struct.pack("<%di" % len(seqs), *[len(s) for s in seqs]))
        f.write(struct.pack("<%dq" % len(seqs), *ptrs))
        f.write(struct.pack("<%dq" % len(docs), *docs))
PY

# `mtrain data build` inputs: JSON lines, plain text (a document a file, a document a line), zstd-compressed
mkdir -p "$S/build"
printf '{"text": "the cat sat"}\n{"text": "on the \\u00e9 mat\\n", "id": 2}\n\n{"text": "12 cats"}\n' >"$S/build/doc.jsonl"
printf 'The cat sat on the mat.\nIt was 12 o\xc3\xa9clock.\n' >"$S/build/doc.txt"
printf 'one line\n\nanother line\n  \nthird\n' >"$S/build/lines.txt"
zstd -q -c "$S/build/doc.jsonl" >"$S/build/doc.jsonl.zst" && zstd -q -c "$S/build/doc.txt" >"$S/build/doc.zst" ||
    { fail fuzz_setup "zstd failed"; exit 1; }

# --- run -------------------------------------------------------------------------
run_fuzz() {
    local h=$1; shift
    local w=$TMP/work-$h
    mkdir -p "$w"
    local seed_args=()
    [ -n "${FUZZ_SEED:-}" ] && seed_args=(--seed "$FUZZ_SEED")
    "$FZ/fuzz_$h" --seconds "$FUZZ_SECONDS" "${seed_args[@]}" --workdir "$w" "$@" >"$TMP/fz.out" 2>&1
    local rc=$?
    grep -E '^(PASS|FAIL) ' "$TMP/fz.out"
    if [ $rc != 0 ] && ! grep -q '^FAIL ' "$TMP/fz.out"; then fail "fuzz_$h" "exit $rc: $(tail -3 "$TMP/fz.out")"; fi
    if ls "$w"/crash-* >/dev/null 2>&1; then
        mkdir -p "$FZ/crashes"
        for c in "$w"/crash-*; do cp "$c" "$FZ/crashes/$h-$(basename "$c")"; done
        echo "(failing inputs copied to $FZ/crashes/$h-crash-*)"
    fi
}
run_fuzz recipe "$S"/*.yaml
run_fuzz safetensors "${ST_SEEDS[@]}"
run_fuzz checkpoint "$S"/ck/step-*/manifest.json "$S"/ck_tp2/step-*/manifest.json "$S"/ckm_ep2/step-*/manifest.json
run_fuzz hf_config "$S"/hf/config.json
run_fuzz tokenizer_hf "$S"/tokenizer0.json "$S"/tokenizer1.json
run_fuzz tiktoken "$S"/ranks.tiktoken
run_fuzz dataset_index "$S"/ds1/index.mtd "$S"/ds2/index.mtd
run_fuzz megatron "$S"/mm16.idx "$S"/mm32.idx
run_fuzz shard "$S"/ds1/shard-00000.zst "$S"/ds2/shard-00000.zst
run_fuzz system "$ROOT"/recipes/systems/*.yaml
run_fuzz data_build "$S"/build/*
