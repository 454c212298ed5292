#!/usr/bin/env bash
# Malformed recipes: `mtrain pretrain RECIPE --dry-run` must exit 2 with one
# error line that names the line (":LINE:") and the key, so users can fix the
# file without guessing. A good recipe must pass the dry run. Paths that do
# not exist are checked by a training run only (DRY= below): a dry run plans
# without the data.
source "$(dirname "$0")/../lib.sh"

if [ ! -x "$MTRAIN" ]; then skip recipe_errors "no $MTRAIN binary (run make)"; exit 0; fi

DATA=$TMP/data
mkdir -p "$DATA"
touch "$TMP/afile"

# bad NAME LINE KEY PATTERN YAML [ARGS...]: the dry run exits 2 and stderr
# holds ":LINE:" (skipped when LINE is -), 'KEY' and the regex PATTERN.
bad() {
    local name=$1 line=$2 key=$3 pattern=$4 yaml=$5
    shift 5
    printf '%s' "$yaml" >"$TMP/$name.yaml"
    "$MTRAIN" pretrain "$TMP/$name.yaml" "$@" ${DRY---dry-run} >"$TMP/out" 2>"$TMP/err"
    local rc=$? msg
    msg=$(head -c 300 "$TMP/err")
    if [ "$rc" != 2 ]; then fail "recipe_error_$name" "exit $rc, want 2: $msg"; return; fi
    if [ "$line" != - ] && ! grep -q -- ":$line:" "$TMP/err"; then
        fail "recipe_error_$name" "stderr lacks line :$line:: $msg"; return
    fi
    if ! grep -qF -- "'$key'" "$TMP/err"; then fail "recipe_error_$name" "stderr lacks key '$key': $msg"; return; fi
    if ! grep -qE -- "$pattern" "$TMP/err"; then fail "recipe_error_$name" "stderr lacks /$pattern/: $msg"; return; fi
    pass "recipe_error_$name"
}

# A valid recipe; error cases below change one thing in it.
good="model:
  hidden_size: 64
  num_heads: 4
  num_kv_heads: 2
train:
  seq_len: 32
  micro_batch: 2
  global_batch: 4
  steps: 10
data:
  path: $DATA
"

# -- YAML syntax --
bad indentation 3 model.hidden_size 'syntax error' 'model:
  hidden_size: 64
 num_layers: 2
'
bad tab 3 model.hidden_size 'tab' "$(printf 'model:\n  hidden_size: 64\n\tnum_layers: 2\n')
"
bad unclosed_quote 4 model.arch 'quoted scalar at line 2' 'model:
  arch: "llama
  num_layers: 2
'
bad deeper_indent 2 model.hidden_size 'line 3' 'model:
  hidden_size: 64
    num_layers: 2
'

# -- structure --
bad unknown_section 13 modle "did you mean 'model'" "$good
modle:
  hidden_size: 64
"
bad unknown_key 3 model.hiden_size "did you mean 'model.hidden_size'" 'model:
  num_layers: 2
  hiden_size: 64
'
bad key_in_wrong_section 2 train.lr "did you mean 'optimizer.lr'" 'train:
  lr: 3e-4
'
bad duplicate_key 3 train.steps 'duplicate key \(first set at line 2\)' 'train:
  steps: 10
  steps: 20
'
bad duplicate_section 3 train 'duplicate section' 'train:
  steps: 10
train:
  seed: 1
'
bad section_not_mapping 2 parallel 'must be a mapping' 'model:
parallel: 4
'
bad list_not_scalar 3 model.num_layers 'got a list' 'model:
  hidden_size: 64
  num_layers: [1, 2]
'
bad mapping_not_scalar 2 optimizer.lr 'got a mapping' 'optimizer:
  lr: {peak: 1}
'

# -- types and ranges --
bad int_type 3 train.steps 'expected an integer' 'train:
  seq_len: 32
  steps: ten
'
bad int_not_float 2 model.num_layers 'expected an integer' 'model:
  num_layers: 2.5
'
bad bool_type 2 model.tie_embeddings 'expected true/false' 'model:
  tie_embeddings: maybe
'
bad double_type 2 optimizer.lr 'expected a number' 'optimizer:
  lr: fast
'
bad out_of_range 2 model.num_layers 'out of range: must be >= 1' 'model:
  num_layers: 0
'
bad beta_range 3 optimizer.beta2 'must be in \[0, 1\)' 'optimizer:
  beta1: 0.9
  beta2: 1.5
'
bad enum_value 2 optimizer.schedule 'one of cosine, linear, constant, wsd' 'optimizer:
  schedule: exponential
'
bad enum_device 2 train.device 'one of auto, cpu, cuda' 'train:
  device: tpu
'
bad string_too_long 2 log.dir 'string too long' "log:
  dir: /tmp/$(printf 'x%.0s' $(seq 1100))
"

