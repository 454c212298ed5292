/* zb-h1's split backward (model/linear.h) against the whole backward, on one
 * rank: two micro batches in flight (F0 F1 B0 B1 W0 W1, both Ws waiting at
 * once) against F0 F1 B0 B1 with the weight gradients computed inside each
 * backward, for Llama, Mixtral (top 2 of 4 experts) and DeepSeek-V3 (MLA,
 * shared expert, MTP), each recompute mode, on the fp32 and the bf16 CPU
 * tables, and on the fp8 table with per-tensor current, block and delayed
 * scaling (every block in FP8: the W casts its operands when it runs). The losses and every gradient bitwise (the W's sums are the
 * backward's, in the same order: the deferred output gradients kept where
 * backward read its tensors for the last time must be intact when the W
 * runs); the copies each waiting W holds (its output gradients without a
 * home in the slot, and inputs recomputation overwrites) within 2% above
 * the memory estimate's per micro batch (transformer_wgrad_bytes: each copy
 * is aligned to 64 bytes, an expert's rows are not) and no less than 90% of
 * it (an estimate that counted the homed gradients, or homes that
 * were not taken, would break one side); and two copy buffers in all (a W's
 * goes back to the pool once it ran). */
#include <string.h>

#include "config/common.h"
#include "model/linear.h"
#include "model/transformer.h"
#include "tests/unit/check.h"
#include "tests/unit/tiny_model.h"

enum { B = 2, T = 32, N = B * T };

/* F0 F1 B0 B1 on m (its Ws wait when m->defer_w); the two micro batches' summed loss */
static double two_micro_batches(struct transformer *m, const int32_t tok[2][N], const int32_t tgt[2][N]) {
    float dscale = 1.0f / (2 * N);
    transformer_sync_weights(m);
    double loss = 0;
    for (int mb = 0; mb < 2; mb++) {
        transformer_stage(m, mb, tok[mb], tgt[mb], NULL);
        loss += transformer_forward_chunk(m, mb, 0, NULL, dscale);
    }
    for (int mb = 0; mb < 2; mb++) transformer_backward_chunk(m, mb, 0, NULL);
    return loss;
}

/* precision: fp32, bf16, or fp8-SCALING (tensor, block, delayed) */
static void check(const char *family, const struct model_config *cfg, const char *precision, enum recompute rc) {
    static const char *rc_name[] = {"none", "selective", "full"};
    int fp8 = !strncmp(precision, "fp8", 3);
    const struct backend *be = backend_get("cpu", fp8 ? "fp8" : precision);
    struct model_part part;
    model_part_full(&part, cfg);
    struct transformer ref, zb;
    transformer_create(&ref, be, cfg, &part, NULL, 0, B, T, 2, NULL, rc, 0);
    transformer_create(&zb, be, cfg, &part, NULL, 0, B, T, 2, NULL, rc, 0);
    if (fp8) {
        const char *sc = precision + 4;
        struct fp8_recipe r = {.scaling = !strcmp(sc, "block")     ? FP8_SCALING_BLOCK
                                          : !strcmp(sc, "delayed") ? FP8_SCALING_DELAYED
                                                                   : FP8_SCALING_TENSOR};
        transformer_set_fp8(&ref, r, 0, 4);
        transformer_set_fp8(&zb, r, 0, 4);
    }
    transformer_init_params(&ref, 5);
    transformer_init_params(&zb, 5);
    zb.defer_w = 1;
    int32_t tok[2][N], tgt[2][N];
    tiny_tokens(tok[0], tgt[0], N, cfg->vocab_size, 11), tiny_tokens(tok[1], tgt[1], N, cfg->vocab_size, 29);
    double lr = two_micro_batches(&ref, tok, tgt), lz = two_micro_batches(&zb, tok, tgt);
    size_t copied[2] = {wgrad_copied_bytes(&zb, 0), wgrad_copied_bytes(&zb, 1)};
    transformer_weight_grads_chunk(&zb, 0, 0);
    transformer_weight_grads_chunk(&zb, 1, 0);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ref.table.total; i++)
        if (memcmp(&ref.grads[i], &zb.grads[i], sizeof(float)) && !bad++) first = i;
    char name[128];
    snprintf(name, sizeof name, "split_backward_%s_%s_%s_equals_whole", family, precision, rc_name[rc]);
    TEST_RESULT(name, lr == lz && !bad, "loss %.9g vs %.9g; %zu gradients differ (first at %zu: %g vs %g)", lr, lz,
                bad, first, bad ? ref.grads[first] : 0.0, bad ? zb.grads[first] : 0.0);
    size_t est = transformer_wgrad_bytes(be, cfg, &part, 0, B, T, rc);
    snprintf(name, sizeof name, "split_backward_%s_%s_%s_copies_are_the_estimate", family, precision, rc_name[rc]);
    int ok = 1;
    for (int s = 0; s < 2; s++) ok &= copied[s] <= est + est / 50 && copied[s] >= est * 9 / 10;
    TEST_RESULT(name, ok && wgrad_buffers(&zb) == 2, "copied %zu and %zu bytes, estimate %zu; %d copy buffers",
                copied[0], copied[1], est, wgrad_buffers(&zb));
    printf("  %s %s %s: W copies %zu / %zu bytes (estimate %zu)\n", family, precision, rc_name[rc], copied[0],
           copied[1], est);
    transformer_free(&ref), transformer_free(&zb);
}

int main(void) {
    struct model_config llama, mixtral, deepseek;
    tiny_model(&llama);
    tiny_model(&mixtral);
    snprintf(mixtral.arch, sizeof mixtral.arch, "mixtral");
    mixtral.num_experts = 4, mixtral.experts_per_token = 2, mixtral.moe_intermediate_size = 48;
    tiny_model(&deepseek);
    snprintf(deepseek.arch, sizeof deepseek.arch, "deepseek_v3");
    snprintf(deepseek.moe_score_func, sizeof deepseek.moe_score_func, "sigmoid");
    deepseek.num_kv_heads = 4, deepseek.q_lora_rank = 16, deepseek.kv_lora_rank = 16, deepseek.qk_nope_head_dim = 8;
    deepseek.qk_rope_head_dim = 4, deepseek.v_head_dim = 8, deepseek.first_k_dense = 1, deepseek.num_experts = 4;
    deepseek.experts_per_token = 2, deepseek.moe_intermediate_size = 16, deepseek.moe_shared_experts = 1;
    deepseek.moe_n_group = 1, deepseek.moe_topk_group = 1, deepseek.moe_routed_scaling = 2.5;
    deepseek.moe_seq_aux_loss_coef = 1e-3, deepseek.mtp_depth = 1, deepseek.mtp_loss_weight = 0.3;
    const struct { const char *name; const struct model_config *cfg; } fam[] = {
        {"llama", &llama}, {"mixtral", &mixtral}, {"deepseek_v3", &deepseek}};
    const char *precisions[] = {"fp32", "bf16", "fp8-tensor", "fp8-block", "fp8-delayed"};
    for (int f = 0; f < 3; f++)
        for (int p = 0; p < 5; p++)
            for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_FULL; rc++)
                check(fam[f].name, fam[f].cfg, precisions[p], (enum recompute)rc);
    TEST_EXIT();
}
