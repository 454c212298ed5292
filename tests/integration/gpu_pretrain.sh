# The CUDA backend end to end on a tiny Llama: the same losses as the CPU
# backend, bitwise repeatable, checkpoints that move between CPU and GPU;
# the same for bf16 (train.precision) against the CPU's fp32 and bf16 runs,
# and fp8 against the CPU's fp8 run and, on real text, the GPU's bf16 run.
# Skipped where no GPU is visible (or the build has no CUDA backend).
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CHECK_TL=$ROOT/tests/integration/check_timeline.py
cd "$TMP"
CHECKS="gpu_pretrain_runs gpu_pretrain_device_line gpu_mfu_and_memory gpu_matches_cpu gpu_eval_matches_cpu gpu_deterministic
gpu_resume_bitwise gpu_checkpoint_resumes_on_cpu gpu_tf32_close gpu_zero_single_rank gpu_layout_tp2_sp gpu_layout_pp2
gpu_layout_dp2_zero gpu_layout_tp2_pp2 gpu_mixtral_matches_cpu gpu_mixtral_deterministic gpu_mixtral_grouped_expert_gemms
gpu_mixtral_layout_ep2_tp2 gpu_deepseek_matches_cpu gpu_deepseek_mtp_matches_cpu gpu_deepseek_deterministic
gpu_deepseek_grouped_expert_gemms gpu_deepseek_layout_tp2_ep2
gpu_generate_matches_cpu gpu_generate_deepseek_matches_cpu gpu_eval_split_matches_cpu gpu_bf16_runs gpu_bf16_device_line gpu_bf16_tracks_cpu_fp32
gpu_bf16_close_to_cpu_bf16 gpu_bf16_deterministic gpu_bf16_resume_bitwise gpu_bf16_checkpoint_resumes_on_cpu
gpu_fp8_runs gpu_fp8_close_to_cpu_fp8 gpu_fp8_deterministic gpu_fp8_delayed_close_to_cpu gpu_fp8_delayed_resume_bitwise
gpu_fp8_real_text_within_1_5pct_of_bf16
gpu_nccl_single_rank_bitwise gpu_nccl_shared_gpu_refused
gpu_nccl_layout_tp2_sp gpu_timeline_device_clock gpu_timeline_staged_dp2 gpu_nccl_overlap_timeline"
"$MTRAIN" data generate --out data --docs 400 --frame-tokens 4096 >/dev/null || { fail gpu_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 264, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 160}
train: {seq_len: 64, micro_batch: 4, global_batch: 8, steps: 40, eval_interval: 20, eval_batches: 2, seed: 7, device: cuda}
# eps 1e-4: with 1e-8 Adam's first steps move near-zero-gradient weights by
# ~lr, turning fp32 summation-order noise into visible parameter differences
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data, valid_fraction: 0.1}
checkpoint: {dir: ck, interval: 10}
log: {dir: run, interval: 1}
YAML
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
val() { grep '"val_loss"' "$1" | sed 's/.*"val_loss":\([^,}]*\).*/\1/'; }
# a check whose run failed is not judged again on the files it left (one FAIL a check)
failed_names=" "
fail() { echo "FAIL $1: ${2:-}"; FAILED=1; failed_names+="$1 "; }
# close NAME FILE_A FILE_B TOL [LINES]: every line's relative difference <= TOL
# (a failure names the line count and the worst line)
close() {
    [[ $failed_names == *" $1 "* ]] && return 0
    local why
    why=$(paste <(cat "$2") <(cat "$3") | awk -v tol="$4" -v want="${5:-0}" \
        'BEGIN{n=0; w=-1} {n++; d=$1-$2; if (d<0) d=-d; r=d/$2; if (r>w) {w=r; wl=n; a=$1; b=$2}}
         END{if (n>0 && (want==0 || n==want) && w<=tol) exit 0;
             printf "%d lines (want %d); worst line %d: %s vs %s, relative %.3g (tol %s)", n, want, wl, a, b, w, tol; exit 1}')
    if [ $? = 0 ]; then pass "$1"; else fail "$1" "$why"; fi
}

"$MTRAIN" pretrain r.yaml --set train.steps=1 --set optimizer.warmup_steps=0 --set log.dir=probe \
    --set checkpoint.dir=probe_ck >"$TMP/out" 2>&1
if grep -qE 'no CUDA device|no CUDA backend' "$TMP/out"; then
    why=$(grep -oE 'no CUDA (device|backend)[^;(]*' "$TMP/out" | head -1)
    for c in $CHECKS; do skip "$c" "$why"; done
    exit 0
fi

"$MTRAIN" pretrain r.yaml --set checkpoint.dir=g_ck --set log.dir=g >"$TMP/out" 2>&1
rc=$?
[ $rc = 0 ] && pass gpu_pretrain_runs || fail gpu_pretrain_runs "exit $rc: $(tail -3 "$TMP/out")"
expect_output gpu_pretrain_device_line '\| device cuda fp32 \|'
expect_output gpu_mfu_and_memory 'mfu [0-9.]+% \| mem [0-9]+ MiB'
"$MTRAIN" pretrain r.yaml --set train.device=cpu --set checkpoint.dir=c_ck --set log.dir=c >/dev/null 2>&1 ||
    fail gpu_cpu_reference "CPU run failed"
losses g/metrics.jsonl >g.loss; losses c/metrics.jsonl >c.loss
close gpu_matches_cpu g.loss c.loss 1e-4 40
val g/metrics.jsonl >g.val; val c/metrics.jsonl >c.val
close gpu_eval_matches_cpu g.val c.val 1e-4 2

# no atomics anywhere: the same bits every run
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=g2_ck --set log.dir=g2 >/dev/null 2>&1
[ "$(losses g2/metrics.jsonl)" = "$(cat g.loss)" ] && pass gpu_deterministic || fail gpu_deterministic "loss sequences differ"

# stop at 20 and resume on the GPU: bitwise the uninterrupted run
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=s_ck --set log.dir=s --stop-after 20 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=s_ck --set log.dir=s >"$TMP/out" 2>&1
[ "$(losses s/metrics.jsonl)" = "$(cat g.loss)" ] && pass gpu_resume_bitwise ||
    fail gpu_resume_bitwise "$(tail -2 "$TMP/out")"

# a GPU checkpoint resumed on the CPU tracks the CPU run
"$MTRAIN" pretrain r.yaml --set checkpoint.dir=x_ck --set log.dir=x --stop-after 20 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml --set train.device=cpu --set checkpoint.dir=x_ck --set log.dir=x >"$TMP/out" 2>&1
losses x/metrics.jsonl >x.loss
close gpu_checkpoint_resumes_on_cpu x.loss c.loss 1e-4 40

# TF32 tensor cores: close to fp32, not equal
"$MTRAIN" pretrain r.yaml --set train.tf32=true --set checkpoint.dir=t_ck --set log.dir=t >/dev/null 2>&1
losses t/metrics.jsonl >t.loss
close gpu_tf32_close t.loss c.loss 2e-2 40

# ZeRO-1 on one rank (the optimizer's gather is a device copy)
"$MTRAIN" pretrain r.yaml --set optimizer.distributed=true --set checkpoint.dir=z_ck --set log.dir=z >/dev/null 2>&1
losses z/metrics.jsonl >z.loss
close gpu_zero_single_rank z.loss g.loss 1e-6 40

# parallel layouts on GPU ranks (here several ranks share one GPU): the
# single-GPU run's losses, through host-staged MPI
layout() {  # NAME NP SETTINGS...
    local name=$1 np=$2; shift 2
    local sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    if ! command -v mpiexec >/dev/null; then skip "$name" "no mpiexec on this machine"; return; fi
    OMP_NUM_THREADS=1 mpiexec -n "$np" "$MTRAIN" pretrain r.yaml "${sets[@]}" --set train.steps=20 \
        --set checkpoint.dir="$name"_ck --set log.dir="$name" >"$TMP/out" 2>&1 || { fail "$name" "exit $?: $(tail -2 "$TMP/out")"; return; }
    losses "$name"/metrics.jsonl >"$name".loss
    close "$name" "$name".loss g20.loss 1e-5 20
}
"$MTRAIN" pretrain r.yaml --set train.steps=20 --set checkpoint.dir=g20_ck --set log.dir=g20 >/dev/null 2>&1
losses g20/metrics.jsonl >g20.loss
layout gpu_layout_tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
layout gpu_layout_pp2 2 parallel.pp=2 train.micro_batch=2
layout gpu_layout_dp2_zero 2 optimizer.distributed=true
layout gpu_layout_tp2_pp2 4 parallel.tp=2 parallel.pp=2 train.micro_batch=2

# NCCL (parallel.comm, docs/parallelism.md): one rank with nccl is bitwise the
# run above (one rank has no communicator either way); two ranks with nccl
# either share this machine's one GPU, and stop with exit 2 and one message,
# or have a GPU each, and their tp2 + SP run matches one GPU over NCCL
"$MTRAIN" pretrain r.yaml --set train.steps=20 --set parallel.comm=nccl --set checkpoint.dir=n1_ck --set log.dir=n1 \
    >"$TMP/out" 2>&1
rc=$?
if [ $rc = 0 ]; then
    losses n1/metrics.jsonl >n1.loss
    [ "$(cat n1.loss)" = "$(cat g20.loss)" ] && pass gpu_nccl_single_rank_bitwise ||
        fail gpu_nccl_single_rank_bitwise "losses differ from parallel.comm auto"
    if command -v mpiexec >/dev/null; then
        OMP_NUM_THREADS=1 mpiexec -n 2 "$MTRAIN" pretrain r.yaml --set parallel.tp=2 --set parallel.sequence_parallel=true \
            --set parallel.comm=nccl --set train.steps=20 --set checkpoint.dir=n2_ck --set log.dir=n2 >"$TMP/out" 2>&1
        rc=$?
        if [ $rc = 2 ] && grep -q 'same GPU' "$TMP/out"; then
            [ "$(grep -c 'parallel.comm nccl' "$TMP/out")" = 1 ] && pass gpu_nccl_shared_gpu_refused ||
                fail gpu_nccl_shared_gpu_refused "not one message: $(cat "$TMP/out")"
            skip gpu_nccl_layout_tp2_sp "the two ranks share one GPU here"
        elif [ $rc = 0 ]; then
            own_gpus=1
            skip gpu_nccl_shared_gpu_refused "each rank has a GPU of its own here"
            losses n2/metrics.jsonl >n2.loss
            if grep -q '"comm":"nccl"' n2/metrics.jsonl; then close gpu_nccl_layout_tp2_sp n2.loss g20.loss 1e-5 20
            else fail gpu_nccl_layout_tp2_sp "the run did not use NCCL"; fi
        else
            fail gpu_nccl_layout_tp2_sp "exit $rc: $(tail -3 "$TMP/out")"
            skip gpu_nccl_shared_gpu_refused "the two-rank run failed"
        fi
    else
        for c in gpu_nccl_shared_gpu_refused gpu_nccl_layout_tp2_sp; do skip $c "no mpiexec on this machine"; done
    fi
elif grep -q "libnccl.so.2 not found" "$TMP/out"; then
    for c in gpu_nccl_single_rank_bitwise gpu_nccl_shared_gpu_refused gpu_nccl_layout_tp2_sp; do
        skip $c "libnccl.so.2 not on the library path (pip's nvidia-nccl: add its lib directory to LD_LIBRARY_PATH)"
    done
else
    fail gpu_nccl_single_rank_bitwise "exit $rc: $(tail -2 "$TMP/out")"
fi

# MTRAIN_TIMELINE (parallel/timeline.h) on the device's clock: one GPU (tracing changes no loss), two ranks
# sharing it through staged MPI (blocking: nothing overlaps there), and, where each rank has a GPU of its own,
# data parallelism over NCCL whose gradient buckets must begin while backward runs (the overlap's timeline;
# its summary line goes to the test's output)
check_tl() { # CHECK FILES FLAGS...: check_timeline.py on each of FILES (a glob)
    local name=$1 files=$2 f out="" n=0
    shift 2
    for f in $files; do
        n=$((n + 1))
        out+=$("$PY" "$CHECK_TL" "$f" "$@" 2>&1) || out+=" ($f)"
    done
    [ $n -gt 0 ] && [ -z "$out" ] && pass "$name" || fail "$name" "${out:-no timeline file}"
}
MTRAIN_TIMELINE=5 "$MTRAIN" pretrain r.yaml --set train.steps=20 --set checkpoint.dir=tl_ck --set log.dir=tl >"$TMP/out" 2>&1
if [ "$(losses tl/metrics.jsonl)" = "$(cat g20.loss)" ]; then check_tl gpu_timeline_device_clock "tl/timeline-rank-*.json" --clock device --lanes compute --finished
else fail gpu_timeline_device_clock "losses differ from the run without MTRAIN_TIMELINE: $(tail -2 "$TMP/out")"; fi
if command -v mpiexec >/dev/null && [ -z "${own_gpus:-}" ]; then
    MTRAIN_TIMELINE=5 OMP_NUM_THREADS=1 mpiexec -n 2 "$MTRAIN" pretrain r.yaml --set train.steps=20 \
        --set parallel.grad_bucket_mb=0.01 --set checkpoint.dir=tls_ck --set log.dir=tls >"$TMP/out" 2>&1
    check_tl gpu_timeline_staged_dp2 "tls/timeline-rank-*.json" --clock device --lanes compute,dp --finished
else skip gpu_timeline_staged_dp2 "no mpiexec, or each rank has a GPU of its own (the NCCL timeline below)"; fi
if [ -n "${own_gpus:-}" ]; then
    MTRAIN_TIMELINE=5 OMP_NUM_THREADS=1 mpiexec -n 2 "$MTRAIN" pretrain r.yaml --set train.steps=20 --set parallel.comm=nccl \
        --set parallel.grad_bucket_mb=0.01 --set checkpoint.dir=tln_ck --set log.dir=tln >"$TMP/out" 2>&1
    grep '^timeline of step' "$TMP/out"
    check_tl gpu_nccl_overlap_timeline "tln/timeline-rank-*.json" --clock device --lanes compute,dp --overlap --finished
else skip gpu_nccl_overlap_timeline "needs two GPUs, one per rank (NCCL)"; fi

# a tiny Mixtral (MoE layers 0 and 2, dense 1 and 3, with z-loss; dropless,
# since with capacity drops a near-tie routing flip cascades): 40 GPU steps
# within 5e-4 of the CPU (the summation order's drift grows through the
# routers: worst 1.7e-4 at step 26 on an H200, 2026-11-26, where the dense
# model stays within 1e-4), bitwise repeatable, and expert parallelism on GPU ranks
cat >m.yaml <<'YAML'
model: {arch: mixtral, vocab_size: 264, hidden_size: 64, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 160, num_experts: 4, experts_per_token: 2, moe_intermediate_size: 96, moe_layer_freq: 2,
        moe_z_loss_coef: 0.001}
train: {seq_len: 64, micro_batch: 4, global_batch: 8, steps: 40, seed: 7, device: cuda}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
log: {dir: mg, interval: 10}
YAML
"$MTRAIN" pretrain m.yaml >/dev/null 2>&1 || fail gpu_mixtral_matches_cpu "GPU run failed"
"$MTRAIN" pretrain m.yaml --set train.device=cpu --set log.dir=mc >/dev/null 2>&1 || fail gpu_mixtral_matches_cpu "CPU run failed"
losses mg/metrics.jsonl >mg.loss; losses mc/metrics.jsonl >mc.loss
close gpu_mixtral_matches_cpu mg.loss mc.loss 5e-4 40
"$MTRAIN" pretrain m.yaml --set log.dir=mg2 >/dev/null 2>&1
[ "$(losses mg2/metrics.jsonl)" = "$(cat mg.loss)" ] && pass gpu_mixtral_deterministic ||
    fail gpu_mixtral_deterministic "loss sequences differ"
# grouped_expert_gemms NAME RECIPE: the experts' GEMMs as cuBLAS grouped calls (MTRAIN_EXPERT_GEMM=grouped: the bf16
# table's experts_matmul ops, kernels/cuda/expert_gemm.cu) against the per-expert calls, 40 bf16 steps within 1e-3
# (the same sums in another kernel's order)
grouped_expert_gemms() {
    "$MTRAIN" pretrain "$2" --set train.precision=bf16 --set log.dir="$1"_pe >"$TMP/out" 2>&1 &&
        MTRAIN_EXPERT_GEMM=grouped "$MTRAIN" pretrain "$2" --set train.precision=bf16 --set log.dir="$1"_gr >"$TMP/out" 2>&1 ||
        fail "$1" "exit $?: $(tail -2 "$TMP/out")"
    losses "$1"_pe/metrics.jsonl >"$1".pe; losses "$1"_gr/metrics.jsonl >"$1".gr
    close "$1" "$1".gr "$1".pe 1e-3 40
}
grouped_expert_gemms gpu_mixtral_grouped_expert_gemms m.yaml
if command -v mpiexec >/dev/null; then
    OMP_NUM_THREADS=1 mpiexec -n 4 "$MTRAIN" pretrain m.yaml --set parallel.tp=2 --set parallel.ep=2 --set train.steps=20 \
        --set log.dir=mep >"$TMP/out" 2>&1 || fail gpu_mixtral_layout_ep2_tp2 "exit $?: $(tail -2 "$TMP/out")"
    "$MTRAIN" pretrain m.yaml --set train.steps=20 --set log.dir=mg20 >/dev/null 2>&1
    losses mep/metrics.jsonl >mep.loss; losses mg20/metrics.jsonl >mg20.loss
    close gpu_mixtral_layout_ep2_tp2 mep.loss mg20.loss 1e-5 20
else skip gpu_mixtral_layout_ep2_tp2 "no mpiexec on this machine"; fi

# a tiny DeepSeek-V3 (MLA with both low-rank paths and YaRN, 2 dense + 2 MoE
# layers with group-limited sigmoid routing, the expert bias and its updates,
# a shared expert, one MTP module): 40 GPU steps within 1e-4 of the CPU (loss
# and MTP loss), bitwise repeatable, and tp 2 x ep 2 on GPU ranks
cat >d.yaml <<'YAML'
model: {arch: deepseek_v3, vocab_size: 264, hidden_size: 64, num_layers: 4, num_heads: 4, num_kv_heads: 4,
        intermediate_size: 128, q_lora_rank: 32, kv_lora_rank: 32, qk_nope_head_dim: 16, qk_rope_head_dim: 8,
        v_head_dim: 16, rope_scaling_type: yarn, rope_scaling_factor: 4, rope_original_max_pos: 16,
        first_k_dense: 2, num_experts: 8, experts_per_token: 2, moe_intermediate_size: 32, moe_shared_experts: 1,
        moe_score_func: sigmoid, moe_n_group: 4, moe_topk_group: 2, moe_routed_scaling: 2.5,
        moe_bias_update_rate: 1e-3, moe_seq_aux_loss_coef: 1e-3, moe_aux_loss_coef: 0, mtp_depth: 1,
        mtp_loss_weight: 0.3}
train: {seq_len: 64, micro_batch: 4, global_batch: 8, steps: 40, seed: 7, device: cuda}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, eps: 1e-4}
data: {path: data}
log: {dir: dg, interval: 10}
YAML
mtp() { grep '"loss"' "$1" | sed 's/.*"mtp_loss":\([^,}]*\).*/\1/'; }
"$MTRAIN" pretrain d.yaml >/dev/null 2>&1 || fail gpu_deepseek_matches_cpu "GPU run failed"
"$MTRAIN" pretrain d.yaml --set train.device=cpu --set log.dir=dc >/dev/null 2>&1 || fail gpu_deepseek_matches_cpu "CPU run failed"
losses dg/metrics.jsonl >dg.loss; losses dc/metrics.jsonl >dc.loss
close gpu_deepseek_matches_cpu dg.loss dc.loss 1e-4 40
mtp dg/metrics.jsonl >dg.mtp; mtp dc/metrics.jsonl >dc.mtp
close gpu_deepseek_mtp_matches_cpu dg.mtp dc.mtp 1e-4 40
"$MTRAIN" pretrain d.yaml --set log.dir=dg2 >/dev/null 2>&1
[ "$(losses dg2/metrics.jsonl)" = "$(cat dg.loss)" ] && pass gpu_deepseek_deterministic ||
    fail gpu_deepseek_deterministic "loss sequences differ"
