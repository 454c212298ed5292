# The dualpipev schedule (DeepSeek's DualPipeV: two chunks per rank in a V,
# vpp 2, DualPipe's phases, steady forward&backward pairs of two micro
# batches run as one unit) under mpiexec: it trains the same model as one
# rank for dense Llama, Mixtral and DeepSeek-V3 with MTP at pp 2 and 4, with
# tp + SP and tied embeddings, ZeRO-1's buckets, expert (and expert tensor)
# parallelism, context parallelism (Mixtral) and each recompute mode: every
# step's loss and the final
# parameters within 1e-5; bitwise one rank's at pp 2, and bitwise zbv's
# (the same gradient sums in the same order) with expert parallelism in
# bf16, where its pairs overlap the all-to-alls. Checkpoints move between it
# and 1f1b / zbv. Each rank runs the dry run's order (pairs traced as one
# span); in the pairs one micro batch's expert all-to-all is under way while
# the other's next step begins its own (the timeline's spans on the ep group
# overlap; never under zbv). Too few micro batches (< 2pp) exit 2.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail dualpipev_setup "data generate failed"; exit 1; }
# the precision tests' recipes (tests/lib.sh) at micro_batch 1: 8 micro batches per step at dp 1 (4 at dp 2)
family_recipes fp32
sed -i 's/micro_batch: 2/micro_batch: 1/' r.yaml moe.yaml deepseek.yaml
for fam in r moe deepseek; do
    "$MTRAIN" pretrain $fam.yaml --set log.dir=ref_$fam --set checkpoint.dir=ck_ref_$fam >/dev/null 2>&1 ||
        fail dualpipev_${fam}_reference_run "exit $?"
done
for fam in r moe deepseek; do
    "$MTRAIN" pretrain $fam.yaml --set model.num_layers=8 --set log.dir=ref8_$fam --set checkpoint.dir=ck_ref8_$fam \
        >/dev/null 2>&1 || fail dualpipev_${fam}_reference_8_layers "exit $?"
done
"$MTRAIN" pretrain r.yaml --set model.tie_embeddings=true --set log.dir=ref_tied --set checkpoint.dir=ck_ref_tied \
    >/dev/null 2>&1 || fail dualpipev_tied_reference_run "exit $?"

