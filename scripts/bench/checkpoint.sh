#!/usr/bin/env bash
# Checkpoint write/read throughput for ~1 GB of state against the raw disk
# write speed (dd with fsync), and the training stall of an async save.
# Writes build/bench/checkpoint.json. Uses $BENCH_DIR (default build/bench/tmp).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/rel}
DIR=${BENCH_DIR:-build/bench/tmp}
rm -rf "$DIR" && mkdir -p "$DIR"
dd_out=$(dd if=/dev/zero of="$DIR/dd.bin" bs=1M count=1024 conv=fsync 2>&1 | tail -1)
dd_gbps=$(echo "$dd_out" | awk '{for (i=1;i<=NF;i++) if ($i ~ /s,$/) s=$(i-1); print 1.073741824/s}')
rm -f "$DIR/dd.bin"
ours=$("$BUILD/bench/bench_checkpoint" "$DIR/ck")
rm -rf "$DIR"
python3 - "$ours" "$dd_gbps" <<'PYEOF'
import json, sys
o, dd = json.loads(sys.argv[1]), float(sys.argv[2])
rows = [("state (params + AdamW moments, fp32)", f'{o["state_gb"]:.2f} GB'),
        ("raw disk write (dd, 1 GiB, fsync)", f"{dd:.2f} GB/s"),
        ("checkpoint write (fsync + commit)", f'{o["write_gbps"]:.2f} GB/s  ({o["write_s"]:.2f} s, {o["write_gbps"] / dd:.2f}x dd)'),
        ("checkpoint read + XXH3 verify", f'{o["read_gbps"]:.2f} GB/s  ({o["read_verify_s"]:.2f} s, page cache warm; the first read took {o["read_first_s"]:.2f} s: fresh 1 GB buffer, file not yet cached)'),
        ("async save: training stall", f'{o["async_stall_s"] * 1e3:.0f} ms  (write finished {o["async_total_s"]:.2f} s later)'),
        ("sync save: training stall", f'{o["write_s"] * 1e3:.0f} ms')]
print("| metric | value |\n| --- | --- |")
for k, v in rows:
    print(f"| {k} | {v} |")
o["dd_gbps"] = dd
json.dump(o, open("build/bench/checkpoint.json", "w"), indent=1)
print("wrote build/bench/checkpoint.json")
PYEOF