grouped_expert_gemms gpu_deepseek_grouped_expert_gemms d.yaml
if command -v mpiexec >/dev/null; then
    OMP_NUM_THREADS=1 mpiexec -n 4 "$MTRAIN" pretrain d.yaml --set parallel.tp=2 --set parallel.ep=2 --set train.steps=20 \
        --set log.dir=dep >"$TMP/out" 2>&1 || fail gpu_deepseek_layout_tp2_ep2 "exit $?: $(tail -2 "$TMP/out")"
    "$MTRAIN" pretrain d.yaml --set train.steps=20 --set log.dir=dg20 >/dev/null 2>&1
    losses dep/metrics.jsonl >dep.loss; losses dg20/metrics.jsonl >dg20.loss
    close gpu_deepseek_layout_tp2_ep2 dep.loss dg20.loss 1e-5 20
else skip gpu_deepseek_layout_tp2_ep2 "no mpiexec on this machine"; fi

# bf16 on the GPU (kernels/cuda/bf16.cu): 200 steps within 2% per step of the
# CPU fp32 run and of the CPU bf16 run (the same storage; sums in another order
# round some values to the neighbouring bf16), bitwise repeatable, a stop and
# resume bitwise, and its checkpoint resumes on the CPU (lr 1e-3 as in bf16.sh)
b16=(--set train.precision=bf16 --set train.steps=200 --set train.eval_interval=0 --set optimizer.lr=1e-3)
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set checkpoint.dir=b_ck --set log.dir=b >"$TMP/out" 2>&1 &&
    pass gpu_bf16_runs || fail gpu_bf16_runs "exit $?: $(tail -3 "$TMP/out")"
