#!/usr/bin/env bash
# The MoE stacks on one GPU, in one run (issue 28's baselines): mtrain against
# what a PyTorch user runs instead, on the two shapes of scripts/bench/shapes/:
#   mixtral   2 layers of Mixtral 8x7B, vocab 32000, 1 x 8192 tokens
#   deepseek  DeepSeek-V3's width and MLA, 1 dense + 1 MoE layer of 32 routed
#             experts (top-8, group-limited sigmoid routing), 1 x 4096 tokens
#             (mtrain's dry run: 77.6 GiB in bf16; an H200, or an H100 at its limit)
# Runs, per shape:
#   mtrain bf16, fp8 (per-tensor) and fp8 with block scaling: the whole step
#     (bench_train --recipe), with its blocking host copies per step and the FP8
#     GEMMs that took the slow reference path
#   PyTorch: Hugging Face's model from the same recipe, fp32 master weights,
#     bf16 autocast, SDPA, fused AdamW, its fastest experts implementation,
#     eager and torch.compile (scripts/bench/torch_moe_model_step.py)
#   the MoE layer alone, forward + backward in bf16: mtrain's (bench_moe
#     --recipe; its ops per layer from a profiled run) against a torchtitan-style
#     layer on torch._grouped_mm (scripts/bench/torch_moe_layer.py), with host
#     copies / synchronisations and kernel launches per layer
# MFU on active parameters: model/flops.c's count (bench_train's flops_per_step,
# the same for every run of a shape) against PEAK_BF16 (default 989: H100 SXM).
# Writes build/bench/moe_gpu.json and prints the tables for docs/benchmarks.md.
# SHAPES and RUNS pick subsets and their order (RUNS: mtrain-bf16 torch layer
# torch-layer grouped mtrain-fp8-block mtrain-fp8 torch-compile; grouped: the
# step and the layer with MTRAIN_EXPERT_GEMM=grouped); `moe_gpu.sh --report` prints the
# tables of the rows written so far (a run cut off at a time limit). Each run is cut off after RUN_LIMIT seconds
# (default 150; COMPILE_LIMIT, default 300, for torch.compile), a row at a time appended to
# build/bench/moe_gpu.jsonl (started afresh unless APPEND=1) and copied to $OUT when set (the device tool's
# folder, so a call killed at its limit still returns the rows). Skips (exit 0) where no GPU is visible, unless
# DEVICE=cpu (a smoke run of the whole script on toy recipes: SHAPE_DIR); fails where nvidia-smi sees a GPU and
# mtrain's benchmark cannot use it.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
STEPS=${STEPS:-5}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
# the DeepSeek-V3 stack (77.6 GiB by the dry run in bf16, and PyTorch's fp32 master, gradients and AdamW state
# ~61 GiB before activations) only on a GPU of 100 GiB or more (an H200) unless SHAPES names it
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ -z "${SHAPES:-}" ] && [ "$DEVICE" = cuda ] && [ -n "$gib" ] && [ "${gib%% *}" -lt 102400 ] 2>/dev/null; then
    echo "moe_gpu: ${gib%% *} MiB of GPU memory: the Mixtral stack only (SHAPES=\"mixtral deepseek\" to try both)" >&2
    SHAPES=mixtral
fi
SHAPES=${SHAPES:-mixtral deepseek}
SHAPE_DIR=${SHAPE_DIR:-scripts/bench/shapes}
RUNS=${RUNS:-mtrain-bf16 torch layer torch-layer grouped mtrain-fp8-block mtrain-fp8 torch-compile}
OUTDIR=${OUTDIR:-build/bench}
mkdir -p "$OUTDIR"
if [ "${1:-}" != --report ] && [ "$DEVICE" = cuda ]; then
    [ -x "$BUILD/bench/bench_train" ] || { echo "FAIL moe_gpu: no $BUILD/bench/bench_train (make bench, or scripts/device/pack.sh)"; exit 1; }
    if ! probe=$("$BUILD/bench/bench_train" 1 64 4 4 128 256 1 16 1 cuda 2>&1 >/dev/null); then
        if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
            echo "FAIL moe_gpu: a GPU is visible but bench_train cannot use it: $(echo "$probe" | tail -3)"; exit 1
        fi
        echo "moe_gpu: no CUDA device here; skipped"; exit 0
    fi
