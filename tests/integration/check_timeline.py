"""Checks a timeline written by MTRAIN_TIMELINE (LOG_DIR/timeline-rank-N.json).

usage: check_timeline.py FILE [--clock host|device] [--lanes a,b] [--overlap]
                              [--no-overlap] [--gather] [--finished] [--rewound]

Always: it parses as a Chrome trace, every span has a start and a duration
of at least 0 (complete slices, and started calls as async begin/end pairs
of one id on their group's lane), and its summary (otherData) agrees with
the one computed here from the spans themselves (a second implementation:
unions by sorting).
--overlap: a data-parallel gradient call began before the last backward
ended; --no-overlap: none did and none ran during a forward or backward;
--gather: a started data-parallel call of the update (ZeRO-1's gathers);
--finished: every span was waited for before the timeline was written;
--rewound: the step was rolled back."""
import json
import sys


def union(iv):
    out = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def inter(x, y):
    s = 0.0
    for a, b in x:
        for c, d in y:
            s += max(0.0, min(b, d) - max(a, c))
    return s


def main():
    path, flags = sys.argv[1], sys.argv[2:]
    d = json.load(open(path))
    o = d["otherData"]
    spans = [dict(e) for e in d["traceEvents"] if e["ph"] == "X"]
    bad = []
    begun = {e["id"]: e for e in d["traceEvents"] if e["ph"] == "b"}
    for e in d["traceEvents"]:
        if e["ph"] == "e":
            b = begun.pop(e["id"], None)
            if b is None or b["tid"] != e["tid"] or b["name"] != e["name"]:
                bad.append(f"an async end without its begin: {e}")
                continue
            spans.append(dict(b, dur=e["ts"] - b["ts"]))
    if begun:
        bad.append(f"{len(begun)} async begins without an end")
    lanes = {e["args"]["name"] for e in d["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    if len(spans) != o["spans"]:
        bad.append(f"{len(spans)} spans, summary says {o['spans']}")
    if any(e["dur"] < 0 or e["ts"] < 0 for e in spans):
        bad.append("a span with a negative start or duration")
    ms = lambda e: (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3)
    passes = [ms(e) for e in spans if e["cat"] == "compute" and e["name"] in ("forward", "backward")]
    grad = [e for e in spans if e["cat"] == "comm" and e["args"]["group"] in ("dp", "edp")
            and e["args"]["phase"] == "compute"]
    gu, cu = union([ms(e) for e in grad]), union(passes)
    mine = {"compute_ms": sum(b - a for a, b in cu), "grad_ms": sum(b - a for a, b in gu),
            "grad_hidden_ms": inter(gu, cu)}
    mine["grad_exposed_ms"] = mine["grad_ms"] - mine["grad_hidden_ms"]
    mine["step_ms"] = max((ms(e)[1] for e in spans if e["cat"] == "compute"), default=0.0)
    for k, v in mine.items():
        # the trace's times and the summary's are rounded to 1 ns
        if abs(v - o[k]) > 1e-5 * (1 + len(spans)):
            bad.append(f"{k} {o[k]}, recomputed {v:.6f}")
    if any(e["cat"] == "comm" and e["args"]["started"] != (e["ph"] == "b") for e in d["traceEvents"]
           if e["ph"] in ("X", "b")):
        bad.append("a started call as a complete slice, or a blocking one as an async slice")
    if o["grad_calls"] != len(grad) or o["grad_bytes"] != sum(e["args"]["bytes"] for e in grad):
        bad.append(f"grad calls/bytes {o['grad_calls']}/{o['grad_bytes']} against the spans'")
    i = 0
    while i < len(flags):
        f = flags[i]
        if f == "--clock":
            i += 1
            if o["clock"] != flags[i]:
                bad.append(f"clock {o['clock']}, want {flags[i]}")
        elif f == "--lanes":
            i += 1
            want = {("comm " + x if x != "compute" else x) for x in flags[i].split(",")}
            if not want <= lanes:
                bad.append(f"lanes {sorted(lanes)}, want {sorted(want)}")
        elif f in ("--overlap", "--no-overlap"):
            last_bwd = max((ms(e)[1] for e in spans if e["name"] == "backward"), default=None)
            early = [e for e in grad if ms(e)[0] < last_bwd] if last_bwd is not None else []
            if f == "--overlap" and not (early and all(e["args"]["started"] for e in early)):
                bad.append("no started gradient call began before backward ended")
            if f == "--no-overlap" and (early or o["grad_hidden_ms"] > 0):
                bad.append(f"{len(early)} gradient calls began during backward, {o['grad_hidden_ms']} ms hidden")
            if not grad:
                bad.append("no data-parallel gradient call")
        elif f == "--gather":
            if not any(e["args"]["phase"] == "update" and e["args"]["started"] and e["args"]["group"] == "dp"
                       for e in spans if e["cat"] == "comm"):
                bad.append("no started data-parallel call in the update")
        elif f == "--rewound":
            if o["rewound"] is not True:
                bad.append("not marked as rolled back")
        elif f == "--finished":
            if o["unfinished"] or any(e["args"].get("unfinished") for e in spans):
                bad.append(f"{o['unfinished']} spans never waited for")
        else:
            bad.append(f"unknown flag {f}")
        i += 1
    if bad:
        print(f"{path}: " + "; ".join(bad))
        sys.exit(1)


main()
