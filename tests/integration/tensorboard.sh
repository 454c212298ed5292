# TensorBoard event files (log.tensorboard) read back with the tensorboard
# package's EventAccumulator (without TensorFlow its record reader checks both
# masked CRC-32Cs of every record): every number of every step line of
# metrics.jsonl (and each eval's val_loss) is a scalar with that tag at that
# step, equal as float32; a resume's SessionLog START drops what the
# interrupted run logged past the checkpoint, as metrics.jsonl is trimmed.
# scripts/plot_metrics.py draws two runs into a PNG with 4 panels.
source "$(dirname "$0")/../lib.sh"
require_python tensorboard_setup tensorboard numpy
PLOT="$(cd "$(dirname "$0")/../.." && pwd)/scripts/plot_metrics.py"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 300 >/dev/null || { fail tensorboard_setup "data generate failed"; exit 1; }
# a small mixture of experts, so the MoE scalars (aux_loss, load_max, ...) are there too
cat >moe.yaml <<'YAML'
model: {arch: mixtral, vocab_size: 257, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        intermediate_size: 64, num_experts: 4, experts_per_token: 2}
train: {seq_len: 32, micro_batch: 4, global_batch: 8, steps: 6, eval_interval: 2, eval_batches: 1}
data: {path: data, valid_fraction: 0.1}
checkpoint: {dir: ck, interval: 2}
log: {dir: run, interval: 100, tensorboard: true}
YAML

# compare RUN_DIR: the event files against metrics.jsonl
cat >compare.py <<'PY'
import glob, json, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
files = glob.glob(f"{run}/events.out.tfevents.*")
assert files, f"no event file in {run}"
want = {}  # (tag, step) -> value; a later line for the same step replaces an earlier one
for line in open(f"{run}/metrics.jsonl"):
    o = json.loads(line)
    if o.get("event") == "eval":
        want[("val_loss", o["step"])] = o["val_loss"]
    elif "event" not in o:
        for k, v in o.items():
            if k not in ("step", "consumed_samples") and isinstance(v, (int, float)):
                want[(k, o["step"])] = v
ea = EventAccumulator(run, size_guidance={"scalars": 0})
ea.Reload()
got = {(t, e.step): e.value for t in ea.Tags()["scalars"] for e in ea.Scalars(t)}
for t in ea.Tags()["scalars"]:
    steps = [e.step for e in ea.Scalars(t)]
    assert len(steps) == len(set(steps)), f"tag {t}: a step appears twice: {steps}"
missing = sorted(set(want) - set(got))
extra = sorted(set(got) - set(want))
assert not missing and not extra, f"missing {missing[:5]}, extra {extra[:5]}"
bad = [(k, want[k], got[k]) for k in want if np.float32(want[k]) != np.float32(got[k])]
assert not bad, f"values differ (tag, step, metrics, tensorboard): {bad[:5]}"
tags = sorted({t for t, _ in want})
print(f"{len(want)} scalars equal, tags: {' '.join(tags)}")
PY

expect_exit tensorboard_run 0 "$MTRAIN" pretrain moe.yaml
if "$PY" compare.py run >cmp.out 2>&1 && grep -q 'aux_loss' cmp.out && grep -q 'val_loss' cmp.out &&
   grep -q ' loss ' cmp.out && grep -q 'grad_norm' cmp.out && grep -q 'tokens_per_s' cmp.out; then
    pass tensorboard_scalars_match_metrics
else fail tensorboard_scalars_match_metrics "$(tail -3 cmp.out)"; fi
echo "  $(tail -1 cmp.out)" >&2

# interrupted at step 5 (checkpoint at 4), resumed: each step once, as in metrics.jsonl
"$MTRAIN" pretrain moe.yaml --set log.dir=res --set checkpoint.dir=ck2 --stop-after 5 >/dev/null 2>&1
rm -rf ck2/step-000000005 && printf 'step-000000004\n' >ck2/latest  # as if it died after step 5, before its save
expect_exit tensorboard_resume_runs 0 "$MTRAIN" pretrain moe.yaml --set log.dir=res --set checkpoint.dir=ck2
if [ "$(ls res/events.out.tfevents.* | wc -l)" = 2 ] && "$PY" compare.py res >cmp.out 2>&1; then
    pass tensorboard_resume_matches_trimmed_metrics
else fail tensorboard_resume_matches_trimmed_metrics "$(ls res; tail -3 cmp.out)"; fi

# off by default
"$MTRAIN" pretrain moe.yaml --set log.dir=off --set log.tensorboard=false --set checkpoint.dir=ck3 \
    --set train.seed=3 --set optimizer.lr=3e-3 >/dev/null 2>&1
if [ -s off/metrics.jsonl ] && ! ls off | grep -q tfevents; then pass tensorboard_off_by_default_key
else fail tensorboard_off_by_default_key "$(ls off)"; fi

# --force moves the old event files aside with the old metrics
"$MTRAIN" pretrain moe.yaml --set checkpoint.dir=ck4 --force >/dev/null 2>&1
if ls run/tensorboard.1/ | grep -q tfevents && [ -s run/metrics.jsonl.1 ] && ls run | grep -q '^events.out.tfevents' &&
   "$PY" compare.py run >/dev/null 2>&1; then
    pass tensorboard_force_moves_old_events
else fail tensorboard_force_moves_old_events "$(ls run run/tensorboard.1 2>&1)"; fi

# plots: two runs -> one PNG; each of the 4 panels (2x2 quadrants) holds both
# runs' colours (matplotlib's first two, C0 and C1)
if ! "$PY" -c "import matplotlib" 2>/dev/null; then
    fail plot_metrics_png "$PY cannot import matplotlib (run scripts/install-deps.sh)"
else
    # two runs with other seeds and learning rates: their curves differ
    expect_exit plot_metrics_runs 0 "$PY" "$PLOT" run off --out plot.png
    if "$PY" - <<'PY' >plot.out 2>&1; then pass plot_metrics_png_4_panels_2_runs; else fail plot_metrics_png_4_panels_2_runs "$(tail -2 plot.out)"; fi
import numpy as np
from PIL import Image
from matplotlib.colors import to_rgb
im = Image.open("plot.png")
assert im.format == "PNG", im.format
assert im.info.get("mtrain-plot") == "panels=loss,lr,grad_norm,tokens_per_s; runs=run,off", im.info
a = np.asarray(im.convert("RGB")).astype(int)
h, w, _ = a.shape
for c in ("C0", "C1"):
    rgb = np.array([round(255 * x) for x in to_rgb(c)])
    hit = (np.abs(a - rgb).sum(axis=2) < 30)
    for qy in range(2):
        for qx in range(2):
            q = hit[qy * h // 2:(qy + 1) * h // 2, qx * w // 2:(qx + 1) * w // 2]
            assert q.sum() > 20, f"panel {qy},{qx} lacks colour {c}"
PY
    expect_exit plot_metrics_missing_run_fails 1 "$PY" "$PLOT" run nosuchdir --out bad.png
    expect_output plot_metrics_missing_run_message 'nosuchdir.*no such file'
    mkdir -p garbled && printf '{"step":1,"loss":2}\nnot json\n' >garbled/metrics.jsonl
    expect_exit plot_metrics_garbled_fails 1 "$PY" "$PLOT" garbled --out bad.png
    expect_output plot_metrics_garbled_message 'garbled/metrics.jsonl:2: not a JSON object'
    expect_exit plot_metrics_usage 2 "$PY" "$PLOT" run
fi
exit $FAILED