fi
has() { [[ " $RUNS " == *" $1 "* ]]; }
# last_json CMD...: the command's last stdout line if it is a JSON object, else null (its exit status and
# stderr's tail shown); cut off after LIMIT seconds (RUN_LIMIT)
last_json() {
    local res err rc
    res=$(mktemp) err=$(mktemp)
    timeout -k 5 "${LIMIT:-${RUN_LIMIT:-150}}" "$@" >"$res" 2>"$err"
    rc=$?
    if [[ "$(tail -1 "$res")" == "{"* ]]; then
        tail -1 "$res"
    else
        echo null
        case $rc in
            124 | 137) echo "  cut off after ${LIMIT:-${RUN_LIMIT:-150}} s" >&2 ;;
            *) echo "  exit $rc" >&2 ;;
        esac
        tail -5 "$err" | sed 's/^/  /' >&2
    fi
    rm -f "$res" "$err"
}
out=$OUTDIR/moe_gpu.jsonl
row() {
    echo "{\"shape\":\"$1\",\"run\":\"$2\",\"kind\":\"$3\",\"r\":$4}" | tee -a "$out" >&2
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$out" "$OUT/"; fi
}
recipe_of() {
    case $1 in
        mixtral) echo "$SHAPE_DIR/mixtral-stack.yaml" ;;
        deepseek) echo "$SHAPE_DIR/deepseek-v3-stack.yaml" ;;
        *) echo "moe_gpu: unknown shape $1" >&2; exit 2 ;;
    esac
}
# one run kind over every shape before the next kind, most wanted first, each row written as it ends:
# a call cut off at its time limit keeps what ran (--report prints the tables of what is there)
if [ "${1:-}" != --report ]; then
    [ "${APPEND:-0}" = 1 ] || : >"$out"
    for run in $RUNS; do
        for shape in $SHAPES; do
            recipe=$(recipe_of "$shape") || exit 2
            echo "moe_gpu: $run, $shape ($recipe)" >&2
            case $run in
                mtrain-bf16 | mtrain-fp8 | mtrain-fp8-block)
                    precision=${run#mtrain-} scaling=tensor
                    [ "$precision" = fp8-block ] && precision=fp8 scaling=block
                    row "$shape" "mtrain ${run#mtrain-}" step "$(last_json "$BUILD/bench/bench_train" --recipe "$recipe" \
                        "$STEPS" "$DEVICE" 0 "$precision" $scaling)" ;;
                torch)
                    row "$shape" "PyTorch bf16 autocast, SDPA, fused AdamW" step \
                        "$(DEVICE=$DEVICE last_json "$PY" scripts/bench/torch_moe_model_step.py "$recipe" "$STEPS")" ;;
                torch-compile)
                    # the experts implementation eager found fastest, where it ran (compiling each costs
                    # minutes); else transformers' eager experts (its grouped_mm ones run in fp32 under autocast,
                    # torch._grouped_mm not being autocast-enabled, and break dynamo's graphs)
                    impl=$("$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["shape"] == sys.argv[2] and r["kind"] == "step" and r["r"] and "experts" in r["r"]: print(r["r"]["experts"])' \
                        "$out" "$shape" 2>/dev/null | tail -1)
                    row "$shape" "PyTorch bf16 autocast, SDPA, fused AdamW, compile" step \
                        "$(DEVICE=$DEVICE COMPILE=1 EXPERTS=${impl:-eager} LIMIT=${COMPILE_LIMIT:-300} last_json "$PY" \
                        scripts/bench/torch_moe_model_step.py "$recipe" "$STEPS")" ;;
                layer)
                    row "$shape" "mtrain MoE layer, bf16" layer "$(last_json "$BUILD/bench/bench_moe" --recipe "$recipe" \
                        "$STEPS" "$DEVICE" bf16)"
                    row "$shape" "mtrain MoE layer, bf16, profiled (ops per layer)" layer-ops \
                        "$(MTRAIN_PROFILE=1 last_json "$BUILD/bench/bench_moe" --recipe "$recipe" 2 "$DEVICE" bf16)" ;;
                grouped)
                    # the experts' GEMMs as one cuBLAS grouped call per kind (MTRAIN_EXPERT_GEMM=grouped): the step
                    # and the layer, beside the per-expert rows above (same recipe; final_loss close to bf16's)
                    row "$shape" "mtrain bf16, grouped expert GEMMs" step "$(MTRAIN_EXPERT_GEMM=grouped last_json \
                        "$BUILD/bench/bench_train" --recipe "$recipe" "$STEPS" "$DEVICE" 0 bf16)"
                    row "$shape" "mtrain MoE layer, bf16, grouped expert GEMMs" layer "$(MTRAIN_EXPERT_GEMM=grouped \
                        last_json "$BUILD/bench/bench_moe" --recipe "$recipe" "$STEPS" "$DEVICE" bf16)" ;;
                torch-layer)
                    row "$shape" "PyTorch MoE layer on torch._grouped_mm (torchtitan-style), bf16" layer \
                        "$(DEVICE=$DEVICE last_json "$PY" scripts/bench/torch_moe_layer.py "$recipe" "$STEPS")" ;;
                *) echo "moe_gpu: unknown run $run" >&2; exit 2 ;;
            esac
        done
    done