# -- cross-field checks name the key and the line it was set on --
bad heads_divide_hidden 2 model.hidden_size 'not divisible by num_heads 3' "${good/num_heads: 4/num_heads: 3}"
bad kv_divide_heads 4 model.num_kv_heads 'does not divide num_heads' "${good/num_kv_heads: 2/num_kv_heads: 3}"
bad batch_divisible 8 train.global_batch 'not divisible by micro_batch' "${good/global_batch: 4/global_batch: 5}"
bad warmup_steps 14 optimizer.warmup_steps 'more than train.steps 10' "$good
optimizer:
  warmup_steps: 20
"
bad min_lr 15 optimizer.min_lr 'above lr' "$good
optimizer:
  lr: 1e-4
  min_lr: 1e-3
"
bad layers_divide_pp 14 parallel.pp 'does not divide model.num_layers' "$good
parallel:
  pp: 3
"
bad max_seq_len 5 model.max_seq_len 'shorter than train.seq_len' "${good/num_kv_heads: 2/num_kv_heads: 2
  max_seq_len: 16}"
bad arch_not_supported 2 model.arch 'expected one of llama, mixtral' 'model:
  arch: deepseek
'

# -- mixture-of-experts configs --
moe="${good/num_kv_heads: 2/num_kv_heads: 2
  arch: mixtral
  num_experts: 4}"
bad moe_arch_needs_experts 5 model.arch 'set model.num_experts' "${good/num_kv_heads: 2/num_kv_heads: 2
  arch: mixtral}"
bad moe_topk_above_experts - model.experts_per_token 'more than num_experts 4' "$moe" --set model.experts_per_token=5
bad moe_ep_divides_experts 16 parallel.ep 'does not divide model.num_experts 4' "$moe
parallel:
  ep: 3
"
export SLURM_NTASKS=2 # a dry run plans for the launcher's world: dp 2
bad moe_ep_divides_stage_ranks 16 parallel.ep 'etp\*ep = 1\*4 = 4 does not divide the ranks of a pipeline stage, tp\*cp\*dp = 2' "$moe
parallel:
  ep: 4
"
bad moe_ep_divides_stage_ranks_pp 17 parallel.ep 'does not divide the ranks of a pipeline stage, tp\*cp\*dp = 1' "$moe
parallel:
  pp: 2
  ep: 2
" --set model.num_layers=2
unset SLURM_NTASKS
# pipeline schedules: interleaved needs vpp > 1, zbv 2, the others 1; zb-h1 and zbv need pp > 1; as the dry
# run, so the run itself
bad schedule_interleaved_vpp1 - parallel.schedule 'the interleaved schedule needs vpp > 1' "$good" --set parallel.pp=2 \
    --set parallel.schedule=interleaved
bad schedule_zb_vpp2 - parallel.schedule 'zb-h1 runs one model chunk per rank: vpp 2 needs the interleaved schedule' \
    "$good" --set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=zb-h1 --set model.num_layers=4
bad schedule_zb_pp1 - parallel.schedule 'zb-h1 is a pipeline schedule: it needs pp > 1' "$good" --set parallel.schedule=zb-h1
bad schedule_unknown - parallel.schedule 'one of|expected' "$good" --set parallel.schedule=zb-v
# zbv: two chunks per rank (vpp 2), pp > 1
bad schedule_zbv_vpp1 - parallel.vpp 'the zbv schedule places two model chunks per rank in a V: it needs vpp 2, not 1' \
    "$good" --set parallel.pp=2 --set parallel.schedule=zbv
bad schedule_zbv_pp1 - parallel.schedule 'zbv is a pipeline schedule: it needs pp > 1' "$good" --set parallel.schedule=zbv
# context parallelism: 2*cp chunks per sequence; no expert capacity; as the dry run, so the run itself
bad cp_divides_seq_len - parallel.cp '2\*cp = 6 does not divide train.seq_len 32' "$good" --set parallel.cp=3
DRY= bad cp_divides_seq_len_run - parallel.cp '2\*cp = 6 does not divide train.seq_len 32' "$good" --set parallel.cp=3
bad cp_capacity - parallel.cp 'with an expert capacity .* is not implemented yet' "$moe" --set parallel.cp=2 \
    --set model.moe_capacity_factor=1.25
# sequence parallelism splits a rank's seq_len / cp tokens
bad cp_sequence_parallel - parallel.sequence_parallel 'micro_batch \* seq_len / cp \(24\) divisible by tp 5' "$good" \
    --set parallel.cp=2 --set parallel.tp=5 --set model.num_heads=5 --set model.num_kv_heads=5 --set model.hidden_size=80 \
    --set parallel.sequence_parallel=true --set train.seq_len=24 --set model.vocab_size=260 --set model.intermediate_size=160