# recipe reference name ranks key=value...: against one rank (pp 2 on the 4-layer recipes, pp 4 on 8 layers)
layouts=(
    "r ref_r dv_pp2 2 parallel.pp=2" "r ref8_r dv_pp4 4 parallel.pp=4 model.num_layers=8"
    "r ref_tied dv_pp2_tp2_sp_tied 4 parallel.pp=2 parallel.tp=2 parallel.sequence_parallel=true model.tie_embeddings=true"
    "r ref_r dv_pp2_dp2_zero_buckets 4 parallel.pp=2 optimizer.distributed=true parallel.grad_bucket_mb=0.001"
    "moe ref_moe dv_pp2_ep2 4 parallel.pp=2 parallel.ep=2" "moe ref_moe dv_pp2_ep2_full 4 parallel.pp=2 parallel.ep=2 train.recompute=full"
    "moe ref_moe dv_pp2_tp2_etp2_sp 4 parallel.pp=2 parallel.tp=2 parallel.etp=2 parallel.sequence_parallel=true"
    "moe ref8_moe dv_pp4_moe 4 parallel.pp=4 model.num_layers=8"
    "moe ref_moe dv_pp2_cp2_ep2 4 parallel.pp=2 parallel.cp=2 parallel.ep=2"
    "deepseek ref_deepseek dv_pp2_ep2_mtp_selective 4 parallel.pp=2 parallel.ep=2 train.recompute=selective"
    "deepseek ref8_deepseek dv_pp4_mtp 4 parallel.pp=4 model.num_layers=8"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    fam=$1 ref=$2 name=$3 np=$4
    shift 4
    layout_matches dualpipev_$name $np $fam.yaml $ref $name parallel.schedule=dualpipev parallel.vpp=2 "$@"
done

# each chunk's items run in micro-batch order: every gradient sums in one rank's order, so pp 2 is bitwise
[ "$(metric ref_r/metrics.jsonl loss)" = "$(metric dv_pp2/metrics.jsonl loss)" ] &&
    "$PY" "$COMPARE" ck_ref_r/step-000000020 ck_dv_pp2/step-000000020 0 >"$TMP/cmp" 2>&1 &&
    pass dualpipev_equals_one_rank_bitwise || fail dualpipev_equals_one_rank_bitwise "$(cat "$TMP/cmp")"

# with expert parallelism in bf16, its overlapped pairs run zbv's sums in zbv's order: bitwise zbv's run; the
# traced step shows the pairs' all-to-alls under way together (never zbv's)
for schedule in zbv dualpipev; do
    MTRAIN_TIMELINE=3 run_np 4 pretrain moe.yaml --set parallel.pp=2 --set parallel.vpp=2 --set parallel.ep=2 \
        --set parallel.schedule=$schedule --set train.precision=bf16 --set log.dir=${schedule}_bf16 \
        --set checkpoint.dir=ck_${schedule}_bf16 >"$TMP/out" 2>&1 ||
        fail dualpipev_${schedule}_bf16_runs "exit $?: $(tail -2 "$TMP/out")"
done
[ "$(metric zbv_bf16/metrics.jsonl loss)" = "$(metric dualpipev_bf16/metrics.jsonl loss)" ] &&
    "$PY" "$COMPARE" ck_zbv_bf16/step-000000020 ck_dualpipev_bf16/step-000000020 0 >"$TMP/cmp" 2>&1 &&
    pass dualpipev_equals_zbv_bitwise_bf16_ep2 ||
    fail dualpipev_equals_zbv_bitwise_bf16_ep2 "$(worst_metric zbv_bf16/metrics.jsonl dualpipev_bf16/metrics.jsonl 1) $(cat "$TMP/cmp")"
overlaps() { # started all-to-alls on the ep group whose span holds the beginning of another ep all-to-all
    "$PY" -c "
import json, sys
ev = json.load(open(sys.argv[1]))['traceEvents']
begin = {e['id']: e['ts'] for e in ev if e.get('ph') == 'b' and e['name'] == 'all_to_all_v_start' and e['args']['group'] == 'ep'}
spans = [(begin[e['id']], e['ts']) for e in ev if e.get('ph') == 'e' and e['id'] in begin]
starts = [e['ts'] for e in ev if e.get('name', '').startswith('all_to_all') and e.get('ph') in ('b', 'X')
          and e['args']['group'] == 'ep']
print(sum(1 for a, b in spans if any(a < t < b for t in starts)), len(spans))" "$1"
}
set -- $(overlaps dualpipev_bf16/timeline-rank-00000.json) $(overlaps zbv_bf16/timeline-rank-00000.json)
[ "${1:-0}" -gt 0 ] && [ "${3:-1}" = 0 ] && pass dualpipev_pairs_overlap_all_to_alls ||
    fail dualpipev_pairs_overlap_all_to_alls "dualpipev: $1 of $2 started all-to-alls overlap another; zbv: $3 of $4"

# checkpoints between schedules: 1f1b saves at step 10, dualpipev resumes; dualpipev saves, zbv resumes
run_np 2 pretrain r.yaml --set parallel.pp=2 --set log.dir=one_f1b --set checkpoint.dir=ck_one_f1b >/dev/null 2>&1 ||
    fail dualpipev_1f1b_run "exit $?"
for spec in "1f1b 1 dualpipev 2" "dualpipev 2 zbv 2"; do
    set -- $spec
    from=$1 from_vpp=$2 to=$3 vpp=$4 dir=ck_${1}_to_$3
    run_np 2 pretrain r.yaml --set parallel.pp=2 --set parallel.schedule=$from --set parallel.vpp=$from_vpp \
        --set checkpoint.dir=$dir --set checkpoint.interval=10 --set log.dir=${from}_to_$to --stop-after 10 >/dev/null 2>&1
    run_np 2 pretrain r.yaml --set parallel.pp=2 --set parallel.schedule=$to --set parallel.vpp=$vpp \
        --set checkpoint.dir=$dir --set log.dir=${from}_to_$to >"$TMP/out" 2>&1
    grep -q "resumed from $dir/step-000000010" "$TMP/out" &&
        "$PY" "$COMPARE" ck_one_f1b/step-000000020 $dir/step-000000020 1e-5 >"$TMP/cmp" 2>&1 &&
        pass dualpipev_resume_${from}_to_$to || fail dualpipev_resume_${from}_to_$to "$(grep -E 'resumed|error' "$TMP/out" | head -2) $(cat "$TMP/cmp")"
done

# each rank runs the dry run's order (a pair "F3.0+B1.1" is one span: its forward's micro batch and chunk)
SLURM_NTASKS=4 "$MTRAIN" pretrain r.yaml --set parallel.pp=4 --set parallel.vpp=2 --set model.num_layers=8 \
    --set parallel.schedule=dualpipev --dry-run --verbose >dry.out 2>&1
MTRAIN_TIMELINE=2 run_np 4 pretrain r.yaml --set parallel.pp=4 --set parallel.vpp=2 --set model.num_layers=8 \
    --set parallel.schedule=dualpipev --set train.steps=3 --set log.dir=order --set checkpoint.dir=ck_order \
    >"$TMP/out" 2>&1 || fail dualpipev_order_run "exit $?: $(tail -2 "$TMP/out")"
bad=""
for r in 0 1 2 3; do
    want=$(sed -n "s/^pipeline rank $r: //p" dry.out | tr ' ' '\n' | sed 's/+B.*/+B/')
    got=$("$PY" -c "
import json, sys
names = {'forward': 'F%d.%d', 'backward': 'B%d.%d', 'weights': 'W%d.%d', 'forward+backward': 'F%d.%d+B'}
ev = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('cat') == 'compute' and e['name'] in names]
ev.sort(key=lambda e: e['ts'])
print('\n'.join(names[e['name']] % (e['args']['micro_batch'], e['args']['chunk']) for e in ev))" \
        "$(printf 'order/timeline-rank-%05d.json' $r)" 2>&1)
    [ -n "$want" ] && [ "$want" = "$got" ] || bad+=" rank $r: $(echo $got | head -c 80) / want $(echo $want | head -c 80)"
done
[ -z "$bad" ] && pass dualpipev_timeline_order || fail dualpipev_timeline_order "$bad"
# the dry run names the pairs and the idle time; fewer than 2pp micro batches exit 2 with one message
grep -q 'forward&backward pairs overlapped' dry.out && grep -q 'idle time 0.17x 1f1b' dry.out &&
    pass dualpipev_dry_run || fail dualpipev_dry_run "$(grep -E 'pairs|idle' dry.out | head -3)"
SLURM_NTASKS=4 "$MTRAIN" pretrain r.yaml --set parallel.pp=4 --set parallel.vpp=2 --set model.num_layers=8 \
    --set parallel.schedule=dualpipev --set train.global_batch=4 --dry-run >few.out 2>&1
rc=$?
[ $rc = 2 ] && grep -q 'needs at least 2 x pp = 8 micro batches' few.out && pass dualpipev_too_few_micro_batches ||
    fail dualpipev_too_few_micro_batches "exit $rc: $(tail -1 few.out)"
exit $FAILED
