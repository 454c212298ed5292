# scripts/bench/acceptance.py, the GPU speed-target verdicts of a device
# session, on train_gpu.sh-shaped JSON written here: numbers that meet every
# target pass, numbers that miss each fail it, missing runs skip, and the
# exit code follows the failures. (The GPU numbers themselves come from a GPU.)
source "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TMP"
# rows as train_gpu.sh writes them: FLOPs 6e14 per 8b step; peak 1000 TFLOP/s
bench() { # MTRAIN_BF16_S TORCH_S COMPILE_S FP8_S MTRAIN_MEM TORCH_MEM M124_S C124_S FLASH_MS TORCH_FLASH_MS
    cat <<JSON
{"gpu": "test", "date": "today", "peak_bf16_tflops": 1000, "rows": [
 {"shape": "8b", "run": "mtrain bf16", "r": {"step_s": $1, "flops_per_step": 6e14, "mem_mib": $5}},
 {"shape": "8b", "run": "mtrain fp8", "r": {"step_s": $4, "flops_per_step": 6e14, "mem_mib": $5}},
 {"shape": "8b", "run": "mtrain fp8-block", "r": {"step_s": 100, "flops_per_step": 6e14}},
 {"shape": "8b", "run": "PyTorch bf16 autocast, SDPA, fused AdamW", "r": {"step_s": $2, "peak_mem_mib": $6}},
 {"shape": "8b", "run": "PyTorch bf16 autocast, SDPA, fused AdamW, compile", "r": {"step_s": $3}},
 {"shape": "124m", "run": "mtrain bf16", "r": {"step_s": $7, "flops_per_step": 1e12}},
 {"shape": "124m", "run": "PyTorch bf16 autocast, SDPA, fused AdamW, compile", "r": {"step_s": $8}},
 {"attention": {"impl": "mtrain flash attention", "D": 128, "fwd_bwd_ms": $9}},
 {"attention": {"impl": "mtrain reference attention (MTRAIN_ATTENTION=reference)", "D": 128, "fwd_bwd_ms": 0.001}},
 {"attention": {"backend": "flash", "torch": "2", "D": 128, "fwd_bwd_ms": ${10}}}]}
JSON
}
A="$ROOT/scripts/bench/acceptance.py"
# 8b: 1.0 s = 60% MFU, 1.3x the faster PyTorch (compile 1.3 s), fp8 0.7 s = 1.43x; all met
bench 1.0 1.5 1.3 0.7 1000 2000 0.05 0.06 5.0 6.0 >good.json
"$PY" "$A" good.json >out 2>&1
rc=$?
[ $rc = 0 ] && [ "$(grep -c '^PASS' out)" = 6 ] && pass acceptance_all_met || fail acceptance_all_met "exit $rc: $(tr "\n" " " <out)"
# each target missed: 1.5 s = 40% MFU, 1.13x the compile step (1.7 s), more memory,
# 124m slower than compile, attention slower than flash, fp8 only 1.2x
bench 1.5 1.8 1.7 1.25 3000 2000 0.07 0.06 7.0 6.0 >bad.json
"$PY" "$A" bad.json >out 2>&1
rc=$?
[ $rc = 1 ] && [ "$(grep -c '^FAIL' out)" = 6 ] && pass acceptance_each_missed_fails || fail acceptance_each_missed_fails "exit $rc: $(tr "\n" " " <out)"
grep -q 'FAIL accept_8b_bf16_mfu: 40.0% MFU' out && grep -q '1.13x the faster PyTorch' out &&
    pass acceptance_numbers_shown || fail acceptance_numbers_shown "$(tr "\n" " " <out)"
# nothing measured: every target skips, exit 0
echo '{"rows": []}' >none.json
"$PY" "$A" none.json >out 2>&1
rc=$?
[ $rc = 0 ] && [ "$(grep -c '^SKIP' out)" = 5 ] && pass acceptance_unmeasured_skips || fail acceptance_unmeasured_skips "exit $rc: $(tr "\n" " " <out)"
exit $FAILED
