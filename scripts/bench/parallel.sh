#!/usr/bin/env bash
# Parallelism: (a) communication payload per step per rank of the TP, DP and
# PP groups, measured by `mtrain pretrain` under mpiexec (the `comm` event of
# metrics.jsonl) against an analytic count derived from the model's shapes and
# the collectives of model/transformer.c, model/trainer.c and model/optimizer.c,
# plus the wire volume a ring algorithm implies; (b) the pipeline bubble of
# mtrain's own schedules (schedule_simulate, backward = 2 x forward) against
# the published formulas. Writes build/bench/parallel.json.
# Tiny model, 5 steps per layout, no eval, no checkpoints (their traffic
# would count); about 30 s on 2 cores (8-rank runs are oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
MTRAIN=${MTRAIN:-$BUILD/mtrain}
PY=${PYTHON:-/usr/bin/python3}
WORK=${BENCH_DIR:-build/bench/parallel-work}
SCHED="$BUILD/bench/bench_parallel"
[ -x "$SCHED" ] || make -s BUILD="$BUILD" "$SCHED" >/dev/null
export OMP_NUM_THREADS=1
rm -rf "$WORK" && mkdir -p "$WORK"

# model and batch shape (the analytic model below reads the same numbers)
V=264 C=64 L=4 H=4 KV=2 F=128 T=16 B=2 G=8 STEPS=5
"$MTRAIN" data generate --out "$WORK/data" --docs 400 >/dev/null
cat >"$WORK/r.yaml" <<YAML
model: {vocab_size: $V, hidden_size: $C, num_layers: $L, num_heads: $H, num_kv_heads: $KV, intermediate_size: $F}
train: {seq_len: $T, micro_batch: $B, global_batch: $G, steps: $STEPS, seed: 7, eval_interval: 0}
optimizer: {lr: 3e-3}
data: {path: $WORK/data}
log: {dir: $WORK/runs/none, interval: 1000}
YAML

# name tp pp dp vpp sequence_parallel zero
layouts=(
    "tp2 2 1 1 1 0 0" "tp2_sp 2 1 1 1 1 0"
    "pp2 1 2 1 1 0 0" "pp4 1 4 1 1 0 0" "pp2_vpp2 1 2 1 2 0 0"
    "dp2 1 1 2 1 0 0" "dp2_zero 1 1 2 1 0 1"
    "tp2_pp2_dp2 2 2 2 1 0 0" "tp2_pp2_dp2_sp_vpp2_zero 2 2 2 2 1 1"
)
for spec in "${layouts[@]}"; do
    set -- $spec
    name=$1 tp=$2 pp=$3 dp=$4 vpp=$5 sp=$6 zero=$7
    sp_set=false zero_set=false
    [ "$sp" = 1 ] && sp_set=true
    [ "$zero" = 1 ] && zero_set=true
    timeout 300 mpiexec -n $((tp * pp * dp)) "$MTRAIN" pretrain "$WORK/r.yaml" --set parallel.tp=$tp \
        --set parallel.pp=$pp --set parallel.vpp=$vpp --set parallel.sequence_parallel=$sp_set \
        --set optimizer.distributed=$zero_set --set log.dir="$WORK/runs/$name" >"$WORK/$name.out" 2>&1 ||
        { echo "parallel.sh: layout $name failed:"; tail -5 "$WORK/$name.out"; exit 1; }
done
"$SCHED" 2 >"$WORK/schedules.json"

SHAPE="$V $C $L $H $KV $F $T $B $G $STEPS" "$PY" - "$WORK" "${layouts[@]}" <<'PYEOF'
import json, os, sys
work, specs = sys.argv[1], sys.argv[2:]
V, C, L, H, KV, F, T, B, G, STEPS = map(int, os.environ["SHAPE"].split())
D, N = C // H, B * T
FL = 4  # bytes per fp32

def ceil16(n):
    return (n + 15) // 16 * 16

