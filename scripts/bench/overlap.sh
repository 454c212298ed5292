#!/usr/bin/env bash
# Data-parallel communication overlapped with backward, measured: the same
# run with parallel.overlap_grad_reduce and overlap_param_gather on and off,
# each with its timeline of one step (MTRAIN_TIMELINE, parallel/timeline.h):
# the step's time, forward and backward, the data-parallel gradient calls'
# time and how much of it ran during forward or backward (hidden) or not
# (exposed), rank 0's view. Where two or more GPUs are visible: one rank per
# GPU over NCCL on a Llama 3 8B-shaped stack (4 layers, bf16, ZeRO-1,
# sequence 4096, 25 MiB buckets); elsewhere 2 CPU ranks over MPI on a tiny
# model (MPI progresses its buckets only inside MPI calls, so little hides
# there; OVERLAP_DEVICE=cpu takes this path anywhere). Prints a table;
# writes build/bench/overlap.json (JSON=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
MTRAIN=${MTRAIN:-$BUILD/mtrain}
PY=${PYTHON:-/usr/bin/python3}
WORK=${BENCH_DIR:-build/bench/overlap-work}
STEP=${STEP:-3}
JSON=${JSON:-build/bench/overlap.json}
mkdir -p "$(dirname "$JSON")"
rm -rf "$WORK" && mkdir -p "$WORK"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -ge 2 ] && [ "${OVERLAP_DEVICE:-}" != cpu ]; then
    NP=${NP:-$gpus} device=cuda
    "$MTRAIN" data generate --out "$WORK/data" --docs 2000 --frame-tokens 65536 >/dev/null
    model="{vocab_size: 128256, hidden_size: 4096, num_layers: 4, num_heads: 32, num_kv_heads: 8, intermediate_size: 14336}"
    train="{seq_len: 4096, micro_batch: 1, global_batch: $((2 * NP)), steps: $((STEP + 1)), seed: 7, device: cuda, precision: bf16}"
    extra=(--set optimizer.distributed=true --set parallel.grad_bucket_mb=25 --set parallel.comm=nccl)
else
    NP=${NP:-2} device=cpu
    export OMP_NUM_THREADS=1
    "$MTRAIN" data generate --out "$WORK/data" --docs 400 >/dev/null
    model="{vocab_size: 264, hidden_size: 64, num_layers: 4, num_heads: 4, num_kv_heads: 2, intermediate_size: 160}"
    train="{seq_len: 64, micro_batch: 2, global_batch: $((4 * NP)), steps: $((STEP + 1)), seed: 7, eval_interval: 0}"
    extra=(--set optimizer.distributed=true --set parallel.grad_bucket_mb=0.05)
fi
cat >"$WORK/r.yaml" <<YAML
model: $model
train: $train
optimizer: {lr: 3e-4}
data: {path: $WORK/data}
log: {interval: 1}
YAML
for overlap in true false; do
    MTRAIN_TIMELINE=$STEP timeout 600 mpiexec -n "$NP" "$MTRAIN" pretrain "$WORK/r.yaml" "${extra[@]}" \
        --set parallel.overlap_grad_reduce=$overlap --set parallel.overlap_param_gather=$overlap \
        --set log.dir="$WORK/overlap_$overlap" >"$WORK/overlap_$overlap.out" 2>&1 ||
        { echo "overlap.sh: the run with overlap $overlap failed:"; tail -5 "$WORK/overlap_$overlap.out"; exit 1; }
done
"$PY" - "$WORK" "$device" "$NP" "$JSON" <<'PYEOF'
import json, sys, datetime
work, device, np_, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = []
for overlap in ("true", "false"):
    ev = [json.loads(l) for l in open(f"{work}/overlap_{overlap}/metrics.jsonl") if '"event":"timeline"' in l][-1]
    ev["overlap"] = overlap == "true"
    rows.append(ev)
print(f"overlap of data-parallel communication, {np_} {device} ranks, step {rows[0]['step']}'s timeline (rank 0):")
print("| overlap | step (ms) | forward+backward (ms) | dp gradient calls | MB | comm (ms) | hidden (ms) | exposed (ms) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    print("| %s | %.2f | %.2f | %d | %.1f | %.2f | %.2f | %.2f |" % ("on" if r["overlap"] else "off", r["step_ms"],
          r["compute_ms"], r["grad_calls"], r["grad_bytes"] / 1e6, r["grad_ms"], r["grad_hidden_ms"],
          r["grad_exposed_ms"]))
json.dump({"device": device, "ranks": np_, "date": datetime.date.today().isoformat(), "rows": rows},
          open(out, "w"), indent=1)
PYEOF
