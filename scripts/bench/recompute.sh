#!/usr/bin/env bash
# Activation recompute on CPU: peak resident memory and step time of
# train.recompute none / selective / full on the same run (a 6-layer Llama,
# hidden 512, micro batch 4 x seq 512, fp32), with the dry run's activation
# estimate beside the measured peak. Writes build/bench/recompute.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build/bench
PY=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
./mtrain data generate --out "$tmp/data" --docs 2000 >/dev/null
cat >"$tmp/r.yaml" <<YAML
model: {vocab_size: 264, hidden_size: 512, num_layers: 6, num_heads: 8, num_kv_heads: 4, intermediate_size: 1536}
train: {seq_len: 512, micro_batch: 4, global_batch: 4, steps: 4}
data: {path: $tmp/data}
log: {interval: 100}
YAML
rows=""
for mode in none selective full; do
    ./mtrain pretrain "$tmp/r.yaml" --set train.recompute=$mode --set log.dir="$tmp/$mode" >/dev/null
    est=$(./mtrain pretrain "$tmp/r.yaml" --set train.recompute=$mode --dry-run | sed -n 's/^memory_per_rank: *\([0-9.]*\) GiB.*activations \([0-9.]*\),.*/\1 \2/p')
    rows="$rows$mode $est $(grep '^{"step":' "$tmp/$mode/metrics.jsonl" | sed 's/.*"mem_mib":\([0-9.]*\),"step_ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ')
"
done
"$PY" - "$rows" <<'PYEOF'
import json, statistics, sys
out = {}
for line in sys.argv[1].strip().splitlines():
    f = line.split()
    mode, est_total, est_act, vals = f[0], float(f[1]), float(f[2]), list(map(float, f[3:]))
    mem, ms = vals[0::2], vals[1::2]
    out[mode] = {"estimate_gib": est_total, "estimate_activations_gib": est_act, "peak_rss_mib": max(mem),
                 "step_ms": statistics.median(ms[1:])}
base = out["none"]
print("| recompute | estimate (activations) | peak RSS | step (median of steps 2-4) | memory saved | time cost |")
print("| --- | --- | --- | --- | --- | --- |")
for mode, v in out.items():
    print(f'| {mode} | {v["estimate_gib"]*1024:.0f} MiB ({v["estimate_activations_gib"]*1024:.0f}) | {v["peak_rss_mib"]:.0f} MiB '
          f'| {v["step_ms"]:.0f} ms | {base["peak_rss_mib"] - v["peak_rss_mib"]:.0f} MiB | {v["step_ms"] / base["step_ms"]:.2f}x |')
json.dump(out, open("build/bench/recompute.json", "w"), indent=1)
print("wrote build/bench/recompute.json")
PYEOF