def table_floats(tp, layers, embed, head):
    """Local parameter buffer of one rank, as model/params.c lays it out:
    every tensor padded to a multiple of 16 floats (untied embeddings)."""
    layer = [C, H * D // tp * C, KV * D // tp * C, KV * D // tp * C, C * (H * D // tp),
             C, F // tp * C, F // tp * C, C * (F // tp)]
    n = layers * sum(ceil16(x) for x in layer)
    if embed: n += ceil16(V // tp * C)
    if head: n += ceil16(C) + ceil16(V // tp * C)
    return n

def analytic(tp, pp, dp, vpp, sp, zero, rank):
    """Collectives of one rank per step: (group, kind, payload bytes, calls).
    Payload as parallel/comm.h counts it: n for an all-reduce of n elements,
    the whole buffer (group size x block) for reduce-scatter / all-gather,
    the message for a send."""
    tp_rank, rest = rank % tp, rank // tp
    pp_rank = rest // dp
    vpp = vpp if pp > 1 else 1
    sp = sp and tp > 1
    m = G // (B * dp)                       # micro batches per step on this rank
    Ns = N // tp if sp else N               # residual-stream rows per rank
    layers = L // pp                        # this rank's layers (all its chunks)
    embed, head = pp_rank == 0, pp_rank == pp - 1
    out = []
    if tp > 1:
        # per micro batch: each layer 2 row-parallel outputs forward and 2
        # column-parallel input gradients backward; vocab-parallel embedding
        # 1 (forward); head 1 (backward). Under sequence parallel each becomes
        # a reduce-scatter, and each norm output / row-parallel input gradient
        # an all-gather (embedding backward, head forward included).
        k = 4 * layers + embed + head
        if sp:
            out += [("tp", "all_gather", N * C * FL, m * k), ("tp", "reduce_scatter", N * C * FL, m * k)]
            # norm-weight gradients saw only this rank's rows: summed once per step
            out += [("tp", "all_reduce", C * FL, 2 * layers + head)]
        else:
            out += [("tp", "all_reduce", N * C * FL, m * k)]
        if head:  # vocab-parallel cross-entropy: row max, sum of exp, target logit
            out += [("tp", "all_reduce", N * FL, 3 * m)]
    if pp > 1:
        nvs = pp * vpp  # virtual stages; chunk c of this rank is stage c*pp + pp_rank
        fwd = sum(1 for c in range(vpp) if c * pp + pp_rank < nvs - 1)
        bwd = sum(1 for c in range(vpp) if c * pp + pp_rank > 0)
        out += [("pp", "send", Ns * C * FL, m * (fwd + bwd))]
    if dp > 1:
        total = table_floats(tp, layers, embed, head)
        if zero:  # ZeRO-1: grads summed onto their shards' owners bucket by bucket (parallel.overlap_grad_reduce),
            # params all-gathered in padded shards
            per = ceil16(-(-total // dp))
            out += [("dp", "reduce_to_owners", total * FL, 1), ("dp", "all_gather", dp * per * FL, 1)]
            # the final weights' snapshot gathers the AdamW moments once per run (2 all-gathers)
            out += [("dp", "all_gather", dp * per * FL, 2 / STEPS)]
        else:
            out += [("dp", "all_reduce", total * FL, 1)]
    return out, m

def ring(kind, p):
    """Bytes a rank sends per payload byte under a ring algorithm."""
    return {"all_reduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p, "reduce_to_owners": (p - 1) / p,
            "all_gather": (p - 1) / p, "send": 1.0}[kind]

results, rows = [], []
for spec in specs:
    name, tp, pp, dp, vpp, sp, zero = spec.split()
    tp, pp, dp, vpp, sp, zero = map(int, (tp, pp, dp, vpp, sp, zero))
    ev = [json.loads(l) for l in open(f"{work}/runs/{name}/metrics.jsonl") if '"event":"comm"' in l][-1]
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    per_rank = []
    for e in ev["bytes_per_step"]:
        coll, m = analytic(tp, pp, dp, vpp, sp, zero, e["rank"])
        a = {g: sum(b * n for gg, _, b, n in coll if gg == g) for g in sizes}
        w = {g: sum(b * n * ring(k, sizes[g]) for gg, k, b, n in coll if gg == g) for g in sizes}
        per_rank.append({"rank": e["rank"], "measured": {g: e[g] for g in sizes}, "analytic": a, "ring_wire": w,
                         "collectives": [{"group": g, "kind": k, "payload_bytes": b, "calls": n} for g, k, b, n in coll]})
    for g in ("tp", "pp", "dp"):
        meas = [r["measured"][g] for r in per_rank]
        ana = [r["analytic"][g] for r in per_rank]
        if not any(meas) and not any(ana):
            continue
        wire = [r["ring_wire"][g] for r in per_rank]
        exact = sum(1 for x, y in zip(meas, ana) if round(x) == round(y))  # the event prints whole bytes
        ratio = sum(meas) / sum(ana) if sum(ana) else float("inf")
        rows.append((name, g, sizes[g], meas, ana, ratio, exact, len(meas), wire))
    results.append({"layout": name, "tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "sequence_parallel": bool(sp),
                    "zero1": bool(zero), "micro_batches_per_rank": G // (B * dp), "steps": ev["steps"],
                    "ranks": per_rank})

def span(xs):
    lo, hi = min(xs), max(xs)
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"

print(f"Communication payload per step per rank: Llama vocab {V}, hidden {C}, {L} layers, {H} heads / {KV} kv, "
      f"FFN {F}; micro batch {B} x seq {T} (N = {N} tokens), global batch {G}; fp32 bytes. "
      f"Ranges are min-max over the ranks of the layout.\n")
print("| layout | group (size) | measured B/step | analytic B/step | measured / analytic | ranks equal | ring wire B/step |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, g, p, meas, ana, ratio, exact, n, wire in rows:
    print(f"| {name} | {g} ({p}) | {span(meas)} | {span(ana)} | {ratio:.4f} | {exact}/{n} | {span(wire)} |")

sched = json.load(open(f"{work}/schedules.json"))
print("\nPipeline bubble of mtrain's schedules (schedule_simulate, forward 1, backward 2, no communication "
      "cost): idle / total rank-time, against (pp-1)/(vpp*m+pp-1) (the same fraction of total time); the last "
      "two columns are the bubble relative to the ideal (busy) time, sim/(1-sim) against the published "
      "(pp-1)/(vpp*m).\n")
print("| pp | vpp | m | simulated (of total) | (pp-1)/(vpp m+pp-1) | sim / formula | simulated (of ideal) | (pp-1)/(vpp m) | micro batches in flight, rank 0 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for s in sched:
    pp, vpp, m, b = s["pp"], s["vpp"], s["m"], s["bubble"]
    f_total = (pp - 1) / (vpp * m + pp - 1)
    f_ideal = (pp - 1) / (vpp * m)
    s.update(formula_of_total=f_total, formula_of_ideal=f_ideal, bubble_of_ideal=b / (1 - b))
    ok = "" if s["ok"] else " (deadlock)"
    print(f"| {pp} | {vpp} | {m} | {b:.4f}{ok} | {f_total:.4f} | {b / f_total:.3f} | {b / (1 - b):.5f} | {f_ideal:.5f} | {s['in_flight']} |")

mismatch = [r for r in rows if r[6] != r[7]]
bubble_off = [s for s in sched if not s["ok"] or abs(s["bubble"] - s["formula_of_total"]) > 1e-6]
print(f"\ncomm: {len(rows) - len(mismatch)}/{len(rows)} (layout, group) rows match the analytic count on every rank; "
      f"schedules: {len(sched) - len(bubble_off)}/{len(sched)} equal the formula")
json.dump({"model": {"vocab": V, "hidden": C, "layers": L, "heads": H, "kv_heads": KV, "ffn": F, "seq_len": T,
                     "micro_batch": B, "global_batch": G},
           "comm": results, "schedules": sched,
           "comm_rows_matching": len(rows) - len(mismatch), "comm_rows": len(rows),
           "schedules_matching": len(sched) - len(bubble_off)},
          open("build/bench/parallel.json", "w"), indent=1)
print("wrote build/bench/parallel.json")
PYEOF
rm -rf "$WORK"
