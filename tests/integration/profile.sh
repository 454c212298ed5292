# MTRAIN_PROFILE=1 (kernels/profile.h): the profiled run trains exactly as
# the plain one (bitwise the same losses, fp32 and bf16), and its table
# counts what the model calls: 2 layers x 7 linears + the head = 15 matmuls
# forward and 15 backward per micro batch, 2 micro batches a step, one
# cross-entropy each; evaluation is left out; the rows add up to the
# header's total, which is no more than the step's wall time; the same
# table is metrics.jsonl's profile event; only rank 0 prints under mpiexec,
# every rank writes LOG_DIR/profile-rank-N.json (pipeline stages differ);
# bench_train prints it on stderr.
source "$(dirname "$0")/../lib.sh"
BENCH_TRAIN=$(build_path bench/bench_train)
cd "$TMP"
"$MTRAIN" data generate --out data --docs 200 --frame-tokens 4096 >/dev/null || { fail profile_setup "data generate failed"; exit 1; }
cat >recipe.yaml <<'YAML'
model: {vocab_size: 257, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 32, micro_batch: 4, global_batch: 8, steps: 12, eval_interval: 6, eval_batches: 2, seed: 7, threads: 1}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 3}
data: {path: data, valid_fraction: 0.1}
log: {dir: run, interval: 1}
YAML
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
# rows OUT OP: the calls per step of OP's rows, summed
calls() { awk -v op="$2" '$5 == op {s += $3} END {print s + 0}' "$1"; }

for precision in fp32 bf16; do
    "$MTRAIN" pretrain recipe.yaml --set train.precision=$precision --set log.dir=plain_$precision >plain.out 2>&1 ||
        { fail profile_${precision}_plain_runs "$(tail -2 plain.out)"; continue; }
    MTRAIN_PROFILE=1 "$MTRAIN" pretrain recipe.yaml --set train.precision=$precision --set log.dir=prof_$precision \
        >prof_$precision.out 2>&1 || { fail profile_${precision}_runs "$(tail -2 prof_$precision.out)"; continue; }
    a=$(losses plain_$precision/metrics.jsonl) b=$(losses prof_$precision/metrics.jsonl)
    [ -n "$a" ] && [ "$a" = "$b" ] && pass profile_${precision}_same_losses ||
        fail profile_${precision}_same_losses "$(paste <(echo "$a") <(echo "$b") | head -3)"
    out=prof_$precision.out
    grep -qE "^profile \(cpu $precision, MTRAIN_PROFILE\): 11 steps, [0-9.]+ ms a step; its ops [0-9.]+ ms" $out &&
        pass profile_${precision}_header || fail profile_${precision}_header "$(grep -m1 profile $out)"
    f=$(calls $out matmul_forward) g=$(calls $out matmul_backward) c=$(calls $out cross_entropy)
    [ "$f" = 30 ] && [ "$g" = 30 ] && [ "$c" = 2 ] && pass profile_${precision}_counts_the_model ||
        fail profile_${precision}_counts_the_model "matmul forward $f, backward $g, cross-entropy $c a step (want 30, 30, 2)"
    # the same table as metrics.jsonl's profile event
    "$PY" - prof_$precision/metrics.jsonl <<'PYEOF' && pass profile_${precision}_event || fail profile_${precision}_event "$(grep -c profile prof_$precision/metrics.jsonl) events"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"event":"profile"' in l]
assert len(ev) == 1, len(ev)
e = ev[0]
mf = sum(r["calls"] for r in e["rows"] if r["op"] == "matmul_forward")
assert e["steps"] == 11 and mf == 30 and abs(sum(r["ms"] for r in e["rows"]) - e["ops_ms"]) < 1e-3 * len(e["rows"]) + 0.01, (e["steps"], mf)
assert all((r["tflops"] is None) == (r["op"] not in ("matmul_forward", "matmul_backward", "attention_forward", "attention_backward")) for r in e["rows"])
PYEOF
    # the rows' ms add up to the header's total (rounding: 1e-3 ms a row), which the wall time bounds
    awk '/^profile/ {for (i = 1; i < NF; i++) {if ($(i + 1) == "ms" && $(i + 2) == "a") wall = $i; if ($i == "ops") ops = $(i + 1)}}
         $4 ~ /^([0-9.]+|-)$/ && $1 ~ /^[0-9.]+$/ {sum += $1; n++}
         END {d = sum - ops; if (d < 0) d = -d; exit (n > 10 && ops > 0 && d <= 1e-3 * n + 0.01 && ops <= wall * 1.001) ? 0 : 1}' $out &&
        pass profile_${precision}_rows_add_up || fail profile_${precision}_rows_add_up "$(grep -A3 '^profile' $out)"
done

# evaluation is not counted: the same counts with evaluation after every step
MTRAIN_PROFILE=1 "$MTRAIN" pretrain recipe.yaml --set train.eval_interval=1 --set log.dir=eval >eval.out 2>&1
f=$(calls eval.out matmul_forward)
[ "$f" = 30 ] && pass profile_leaves_out_evaluation || fail profile_leaves_out_evaluation "matmul forward $f a step"

# one table from rank 0 only under mpiexec (dp 2)
MTRAIN_PROFILE=1 run_np 2 pretrain recipe.yaml --set log.dir=dp2 >dp2.out 2>&1
n=$(grep -c '^profile (' dp2.out)
[ "$n" = 1 ] && pass profile_rank0_prints_once || fail profile_rank0_prints_once "$n tables: $(tail -2 dp2.out)"
# ... and every rank's table as LOG_DIR/profile-rank-N.json: under pp 2 the head's ops are the last stage's only
MTRAIN_PROFILE=1 run_np 2 pretrain recipe.yaml --set parallel.pp=2 --set log.dir=pp2 >pp2.out 2>&1
"$PY" - pp2/profile-rank-00000.json pp2/profile-rank-00001.json <<'PYEOF' && pass profile_every_rank_file ||
import json, sys
first, last = (json.load(open(f)) for f in sys.argv[1:])
head = lambda p: sum(r["calls"] for r in p["rows"] if r["op"] == "cross_entropy")
# stage 0: layer 0's 7 linears, stage 1: layer 1's 7 and the head, 2 micro batches a step
mm = lambda p: sum(r["calls"] for r in p["rows"] if r["op"] == "matmul_forward")
assert head(first) == 0 and head(last) == 2 and mm(first) == 14 and mm(last) == 16, (head(first), head(last), mm(first), mm(last))
PYEOF
    fail profile_every_rank_file "$(ls pp2; tail -2 pp2.out)"

# bench_train: its JSON on stdout, the table on stderr
MTRAIN_PROFILE=1 "$BENCH_TRAIN" 1 32 4 2 64 256 2 16 2 cpu 0 bf16 >bench.json 2>bench.err
grep -q '"step_s"' bench.json && grep -q '^profile (cpu bf16' bench.err && [ "$(calls bench.err matmul_forward)" = 8 ] &&
    pass profile_bench_train || fail profile_bench_train "$(head -c 300 bench.json) / $(head -3 bench.err)"
exit $FAILED
