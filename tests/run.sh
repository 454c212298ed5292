#!/usr/bin/env bash
# Runs every test: unit programs (build/*/tests/test_*), shell integration
# tests (tests/integration/*.sh) and PyTorch reference tests (tests/reference/*.sh).
# Each prints PASS/FAIL/SKIP lines; the last line here is the summary.
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/rel}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# sanitized builds: MPI's transport leaks a little at init (tests/lsan.supp)
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
log=$(mktemp)
run() {
    local what=$1; shift
    local one; one=$(mktemp)
    local start; start=$(date +%s)
    "$@" >"$one" 2>&1
    local rc=$?
    # a crash or non-zero exit without a FAIL line still counts as a failure
    if [ "$rc" != 0 ] && ! grep -q '^FAIL ' "$one"; then
        tail -n 20 "$one"; echo "FAIL $what: exited $rc" >>"$one"
    fi
    grep -E '^(PASS|FAIL|SKIP) ' "$one" | tee -a "$log" | sed 's/^/  /'
    echo "== $what ($(( $(date +%s) - start ))s)"
    rm -f "$one"
}
for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && run "$(basename "$t")" "$t"; done
for t in tests/integration/*.sh tests/reference/*.sh; do [ -f "$t" ] && run "$t" bash "$t"; done
p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
grep '^FAIL ' "$log" | sed 's/^/  /'
rm -f "$log"
echo "$p passed, $f failed, $s skipped"
[ "$f" = 0 ]
