#!/usr/bin/env bash
# Streaming data tools: peak resident memory of `mtrain data build` on one
# 1 GB document (a plain text file) and of `mtrain data import` on a Megatron
# index whose one document reads the same 40 MB range of the .bin 40 times.
# Writes build/bench/data_stream.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build/bench
PY=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$tmp" "$PWD/mtrain" <<'PY'
import json, os, resource, struct, subprocess, sys, time
import numpy as np
tmp, mtrain = sys.argv[1], sys.argv[2]
line = b"the quick brown fox jumps over the lazy dog; 0123456789 " * 16 + b"\n"
with open(os.path.join(tmp, "one.txt"), "wb") as f:
    for _ in range(1024 ** 3 // len(line)):
        f.write(line)
n, seqs = 20 * 1024 * 1024, 40
np.arange(n, dtype=np.uint16).tofile(os.path.join(tmp, "adv.bin"))
with open(os.path.join(tmp, "adv.idx"), "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<QQ", seqs, 2))
    f.write(np.full(seqs, n, dtype=np.int32).tobytes() + np.zeros(seqs, dtype=np.int64).tobytes())
    f.write(np.array([0, seqs], dtype=np.int64).tobytes())
out = {}
for name, cmd in [("build_1GB_document", ["data", "build", "--tokenizer", "bytes", "--quiet", "--out", "ds1", "one.txt"]),
                  ("import_adversarial_idx", ["data", "import", "adv", "--out", "ds2", "--vocab-size", "65536"])]:
    t0 = time.time()
    # a fresh child per command: wait4 gives each one's own peak
    pid = os.fork()
    if pid == 0:
        os.chdir(tmp)
        os.execv(mtrain, [mtrain] + cmd)
    _, status, ru = os.wait4(pid, 0)
    out[name] = {"exit": os.waitstatus_to_exitcode(status), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
                 "seconds": round(time.time() - t0, 1)}
print("| command | peak RSS | time |\n| --- | --- | --- |")
for k, v in out.items():
    print(f'| {k} | {v["peak_rss_mib"]:.0f} MiB (exit {v["exit"]}) | {v["seconds"]} s |')
json.dump(out, open("build/bench/data_stream.json", "w"), indent=1)
print("wrote build/bench/data_stream.json")
PY
