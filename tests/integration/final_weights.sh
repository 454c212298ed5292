# Every run ends with LOG_DIR/model.safetensors, whatever the layout and with
# checkpoints off or on: a tp 2 x pp 2 run (dense), an ep 2 x dp 2 run (MoE)
# and a dp 2 run with async checkpoints (whose snapshot the final weights
# reuse) leave the same whole tensors as one rank (within 1e-5), with no
# scratch left behind.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 300 >/dev/null || { fail final_setup "data generate failed"; exit 1; }
cat >dense.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 6, seed: 3}
optimizer: {lr: 3e-3, warmup_steps: 2, eps: 1e-4}
data: {path: data}
log: {interval: 100}
YAML
sed 's/model: {/model: {arch: mixtral, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48, /' dense.yaml >moe.yaml
# same NAME A B: the two safetensors files hold the same tensors within 1e-5 (relative to each tensor's max)
same() {
    "$PY" - "$2" "$3" >"$TMP/cmp" 2>&1 <<'PY'
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), f"tensor names differ: {sorted(set(a) ^ set(b))[:4]}"
worst = max(float(abs(a[k] - b[k]).max() / max(abs(b[k]).max(), 1e-30)) for k in a)
print(f"{len(a)} tensors, worst relative difference {worst:.3g}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
    [ $? = 0 ] && pass "$1" || fail "$1" "$(tail -2 "$TMP/cmp")"
}
for spec in "dense tp2_pp2 4 parallel.tp=2 parallel.pp=2" "moe ep2_dp2 4 parallel.ep=2" \
    "dense dp2_async_checkpoints 2 checkpoint.dir=ck checkpoint.interval=3 checkpoint.async=true"; do
    set -- $spec
    model=$1 name=$2 np=$3; shift 3
    sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    "$MTRAIN" pretrain $model.yaml --set log.dir=$model-one --force >/dev/null 2>&1 || fail final_${model}_one "exit $?"
    run_np $np pretrain $model.yaml "${sets[@]}" --set log.dir=$model-$name >"$TMP/out" 2>&1 ||
        { fail final_${model}_${name}_runs "exit $?: $(tail -2 "$TMP/out")"; continue; }
    same final_${model}_${name}_weights $model-$name/model.safetensors $model-one/model.safetensors
    [ ! -e $model-$name/final-weights.tmp ] && pass final_${model}_${name}_no_scratch ||
        fail final_${model}_${name}_no_scratch "$(ls $model-$name)"
    grep -q "weights in $model-$name/model.safetensors" "$TMP/out" && pass final_${model}_${name}_says_where ||
        fail final_${model}_${name}_says_where "$(tail -1 "$TMP/out")"
done
# A run without checkpoints is exported from its final weights: convert LOG_DIR
# --hf gives a directory transformers loads with exactly those tensors, with
# the dataset's tokenizer, and mtrain generates the same tokens from both.
for run in dense-tp2_pp2 moe-ep2_dp2; do
    "$MTRAIN" convert $run --hf hf-$run >"$TMP/out" 2>&1 || { fail final_${run}_convert_hf "exit $?: $(tail -2 "$TMP/out")"; continue; }
    "$PY" - hf-$run $run/model.safetensors >"$TMP/cmp" 2>&1 <<'PY'
import sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
out, final = sys.argv[1], load_file(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
sd = model.state_dict()
assert set(sd) == set(final), f"names differ: {sorted(set(sd) ^ set(final))[:4]}"
assert all(torch.equal(sd[k], final[k]) for k in final), "a tensor differs"
tok = AutoTokenizer.from_pretrained(out)
assert tok("hello")["input_ids"] == list(b"hello"), tok("hello")
print(type(model).__name__, len(sd), "tensors equal; tokenizer ok")
PY
    [ $? = 0 ] && pass final_${run}_convert_hf_loads || fail final_${run}_convert_hf_loads "$(tail -3 "$TMP/cmp")"
    a=$("$MTRAIN" generate $run --prompt-ids 1,2,3 --max-tokens 8 --print-ids 2>/dev/null | tail -1)
    b=$("$MTRAIN" generate hf-$run --prompt-ids 1,2,3 --max-tokens 8 --print-ids 2>/dev/null | tail -1)
    [ -n "$a" ] && [ "$a" = "$b" ] && pass final_${run}_convert_hf_generates ||
        fail final_${run}_convert_hf_generates "'$a' vs '$b'"
done
# A final-weights write that fails (here the file size limit, as a full disk would): the start-up
# warned about it, the run exits non-zero naming the file, and no partial file is left
big=(--set model.hidden_size=512 --set model.intermediate_size=2048 --set model.num_layers=4 --set train.steps=2
     --set optimizer.warmup_steps=1 --set log.dir=limited --set checkpoint.dir= --set checkpoint.interval=0)
(ulimit -f 32768; trap '' XFSZ; "$MTRAIN" pretrain "$TEST_ROOT/recipes/tiny-llama3.yaml" --set data.path=data "${big[@]}" \
    >"$TMP/limited.out" 2>&1)
rc=$?
[ $rc = 1 ] && grep -q 'warning: limited: the final weights need about .* file size limit (ulimit -f)' "$TMP/limited.out" &&
    grep -q 'cannot write limited/model.safetensors.tmp.*the partial file is removed' "$TMP/limited.out" &&
    [ -z "$(ls limited | grep '\.tmp')" ] && [ ! -e limited/model.safetensors ] && pass final_failed_write_cleans_up ||
    fail final_failed_write_cleans_up "exit $rc: $(grep -E 'warning|error' "$TMP/limited.out" | head -2); $(ls limited)"
exit $FAILED
