# Pipeline schedules (parallel.schedule) under mpiexec: zb-h1 (zero
# bubble's ZB-H1: each backward split into the input gradient, B, and the
# weight gradients, W, run later) trains the same model as one rank for
# dense Llama, Mixtral and DeepSeek-V3 with MTP at pp 2 and 4, with tp + SP,
# ZeRO-1's overlapped buckets (reduced after each layer's last W), expert
# parallelism and each recompute mode: every step's loss and the final
# parameters within 1e-5; at pp 2 it equals 1f1b bitwise (the same gradient
# sums in the same order), in fp32 and bf16. Checkpoints move between
# schedules (1f1b -> zb-h1 bitwise, zb-h1 -> interleaved within 1e-5). Each
# rank runs its items in the order the dry run prints (the traced step's
# forward / backward / weights spans), and the dry run's in-flight counts
# are zb-h1's (pp on every stage). The bubble and memory against 1f1b are
# measured by scripts/bench/pipeline_schedules.sh (timings: not a test).
# zbv (ZB-V: two chunks per rank in a V, vpp 2, buffered sends) likewise
# equals one rank for the three families at pp 2 and 4, with tp + SP and tied
# embeddings (rank 0 holds both ends), ZeRO-1 buckets, expert parallelism and
# each recompute mode, and checkpoints move between it and 1f1b. In FP8
# (every block): zb-h1 equals 1f1b bitwise; zbv (DeepSeek-V3 + MTP, delayed
# scaling) and dualpipev (Mixtral, ep 2, block scaling) equal one FP8 rank.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail sched_setup "data generate failed"; exit 1; }
# the precision tests' recipes (tests/lib.sh) at micro_batch 1: 8 micro batches per step at dp 1 (4 at dp 2)
family_recipes fp32
sed -i 's/micro_batch: 2/micro_batch: 1/' r.yaml moe.yaml deepseek.yaml
for fam in r moe deepseek; do
    "$MTRAIN" pretrain $fam.yaml --set log.dir=ref_$fam --set checkpoint.dir=ck_ref_$fam >/dev/null 2>&1 ||
        fail sched_${fam}_reference_run "exit $?"
done

