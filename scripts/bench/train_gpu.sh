#!/usr/bin/env bash
# Training throughput on one GPU, in one run: mtrain (fp32, TF32, bf16, and
# fp8 with per-tensor current, block and delayed scaling, every block in FP8)
# against what a user would run instead, PyTorch with Hugging Face
# LlamaForCausalLM, fp32 master weights + torch.autocast(bfloat16), SDPA
# attention and fused AdamW, eager and torch.compile (issue 9). Shapes:
#   124m  the 124M Llama of docs/benchmarks.md, micro batch 8 x seq 1024
#   8b    an 8B-shaped stack: 4 layers, hidden 4096, FFN 14336, 32 / 8 heads,
#         vocab 128256, micro batch 1 x seq 8192
# plus causal GQA attention alone (B 1, 32 / 8 heads, T 8192, head dim 128
# and 64, bf16, forward + backward) through every PyTorch SDPA backend.
# MFU against the bf16 dense peak (PEAK_BF16 TFLOP/s, default 989: H100 SXM).
# "vs fastest PyTorch" is against the faster PyTorch bf16 run. FP8 (issue 12):
# PyTorch with torch._scaled_mm linears (scripts/bench/torch_fp8.py) on the 8b
# shape, and the FP8 vs bf16 GEMM rates at its shapes.
# Reports step ms, tokens/s, TFLOP/s, MFU, device memory (mtrain: in use
# after the steps, it allocates up front; PyTorch: the allocator's peak) and
# writes build/bench/train_gpu.json. SHAPES (default "124m 8b") and RUNS
# (default below) pick subsets, so each fits a time-limited call;
# mtrain-bf16-variants adds mtrain bf16 with train.deterministic false and
# with MTRAIN_ATTENTION=flash. Attention alone: mtrain's default (cuDNN
# where it agrees with the flash kernels), cuDNN's faster backward, the
# flash kernels and the reference path.
# Skips (exit 0) where no GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
STEPS=${STEPS:-5}
PY=${PYTHON:-python3}
SHAPES=${SHAPES:-124m 8b}
RUNS=${RUNS:-mtrain-fp32 mtrain-tf32 mtrain-bf16 mtrain-bf16-variants mtrain-fp8 mtrain-fp8-block mtrain-fp8-delayed torch-bf16 torch-bf16-compile torch-fp8 attention fp8-gemm}
mkdir -p build/bench
if ! "$BUILD/bench/bench_train" 1 64 4 4 128 256 1 16 1 cuda >/dev/null 2>&1; then
    echo "train_gpu: no CUDA device here; skipped"; exit 0
fi
has() { [[ " $RUNS " == *" $1 "* ]]; }
# mtrain_run TF32 PRECISION [SCALING]: bench_train's JSON line for $dims, or nothing (its errors to stderr)
mtrain_run() {
    local res err
    res=$(mktemp) err=$(mktemp)
    "$BUILD/bench/bench_train" $dims "$STEPS" cuda "$@" >"$res" 2>"$err"
    if [[ "$(tail -1 "$res")" == "{"* ]]; then tail -1 "$res"; else tail -5 "$err" | sed 's/^/  /' >&2; fi
    rm -f "$res" "$err"
}
out=build/bench/train_gpu.jsonl
: >"$out"
for shape in $SHAPES; do
    case $shape in
        124m) dims="12 768 12 4 2048 32768 8 1024" ;;
        8b) dims="4 4096 32 8 14336 128256 1 8192" ;;
        *) echo "train_gpu: unknown shape $shape"; exit 2 ;;
    esac
    for p in fp32:0 tf32:1 bf16:0 fp8:0 fp8-block:0 fp8-delayed:0; do
        has "mtrain-${p%%:*}" || continue
        precision=${p%%:*} scaling=tensor
        [ "$precision" = tf32 ] && precision=fp32
        [ "$precision" = fp8-block ] && precision=fp8 scaling=block
        [ "$precision" = fp8-delayed ] && precision=fp8 scaling=delayed
        r=$(mtrain_run "${p#*:}" "$precision" $scaling)
        echo "{\"shape\":\"$shape\",\"run\":\"mtrain ${p%%:*}\",\"r\":${r:-null}}" >>"$out"
        if [ "$precision" = bf16 ] && has mtrain-bf16-variants; then
            # the same step with cuDNN's faster attention backward (train.deterministic false), and on
            # mtrain's own flash kernels: what each attention choice costs in the whole step
            r2=$(DETERMINISTIC=0 mtrain_run "${p#*:}" bf16)
            echo "{\"shape\":\"$shape\",\"run\":\"mtrain bf16 (train.deterministic false)\",\"r\":${r2:-null}}" >>"$out"
            r2=$(MTRAIN_ATTENTION=flash mtrain_run "${p#*:}" bf16)
            echo "{\"shape\":\"$shape\",\"run\":\"mtrain bf16 (MTRAIN_ATTENTION=flash)\",\"r\":${r2:-null}}" >>"$out"
        fi
        if [ -z "$r" ] && [ "$precision" != fp32 ]; then
            # a failing fast kernel (flash attention, FP8 GEMMs: their first GPU runs) should not cost the
            # numbers of everything else: again on the reference paths, recorded apart (no target reads it)
            echo "train_gpu: mtrain ${p%%:*} failed; again with MTRAIN_ATTENTION=reference MTRAIN_FP8_GEMM=reference" >&2
            r=$(MTRAIN_ATTENTION=reference MTRAIN_FP8_GEMM=reference mtrain_run "${p#*:}" "$precision" $scaling)
            echo "{\"shape\":\"$shape\",\"run\":\"mtrain ${p%%:*} (reference attention and FP8 GEMMs)\",\"r\":${r:-null}}" >>"$out"
        fi
    done
    for c in 0 1; do
        name=torch-bf16$([ $c = 1 ] && echo -compile)
        has "$name" || continue
        r=$(DEVICE=cuda PRECISION=bf16 ATTN=sdpa FUSED=1 COMPILE=$c "$PY" scripts/bench/torch_llama_step.py $dims "$STEPS" \
            2>/dev/null | tail -1)
        echo "{\"shape\":\"$shape\",\"run\":\"PyTorch bf16 autocast, SDPA, fused AdamW$([ $c = 1 ] && echo ', compile')\",\"r\":${r:-null}}" >>"$out"
    done
