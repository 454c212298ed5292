# mtrain generate / eval: sampling is reproducible, top-k 1 is greedy, every
# kind of model source gives the same tokens and losses (checkpoint step and
# root, LOG_DIR final weights, Hugging Face export, multi-rank tp 2 and ep 2
# checkpoints), eval over the valid split equals the training run's eval,
# long prompts (fed in pieces) match the full forward, and bad input gets a
# clear message with exit 2 (usage) or 1 (damaged files).
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 300 >/dev/null || { fail gen_setup "data generate failed"; exit 1; }
cat >dense.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
        max_seq_len: 320}
train: {seq_len: 32, micro_batch: 2, global_batch: 4, steps: 12, eval_interval: 12, eval_batches: 3}
optimizer: {lr: 1e-2, warmup_steps: 2}
data: {path: data, valid_fraction: 0.1}
checkpoint: {dir: ck, interval: 6}
log: {dir: run, interval: 100}
YAML
sed 's/model: {/model: {arch: mixtral, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 48, /' dense.yaml >moe.yaml
"$MTRAIN" pretrain dense.yaml >out 2>&1 || { fail gen_train "exit $?: $(tail -2 out)"; exit 1; }
P=72,101,108,108,111,32
gen() { "$MTRAIN" generate "$@" 2>"$TMP/err"; }

# one model, every way of naming it
gen ck/step-000000012 --prompt-ids $P --max-tokens 20 >a.txt || fail gen_step_dir "$(cat err)"
for src in ck run run/model.safetensors; do
    gen $src --prompt-ids $P --max-tokens 20 >b.txt && cmp -s a.txt b.txt && pass "gen_same_tokens_from_${src//\//_}" ||
        fail "gen_same_tokens_from_${src//\//_}" "$(cat b.txt err | head -3) vs $(cat a.txt)"
done
"$MTRAIN" convert ck --hf hf >/dev/null || fail gen_export "convert --hf failed"
gen hf --prompt-ids $P --max-tokens 20 >b.txt && cmp -s a.txt b.txt && pass gen_same_tokens_from_hf_export ||
    fail gen_same_tokens_from_hf_export "$(cat b.txt err | head -3)"
# text prompts go through the tokenizer: the bytes of "Hello " are $P
gen ck --prompt "Hello " --tokenizer bytes --max-tokens 20 --print-ids --stop-id -1 >b.txt &&
    [ "$(tail -1 b.txt)" = "$(cat a.txt)" ] && pass gen_text_prompt_tokenized || fail gen_text_prompt_tokenized "$(cat b.txt err)"

# sampling: a seed fixes the output; top-k 1 is greedy
gen ck --prompt-ids $P --max-tokens 24 --temperature 1 --seed 7 >s1.txt
gen ck --prompt-ids $P --max-tokens 24 --temperature 1 --seed 7 >s2.txt
gen ck --prompt-ids $P --max-tokens 24 --temperature 1 --seed 8 >s3.txt
cmp -s s1.txt s2.txt && pass gen_sampling_reproducible || fail gen_sampling_reproducible "$(cat s1.txt s2.txt)"
cmp -s s1.txt s3.txt && fail gen_sampling_seed_matters "seeds 7 and 8 gave the same 24 tokens" || pass gen_sampling_seed_matters
gen ck --prompt-ids $P --max-tokens 20 --temperature 0.7 --top-k 1 --seed 3 >b.txt && cmp -s a.txt b.txt &&
    pass gen_top_k_1_is_greedy || fail gen_top_k_1_is_greedy "$(cat b.txt) vs $(cat a.txt)"
gen ck --prompt-ids $P --max-tokens 20 --temperature 1 --top-p 1e-6 --seed 3 >b.txt && cmp -s a.txt b.txt &&
    pass gen_tiny_top_p_is_greedy || fail gen_tiny_top_p_is_greedy "$(cat b.txt) vs $(cat a.txt)"

