#!/usr/bin/env bash
# MoE layer throughput on CPU: mtrain's MoE FFN (model/moe.c) forward+backward
# against Hugging Face's MixtralSparseMoeBlock on the same threads, fp32:
# hidden 512, expert FFN 1024, 8 experts, top-2, 2048 tokens. Writes
# build/bench/moe.json. The all-to-all payload against its analytic count is
# checked by tests/integration/moe_parallel.sh (moe_all_to_all_bytes).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
mkdir -p build/bench
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-5}
SHAPE="512 1024 8 2 2048 $STEPS"
PY=${PYTHON:-/usr/bin/python3}
export OMP_NUM_THREADS=$THREADS
ours=$("$BUILD/bench/bench_moe" $SHAPE)
theirs=$("$PY" scripts/bench/torch_moe_step.py $SHAPE)
"$PY" - "$ours" "$theirs" <<'PYEOF'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
rows = [
    ("layer", f'MoE FFN hidden {ours["hidden"]}, expert FFN {ours["moe_ffn"]}, {ours["experts"]} experts top-{ours["top_k"]}, {ours["tokens"]} tokens, fp32, {ours["threads"]} threads'),
    ("mtrain fwd+bwd (median)", f'{ours["step_s"]:.4f} s  ({ours["tokens_per_s"]:.0f} tokens/s, {ours["gflops"]:.1f} GFLOP/s)'),
    ("PyTorch MixtralSparseMoeBlock", f'{theirs["step_s"]:.4f} s  ({theirs["tokens_per_s"]:.0f} tokens/s, torch {theirs["torch"]})'),
    ("mtrain / PyTorch", f"{ratio:.2f}x"),
]
print("| metric | value |\n| --- | --- |")
for k, v in rows:
    print(f"| {k} | {v} |")
json.dump({"mtrain": ours, "pytorch": theirs, "ratio": ratio}, open("build/bench/moe.json", "w"), indent=1)
print("wrote build/bench/moe.json")
PYEOF
