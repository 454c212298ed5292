# Train a tiny Mixtral a few steps, export the checkpoint with `mtrain convert
# --hf`, load it in transformers (see mixtral_export.py).
source "$(dirname "$0")/../lib.sh"
require_python reference_python_deps torch transformers safetensors
HERE=$(cd "$(dirname "$0")" && pwd)
DRIVER=$(build_path tools/ref_driver)
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 >/dev/null || { fail mixtral_export_setup "data generate failed"; exit 1; }
cat >m.yaml <<'YAML'
model: {arch: mixtral, vocab_size: 264, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 64, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48, rope_theta: 1000000}
train: {seq_len: 16, micro_batch: 4, global_batch: 4, steps: 5}
data: {path: data}
checkpoint: {dir: ck, interval: 5}
log: {dir: run}
YAML
"$MTRAIN" pretrain m.yaml >out 2>&1 || { fail mixtral_export_train "exit $?: $(tail -2 out)"; exit 1; }
expect_exit mixtral_export_convert 0 "$MTRAIN" convert ck --hf hf
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$PY" "$HERE/mixtral_export.py" "$DRIVER" \
    m.yaml ck/step-000000005 hf work
# and training starts from it: model.init_from takes the exported directory
expect_exit mixtral_export_init_from 0 "$MTRAIN" pretrain m.yaml --set model.init_from=hf --set checkpoint.dir= \
    --set checkpoint.interval=0 --set train.steps=2 --set log.dir=run_init