# eval over the valid split = the training run's eval at step 12 (same samples, same forward)
want=$("$PY" -c "import json,sys; print([json.loads(l)['val_loss'] for l in open('run/metrics.jsonl') if '\"eval\"' in l][-1])")
"$MTRAIN" eval ck --data data --split valid --batches 3 --batch-size 4 --json >ev.json 2>err || fail gen_eval_runs "$(cat err)"
"$PY" -c "import json,sys; g=json.load(open('ev.json'))['loss']; sys.exit(0 if abs(g-$want)<=2e-6*abs($want)+1e-6 else 1)" &&
    pass eval_valid_equals_training_eval || fail eval_valid_equals_training_eval "eval $(cat ev.json), training $want"
# batch size does not change the mean (padded last batch counts nothing)
# a pass over a split says how far it is on stderr (every --progress seconds), stdout stays the result
"$MTRAIN" eval ck --data data --split all --batches 6 --batch-size 2 --json --progress 0.000001 >ep.json 2>ep.err
grep -q '^eval all: [0-9]* of 12 samples, loss so far [0-9.]*, [0-9]* tokens/s$' ep.err && [ "$(wc -l <ep.json)" = 1 ] &&
    pass eval_progress_lines || fail eval_progress_lines "$(head -c 300 ep.err)"
"$MTRAIN" eval ck --data data --split all --batches 3 --batch-size 4 --json >e1.json 2>/dev/null
"$MTRAIN" eval ck --data data --split all --batches 4 --batch-size 3 --json >e2.json 2>/dev/null
"$MTRAIN" eval ck --data data --split all --batches 2 --batch-size 5 --json >e3.json 2>/dev/null
"$PY" - <<'PY' && pass eval_batch_size_invariant || fail eval_batch_size_invariant "$(cat e1.json e2.json e3.json)"
import json, sys
a, b, c = (json.load(open(f)) for f in ("e1.json", "e2.json", "e3.json"))
# 12 samples each way, except 10 for the last: compare the first two, and that the third counts 10 samples
sys.exit(0 if abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]) and c["samples"] == 10 and a["tokens"] == 12 * 32 else 1)
PY

# logits_match CHECK GEN_JSON FULL_JSON FIRST STEPS: the top logits of each of
# STEPS generated steps (generate --json) equal the full forward's (eval
# --dump) at positions FIRST, FIRST+1, ... (FIRST -1: the last position)
logits_match() {
    "$PY" - "$@" <<'PY' && pass "$1" || fail "$1" "see above"
import json, sys
name, steps, pos, first, want = sys.argv[1], *(json.load(open(f)) for f in sys.argv[2:4]), *map(int, sys.argv[4:6])
steps, pos = steps["steps"], pos["positions"]
first = first if first >= 0 else len(pos) - 1
err = 0
for i, g in enumerate(steps):
    full = dict(zip(pos[first + i]["top_ids"], pos[first + i]["top_logits"]))
    err = max(err, max(abs(l - full.get(t, 1e9)) for t, l in zip(g["top_ids"], g["top_logits"])))
print(f"  {name}: {len(steps)} steps, max |kv - full| {err:.3g}", file=sys.stderr)
sys.exit(0 if len(steps) == want and err <= 1e-5 else 1)
PY
}

# a long prompt is fed to the cache in pieces of 256: its next-token logits equal the full forward's
ids=$("$PY" -c "import random; random.seed(1); print(','.join(str(random.randrange(256)) for _ in range(300)))")
gen ck --prompt-ids $ids --max-tokens 1 --json --json-top 5 >long.json || fail gen_long_prompt "$(cat err)"
"$MTRAIN" eval ck --ids $ids --dump full.json >/dev/null 2>err || fail gen_long_prompt_eval "$(cat err)"
logits_match gen_long_prompt_chunks_match_full_forward long.json full.json -1 1

