# mtrain generate / eval against Hugging Face transformers (generate_ref.py):
# a tiny Llama and a tiny Mixtral, trained a few dozen steps so their next
# token is not a coin toss, exported with `mtrain convert --hf`.
source "$(dirname "$0")/../lib.sh"
require_python reference_python_deps torch transformers safetensors
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$TMP"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
"$MTRAIN" data generate --out data --docs 300 >/dev/null || { fail generate_ref_setup "data generate failed"; exit 1; }
cat >llama.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 48, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 96}
train: {seq_len: 64, micro_batch: 4, global_batch: 4, steps: 40}
optimizer: {lr: 1e-2, warmup_steps: 5}
data: {path: data}
checkpoint: {dir: ck, interval: 40}
log: {dir: run, interval: 100}
YAML
sed 's/model: {/model: {arch: mixtral, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48, /' llama.yaml >mixtral.yaml
for m in llama mixtral; do
    "$MTRAIN" pretrain $m.yaml --set checkpoint.dir=ck-$m --set log.dir=run-$m >out 2>&1 ||
        { fail generate_ref_${m}_train "exit $?: $(tail -2 out)"; continue; }
    "$MTRAIN" convert ck-$m --hf hf-$m >out 2>&1 || { fail generate_ref_${m}_export "$(tail -2 out)"; continue; }
    "$PY" "$HERE/generate_ref.py" $m "$MTRAIN" ck-$m hf-$m work-$m || FAILED=1
done
exit $FAILED
