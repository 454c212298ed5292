# DeepSeek-V3 on CPU under mpiexec (oversubscribed): a tiny model with MLA,
# 2 dense + 2 MoE layers (sigmoid group-limited routing, expert bias, shared
# expert, sequence-wise balance loss) and one MTP module trains the same
# under tp, ep, dp, sequence parallel and ZeRO-1 as on one rank: every step's
# loss within 1e-5 relative and the final parameters, expert biases included,
# within 1e-5. Pipeline layouts run with the MTP module too: the last stage
# keeps a copy of the embedding (MTP embeds the next tokens) whose gradient is
# summed with the first stage's. One pipeline layout also runs without MTP
# against its own single-rank run. A checkpoint saved at one layout resumes
# at another, a pipeline one included.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail deepseek_par_setup "data generate failed"; exit 1; }
# eps 1e-4 as in parallel.sh: AdamW steps of near-zero gradients do not amplify rounding
cat >r.yaml <<'YAML'
model: {arch: deepseek_v3, vocab_size: 264, hidden_size: 32, num_layers: 4, num_heads: 4, num_kv_heads: 4,
        intermediate_size: 64, q_lora_rank: 16, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4,
        v_head_dim: 8, rope_scaling_type: yarn, rope_scaling_factor: 4, rope_original_max_pos: 8,
        first_k_dense: 2, num_experts: 8, experts_per_token: 2, moe_intermediate_size: 16, moe_shared_experts: 1,
        moe_score_func: sigmoid, moe_n_group: 4, moe_topk_group: 2, moe_routed_scaling: 2.5,
        moe_bias_update_rate: 1e-3, moe_seq_aux_loss_coef: 1e-3, moe_aux_loss_coef: 0, mtp_depth: 1,
        mtp_loss_weight: 0.3}
train: {seq_len: 16, micro_batch: 2, global_batch: 8, steps: 20, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
checkpoint: {dir: ck_ref, interval: 20}
log: {dir: ref, interval: 100}
YAML
# close A B: 20 steps, each loss (and MTP loss where recorded) within 1e-5 relative
close() { close_metrics "$1" "$2" 1 20 && close_metrics "$1" "$2" 1 20 mtp_loss; }
"$MTRAIN" pretrain r.yaml >/dev/null 2>&1 || fail deepseek_par_reference_run "exit $?"
"$MTRAIN" pretrain r.yaml --set model.mtp_depth=0 --set log.dir=ref0 --set checkpoint.dir=ck_ref0 >/dev/null 2>&1 ||
    fail deepseek_par_reference_run_no_mtp "exit $?"
# name tp pp dp ep extra-args...
layouts=(
    "tp2 2 1 1 1" "ep2 1 1 2 2" "ep4_zero 1 1 4 4 optimizer.distributed=true"
    "tp2_sp_ep2 2 1 2 2 parallel.sequence_parallel=true" "dp2_ep2_zero 1 1 2 2 optimizer.distributed=true"
    "pp2_ep2 1 2 2 2" "tp2_pp2 2 2 1 1" "tp2_pp2_zero 2 2 2 1 optimizer.distributed=true"
    "pp2_ep2_no_mtp 1 2 2 2 model.mtp_depth=0"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 tp=$2 pp=$3 dp=$4 ep=$5; shift 5
    ref=ref ck=ck_ref
    for kv in "$@"; do [ "$kv" = model.mtp_depth=0 ] && ref=ref0 ck=ck_ref0; done
    layout_run deepseek_$name $((tp * pp * dp)) r.yaml $name parallel.tp=$tp parallel.pp=$pp parallel.ep=$ep "$@" || continue
    close $ref/metrics.jsonl $name/metrics.jsonl && pass "deepseek_${name}_losses" ||
        fail "deepseek_${name}_losses" "$(paste <(metric $ref/metrics.jsonl loss) <(metric $name/metrics.jsonl loss) | head -4 | tr '\n' ' ')"
    params_close deepseek_$name $ck/step-000000020 ck_$name/step-000000020
done
# the expert biases moved and are in the checkpoint the layouts were compared on
"$PY" - ck_ref/step-000000020 <<'PY' && pass deepseek_par_bias_in_checkpoint || fail deepseek_par_bias_in_checkpoint "no moved expert bias"
import glob, sys
from safetensors.numpy import load_file
t = {}
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    t.update(load_file(f))
b = [v for n, v in t.items() if n.startswith("model.") and n.endswith("e_score_correction_bias")]
sys.exit(0 if len(b) == 3 and all(abs(v).max() > 0 for v in b) else 1)
PY
# a checkpoint saved at step 20 by a 4-rank layout resumes on one rank and
# ends where the single-rank 30-step run ends
"$MTRAIN" pretrain r.yaml --set train.steps=30 --set checkpoint.dir=long --set log.dir=long >/dev/null 2>&1
# resume_on_one SAVE_CHECK RESUME_CHECK COMPARE_CHECK DIR SETTINGS...
resume_on_one() {
    local save=$1 resume=$2 cmp=$3 dir=$4; shift 4
    local sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    run_np 4 pretrain r.yaml --set train.steps=30 "${sets[@]}" --set checkpoint.dir=s_$dir --set log.dir=s_$dir \
        --stop-after 20 >/dev/null 2>&1 || fail $save "exit $?"
    cp -r s_$dir r_$dir
    "$MTRAIN" pretrain r.yaml --set train.steps=30 --set checkpoint.dir=r_$dir --set log.dir=r_$dir >"$TMP/out" 2>&1 ||
        fail $resume "exit $?: $(tail -2 "$TMP/out")"
    grep -q "resumed from r_$dir/step-000000020" "$TMP/out" && pass $resume ||
        fail $resume "$(grep -E 'resumed|error' "$TMP/out" | head -2)"
    "$PY" "$COMPARE" long/step-000000030 r_$dir/step-000000030 1e-5 >"$TMP/cmp" 2>&1 && pass $cmp ||
        fail $cmp "$(cat "$TMP/cmp")"
}
# the ep 4 / ZeRO layout
resume_on_one deepseek_save_ep4 deepseek_resume_ep1 deepseek_checkpoint_ep4_to_ep1 ep4 parallel.ep=4 \
    optimizer.distributed=true
# a pipeline layout with MTP (the last stage's embedding copy is not saved)
resume_on_one deepseek_save_pp2_mtp deepseek_resume_pp1_mtp deepseek_checkpoint_pp2_mtp_to_pp1 pp2 parallel.pp=2 \
    parallel.ep=2
exit $FAILED