# expert tensor parallelism: etp divides the experts' width, and etp x ep the ranks of a stage
SLURM_NTASKS=2 bad moe_etp_ep_divide_stage_ranks 16 parallel.etp 'etp\*ep = 2\*2 = 4 does not divide the ranks of a pipeline stage, tp\*cp\*dp = 2' "$moe
parallel:
  etp: 2
" --set parallel.ep=2
bad moe_etp_divides_width 16 parallel.etp 'etp 3 does not divide the experts. width 128' "$moe
parallel:
  etp: 3
" --set model.intermediate_size=128
# the same refusals in a training run (not only the dry run)
DRY= bad moe_etp_divides_stage_ranks_run 16 parallel.etp 'etp\*ep = 2\*1 = 2 does not divide the ranks of a pipeline stage, tp\*cp\*dp = 1' "$moe
parallel:
  etp: 2
"
DRY= bad moe_etp_divides_width_run 16 parallel.etp 'etp 3 does not divide the experts. width 128' "$moe
parallel:
  etp: 3
" --set model.intermediate_size=128
bad moe_etp_dense 14 parallel.etp 'needs a mixture-of-experts model' "$good
parallel:
  etp: 2
"
bad moe_capacity_negative - model.moe_capacity_factor 'out of range|>= 0' "$moe" --set model.moe_capacity_factor=-1
# DeepSeek-V3's routing keys with softmax routing: refused by the dry run as by the run (they lived in the model)
for kv in moe_n_group=2 moe_routed_scaling=2.5 moe_bias_update_rate=1e-3 moe_seq_aux_loss_coef=1e-4; do
    bad moe_softmax_${kv%%=*} - model.${kv%%=*} 'belong to sigmoid routing' "$moe" --set model.$kv
done
# a short run of a tiny recipe (warmup_steps 20): the error says what to set
bad warmup_short_run - optimizer.warmup_steps 'set both, e.g. --set train.steps=5 --set optimizer.warmup_steps=1' \
    "$(cat "$TEST_ROOT/recipes/tiny-llama3.yaml")" --set train.steps=5 --set data.path="$DATA"
# the documented ep line without its micro batch: the error says which micro batch works
SLURM_NTASKS=2 "$MTRAIN" pretrain "$TEST_ROOT/recipes/tiny-mixtral.yaml" --set parallel.ep=2 --set data.path="$DATA" --dry-run \
    >"$TMP/out" 2>&1
[ $? = 2 ] && grep -q 'with 2 data-parallel ranks set train.micro_batch=4' "$TMP/out" && pass recipe_error_batch_split_says_fix ||
    fail recipe_error_batch_split_says_fix "$(head -c 300 "$TMP/out")"
bad log_dir_empty - log.dir 'log.dir is empty' "$good" --set log.dir=
bad moe_rows_headroom_below_one - model.moe_rows_headroom 'out of range|>= 1' "$moe" --set model.moe_rows_headroom=0.5
bad moe_ep_dense 14 parallel.ep 'needs a mixture-of-experts model' "$good
parallel:
  ep: 2
"
DRY= bad missing_data_path - data.path 'data.path is required' "${good%data:*}"
DRY= bad data_path_not_dir 11 data.path 'not a directory' "${good/path: $DATA/path: $TMP/afile}"
DRY= bad data_path_missing 11 data.path 'does not exist' "${good/path: $DATA/path: $TMP/nowhere}"

# -- --set overrides name the override --
bad set_unknown_key - train.stepz "did you mean 'train.steps'" "$good" --set train.stepz=5
bad set_bad_value - optimizer.lr 'set optimizer.lr=abc: .*expected a number' "$good" --set optimizer.lr=abc
bad set_cross_field 2 model.hidden_size 'model.num_heads set by --set' "$good" --set model.num_heads=5
bad set_not_utf8 - data.path 'not valid UTF-8' "$good" --set data.path=$'caf\xe9'
bad set_blend_not_utf8 - data.blend 'not valid UTF-8' "$good" --set data.blend=$'caf\xe9:1'
# a MoE token exchange past MPI's int counts (32768 tokens x 8 experts x hidden 8192 = 2^31 elements to one rank)
bad moe_exchange_count - train.micro_batch 'elements a MoE layer may send one rank, more than 2147483647' \
    "model: {arch: mixtral, vocab_size: 256, hidden_size: 8192, num_layers: 1, num_heads: 64, num_kv_heads: 8, intermediate_size: 64, num_experts: 8, experts_per_token: 8, moe_intermediate_size: 64}
train: {seq_len: 8192, micro_batch: 4, global_batch: 4, steps: 1}
data: {path: $DATA}
"

# -- a good recipe passes; a good --set is applied --
printf '%s' "$good" >"$TMP/good.yaml"
expect_exit recipe_good_dry_run 0 "$MTRAIN" pretrain "$TMP/good.yaml" --dry-run
expect_exit recipe_good_set_dry_run 0 "$MTRAIN" pretrain "$TMP/good.yaml" --set optimizer.lr=1e-3 --dry-run
exit $FAILED
