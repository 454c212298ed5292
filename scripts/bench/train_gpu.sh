#!/usr/bin/env bash
# Training throughput on one GPU: mtrain's CUDA backend against PyTorch
# (Hugging Face LlamaForCausalLM, eager and SDPA attention) on the ~124M
# Llama of train.sh, micro batch 8 x seq 1024, fp32 and TF32, plus cuBLAS
# sgemm at the model's shapes measured in the same process. MFU against the
# peak of the precision's unit (PEAK_FP32, PEAK_TF32 in TFLOP/s; defaults:
# H100 SXM dense 67 and 495). Writes build/bench/train_gpu.json.
# Skips (exit 0) where no GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
STEPS=${STEPS:-5}
SHAPE="12 768 12 4 2048 32768 ${MICRO_BATCH:-8} ${SEQ:-1024} $STEPS"
PY=${PYTHON:-python3}
mkdir -p build/bench
if ! "$BUILD/bench/bench_train" 1 64 4 4 128 256 1 16 1 cuda >/dev/null 2>&1; then
    echo "train_gpu: no CUDA device here; skipped"; exit 0
fi
runs=()
for tf in 0 1; do
    runs+=("$("$BUILD/bench/bench_train" $SHAPE cuda $tf)") || exit 1
    for attn in eager sdpa; do
        runs+=("$(DEVICE=cuda TF32=$tf ATTN=$attn "$PY" scripts/bench/torch_llama_step.py $SHAPE 2>/dev/null || echo '{}')")
    done
done
"$PY" - "${PEAK_FP32:-67}" "${PEAK_TF32:-495}" "${runs[@]}" <<'PYEOF'
import json, sys
peak = {False: float(sys.argv[1]), True: float(sys.argv[2])}
runs = [json.loads(a) for a in sys.argv[3:]]
ours = [r for r in runs if "gflops" in r]
flops = ours[0]["flops_per_step"]
print("| run | precision | step (ms) | tokens/s | TFLOP/s | MFU | vs mtrain |")
print("| --- | --- | --- | --- | --- | --- | --- |")
out = []
for r in runs:
    if "step_s" not in r:
        continue
    tf32 = bool(r.get("tf32"))
    mine = [o for o in ours if bool(o["tf32"]) == tf32][0]
    tflops = flops / r["step_s"] / 1e12
    name = "mtrain" if "gflops" in r else "PyTorch %s (%s)" % (r["torch"], r["attn"])
    row = {"run": name, "tf32": tf32, "step_s": r["step_s"], "tokens_per_s": r["tokens_per_s"], "tflops": tflops,
           "mfu": tflops / peak[tf32], "mtrain_speedup": r["step_s"] / mine["step_s"]}
    out.append(row)
    print("| %s | %s | %.1f | %.0f | %.1f | %.1f%% | %.2fx |" % (name, "tf32" if tf32 else "fp32", 1e3 * r["step_s"],
          r["tokens_per_s"], tflops, 100 * row["mfu"], row["mtrain_speedup"]))
for o in ours:
    print("cuBLAS sgemm (%s): %.1f TFLOP/s (8192x768x2048), %.1f (8192x768x32768)" % (
        "tf32" if o["tf32"] else "fp32", o["sgemm_gflops_ffn"] / 1e3, o["sgemm_gflops_head"] / 1e3))
json.dump({"runs": out, "mtrain": ours, "peak_tflops": {"fp32": peak[False], "tf32": peak[True]}},
          open("build/bench/train_gpu.json", "w"), indent=1)
print("wrote build/bench/train_gpu.json")
PYEOF