# DeepSeek-V3 (latent attention with YaRN, with and without the query
# latent; a dense layer, then sigmoid group-limited routing with a shared
# expert; an MTP module, which generation does not run): the KV-cache
# decoder's logits equal the full forward's, for a long prompt fed in pieces
# and for every token generated one at a time; its HF export generates the same
cat >ds.yaml <<'YAML'
model: {arch: deepseek_v3, vocab_size: 264, hidden_size: 32, num_layers: 3, num_heads: 4, num_kv_heads: 4,
        intermediate_size: 64, q_lora_rank: 16, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4,
        v_head_dim: 6, rope_scaling_type: yarn, rope_scaling_factor: 4, rope_original_max_pos: 80,
        yarn_mscale: 1.0, yarn_mscale_all_dim: 0.7, max_seq_len: 320, first_k_dense: 1, num_experts: 4,
        experts_per_token: 2, moe_intermediate_size: 16, moe_shared_experts: 1, moe_score_func: sigmoid,
        moe_n_group: 2, moe_topk_group: 1, moe_routed_scaling: 2.5, moe_bias_update_rate: 1e-2,
        moe_aux_loss_coef: 0, mtp_depth: 1}
train: {seq_len: 32, micro_batch: 2, global_batch: 4, steps: 12}
optimizer: {lr: 1e-2, warmup_steps: 2}
data: {path: data, valid_fraction: 0.1}
checkpoint: {interval: 12}
log: {interval: 100}
YAML
for v in q_latent:16 q_proj:0; do
    name=${v%:*}
    "$MTRAIN" pretrain ds.yaml --set model.q_lora_rank=${v#*:} --set checkpoint.dir=ck-$name --set log.dir=run-$name \
        >out 2>&1 || { fail gen_deepseek_${name}_train "exit $?: $(tail -2 out)"; continue; }
    gen ck-$name --prompt-ids $ids --max-tokens 1 --json --json-top 5 >long.json &&
        "$MTRAIN" eval ck-$name --ids $ids --dump full.json >/dev/null 2>>err || fail gen_deepseek_${name}_runs "$(cat err)"
    logits_match gen_deepseek_${name}_long_prompt_matches_full_forward long.json full.json -1 1
    # 24 tokens one at a time: each step's logits against the full forward of prompt + tokens so far
    gen ck-$name --prompt-ids $P --max-tokens 24 --stop-id -1 --json --json-top 5 >steps.json ||
        fail gen_deepseek_${name}_steps "$(cat err)"
    all=$("$PY" -c "import json; print(','.join(str(t) for t in [$P] + json.load(open('steps.json'))['ids'][:-1]))")
    "$MTRAIN" eval ck-$name --ids $all --dump full.json >/dev/null 2>err || fail gen_deepseek_${name}_steps_eval "$(cat err)"
    logits_match gen_deepseek_${name}_decode_steps_match_full_forward steps.json full.json \
        $(($(echo $P | tr ',' ' ' | wc -w) - 1)) 24
done
"$MTRAIN" convert ck-q_latent --hf hf-ds >/dev/null 2>&1 || fail gen_deepseek_export "convert --hf failed"
gen ck-q_latent --prompt-ids $P --max-tokens 20 >x.txt && gen hf-ds --prompt-ids $P --max-tokens 20 >y.txt &&
    [ -s x.txt ] && cmp -s x.txt y.txt && pass gen_deepseek_checkpoint_tokens_equal_export ||
    fail gen_deepseek_checkpoint_tokens_equal_export "$(cat x.txt y.txt err)"

# YaRN: the positions are its extended context, factor x original_max_pos (4 x 80), as DeepSeek-V3's config states
"$MTRAIN" pretrain ds.yaml --set model.max_seq_len=0 --set train.steps=2 --set checkpoint.dir=ck-yarn \
    --set checkpoint.interval=2 --set log.dir=run-yarn >/dev/null 2>&1 && "$MTRAIN" convert ck-yarn --hf hf-yarn >/dev/null 2>&1
"$PY" -c "import json,sys; sys.exit(0 if json.load(open('hf-yarn/config.json'))['max_position_embeddings'] == 320 else 1)" &&
    pass export_max_positions_yarn || fail export_max_positions_yarn "$(grep -o '"max_position_embeddings":[0-9]*' hf-yarn/config.json)"
# multi-rank checkpoints (tp 2 dense, ep 2 MoE) give what their exports give
for spec in "dense tp2 parallel.tp=2" "moe ep2 parallel.ep=2"; do
    set -- $spec
    run_np 2 pretrain $1.yaml --set $3 --set checkpoint.dir=ck-$2 --set log.dir=run-$2 >out 2>&1 ||
        { fail gen_${2}_train "exit $?: $(tail -2 out)"; continue; }
    "$MTRAIN" convert ck-$2 --hf hf-$2 >/dev/null || fail gen_${2}_export "convert failed"
    gen ck-$2 --prompt-ids $P --max-tokens 20 >x.txt && gen hf-$2 --prompt-ids $P --max-tokens 20 >y.txt &&
        [ -s x.txt ] && cmp -s x.txt y.txt && pass gen_${2}_checkpoint_tokens_equal_export ||
        fail gen_${2}_checkpoint_tokens_equal_export "$(cat x.txt y.txt err)"
    "$MTRAIN" eval ck-$2 --ids $P,1,2,3 --dump x.json >/dev/null 2>&1 && "$MTRAIN" eval hf-$2 --ids $P,1,2,3 --dump y.json >/dev/null 2>&1
    "$PY" -c "
import json, sys
a, b = (json.load(open(f))['positions'][:-1] for f in ('x.json', 'y.json'))
sys.exit(0 if len(a) == 8 and max(abs(p['loss'] - q['loss']) for p, q in zip(a, b)) <= 1e-6 else 1)" &&
        pass eval_${2}_checkpoint_losses_equal_export || fail eval_${2}_checkpoint_losses_equal_export "$(head -c 300 x.json)"
done

# a damaged newest step: the checkpoint root falls back to the previous one, a named step fails
cp -r ck ck2
"$PY" - <<'PY'
import json, struct
path = "ck2/step-000000012/rank-00000.safetensors"
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    begin = json.loads(f.read(n))["model.norm.weight"]["data_offsets"][0]
    f.seek(8 + n + begin)
    f.write(b"garbage!")
PY
gen ck/step-000000006 --prompt-ids $P --max-tokens 8 >a.txt
gen ck2 --prompt-ids $P --max-tokens 8 >b.txt && cmp -s a.txt b.txt && grep -q "falling back" err &&
    pass gen_root_falls_back_past_damage || fail gen_root_falls_back_past_damage "$(cat b.txt err)"
expect_exit gen_damaged_step_exit_1 1 "$MTRAIN" generate ck2/step-000000012 --prompt-ids $P
expect_output gen_damaged_step_names_file "rank-00000.safetensors"

# bad input: exit 2 with a message that says what is wrong
expect_exit gen_missing_model 2 "$MTRAIN" generate nowhere --prompt-ids 1
expect_output gen_missing_model_message "nowhere: no such file"
expect_exit gen_bad_id 2 "$MTRAIN" generate ck --prompt-ids 1,x,3
expect_output gen_bad_id_message "item 2"
expect_exit gen_id_outside_vocab 2 "$MTRAIN" generate ck --prompt-ids 1,264
expect_output gen_id_outside_vocab_message "264.*vocabulary"
long=$("$PY" -c "print(','.join(['5'] * 321))")
expect_exit gen_prompt_too_long 2 "$MTRAIN" generate ck --prompt-ids $long
expect_output gen_prompt_too_long_message "321 tokens, more than the model's 320 positions"
expect_exit gen_prompt_needs_tokenizer 2 "$MTRAIN" generate ck --prompt hi
expect_exit gen_bad_temperature 2 "$MTRAIN" generate ck --prompt-ids 1 --temperature -1
expect_exit gen_weights_without_recipe 2 "$MTRAIN" generate hf/model.safetensors --recipe nothere.yaml --prompt-ids 1
expect_exit eval_ids_too_long 2 "$MTRAIN" eval ck --ids $long
# the positions the model takes, one number for both sources: config.json's max_position_embeddings
# is the run's (max_seq_len 320 here; train.seq_len without it) and the export refuses what the run does
"$PY" -c "import json,sys; sys.exit(0 if json.load(open('hf/config.json'))['max_position_embeddings'] == 320 else 1)" &&
    pass export_max_positions_max_seq_len || fail export_max_positions_max_seq_len "$(grep -o '"max_position_embeddings":[0-9]*' hf/config.json)"
expect_exit eval_export_ids_too_long 2 "$MTRAIN" eval hf --ids $long
"$MTRAIN" pretrain dense.yaml --set model.max_seq_len=0 --set train.steps=2 --set optimizer.warmup_steps=1 \
    --set checkpoint.dir=ck_nomax --set log.dir=run_nomax >/dev/null 2>&1 && "$MTRAIN" convert ck_nomax --hf hf_nomax >/dev/null 2>&1
"$PY" -c "import json,sys; sys.exit(0 if json.load(open('hf_nomax/config.json'))['max_position_embeddings'] == 32 else 1)" &&
    pass export_max_positions_seq_len || fail export_max_positions_seq_len "$(grep -o '"max_position_embeddings":[0-9]*' hf_nomax/config.json)"
ids33=$("$PY" -c "print(','.join(['5'] * 33))")
expect_exit eval_run_seq_len_limit 2 "$MTRAIN" eval ck_nomax --ids $ids33
expect_exit eval_export_seq_len_limit 2 "$MTRAIN" eval hf_nomax --ids $ids33
# one id has no token to score (it printed "loss nan" and exit 0)
expect_exit eval_one_id_refused 2 "$MTRAIN" eval ck --ids 5
expect_output eval_one_id_says_why "scoring takes 2 to"

expect_exit eval_empty_valid_split 2 "$MTRAIN" eval ck --data data --valid-fraction 0
expect_exit eval_seq_len_too_long 2 "$MTRAIN" eval ck --data data --seq-len 400
expect_exit eval_missing_data 1 "$MTRAIN" eval ck --data nodata
mkdir -p other && cp -r hf other/hfx && sed -i 's/"llama"/"gpt2"/' other/hfx/config.json
expect_exit gen_refuses_other_family 2 "$MTRAIN" generate other/hfx --prompt-ids 1
expect_output gen_refuses_other_family_message '"gpt2" is not supported'
# a config.json whose shapes are not its weights': refused by tensor before a model its size is allocated
cp -r hf other/hfbig && sed -i 's/"vocab_size": *[0-9]*/"vocab_size": 1073741824/' other/hfbig/config.json
grep -q '"vocab_size": 1073741824' other/hfbig/config.json || fail gen_config_shape_mismatch_setup "sed did not change it"
expect_exit gen_config_shape_mismatch 1 "$MTRAIN" generate other/hfbig --prompt-ids 1
expect_output gen_config_shape_mismatch_message \
    'other/hfbig/model.safetensors: tensor model.embed_tokens.weight has shape \[[0-9]+, [0-9]+\], the recipe needs \[1073741824, '
# a config.json with more layers than mtrain's tables take: refused by name (was an internal check failure)
cp -r hf other/hfdeep && sed -i 's/"num_hidden_layers": *[0-9]*/"num_hidden_layers": 1073741824/' other/hfdeep/config.json
expect_exit gen_config_too_many_layers 2 "$MTRAIN" generate other/hfdeep --prompt-ids 1
expect_output gen_config_too_many_layers_message 'other/hfdeep/config.json: num_layers 1073741824 is more than the supported'
expect_exit gen_help 0 "$MTRAIN" help generate
expect_exit eval_help 0 "$MTRAIN" eval --help
exit $FAILED