done
if has torch-fp8; then
    for shape in $SHAPES; do
        [ "$shape" = 8b ] || continue
        r=$(DEVICE=cuda PRECISION=fp8 ATTN=sdpa FUSED=1 "$PY" scripts/bench/torch_llama_step.py 4 4096 32 8 14336 128256 1 8192 \
            "$STEPS" 2>/dev/null | tail -1)
        echo "{\"shape\":\"8b\",\"run\":\"PyTorch fp8 (torch._scaled_mm, per-tensor current scaling), SDPA, fused AdamW\",\"r\":${r:-null}}" >>"$out"
    done
fi
if has fp8-gemm; then
    "$PY" scripts/bench/torch_fp8.py 2>/dev/null | sed 's/^/{"fp8_gemm":/; s/$/}/' >>"$out"
fi
if has attention; then
    for d in ${ATTENTION_DIMS:-128 64}; do
        "$PY" scripts/bench/torch_attention.py 1 32 8 8192 $d 2>/dev/null | sed 's/^/{"attention":/; s/$/}/' >>"$out"
        # auto: cuDNN (deterministic backward) where it agrees with the flash kernels; auto:0 its
        # faster backward (train.deterministic false); then mtrain's own kernels
        for mode in auto auto:0 flash reference; do
            MTRAIN_ATTENTION=${mode%:0} DETERMINISTIC=$([ "$mode" = auto:0 ] && echo 0 || echo 1) \
                "$BUILD/bench/bench_attention" 1 32 8 8192 $d \
                2>/dev/null | sed 's/^/{"attention":/; s/$/}/' >>"$out" || true
        done
    done
fi
"$PY" - "${PEAK_BF16:-989}" "$out" <<'PYEOF'
import json, sys, datetime, subprocess
peak = float(sys.argv[1])
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()[0]
except Exception:
    gpu = "unknown GPU"
print("%s, %s, MFU against %g TFLOP/s (bf16 dense)\n" % (gpu, datetime.date.today(), peak))
print("| shape | run | step (ms) | tokens/s | TFLOP/s | MFU | memory (MiB) | vs fastest PyTorch |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
flops = {r["shape"]: r["r"]["flops_per_step"] for r in rows if "shape" in r and r["r"] and "flops_per_step" in r["r"]}
best = {}
for r in rows:
    if "shape" in r and r["r"] and "step_s" in r["r"] and r["run"].startswith("PyTorch bf16"):
        best[r["shape"]] = min(best.get(r["shape"], 1e9), r["r"]["step_s"])
for r in rows:
    if "shape" not in r:
        continue
    x = r["r"]
    if not x or "step_s" not in x:
        print("| %s | %s | failed | | | | | |" % (r["shape"], r["run"]))
        continue
    f = flops.get(r["shape"], 0)
    tf = f / x["step_s"] / 1e12
    mem = x.get("mem_mib") or x.get("peak_mem_mib") or 0
    vs = "%.2fx" % (best[r["shape"]] / x["step_s"]) if r["shape"] in best else ""
    run = r["run"] + (" [attention: %s]" % x["attention"] if x.get("attention", "none") != "none" else "")
    print("| %s | %s | %.1f | %.0f | %.1f | %.1f%% | %.0f | %s |" % (r["shape"], run, 1e3 * x["step_s"],
          x["tokens_per_s"], tf, 100 * tf / peak, mem, vs))
att = [r["attention"] for r in rows if "attention" in r]
if att:
    print("\n| attention (B 1, 32 / 8 heads, T 8192, causal, bf16) | head dim | fwd+bwd (ms) | TFLOP/s |")
    print("| --- | --- | --- | --- |")
    for a in att:
        name = a["impl"] if "impl" in a else "PyTorch SDPA %s %s" % (a["backend"], a["torch"])
        print("| %s | %d | %s | %s |" % (name, a["D"], a.get("fwd_bwd_ms", a.get("error", "")), a.get("tflops", "")))
gem = [r["fp8_gemm"] for r in rows if "fp8_gemm" in r]
if gem:
    print("\n| GEMM at the 8B stack's shapes (M x K x N) | bf16 TFLOP/s | fp8 TFLOP/s (torch._scaled_mm) | fp8 / bf16 |")
    print("| --- | --- | --- | --- |")
    for g in gem:
        if "gemm" in g:
            print("| %s %dx%dx%d | %s | %s | %s |" % (g["gemm"], g["M"], g["K"], g["N"], g["bf16_tflops"], g["fp8_tflops"],
                                                   g["ratio"]))
json.dump({"gpu": gpu, "date": str(datetime.date.today()), "peak_bf16_tflops": peak, "rows": rows},
          open("build/bench/train_gpu.json", "w"), indent=1)
print("\nwrote build/bench/train_gpu.json")
PYEOF
