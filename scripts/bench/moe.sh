#!/usr/bin/env bash
# MoE layer throughput on CPU: mtrain's MoE FFN (model/moe.c) forward+backward
# against Hugging Face's MixtralSparseMoeBlock on the same threads, fp32:
# hidden 512, expert FFN 1024, 8 experts, top-2, 2048 tokens. Then the
# all-to-all payload per step and rank of a 4-rank ep 4 run (mpiexec) against
# its analytic count. Writes build/bench/moe.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
mkdir -p build/bench
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-5}
SHAPE="512 1024 8 2 2048 $STEPS"
PY=${PYTHON:-/usr/bin/python3}
export OMP_NUM_THREADS=$THREADS
# the VM is noisy: alternate the two three times and keep each side's best median
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3; do
    "$BUILD/bench/bench_moe" $SHAPE >>"$tmp/ours"
    "$PY" scripts/bench/torch_moe_step.py $SHAPE >>"$tmp/theirs"
done
best() { "$PY" -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(json.dumps(min(r, key=lambda x: x["step_s"])))' "$1"; }
ours=$(best "$tmp/ours")
theirs=$(best "$tmp/theirs")
# all-to-all volume: 4 ranks, ep 4, 2 MoE layers of 8 experts top-2, hidden 64,
# micro batch 2 x seq 64, 2 micro batches per rank, 5 steps
./mtrain data generate --out "$tmp/data" --docs 300 >/dev/null
cat >"$tmp/r.yaml" <<YAML
model: {arch: mixtral, vocab_size: 264, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 128, num_experts: 8, experts_per_token: 2, moe_intermediate_size: 64}
parallel: {ep: 4}
train: {seq_len: 64, micro_batch: 2, global_batch: 16, steps: 5}
data: {path: $tmp/data}
log: {dir: $tmp/run, interval: 100}
YAML
OMP_NUM_THREADS=1 mpiexec -n 4 ./mtrain pretrain "$tmp/r.yaml" >/dev/null
comm=$(grep '"event":"comm"' "$tmp/run/metrics.jsonl")
"$PY" - "$ours" "$theirs" "$comm" <<'PYEOF'
import json, sys
ours, theirs, comm = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
# per MoE layer and micro batch, a rank sends its routed rows (tokens x k x hidden floats) in the
# dispatch and in backward's gradient exchange; the combine legs return what its experts got, which
# depends on the routing: over the EP group they sum to the same, so the group total is analytic
rows, hidden, experts, layers, mbs, ranks = 2 * 64 * 2, 64, 8, 2, 2, 4
analytic = ranks * layers * mbs * (4 * rows * hidden + experts) * 4
measured = sum(e["ep"] for e in comm["bytes_per_step"])
per_rank = [e["ep"] for e in comm["bytes_per_step"]]
ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
rows = [
    ("layer", f'MoE FFN hidden {ours["hidden"]}, expert FFN {ours["moe_ffn"]}, {ours["experts"]} experts top-{ours["top_k"]}, {ours["tokens"]} tokens, fp32, {ours["threads"]} threads'),
    ("mtrain fwd+bwd (median)", f'{ours["step_s"]:.4f} s  ({ours["tokens_per_s"]:.0f} tokens/s, {ours["gflops"]:.1f} GFLOP/s)'),
    ("PyTorch MixtralSparseMoeBlock", f'{theirs["step_s"]:.4f} s  ({theirs["tokens_per_s"]:.0f} tokens/s, torch {theirs["torch"]})'),
    ("mtrain / PyTorch", f"{ratio:.2f}x"),
    ("all-to-all bytes per step, ep 4 (sum of ranks)", f"{measured:.0f} measured, {analytic} analytic ({measured / analytic:.4f})"),
    ("... per rank", ", ".join(f"{b:.0f}" for b in per_rank)),
]
print("| metric | value |\n| --- | --- |")
for k, v in rows:
    print(f"| {k} | {v} |")
json.dump({"mtrain": ours, "pytorch": theirs, "ratio": ratio, "all_to_all_bytes_per_step": measured,
           "all_to_all_analytic": analytic, "all_to_all_per_rank": per_rank}, open("build/bench/moe.json", "w"), indent=1)
print("wrote build/bench/moe.json")
PYEOF