expect_output gpu_bf16_device_line '\| device cuda bf16 \|'
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set train.device=cpu --set train.precision=fp32 --set checkpoint.dir=bc_ck \
    --set log.dir=bc >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set train.device=cpu --set checkpoint.dir=bb_ck --set log.dir=bb >/dev/null 2>&1
losses b/metrics.jsonl >b.loss; losses bc/metrics.jsonl >bc.loss; losses bb/metrics.jsonl >bb.loss
close gpu_bf16_tracks_cpu_fp32 b.loss bc.loss 2e-2 200
close gpu_bf16_close_to_cpu_bf16 b.loss bb.loss 2e-2 200
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set checkpoint.dir=b2_ck --set log.dir=b2 >/dev/null 2>&1
[ "$(losses b2/metrics.jsonl)" = "$(cat b.loss)" ] && pass gpu_bf16_deterministic || fail gpu_bf16_deterministic "differ"
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set checkpoint.dir=bs_ck --set log.dir=bs --stop-after 100 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set checkpoint.dir=bs_ck --set log.dir=bs >"$TMP/out" 2>&1
[ "$(losses bs/metrics.jsonl)" = "$(cat b.loss)" ] && pass gpu_bf16_resume_bitwise ||
    fail gpu_bf16_resume_bitwise "$(tail -2 "$TMP/out")"
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set checkpoint.dir=bx_ck --set log.dir=bx --stop-after 100 >/dev/null 2>&1
"$MTRAIN" pretrain r.yaml "${b16[@]}" --set train.device=cpu --set checkpoint.dir=bx_ck --set log.dir=bx >"$TMP/out" 2>&1
losses bx/metrics.jsonl >bx.loss
grep -q "resumed from bx_ck/step-000000100" "$TMP/out" && close gpu_bf16_checkpoint_resumes_on_cpu bx.loss b.loss 2e-2 200 ||
    fail gpu_bf16_checkpoint_resumes_on_cpu "$(grep -E 'resumed|error' "$TMP/out" | head -2)"

