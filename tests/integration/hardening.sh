#!/usr/bin/env bash
# Hardened readers: damaged or hostile input files end in one clear error
# line (exit 1 for data files, 2 for recipes), never a crash, a hang or a
# gigabyte allocation. Leaks and undefined behaviour show up when $MTRAIN is
# the sanitizer build (`make SANITIZE=1 test`); MTRAIN_ASAN adds a second,
# sanitized binary to a release run.
source "$(dirname "$0")/../lib.sh"
if [ ! -x "$MTRAIN" ]; then skip hardening "no $MTRAIN binary (run make)"; exit 0; fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ASAN=${MTRAIN_ASAN:-}
[ -n "$ASAN" ] && [ ! -x "$ASAN" ] && ASAN=
export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export OMP_NUM_THREADS=1
cd "$TMP"
printf 'the cat sat on the mat 12345\n' >in.txt

# -- 1. tokenizer ids: a huge id loops forever or allocates gigabytes --------------
python3 - <<'PY'
import base64, json
with open("big_rank.tiktoken", "w") as f:
    for b in range(256): f.write(base64.b64encode(bytes([b])).decode() + " %d\n" % b)
    f.write(base64.b64encode(b"th").decode() + " 1073741824\n")           # 2^30: the doubling never ends
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256)); cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
tok = {"version": "1.0", "normalizer": None, "model": {"type": "BPE", "vocab": vocab, "merges": []},
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}
json.dump(tok, open("nospecial.json", "w"))                                 # no added_tokens at all
vocab["th"] = 1 << 28                                                       # 2^28: 3.5 GB of id tables
json.dump(tok, open("big_id.json", "w"))
tok["added_tokens"] = [{"id": 1 << 30, "content": "<|x|>", "special": True}]
del vocab["th"]
json.dump(tok, open("big_added.json", "w"))
PY
timeout 20 "$MTRAIN" data build --tokenizer tiktoken:big_rank.tiktoken --quiet --out o1 in.txt >"$TMP/out" 2>&1
rc=$?
if [ $rc = 124 ]; then fail tok_huge_rank_no_hang "still running after 20 s"
elif [ $rc = 1 ] && grep -q "big_rank.tiktoken:257: rank 1073741824 is above" "$TMP/out"; then pass tok_huge_rank_no_hang
else fail tok_huge_rank_no_hang "exit $rc: $(head -c 300 "$TMP/out")"; fi
# bounded memory: the old loader took 3.5 GB for id 2^28 (peak RSS of the child, measured from
# Python: an address-space ulimit would also stop a sanitizer build's shadow memory)
"$PY" - "$MTRAIN" >"$TMP/out" 2>&1 <<'PY'
import resource, subprocess, sys
r = subprocess.run(["timeout", "20", sys.argv[1], "data", "build", "--tokenizer", "hf:big_id.json", "--quiet", "--out",
                    "o2", "in.txt"], capture_output=True, text=True)
print(f"rc {r.returncode} peak {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024} MiB")
print(r.stderr[-400:])
PY
rc=$(sed -n 's/^rc \([0-9-]*\) .*/\1/p' "$TMP/out"); peak=$(sed -n 's/^rc .* peak \([0-9]*\) MiB/\1/p' "$TMP/out")
if [ "$rc" = 1 ] && [ -n "$peak" ] && [ "$peak" -lt 512 ] &&
    grep -q "big_id.json: model.vocab\['th'\]: id 268435456 is above the largest supported token id 16777216" "$TMP/out"
then pass tok_big_id_bounded_memory; else fail tok_big_id_bounded_memory "$(head -c 400 "$TMP/out")"; fi
expect_exit tok_big_added_id 1 timeout 20 "$MTRAIN" data build --tokenizer hf:big_added.json --quiet --out o3 in.txt
expect_output tok_big_added_id_message "big_added.json: added_tokens\[0\]: id 1073741824 is above"

