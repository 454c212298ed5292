# mtrain pretrain end to end on a small synthetic dataset: determinism,
# gradient accumulation, metrics output, corrupt data, CLI contract.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail pretrain_setup "data generate failed"; exit 1; }
cat >recipe.yaml <<'YAML'
model: {vocab_size: 257, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 32, micro_batch: 4, global_batch: 8, steps: 12, eval_interval: 6, eval_batches: 2, seed: 7}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3}
data: {path: data, valid_fraction: 0.1}
log: {dir: run, interval: 1}
YAML
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

expect_exit pretrain_runs 0 "$MTRAIN" pretrain recipe.yaml
expect_output pretrain_console_line 'step +12/12 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| gnorm [0-9.]+ \| +[0-9]+ tok/s \| [0-9.]+ TFLOP/s \| mfu - \| mem [0-9]+ MiB \| [0-9]+s, ETA 0s$'
expect_output pretrain_eval_line 'eval  step +12 \| val_loss [0-9.]+'
m=run/metrics.jsonl
if [ "$(grep -c '"step"' $m | tr -d ' ')" -ge 12 ] && grep -q '"event":"eval"' $m && grep -q '"event":"start"' $m &&
   head -2 $m | tail -1 | grep -q '"grad_norm":.*"tokens_per_s":.*"tflops":.*"mfu":.*"mem_mib"'; then
    pass pretrain_metrics_jsonl
else fail pretrain_metrics_jsonl "$(head -3 $m)"; fi
[ -s run/model.safetensors ] && pass pretrain_writes_weights || fail pretrain_writes_weights "no run/model.safetensors"

# same recipe and seed -> bitwise the same losses
cp $m first.jsonl
"$MTRAIN" pretrain recipe.yaml --force >/dev/null 2>&1
if [ -n "$(losses first.jsonl)" ] && [ "$(losses first.jsonl)" = "$(losses $m)" ]; then pass pretrain_deterministic
else fail pretrain_deterministic "loss sequences differ"; fi
# ... and a different seed gives a different run
"$MTRAIN" pretrain recipe.yaml --set train.seed=8 --force >/dev/null 2>&1
[ "$(losses first.jsonl)" != "$(losses $m)" ] && pass pretrain_seed_matters || fail pretrain_seed_matters "same losses"

# gradient accumulation: 8 sequences as 1x8 or 4x2 give the same step losses (fp32 tolerance)
"$MTRAIN" pretrain recipe.yaml --set train.micro_batch=8 --set log.dir=acc1 >/dev/null 2>&1
"$MTRAIN" pretrain recipe.yaml --set train.micro_batch=2 --set log.dir=acc4 >/dev/null 2>&1
if paste <(losses acc1/metrics.jsonl) <(losses acc4/metrics.jsonl) |
   awk 'BEGIN{n=0; bad=0} {n++; d=$1-$2; if (d<0) d=-d; if (d/$1 > 1e-5) bad=1} END{exit (n==12 && !bad) ? 0 : 1}'; then
    pass pretrain_grad_accumulation
else fail pretrain_grad_accumulation "$(paste <(losses acc1/metrics.jsonl) <(losses acc4/metrics.jsonl) | head -3)"; fi

# weights out and back in: starting from the trained model, step 1's loss is
# far below a fresh model's step 1 (same batch), so the weights were loaded
"$MTRAIN" pretrain recipe.yaml --set model.init_from=run/model.safetensors --set log.dir=reload >/dev/null 2>&1
fresh=$(losses first.jsonl | head -1); reloaded=$(losses reload/metrics.jsonl | head -1)
if [ -n "$reloaded" ] && awk -v a="$fresh" -v b="$reloaded" 'BEGIN{exit !(b < a - 0.3)}'; then pass pretrain_init_from
else fail pretrain_init_from "fresh step-1 loss $fresh, reloaded $reloaded"; fi

# a Hugging Face model directory with sharded safetensors + index.json loads the same weights
${PYTHON:-/usr/bin/python3} - run/model.safetensors hfsharded <<'PYEOF' >"$TMP/out" 2>&1 || fail pretrain_init_from_hf_sharded "cannot make the shards: $(tail -2 "$TMP/out")"
import json, os, sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1]); os.makedirs(sys.argv[2], exist_ok=True)
names = sorted(t); half = len(names) // 2; weight_map = {}
for i, part in enumerate([names[:half], names[half:]]):
    f = f"model-{i + 1:05d}-of-00002.safetensors"
    save_file({n: t[n] for n in part}, os.path.join(sys.argv[2], f), metadata={"format": "pt"})
    weight_map.update({n: f for n in part})
json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, open(os.path.join(sys.argv[2], "model.safetensors.index.json"), "w"))
PYEOF
"$MTRAIN" pretrain recipe.yaml --set model.init_from=hfsharded --set log.dir=reload_sharded >/dev/null 2>&1
if [ -n "$(losses reload/metrics.jsonl)" ] && [ "$(losses reload/metrics.jsonl)" = "$(losses reload_sharded/metrics.jsonl)" ]; then
    pass pretrain_init_from_hf_sharded
else fail pretrain_init_from_hf_sharded "losses differ from the single-file load"; fi