# FP8 on the GPU (both blocks in FP8; every dimension a multiple of 16, so
# the tensor-core GEMMs of kernels/cuda/fp8_gemm.cu): 200 steps within 2% of
# the CPU fp8 run (the same quantised operands; sums in another order),
# bitwise repeatable; delayed scaling likewise, and a stopped delayed run
# resumes bitwise (its amax history read back from the checkpoint)
f8=("${b16[@]}" --set train.precision=fp8 --set train.fp8_skip_layers=0)
if "$MTRAIN" pretrain r.yaml "${f8[@]}" --set checkpoint.dir=f_ck --set log.dir=f >"$TMP/out" 2>&1; then
    pass gpu_fp8_runs
    "$MTRAIN" pretrain r.yaml "${f8[@]}" --set train.device=cpu --set checkpoint.dir=fc_ck --set log.dir=fc >/dev/null 2>&1
    "$MTRAIN" pretrain r.yaml "${f8[@]}" --set checkpoint.dir=f2_ck --set log.dir=f2 >/dev/null 2>&1
    losses f/metrics.jsonl >f.loss; losses fc/metrics.jsonl >fc.loss
    close gpu_fp8_close_to_cpu_fp8 f.loss fc.loss 2e-2 200
    [ "$(losses f2/metrics.jsonl)" = "$(cat f.loss)" ] && pass gpu_fp8_deterministic || fail gpu_fp8_deterministic "differ"
    fd=("${f8[@]}" --set train.fp8_scaling=delayed)
    "$MTRAIN" pretrain r.yaml "${fd[@]}" --set checkpoint.dir=fd_ck --set log.dir=fd >/dev/null 2>&1
    "$MTRAIN" pretrain r.yaml "${fd[@]}" --set train.device=cpu --set checkpoint.dir=fdc_ck --set log.dir=fdc >/dev/null 2>&1
    losses fd/metrics.jsonl >fd.loss; losses fdc/metrics.jsonl >fdc.loss
    close gpu_fp8_delayed_close_to_cpu fd.loss fdc.loss 2e-2 200
    "$MTRAIN" pretrain r.yaml "${fd[@]}" --set checkpoint.dir=fds_ck --set log.dir=fds --stop-after 100 >/dev/null 2>&1
    "$MTRAIN" pretrain r.yaml "${fd[@]}" --set checkpoint.dir=fds_ck --set log.dir=fds >"$TMP/out" 2>&1
    [ -s fd.loss ] && [ "$(losses fds/metrics.jsonl)" = "$(cat fd.loss)" ] && pass gpu_fp8_delayed_resume_bitwise ||
        fail gpu_fp8_delayed_resume_bitwise "$(tail -2 "$TMP/out")"
    # issue 12 on the GPU: tests/integration/fp8.sh's real-text runs (the tiny
    # recipe, 300 steps at lr 1e-3, byte-tokenised /usr/share/common-licenses)
    # in bf16 and FP8 (current scaling), seeds 1234, 2 and 3: the mean final
    # validation loss within 1.5% (one run moves ~3% between seeds on this
    # text: one seed measured +2.95% on an H200, 2026-11-26), every FP8 run
    # 300 finite losses
    texts=$(find /usr/share/common-licenses -maxdepth 1 -type f 2>/dev/null | sort)
    if [ -n "$texts" ] && "$MTRAIN" data build --tokenizer bytes --split-lines --append-eod --quiet --out text $texts \
        >/dev/null 2>&1; then
        tiny=(--set data.path=text --set optimizer.lr=1e-3 --set checkpoint.dir= --set train.device=cuda)
        : >tb.val; : >tf.val; finite=0
        for seed in 1234 2 3; do
            "$MTRAIN" pretrain "$ROOT/recipes/tiny-llama3.yaml" "${tiny[@]}" --set train.seed=$seed \
                --set log.dir=tb$seed --set train.precision=bf16 >/dev/null 2>&1
            "$MTRAIN" pretrain "$ROOT/recipes/tiny-llama3.yaml" "${tiny[@]}" --set train.seed=$seed \
                --set log.dir=tf$seed --set train.precision=fp8 >"$TMP/out" 2>&1
            val tb$seed/metrics.jsonl | tail -1 >>tb.val; val tf$seed/metrics.jsonl | tail -1 >>tf.val
            [ "$(losses tf$seed/metrics.jsonl | awk '$1 == $1 + 0 && $1 < 100' | wc -l)" = 300 ] && finite=$((finite + 1))
        done
        b=$(awk '{s += $1; n++} END {if (n == 3) printf "%.6f", s / n}' tb.val)
        f=$(awk '{s += $1; n++} END {if (n == 3) printf "%.6f", s / n}' tf.val)
        awk -v a="$b" -v b="$f" 'BEGIN {d = (b - a) / a; if (d < 0) d = -d; exit (a != "" && b != "" && d <= 0.015) ? 0 : 1}' &&
            [ $finite = 3 ] && pass gpu_fp8_real_text_within_1_5pct_of_bf16 ||
            fail gpu_fp8_real_text_within_1_5pct_of_bf16 "mean val_loss bf16 $b, fp8 $f; $finite of 3 FP8 runs with 300 finite losses"
        echo "  real text, 300 steps on the GPU, seeds 1234 2 3: val_loss bf16 $(tr '\n' ' ' <tb.val)(mean $b), fp8 $(tr '\n' ' ' <tf.val)(mean $f)"
    else skip gpu_fp8_real_text_within_1_5pct_of_bf16 "no /usr/share/common-licenses texts here"; fi