# -- 2. no special tokens: qsort(NULL) aborts the sanitizer build --------------------
head -256 big_rank.tiktoken >ranks.tiktoken
for bin in "$MTRAIN" ${ASAN:+"$ASAN"}; do
    tag=$([ "$bin" = "$MTRAIN" ] && echo rel || echo asan)
    expect_exit "tok_no_specials_hf_$tag" 0 timeout 60 "$bin" data build --tokenizer hf:nospecial.json --quiet --out "ns_$tag" in.txt
    expect_exit "tok_no_specials_tiktoken_$tag" 0 timeout 60 "$bin" data build --tokenizer tiktoken:ranks.tiktoken \
        --tiktoken-specials none --quiet --out "nt_$tag" in.txt
done

# -- 3. recipe sizes: int products overflowed (SIGFPE) --------------------------------
"$MTRAIN" data generate --out ds --docs 20 >/dev/null
cat >r.yaml <<YAML
model: {vocab_size: 257, hidden_size: 16, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 32}
train: {seq_len: 16, micro_batch: 2, global_batch: 2, steps: 2, seed: 1}
optimizer: {lr: 1e-3, warmup_steps: 0}
data: {path: ds}
log: {dir: run, interval: 1}
YAML
# bad_size NAME KEY SETS...: the dry run exits 2 naming KEY (a signal would be 136)
bad_size() {
    local name=$1 key=$2; shift 2
    local sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    timeout 20 "$MTRAIN" pretrain r.yaml "${sets[@]}" --dry-run >"$TMP/out" 2>&1
    local rc=$?
    if [ $rc = 2 ] && grep -q "^mtrain: error: .*key '$key'" "$TMP/out"; then pass "recipe_size_$name"
    else fail "recipe_size_$name" "exit $rc, want 2 naming '$key': $(head -c 300 "$TMP/out")"; fi
}
bad_size pp_vpp_overflow parallel.pp model.num_layers=65536 parallel.pp=65536 parallel.vpp=65536
bad_size pp_vpp_product parallel.vpp model.num_layers=16384 parallel.pp=16384 parallel.vpp=16
bad_size vpp_too_many parallel.vpp model.num_layers=64 parallel.pp=2 parallel.vpp=32
bad_size tp_huge parallel.tp parallel.tp=2147483647
bad_size layers_huge model.num_layers model.num_layers=2147483647
bad_size experts_table model.num_experts model.arch=mixtral model.num_layers=4096 model.num_experts=4096
bad_size tokens_per_micro_batch train.micro_batch train.micro_batch=2147483647 train.global_batch=2147483647 train.seq_len=16
bad_size uneven_overflow parallel.first_stage_layers parallel.pp=2 parallel.first_stage_layers=2147483647 \
    parallel.last_stage_layers=2147483647
bad_size schedule_huge train.global_batch parallel.pp=2 train.micro_batch=1 train.global_batch=2000000000
expect_exit recipe_size_sane_still_ok 0 "$MTRAIN" pretrain r.yaml --set parallel.pp=2 --set parallel.vpp=1 --dry-run