# recipe name ranks key=value...: zb-h1 against one rank
layouts=(
    "r zb_pp2 2 parallel.pp=2" "r zb_pp4_selective 4 parallel.pp=4 train.recompute=selective"
    "r zb_pp2_tp2_sp 4 parallel.pp=2 parallel.tp=2 parallel.sequence_parallel=true"
    "r zb_pp2_dp2_zero_buckets 4 parallel.pp=2 optimizer.distributed=true parallel.grad_bucket_mb=0.001"
    "moe zb_pp2_ep2 4 parallel.pp=2 parallel.ep=2" "moe zb_pp2_full 2 parallel.pp=2 train.recompute=full"
    "moe zb_pp4 4 parallel.pp=4"
    "deepseek zb_pp2_mtp 2 parallel.pp=2" "deepseek zb_pp4_mtp 4 parallel.pp=4"
    "deepseek zb_pp2_ep2_mtp_selective 4 parallel.pp=2 parallel.ep=2 train.recompute=selective"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    fam=$1 name=$2 np=$3
    shift 3
    layout_matches sched_$name $np $fam.yaml ref_$fam $name parallel.schedule=zb-h1 "$@"
done

# zbv (two chunks per rank in a V, vpp 2) against one rank: pp 2 on the 4-layer recipes, pp 4 on 8 layers
for fam in r moe deepseek; do
    "$MTRAIN" pretrain $fam.yaml --set model.num_layers=8 --set log.dir=ref8_$fam --set checkpoint.dir=ck_ref8_$fam \
        >/dev/null 2>&1 || fail sched_${fam}_reference_8_layers "exit $?"
done
"$MTRAIN" pretrain r.yaml --set model.tie_embeddings=true --set log.dir=ref_tied --set checkpoint.dir=ck_ref_tied \
    >/dev/null 2>&1 || fail sched_tied_reference_run "exit $?"
# recipe reference name ranks key=value...
zbv_layouts=(
    "r ref_r zbv_pp2 2 parallel.pp=2" "r ref8_r zbv_pp4 4 parallel.pp=4 model.num_layers=8"
    "r ref_tied zbv_pp2_tp2_sp_tied 4 parallel.pp=2 parallel.tp=2 parallel.sequence_parallel=true model.tie_embeddings=true"
    "r ref_r zbv_pp2_dp2_zero_buckets 4 parallel.pp=2 optimizer.distributed=true parallel.grad_bucket_mb=0.001"
    "moe ref_moe zbv_pp2_ep2 4 parallel.pp=2 parallel.ep=2" "moe ref_moe zbv_pp2_full 2 parallel.pp=2 train.recompute=full"
    "moe ref8_moe zbv_pp4_moe 4 parallel.pp=4 model.num_layers=8"
    "deepseek ref_deepseek zbv_pp2_ep2_mtp_selective 4 parallel.pp=2 parallel.ep=2 train.recompute=selective"
    "deepseek ref8_deepseek zbv_pp4_mtp 4 parallel.pp=4 model.num_layers=8"
)
for spec in "${zbv_layouts[@]}"; do
    set -- $spec
    fam=$1 ref=$2 name=$3 np=$4
    shift 4
    layout_matches sched_$name $np $fam.yaml $ref $name parallel.schedule=zbv parallel.vpp=2 "$@"
done

# zbv's order is made again after the first step for the measured F, B and W times, but each chunk's items
# keep micro-batch order: every gradient sums in one rank's order, so pp 2 is bitwise one rank's run
[ "$(metric ref_r/metrics.jsonl loss)" = "$(metric zbv_pp2/metrics.jsonl loss)" ] &&
    "$PY" "$COMPARE" ck_ref_r/step-000000020 ck_zbv_pp2/step-000000020 0 >"$TMP/cmp" 2>&1 &&
    pass sched_zbv_equals_one_rank_bitwise || fail sched_zbv_equals_one_rank_bitwise "$(cat "$TMP/cmp")"

# zb-h1 runs 1f1b's gradient sums in 1f1b's order: bitwise the same run (fp32, bf16, and fp8: its deferred Ws
# cast their operands as the whole backward's weight-gradient GEMMs do)
for precision in fp32 bf16 fp8; do
    for schedule in 1f1b zb-h1; do
        run_np 2 pretrain r.yaml --set parallel.pp=2 --set parallel.schedule=$schedule --set train.precision=$precision \
            --set log.dir=${schedule}_$precision --set checkpoint.dir=ck_${schedule}_$precision >"$TMP/out" 2>&1 ||
            fail sched_${schedule}_${precision}_runs "exit $?: $(tail -2 "$TMP/out")"
    done
    [ "$(metric 1f1b_$precision/metrics.jsonl loss)" = "$(metric zb-h1_$precision/metrics.jsonl loss)" ] &&
        "$PY" "$COMPARE" ck_1f1b_$precision/step-000000020 ck_zb-h1_$precision/step-000000020 0 >"$TMP/cmp" 2>&1 &&
        pass sched_zb_h1_equals_1f1b_bitwise_$precision ||
        fail sched_zb_h1_equals_1f1b_bitwise_$precision "$(worst_metric 1f1b_$precision/metrics.jsonl zb-h1_$precision/metrics.jsonl 1) $(cat "$TMP/cmp")"
done

# the V schedules in FP8 against one FP8 rank: DeepSeek-V3 with MTP under delayed scaling (zbv), Mixtral with
# expert parallelism under block scaling (dualpipev: its pairs run one micro batch's forward beside another's
# backward); every block in FP8
for spec in "deepseek zbv 2 delayed" "moe dualpipev 4 block parallel.ep=2"; do
    set -- $spec
    fam=$1 sched=$2 np=$3 scaling=$4
    shift 4
    fp8=(train.precision=fp8 train.fp8_scaling=$scaling train.fp8_skip_layers=0)
    "$MTRAIN" pretrain $fam.yaml $(printf -- '--set %s ' "${fp8[@]}") --set log.dir=ref_fp8_$fam \
        --set checkpoint.dir=ck_ref_fp8_$fam >/dev/null 2>&1 || fail sched_${fam}_fp8_reference_run "exit $?"
    layout_matches sched_${sched}_${fam}_fp8_$scaling $np $fam.yaml ref_fp8_$fam ${sched}_fp8_$fam \
        parallel.schedule=$sched parallel.pp=2 parallel.vpp=2 "${fp8[@]}" "$@"
done

# checkpoints between schedules: 1f1b saves at step 10, zb-h1 resumes (bitwise the uninterrupted 1f1b run);
# zb-h1 saves, interleaved (vpp 2) resumes (within 1e-5)
for spec in "1f1b zb-h1 1 0" "zb-h1 interleaved 2 1e-5" "1f1b zbv 2 1e-5" "zbv 1f1b 1 1e-5"; do
    set -- $spec
    from=$1 to=$2 vpp=$3 tol=$4 dir=ck_${1}_to_$2 from_vpp=1
    [ $from = zbv ] && from_vpp=2
    run_np 2 pretrain r.yaml --set parallel.pp=2 --set parallel.schedule=$from --set parallel.vpp=$from_vpp \
        --set checkpoint.dir=$dir --set checkpoint.interval=10 --set log.dir=${from}_to_$to --stop-after 10 >/dev/null 2>&1
    run_np 2 pretrain r.yaml --set parallel.pp=2 --set parallel.schedule=$to --set parallel.vpp=$vpp \
        --set checkpoint.dir=$dir --set log.dir=${from}_to_$to >"$TMP/out" 2>&1
    grep -q "resumed from $dir/step-000000010" "$TMP/out" &&
        "$PY" "$COMPARE" ck_1f1b_fp32/step-000000020 $dir/step-000000020 $tol >"$TMP/cmp" 2>&1 &&
        pass sched_resume_${from}_to_$to || fail sched_resume_${from}_to_$to "$(grep -E 'resumed|error' "$TMP/out" | head -2) $(cat "$TMP/cmp")"
done

# each rank runs the dry run's order: the traced step's compute spans, F/B/W and micro batch, as printed
SLURM_NTASKS=4 "$MTRAIN" pretrain r.yaml --set parallel.pp=4 --set parallel.schedule=zb-h1 --dry-run --verbose >dry.out 2>&1
MTRAIN_TIMELINE=3 run_np 4 pretrain r.yaml --set parallel.pp=4 --set parallel.schedule=zb-h1 --set train.steps=3 \
    --set log.dir=order --set checkpoint.dir=ck_order >"$TMP/out" 2>&1 || fail sched_order_run "exit $?: $(tail -2 "$TMP/out")"
bad=""
for r in 0 1 2 3; do
    want=$(sed -n "s/^pipeline rank $r: //p" dry.out | tr ' ' '\n' | sed 's/\.0$//')
    got=$("$PY" -c "
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('cat') == 'compute' and e['name'] in ('forward', 'backward', 'weights')]
ev.sort(key=lambda e: e['ts'])
print('\n'.join({'forward': 'F', 'backward': 'B', 'weights': 'W'}[e['name']] + str(e['args']['micro_batch']) for e in ev))" \
        "$(printf 'order/timeline-rank-%05d.json' $r)" 2>&1)
    [ -n "$want" ] && [ "$want" = "$got" ] || bad+=" rank $r: $(echo $got | head -c 80) / want $(echo $want | head -c 80)"
done
[ -z "$bad" ] && pass sched_zb_h1_timeline_order || fail sched_zb_h1_timeline_order "$bad"
# zbv's first step runs the order the dry run prints (made for equal costs; later steps' for the measured ones)
SLURM_NTASKS=2 "$MTRAIN" pretrain r.yaml --set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=zbv --dry-run \
    --verbose >dryv.out 2>&1
MTRAIN_TIMELINE=1 run_np 2 pretrain r.yaml --set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=zbv \
    --set train.steps=3 --set log.dir=orderv --set checkpoint.dir=ck_orderv >"$TMP/out" 2>&1 ||
    fail sched_zbv_order_run "exit $?: $(tail -2 "$TMP/out")"
bad=""
for r in 0 1; do
    want=$(sed -n "s/^pipeline rank $r: //p" dryv.out | tr ' ' '\n')
    got=$("$PY" -c "
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('cat') == 'compute' and e['name'] in ('forward', 'backward', 'weights')]
ev.sort(key=lambda e: e['ts'])
print('\n'.join('%s%d.%d' % ({'forward': 'F', 'backward': 'B', 'weights': 'W'}[e['name']], e['args']['micro_batch'], e['args']['chunk']) for e in ev))" \
        "$(printf 'orderv/timeline-rank-%05d.json' $r)" 2>&1)
    [ -n "$want" ] && [ "$want" = "$got" ] || bad+=" rank $r: $(echo $got | head -c 80) / want $(echo $want | head -c 80)"
done
[ -z "$bad" ] && pass sched_zbv_timeline_order || fail sched_zbv_timeline_order "$bad"
# its dry run says when pp does not divide the micro batches (a partial last group idles more), and not otherwise
SLURM_NTASKS=2 "$MTRAIN" pretrain r.yaml --set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=zbv \
    --set train.global_batch=7 --dry-run >dry7.out 2>&1
grep -q 'hint: pp 2 does not divide the 7 micro batches' dry7.out && ! grep -q 'hint:' dryv.out &&
    pass sched_zbv_dry_run_hint || fail sched_zbv_dry_run_hint "$(grep -E 'idle|hint|error' dry7.out | head -3)"
# the dry run: every stage holds pp micro batches (1f1b: pp - stage), the idle time a third of 1f1b's
[ "$(grep -c 'up to 4 micro batches in flight' dry.out)" = 4 ] && grep -q 'idle time 0.33x 1f1b' dry.out &&
    pass sched_zb_h1_dry_run || fail sched_zb_h1_dry_run "$(grep -E 'in flight|idle' dry.out | head -5)"
exit $FAILED
