#!/usr/bin/env bash
# Context parallelism's balance in wall time (model/cp_attention.c): one
# step of a 1024-token sequence on cp CPU ranks (default 2, one per core),
# traced (MTRAIN_TIMELINE). Per rank: the time its ring block ops
# ("attention_block" spans) took and their work ("flops", counted by the
# op's chunk pairs); then max/min over the ranks of each. The work balances
# exactly by construction (tests/integration/cp_parallel.sh checks it); the
# time shows what the machine makes of it. The best of three runs: other work
# on the machine shows in wall time. Prints a table; writes
# build/bench/cp_balance.json (JSON=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
MTRAIN=${MTRAIN:-$BUILD/mtrain}
PY=${PYTHON:-/usr/bin/python3}
CP=${CP:-2}
WORK=${BENCH_DIR:-build/bench/cp-work}
JSON=${JSON:-build/bench/cp_balance.json}
mkdir -p "$(dirname "$JSON")"
rm -rf "$WORK" && mkdir -p "$WORK"
export OMP_NUM_THREADS=1
"$MTRAIN" data generate --out "$WORK/data" --docs 400 --frame-tokens 4096 >/dev/null
cat >"$WORK/r.yaml" <<YAML
model: {vocab_size: 264, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 1024, micro_batch: 1, global_batch: 2, steps: 4, seed: 7, eval_interval: 0}
optimizer: {lr: 3e-3}
data: {path: $WORK/data}
parallel: {cp: $CP}
YAML
for try in 1 2 3; do
    MTRAIN_TIMELINE=3 timeout 600 mpiexec -n "$CP" "$MTRAIN" pretrain "$WORK/r.yaml" --set log.dir="$WORK/run$try" \
        --set checkpoint.dir="$WORK/ck$try" >"$WORK/out$try" 2>&1 || { tail -5 "$WORK/out$try"; exit 1; }
done
"$PY" - "$WORK" "$JSON" "$CP" <<'PY'
import glob, json, sys, datetime
work, out, cp = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = []
for t in (1, 2, 3):
    ms, fl = [], []
    for f in sorted(glob.glob(f"{work}/run{t}/timeline-rank-*.json")):
        ev = [e for e in json.load(open(f))["traceEvents"] if e.get("name") == "attention_block"]
        ms.append(sum(e["dur"] for e in ev) / 1e3)
        fl.append(sum(e["args"].get("flops", 0) for e in ev))
    runs.append({"ms": ms, "flops": fl, "time_ratio": max(ms) / min(ms), "work_ratio": max(fl) / min(fl)})
best = min(runs, key=lambda r: r["time_ratio"])
print(f"cp {cp}, seq 1024: attention block ops per rank")
print(f"{'run':>4} {'ms per rank':>30} {'time max/min':>13} {'work max/min':>13}")
for i, r in enumerate(runs, 1):
    print(f"{i:>4} {' '.join('%.1f' % x for x in r['ms']):>30} {r['time_ratio']:>13.4f} {r['work_ratio']:>13.4f}")
print(f"best time max/min {best['time_ratio']:.4f}, work max/min {best['work_ratio']:.4f}")
json.dump({"date": datetime.date.today().isoformat(), "cp": cp, "runs": runs,
           "best_time_ratio": best["time_ratio"]}, open(out, "w"), indent=1)
PY