elif grep -q "no FP8 tensor cores" "$TMP/out"; then
    for c in gpu_fp8_runs gpu_fp8_close_to_cpu_fp8 gpu_fp8_deterministic gpu_fp8_delayed_close_to_cpu \
        gpu_fp8_delayed_resume_bitwise gpu_fp8_real_text_within_1_5pct_of_bf16; do
        skip $c "this GPU has no FP8 tensor cores"
    done
else
    fail gpu_fp8_runs "exit $?: $(tail -3 "$TMP/out")"
fi

# generate and eval on the GPU (KV-cache decode op, training forward) equal the CPU
a=$("$MTRAIN" generate g --prompt-ids 1,2,3,4 --max-tokens 24 --device cuda --print-ids 2>/dev/null | tail -1)
b=$("$MTRAIN" generate g --prompt-ids 1,2,3,4 --max-tokens 24 --device cpu --print-ids 2>/dev/null | tail -1)
[ -n "$a" ] && [ "$a" = "$b" ] && pass gpu_generate_matches_cpu || fail gpu_generate_matches_cpu "'$a' vs '$b'"
a=$("$MTRAIN" generate dg --prompt-ids 1,2,3,4 --max-tokens 24 --device cuda --print-ids 2>/dev/null | tail -1)
b=$("$MTRAIN" generate dg --prompt-ids 1,2,3,4 --max-tokens 24 --device cpu --print-ids 2>/dev/null | tail -1)
[ -n "$a" ] && [ "$a" = "$b" ] && pass gpu_generate_deepseek_matches_cpu ||
    fail gpu_generate_deepseek_matches_cpu "'$a' vs '$b'"
"$MTRAIN" eval g --data data --split all --batches 2 --device cuda --json 2>/dev/null | grep -o '"loss":[^,}]*' | cut -d: -f2 >eg.loss
"$MTRAIN" eval g --data data --split all --batches 2 --device cpu --json 2>/dev/null | grep -o '"loss":[^,}]*' | cut -d: -f2 >ec.loss
close gpu_eval_split_matches_cpu eg.loss ec.loss 1e-5 1
exit $FAILED
