#!/usr/bin/env bash
# A short time-boxed run of every fuzz harness (tests/fuzz/, 3 s each, about
# 45 s in all with the seeds' set-up) so CI exercises the parsers with mutated inputs; `make fuzz`
# runs them longer. A crash, hang, sanitizer report or gigabyte allocation
# on any input is a FAIL line naming the kept input. The mutation seed is
# fixed (FUZZ_SEED, default 1) so a CI run is repeatable.
source "$(dirname "$0")/../lib.sh"
if [ ! -x "$(build_path fuzz/fuzz_recipe)" ]; then skip fuzz_short "no $(build_path fuzz) harnesses (make unit-tests)"; exit 0; fi
FUZZ_SEED=${FUZZ_SEED:-1} FUZZ_SECONDS=${FUZZ_SHORT_SECONDS:-3} bash "$(dirname "$0")/../fuzz/run.sh"
