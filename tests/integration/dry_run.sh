# --dry-run plans without the data: a missing data.path is not an error
# (and it says so); the pipeline summary agrees with the full schedule of
# --verbose (warm-up/steady/cool-down counts, micro batches in flight, the
# 1F1B bubble (pp-1)/(m+pp-1)); the fit verdict per stage agrees with the
# estimate it prints and with train.device_memory_gib.
source "$(dirname "$0")/../lib.sh"
RECIPES="$(cd "$(dirname "$0")/../.." && pwd)/recipes"
cd "$TMP"
cat >r.yaml <<'YAML'
model: {vocab_size: 257, hidden_size: 64, num_layers: 8, num_heads: 4, num_kv_heads: 2, intermediate_size: 128}
train: {seq_len: 64, micro_batch: 2, global_batch: 16, steps: 4}
parallel: {pp: 4}
data: {path: nosuch_dataset}
log: {dir: run}
YAML

expect_exit dry_run_without_data 0 "$MTRAIN" pretrain r.yaml --dry-run
expect_output dry_run_says_data_unchecked '^data_checked: +no \(dry run\): data.path nosuch_dataset is not opened'
# a training run still checks it
expect_exit dry_run_real_run_checks_data 2 "$MTRAIN" pretrain r.yaml --set parallel.pp=1
expect_output dry_run_real_run_data_message "dataset directory 'nosuch_dataset' does not exist"
expect_exit dry_run_verbose_needs_dry_run 2 "$MTRAIN" pretrain r.yaml --verbose

# summary vs --verbose: for 1F1B (vpp 1) and interleaved (vpp 2), 8 micro batches, pp 4
cat >check_schedule.py <<'PY'
import re, sys
summary, verbose, vpp = open(sys.argv[1]).read(), open(sys.argv[2]).read(), int(sys.argv[3])
assert "pipeline rank" not in summary, "the summary prints the full schedule"
stages = {int(m[0]): tuple(map(int, m[1:])) for m in re.findall(
    r"stage (\d+): [^:]*: warm-up (\d+) forwards, steady (\d+) forward\+backward pairs, cool-down (\d+) backwards; "
    r"up to (\d+) micro batch", summary)}
ranks = {int(r): s.split() for r, s in re.findall(r"pipeline rank (\d+):(.*)", verbose)}
assert len(stages) == 4 and sorted(ranks) == sorted(stages), (stages, list(ranks))
for r, items in ranks.items():
    w, s, c, k = stages[r]
    ops = "".join(i[0] for i in items)
    assert ops == "F" * w + "FB" * s + "B" * c, f"rank {r}: {ops} is not warm-up {w}, steady {s}, cool-down {c}"
    assert ops.count("F") == 8 * vpp, ops
    live = most = 0
    for i in items:
        if i.endswith(".0"):
            live += 1 if i[0] == "F" else -1
            most = max(most, live)
    assert most == k, f"rank {r}: {most} micro batches in flight, summary says {k}"
bubble = float(re.search(r"bubble fraction ([0-9.]+)%", summary)[1])
if vpp == 1:  # 1F1B with a backward of two forwards idles (pp-1)/(m+pp-1) of the time
    assert abs(bubble - 100 * 3 / (8 + 3)) < 0.051, bubble
print(f"vpp {vpp}: {len(stages)} stages agree, bubble {bubble}%")
PY
for vpp in 1 2; do
    "$MTRAIN" pretrain r.yaml --set parallel.vpp=$vpp --dry-run >sum$vpp.txt 2>&1
    "$MTRAIN" pretrain r.yaml --set parallel.vpp=$vpp --dry-run --verbose >verb$vpp.txt 2>&1
    if "$PY" check_schedule.py sum$vpp.txt verb$vpp.txt $vpp >"$TMP/out" 2>&1; then pass dry_run_schedule_summary_vpp$vpp
    else fail dry_run_schedule_summary_vpp$vpp "$(tail -2 "$TMP/out")"; fi
done

# fit verdict: 2 ranks (pp 2); stage 0's need is memory_per_rank; need +- margin = capacity
cat >check_fit.py <<'PY'
import re, sys
out, cap, want = open(sys.argv[1]).read(), float(sys.argv[2]), sys.argv[3]
total = float(re.search(r"^memory_per_rank: +([0-9.]+) GiB", out, re.M)[1])
rows = re.findall(r"stage (\d) \(ranks (\d)-(\d)\) needs ([0-9.]+) GiB of ([0-9.]+) GiB: (fits, ([0-9.]+) GiB to spare|"
                  r"does not fit by ([0-9.]+) GiB)", out)
assert len(rows) == 2, out
for st, r0, r1, need, of, _, spare, over in rows:
    need, of = float(need), float(of)
    assert int(r0) == int(r1) == int(st), (st, r0, r1)
    assert of == cap, of
    if st == "0":
        assert abs(need - total) < 0.0015, (need, total)
    if need <= cap:
        assert spare and abs(float(spare) - (cap - need)) < 0.0015, (need, spare)
    else:
        assert over and abs(float(over) - (need - cap)) < 0.0015, (need, over)
fits = all(float(r[3]) <= cap for r in rows)
assert fits == (want == "fits"), (fits, want)
assert ("fits on every rank" in out) == fits and ("does not fit:" in out) != fits
print("stage needs:", [r[3] for r in rows])
PY
"$MTRAIN" pretrain r.yaml --set parallel.pp=2 --dry-run >big.txt 2>&1
need0=$(sed -n 's/^memory_per_rank: *\([0-9.]*\) GiB.*/\1/p' big.txt)
roomy=$(awk -v n="$need0" 'BEGIN{print n * 4}')
tight=$(awk -v n="$need0" 'BEGIN{printf "%.4f", n / 4}')
SLURM_NTASKS=2 "$MTRAIN" pretrain r.yaml --set parallel.pp=2 --set train.device_memory_gib=$roomy --dry-run >fit.txt 2>&1
"$PY" check_fit.py fit.txt "$roomy" fits >"$TMP/out" 2>&1 && pass dry_run_fit_verdict_fits ||
    fail dry_run_fit_verdict_fits "$(tail -2 "$TMP/out")"
SLURM_NTASKS=2 "$MTRAIN" pretrain r.yaml --set parallel.pp=2 --set train.device_memory_gib=$tight --dry-run >nofit.txt 2>&1
"$PY" check_fit.py nofit.txt "$tight" "does not fit" >"$TMP/out" 2>&1 && pass dry_run_fit_verdict_does_not_fit ||
    fail dry_run_fit_verdict_does_not_fit "$(tail -2 "$TMP/out")"
grep -q '^verdict: .*try train.recompute=' nofit.txt && pass dry_run_fit_verdict_suggests ||
    fail dry_run_fit_verdict_suggests "$(grep verdict nofit.txt)"
"$MTRAIN" pretrain r.yaml --dry-run >"$TMP/out" 2>&1
expect_output dry_run_fit_unknown_without_capacity '^fit: +not judged \(set train.device_memory_gib'

# the shipped 8B recipe plans without its data and judges 80 GiB devices
expect_exit dry_run_llama3_8b_without_data 0 "$MTRAIN" pretrain "$RECIPES/llama3-8b.yaml" --dry-run
expect_output dry_run_llama3_8b_fit 'stage 0 needs [0-9.]+ GiB of 80 GiB: (fits|does not fit)'
exit $FAILED
