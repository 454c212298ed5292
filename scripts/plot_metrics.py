#!/usr/bin/env python3
"""Plot the training curves of one or several mtrain runs.

usage: scripts/plot_metrics.py RUN_DIR [RUN_DIR...] --out FILE.png

Reads RUN_DIR/metrics.jsonl (or a metrics.jsonl path) of each run and draws
four panels: loss (dashed: validation loss), learning rate, gradient norm and
throughput (tokens/s), one colour per run. The PNG records what it holds in a
text chunk ("mtrain-plot": panels and runs) so tools can check it.
Exit codes: 0 ok, 1 a run could not be read, 2 usage error.
"""
import argparse
import json
import os
import sys

PANELS = [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "grad norm"), ("tokens_per_s", "tokens/s")]


def read_run(path):
    """Step lines and eval events of one run; raises ValueError naming the file and line."""
    metrics = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(metrics):
        raise ValueError(f"{metrics}: no such file (expected a run directory holding metrics.jsonl)")
    steps, evals = {}, {}
    with open(metrics, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{metrics}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(obj, dict) or "step" not in obj:
                continue
            if obj.get("event") == "eval" and "val_loss" in obj:
                evals[obj["step"]] = obj["val_loss"]
            elif "event" not in obj and "loss" in obj:
                steps[obj["step"]] = obj  # a step seen twice (rewind) keeps its last value
    if not steps:
        raise ValueError(f"{metrics}: no training steps in it")
    return metrics, steps, evals


def main():
    ap = argparse.ArgumentParser(description="Plot loss, lr, grad norm and throughput of mtrain runs.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directory (log.dir) or metrics.jsonl")
    ap.add_argument("--out", required=True, metavar="FILE.png", help="PNG file to write")
    args = ap.parse_args()
    runs = []
    for path in args.runs:
        try:
            runs.append((path, *read_run(path)))
        except (OSError, ValueError) as e:
            print(f"plot_metrics: error: {e}", file=sys.stderr)
            return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: error: needs matplotlib (Debian: python3-matplotlib)", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for (key, title), ax in zip(PANELS, axes.flat):
        for path, _, steps, evals in runs:
            xs = sorted(s for s in steps if key in steps[s])
            line, = ax.plot(xs, [steps[s][key] for s in xs], label=path)
            if key == "loss" and evals:
                es = sorted(evals)
                ax.plot(es, [evals[s] for s in es], "--o", color=line.get_color(), markersize=3,
                        label=f"{path} (val)")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    names = ",".join(os.path.basename(os.path.normpath(p)) for p, *_ in runs)
    meta = {"mtrain-plot": f"panels={','.join(k for k, _ in PANELS)}; runs={names}"}
    try:
        fig.savefig(args.out, dpi=80, metadata=meta)
    except OSError as e:
        print(f"plot_metrics: error: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {len(PANELS)} panels, {len(runs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
