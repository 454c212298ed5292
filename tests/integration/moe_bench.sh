# The MoE GPU benchmarks' preparation (scripts/bench/moe_gpu.sh, issue 28), on
# the CPU: the shipped shapes fit the GPUs they are meant for by the dry run;
# the whole script runs its mtrain parts (bench_train --recipe, bench_moe
# --recipe, the report) on toy copies of the shapes and writes non-empty
# rows; the MoE layer alone makes no blocking host copy at ep 1 and its
# profiled run counts its ops; bench_train --recipe refuses a missing recipe.
# (The PyTorch peers need torch >= 2.8 and transformers 5.x, which this
# machine's Debian Python lacks: they run on the GPU machine.)
source "$(dirname "$0")/../lib.sh"
SHAPES=$TEST_ROOT/scripts/bench/shapes
# the dry run's verdict: the Mixtral stack on an 80 GiB H100, the DeepSeek-V3 stack on a 141 GiB H200
for s in mixtral-stack:80 deepseek-v3-stack:141; do
    "$MTRAIN" pretrain "$SHAPES/${s%%:*}.yaml" --dry-run --set train.device_memory_gib=${s#*:} >"$TMP/out" 2>&1
    expect_output "moe_bench_${s%%:*}_fits_${s#*:}gib" "^verdict: +fits on every rank"
done
# toy copies: the same keys, small widths
mkdir -p "$TMP/shapes"
sed -e 's/hidden_size: 4096/hidden_size: 64/; s/num_heads: 32/num_heads: 4/; s/num_kv_heads: 8/num_kv_heads: 2/' \
    -e 's/intermediate_size: 14336/intermediate_size: 128/; s/vocab_size: 32000/vocab_size: 256/' \
    -e 's/seq_len: 8192/seq_len: 128/' "$SHAPES/mixtral-stack.yaml" >"$TMP/shapes/mixtral-stack.yaml"
sed -e 's/vocab_size: 129280/vocab_size: 256/; s/hidden_size: 7168/hidden_size: 64/; s/num_heads: 128/num_heads: 4/' \
    -e 's/num_kv_heads: 128/num_kv_heads: 4/; s/^  intermediate_size: 18432/  intermediate_size: 128/' \
    -e 's/q_lora_rank: 1536/q_lora_rank: 16/; s/kv_lora_rank: 512/kv_lora_rank: 16/; s/qk_nope_head_dim: 128/qk_nope_head_dim: 8/' \
    -e 's/qk_rope_head_dim: 64/qk_rope_head_dim: 8/; s/v_head_dim: 128/v_head_dim: 8/' \
    -e 's/moe_intermediate_size: 2048/moe_intermediate_size: 32/; s/seq_len: 4096/seq_len: 128/' \
    -e 's/rope_original_max_pos: 4096/rope_original_max_pos: 128/' "$SHAPES/deepseek-v3-stack.yaml" >"$TMP/shapes/deepseek-v3-stack.yaml"
if [ "$(grep -c 'hidden_size: 64$' "$TMP"/shapes/*.yaml | grep -c ':1$')" != 2 ]; then
    fail moe_bench_toy_shapes "the shapes' widths changed; update the toy copies here"
    exit 1
fi
OMP_NUM_THREADS=1 DEVICE=cpu SHAPE_DIR="$TMP/shapes" OUTDIR="$TMP/bench" BUILD=${BUILD:-build/rel} STEPS=2 \
    RUNS="mtrain-bf16 layer grouped mtrain-fp8-block" bash "$TEST_ROOT/scripts/bench/moe_gpu.sh" >"$TMP/out" 2>&1
rc=$?
[ $rc = 0 ] && pass moe_bench_script_runs || fail moe_bench_script_runs "exit $rc: $(tail -5 "$TMP/out")"
expect_output moe_bench_step_table "^\| deepseek \| mtrain fp8-block \| [0-9.]+ \|"
expect_output moe_bench_layer_table "^\| mixtral \| mtrain MoE layer, bf16 \| [0-9.]+ \|"
"$PY" - "$TMP/bench/moe_gpu.json" <<'PYEOF' >"$TMP/out" 2>&1
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 12, len(rows)  # 2 shapes x (bf16, fp8-block, layer, layer ops, grouped step and layer)
assert all(r["r"] for r in rows), [r["run"] for r in rows if not r["r"]]
arch = {"mixtral": "mixtral", "deepseek": "deepseek_v3"}
assert all(r["r"]["arch"] == arch[r["shape"]] for r in rows)
for r in rows:
    if r["kind"] == "layer":
        assert r["r"]["d2h_copies_per_layer"] == 0, r  # ep 1: the routing stays on the device
    if r["kind"] == "layer-ops":
        assert r["r"]["ops_per_layer"] > 20, r  # router, routing, per-expert GEMMs, combine, forward and backward
    if r["kind"] == "step":
        assert r["r"]["flops_per_step"] > 0 and r["r"]["fp8_reference_gemms_per_step"] == 0, r
print("ok")
PYEOF
[ $? = 0 ] && pass moe_bench_rows || fail moe_bench_rows "$(tail -3 "$TMP/out")"
expect_exit moe_bench_missing_recipe 2 "$(build_path bench/bench_train)" --recipe "$TMP/none.yaml" 1
expect_output moe_bench_missing_recipe_names_it "none.yaml"
exit $FAILED
