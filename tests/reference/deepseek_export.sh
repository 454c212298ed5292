# Train a tiny DeepSeek-V3 a few steps, export it with `mtrain convert --hf`,
# and check the Hugging Face DeepseekV3 directory (deepseek_export.py): its
# config.json, every tensor against the checkpoint (rotary rows interleaved),
# and that model.init_from of it computes the same loss as the original.
# Two models: q_lora + trained expert bias + untied head, and q_proj + no
# bias (zeros written) + tied embeddings.
source "$(dirname "$0")/../lib.sh"
require_python reference_python_deps torch safetensors yaml
HERE=$(cd "$(dirname "$0")" && pwd)
DRIVER=$(build_path tools/ref_driver)
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 >/dev/null || { fail deepseek_export_setup "data generate failed"; exit 1; }
cat >m.yaml <<'YAML'
model: {arch: deepseek_v3, vocab_size: 264, hidden_size: 32, num_layers: 3, num_heads: 4, num_kv_heads: 4,
        intermediate_size: 64, q_lora_rank: 16, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 8,
        v_head_dim: 8, rope_theta: 10000, rope_scaling_type: yarn, rope_scaling_factor: 4, rope_original_max_pos: 8,
        yarn_beta_fast: 32, yarn_beta_slow: 1, yarn_mscale: 1.0, yarn_mscale_all_dim: 0.8, norm_eps: 1e-6,
        first_k_dense: 1, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 24, moe_shared_experts: 1,
        moe_score_func: sigmoid, moe_n_group: 2, moe_topk_group: 1, moe_routed_scaling: 2.5,
        moe_bias_update_rate: 1e-2, moe_seq_aux_loss_coef: 1e-4, moe_aux_loss_coef: 0, mtp_depth: 1,
        mtp_loss_weight: 0.3}
train: {seq_len: 16, micro_batch: 4, global_batch: 4, steps: 5, device: cpu}
optimizer: {lr: 1e-2, warmup_steps: 1}
data: {path: data}
checkpoint: {dir: ck, interval: 5}
log: {dir: run}
YAML
for v in a b; do
    sets=()
    [ $v = b ] && sets=(--set model.q_lora_rank=0 --set model.moe_bias_update_rate=0 --set model.tie_embeddings=true)
    "$MTRAIN" pretrain m.yaml "${sets[@]}" --set checkpoint.dir=ck_$v --set log.dir=run_$v >out 2>&1 ||
        { fail deepseek_export_train_$v "exit $?: $(tail -2 out)"; exit 1; }
    expect_exit deepseek_export_convert_$v 0 "$MTRAIN" convert ck_$v --hf hf_$v
    # the run's final weights (mtrain's layout) exported through the other path
    expect_exit deepseek_export_convert_final_$v 0 "$MTRAIN" convert run_$v --hf hf_final_$v
    # a Hugging Face directory re-exported: config.json read back by hf_config_read
    expect_exit deepseek_export_convert_hf_$v 0 "$MTRAIN" convert hf_$v --hf hf_again_$v
    # model.init_from of the export: one step from it vs one from the final weights file
    for src in hf_$v run_$v/model.safetensors; do
        tag=$(echo "$src" | tr '/.' '__')
        "$MTRAIN" pretrain m.yaml "${sets[@]}" --set model.init_from=$src --set checkpoint.dir= --set checkpoint.interval=0 --set train.steps=1 \
            --set log.dir=init_$tag >out 2>&1 || { fail deepseek_export_init_from_$v "exit $?: $(tail -2 out)"; exit 1; }
    done
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$PY" "$HERE/deepseek_export.py" "$DRIVER" m.yaml "$v" \
        ck_$v/step-000000005 hf_$v hf_final_$v hf_again_$v init_hf_$v init_run_${v}_model_safetensors work_$v ||
        FAILED=1
done
exit $FAILED