# a weighted blend of two datasets trains, and differs from either alone
"$MTRAIN" data generate --out data2 --docs 300 --seed 5 --frame-tokens 4096 >/dev/null
expect_exit pretrain_blend_runs 0 "$MTRAIN" pretrain recipe.yaml --set data.path= --set "data.blend=data:0.7,data2:0.3" --set log.dir=blend
[ -n "$(losses blend/metrics.jsonl)" ] && [ "$(losses blend/metrics.jsonl)" != "$(losses first.jsonl)" ] &&
    pass pretrain_blend_uses_both || fail pretrain_blend_uses_both "same losses as data alone"

# the model out to Hugging Face: transformers loads it, weights equal mtrain's own export
"$MTRAIN" pretrain recipe.yaml --set checkpoint.dir=ck --set checkpoint.interval=12 --set log.dir=hfrun >/dev/null 2>&1
expect_exit convert_hf_export 0 "$MTRAIN" convert ck --hf hf
if ${PYTHON:-/usr/bin/python3} - hf hfrun/model.safetensors <<'PYEOF' >"$TMP/out" 2>&1; then pass convert_hf_loads_in_transformers; else fail convert_hf_loads_in_transformers "$(tail -3 "$TMP/out")"; fi
import sys, torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM
model, info = LlamaForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
assert not info["missing_keys"] and not info["unexpected_keys"], info
ours = load_file(sys.argv[2])
for name, p in model.state_dict().items():
    assert torch.equal(p, ours[name]), name
out = model(input_ids=torch.tensor([[72, 101, 108, 108, 111]]))
assert torch.isfinite(out.logits).all()
PYEOF

# corrupt data: exit 1 with the file named
cp -r data bad1 && truncate -s -100 bad1/shard-00000.zst
expect_exit pretrain_truncated_shard 1 "$MTRAIN" pretrain recipe.yaml --set data.path=bad1 --set log.dir=bad1_run
expect_output pretrain_truncated_shard_names_file 'bad1/shard-00000.zst'
cp -r data bad2
printf '\xff' | dd of=bad2/shard-00000.zst bs=1 seek=2000 conv=notrunc status=none
expect_exit pretrain_flipped_byte 1 "$MTRAIN" pretrain recipe.yaml --set data.path=bad2 --set log.dir=bad2_run
expect_output pretrain_flipped_byte_names_frame 'bad2/shard-00000.zst.*frame'
expect_exit pretrain_vocab_mismatch 1 "$MTRAIN" pretrain recipe.yaml --set model.vocab_size=100 --set log.dir=bad3_run
expect_output pretrain_vocab_mismatch_message 'vocabulary mismatch'

# CLI contract
expect_exit cli_help 0 "$MTRAIN" help
expect_exit cli_pretrain_help 0 "$MTRAIN" pretrain --help
expect_exit cli_version 0 "$MTRAIN" version
expect_output cli_version_text '^mtrain [0-9]+\.[0-9]+\.[0-9]+'
expect_exit cli_unknown_command 2 "$MTRAIN" frobnicate
expect_exit cli_pretrain_no_recipe 2 "$MTRAIN" pretrain
expect_exit cli_pretrain_bad_option 2 "$MTRAIN" pretrain recipe.yaml --bogus
expect_exit cli_missing_recipe 2 "$MTRAIN" pretrain nosuch.yaml
expect_exit cli_dry_run 0 "$MTRAIN" pretrain recipe.yaml --dry-run
expect_output cli_dry_run_plan 'parameters: +[0-9]+'
# the memory estimate follows the backend: the CPU stores attention
# probabilities (T^2 per head), a CUDA build a log-sum-exp per row
"$MTRAIN" pretrain recipe.yaml --dry-run --set train.seq_len=2048 --set train.device=cpu >"$TMP/out" 2>&1
expect_output cli_dry_run_memory_cpu 'memory_per_rank: .*activations [0-9.]+, buffers [0-9.]+; fp32, cpu backend'
act() { sed -nE 's/.*activations ([0-9.]+),.*/\1/p' "$TMP/$1"; }
cp "$TMP/out" "$TMP/dry_cpu"
"$MTRAIN" pretrain recipe.yaml --dry-run --set train.seq_len=2048 --set train.device=cuda >"$TMP/dry_cuda" 2>&1
if grep -q 'cuda backend' "$TMP/dry_cuda"; then
    awk -v a="$(act dry_cuda)" -v b="$(act dry_cpu)" 'BEGIN{exit !(a < b)}' && pass cli_dry_run_memory_backend ||
        fail cli_dry_run_memory_backend "cuda $(act dry_cuda) GiB not below cpu $(act dry_cpu) GiB"
else
    grep -q 'cpu backend' "$TMP/dry_cuda" && pass cli_dry_run_memory_backend ||
        fail cli_dry_run_memory_backend "$(tail -1 "$TMP/dry_cuda")"
fi
# train.device cuda where there is no GPU: one error line saying what to set, exit 1
"$MTRAIN" pretrain recipe.yaml --set train.device=cuda --set train.steps=1 --set optimizer.warmup_steps=0 --set log.dir=cuda_try >"$TMP/out" 2>&1
rc=$?
if grep -q '| device cuda |' "$TMP/out"; then pass cli_device_cuda_without_gpu # this machine has one
elif [ $rc = 1 ] && [ "$(grep -c 'mtrain: error: train.device cuda: .*use train.device cpu or auto' "$TMP/out")" = 1 ]; then
    pass cli_device_cuda_without_gpu
else fail cli_device_cuda_without_gpu "exit $rc: $(head -c 300 "$TMP/out")"; fi
exit $FAILED