# -- 4./5. init_from weights: header leaks, 1-D shape message, NaN/Inf -----------------
"$MTRAIN" pretrain r.yaml >/dev/null 2>&1 || fail init_setup "tiny training run failed"
# rewrite SRC DST NAME MODE: MODE grow (one more element), nan, inf, negshape
python3 - run/model.safetensors <<'PY'
import json, struct, sys
src = sys.argv[1]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
meta = hdr.pop("__metadata__", None)
def write(dst, name, mode):
    out, blobs, off = {}, [], 0
    if meta is not None: out["__metadata__"] = meta
    for k, v in hdr.items():
        b = data[v["data_offsets"][0]:v["data_offsets"][1]]; shape = list(v["shape"])
        if k == name and mode == "grow": shape[0] += 1; b += b[:4]
        if k == name and mode in ("nan", "inf"): b = b[:8] + struct.pack("<f", float(mode)) + b[12:]
        if k == name and mode == "negshape": shape = [-1]
        out[k] = {"dtype": v["dtype"], "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(out).encode()
    open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
norm = "model.layers.0.input_layernorm.weight"
write("grow1d.safetensors", norm, "grow")
write("nan.safetensors", "model.layers.1.mlp.up_proj.weight", "nan")
write("inf.safetensors", norm, "inf")
write("negshape.safetensors", norm, "negshape")
PY
expect_exit init_from_1d_shape 1 "$MTRAIN" pretrain r.yaml --set model.init_from=grow1d.safetensors --set log.dir=i1
expect_output init_from_1d_shape_message "grow1d.safetensors: tensor model.layers.0.input_layernorm.weight has shape \[17\], the recipe needs \[16\]$"
expect_exit init_from_nan 1 "$MTRAIN" pretrain r.yaml --set model.init_from=nan.safetensors --set log.dir=i2
expect_output init_from_nan_message "nan.safetensors: tensor model.layers.1.mlp.up_proj.weight has a non-finite value \(nan\) at element 2"
expect_exit init_from_inf 1 "$MTRAIN" pretrain r.yaml --set model.init_from=inf.safetensors --set log.dir=i3
expect_output init_from_inf_message "inf.safetensors: tensor model.layers.0.input_layernorm.weight has a non-finite value \(inf\)"
# a header entry failing validation: exit 1 with the reason, and no LeakSanitizer report on the sanitizer build
expect_exit init_from_bad_header "1" timeout 120 "${ASAN:-$MTRAIN}" pretrain r.yaml --set model.init_from=negshape.safetensors --set log.dir=i4
expect_output init_from_bad_header_message "negshape.safetensors: shape must be non-negative integers"
if grep -qE "LeakSanitizer|runtime error" "$TMP/out"; then fail init_from_bad_header_no_leak "$(grep -m1 -A3 Sanitizer "$TMP/out")"
else pass init_from_bad_header_no_leak; fi
expect_exit init_from_good 0 "$MTRAIN" pretrain r.yaml --set model.init_from=run/model.safetensors --set log.dir=i5

# -- 6. mtrain data build: no OUT.tmp-* left by a failed build ---------------------------
head -c 400000 /dev/urandom >rand.bin
# a 64 KiB file size limit makes the shard write fail like a full disk (EFBIG, SIGXFSZ ignored)
(trap '' XFSZ; ulimit -f 64; "$MTRAIN" data build --tokenizer bytes --quiet --out full rand.bin) >"$TMP/out" 2>&1
rc=$?
left=$(ls -d full.tmp-* 2>/dev/null)
if [ $rc = 1 ] && [ -z "$left" ] && [ ! -e full ]; then pass data_build_failed_write_cleans_tmp
else fail data_build_failed_write_cleans_tmp "exit $rc, left: ${left:-nothing}: $(head -c 300 "$TMP/out")"; fi
# leftovers of earlier builds whose process is gone are removed by the next build into OUT
mkdir -p stale.tmp-99999999/sub stale.tmp-999999999
touch stale.tmp-99999999/sub/shard-00000.zst
expect_exit data_build_after_crash 0 "$MTRAIN" data build --tokenizer bytes --quiet --out stale in.txt
left=$(ls -d stale.tmp-* 2>/dev/null)
[ -z "$left" ] && pass data_build_removes_stale_tmp || fail data_build_removes_stale_tmp "left: $left"

# output that cannot be written (a full disk: /dev/full) is an error, not a silent exit 0
if [ -w /dev/full ]; then
    "$MTRAIN" version >/dev/full 2>"$TMP/err"
    rc=$?
    [ $rc = 1 ] && grep -q 'cannot write the output' "$TMP/err" && pass output_to_full_disk_fails ||
        fail output_to_full_disk_fails "exit $rc: $(cat "$TMP/err")"
fi