fi
[ -s "$out" ] || { echo "moe_gpu: no rows in $out (nothing ran)"; exit 1; }
"$PY" - "${PEAK_BF16:-989}" "$out" "$OUTDIR/moe_gpu.json" <<'PYEOF'
import datetime, json, subprocess, sys
peak, rows, dest = float(sys.argv[1]), [json.loads(l) for l in open(sys.argv[2]) if l.strip()], sys.argv[3]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()[0]
except Exception:
    gpu = "no GPU (smoke run)"
print("%s, %s, MFU on active parameters against %g TFLOP/s (bf16 dense)\n" % (gpu, datetime.date.today(), peak))
flops = {r["shape"]: r["r"]["flops_per_step"] for r in rows if r["kind"] == "step" and r["r"] and "flops_per_step" in r["r"]}
best = {}
for r in rows:
    if r["kind"] == "step" and r["r"] and r["run"].startswith("PyTorch"):
        best[r["shape"]] = min(best.get(r["shape"], 1e9), r["r"]["step_s"])
fmt = lambda v, f="%s": "" if v is None else f % v
print("| shape | run | step (ms) | tokens/s | TFLOP/s | MFU | memory (MiB) | vs faster PyTorch | host copies / syncs per step | FP8 GEMMs on the reference path per step | launches per step |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    if r["kind"] != "step":
        continue
    x = r["r"]
    if not x:
        print("| %s | %s | failed | | | | | | | | |" % (r["shape"], r["run"]))
        continue
    tf = flops.get(r["shape"], 0) / x["step_s"] / 1e12
    tokens = x["tokens_per_s"]
    mem = x.get("mem_mib") or x.get("peak_mem_mib") or 0
    vs = "%.2fx" % (best[r["shape"]] / x["step_s"]) if r["shape"] in best else ""
    run = r["run"] + (" [experts: %s]" % x["experts"] if "experts" in x else "")
    print("| %s | %s | %.1f | %.0f | %.1f | %.1f%% | %.0f | %s | %s | %s | %s |" % (
        r["shape"], run, 1e3 * x["step_s"], tokens, tf, 100 * tf / peak, mem, vs,
        fmt(x.get("d2h_copies_per_step", x.get("syncs_per_step"))), fmt(x.get("fp8_reference_gemms_per_step")),
        fmt(x.get("launches_per_step"))))
print("\n| shape | MoE layer alone, forward + backward | ms | TFLOP/s | memory (MiB) | host copies / syncs per layer | ops / launches per layer |")
print("| --- | --- | --- | --- | --- | --- | --- |")
ops = {r["shape"]: r["r"].get("ops_per_layer") for r in rows if r["kind"] == "layer-ops" and r["r"]}
for r in rows:
    if r["kind"] != "layer":
        continue
    x = r["r"]
    if not x:
        print("| %s | %s | failed | | | | |" % (r["shape"], r["run"]))
        continue
    mine = r["run"].startswith("mtrain")
    print("| %s | %s | %.2f | %.1f | %s | %s | %s |" % (
        r["shape"], r["run"], 1e3 * x["step_s"], x["gflops"] / 1e3, fmt(x.get("peak_mem_mib"), "%.0f"),
        fmt(x.get("d2h_copies_per_layer", x.get("syncs_per_layer"))),
        fmt(ops.get(r["shape"]) if mine else x.get("launches_per_layer"))))
json.dump({"gpu": gpu, "date": str(datetime.date.today()), "peak_bf16_tflops": peak, "rows": rows},
          open(dest, "w"), indent=1)
print("\nwrote %s" % dest)
PYEOF
