/* One forward + backward of each model family (Llama, Mixtral, DeepSeek-V3
 * with MLA, shared expert and MTP) on the fp32 and the bf16 CPU tables, from
 * the same weights and tokens: the loss and every parameter's gradient
 * within a tolerance norm-wise (||g16 - g32|| / ||g32|| per tensor). A wrong
 * row offset into 2-byte storage (an expert's rows, MLA's rotary rows,
 * eh_proj's columns) garbles one tensor's gradient far beyond bf16
 * rounding, which a layout comparison (both sides wrong alike) or a loss at
 * initialisation (about ln V whatever the weights) would not show.
 * The MoE layers route every token to every expert (top-k = all of them):
 * with a choice to make, bf16's rounding of near-tied router scores flips a
 * few tokens' experts, which moves whole tokens between experts and every
 * gradient upstream of them. All experts, routers and their weights still
 * carry gradients. Tolerances: the loss 1e-2; gradients 5e-2 (bf16 keeps 8
 * bits; the measured worst per family is printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "model/transformer.h"
#include "tests/unit/check.h"
#include "tests/unit/tiny_model.h"

/* Largest norm-wise difference between an fp32 activation and its bf16 twin. */
static double act_err(const struct transformer *m16, const float *a32, const float *b16, size_t n) {
    float *b = malloc(sizeof(float) * (n ? n : 1));
    m16->be->from_storage(b, b16, n);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)b[i] - a32[i]) * ((double)b[i] - a32[i]), den += (double)a32[i] * a32[i];
    free(b);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Every saved activation of the forward pass (layer inputs, norms, q/k/v,
 * MLA latents, attention output, SwiGLU products, head, MTP), fp32 against
 * bf16, norm-wise: a weight or activation addressed at a wrong offset
 * computes different numbers here even where the loss and the gradients at
 * initialisation hardly move. */
static void check_activations(const char *tag, const struct transformer *m32, const struct transformer *m16) {
    size_t N = m32->N, Ns = m32->Ns, C = m32->C, QD = (size_t)m32->Hl * m32->D, KD = (size_t)m32->KVl * m32->D;
    size_t VD = (size_t)m32->KVl * m32->Dv, OD = (size_t)m32->Hl * m32->Dv;
    double worst = 0;
    char where[96] = "";
#define ACT(field, n, what, l)                                                                                   \
    do {                                                                                                       \
        double e_ = act_err(m16, a->field, b->field, (n));                                                     \
        if (!(e_ <= worst)) worst = e_, snprintf(where, sizeof where, "%s of layer %d", what, l);              \
    } while (0)
    for (int l = 0; l < m32->NL; l++) {
        const struct layer_acts *a = &m32->slots[0].acts[l], *b = &m16->slots[0].acts[l];
        ACT(x, Ns * C, "x", l); ACT(ln1, N * C, "ln1", l); ACT(q, N * QD, "q", l); ACT(k, N * KD, "k", l);
        ACT(v, N * VD, "v", l); ACT(attn_out, N * OD, "attn_out", l); ACT(xmid, Ns * C, "xmid", l);
        ACT(ln2, N * C, "ln2", l);
        if (m32->mla) {
            ACT(qa, N * m32->QR, "qa", l); ACT(qan, N * m32->QR, "qan", l); ACT(ckv, N * m32->KR, "ckv", l);
            ACT(kvn, N * m32->KR, "kvn", l);
        }
        size_t F = m32->layers[l].moe ? (size_t)m32->Fs : (size_t)m32->Fl;
        if (F) {
            ACT(gate, N * F, "gate", l); ACT(up, N * F, "up", l); ACT(h, N * F, "h", l);
        }
        if (m32->layers[l].moe) ACT(logits, (size_t)m32->moe_n * m32->E, "router logits", l);
    }
    {
        const struct act_slot *a = &m32->slots[0], *b = &m16->slots[0];
        ACT(x_final, Ns * C, "x_final", -1); ACT(lnf, N * C, "lnf", -1);
    }
    for (int d = 0; d < m32->mtp_depth; d++) {
        const struct mtp_acts *a = &m32->slots[0].mtp[d], *b = &m16->slots[0].mtp[d];
        ACT(emb, Ns * C, "mtp emb", d); ACT(en, N * C, "mtp en", d); ACT(hn, N * C, "mtp hn", d);
        ACT(cat, N * 2 * C, "mtp cat", d); ACT(out, Ns * C, "mtp out", d);
    }
#undef ACT
    char name[96];
    snprintf(name, sizeof name, "bf16_model_%s_activations", tag);
    TEST_RESULT(name, worst <= 2e-2, "worst %s: %.3g", where, worst);
    printf("  %s: worst activation %s %.3g\n", tag, where, worst);
}

static void check_family(const char *tag, const struct model_config *cfg) {
    const struct backend *b32 = backend_get("cpu", "fp32"), *b16 = backend_get("cpu", "bf16");
    int B = 2, T = 32, N = B * T;
    struct model_part part;
    model_part_full(&part, cfg);
    struct transformer m32, m16;
    transformer_create(&m32, b32, cfg, &part, NULL, 0, B, T, 1, NULL, RECOMPUTE_NONE, 0);
    transformer_create(&m16, b16, cfg, &part, NULL, 0, B, T, 1, NULL, RECOMPUTE_NONE, 0);
    transformer_init_params(&m32, 3);
    transformer_init_params(&m16, 3);
    int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    tiny_tokens(tok, tgt, N, cfg->vocab_size, 17);
    float dscale = 1.0f / (float)N;
    double l32 = transformer_step(&m32, tok, tgt, dscale) / N, l16 = transformer_step(&m16, tok, tgt, dscale) / N;
    check_activations(tag, &m32, &m16);
    char name[96];
    snprintf(name, sizeof name, "bf16_model_%s_loss", tag);
    TEST_RESULT(name, fabs(l16 - l32) / l32 <= 1e-2, "loss fp32 %.6f bf16 %.6f", l32, l16);
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < m32.table.count; i++) {
        const struct param_info *p = &m32.table.items[i];
        if (p->kind == PARAM_STATE) continue;
        const float *a = m32.grads + p->offset, *b = m16.grads + p->offset;
        double num = 0, den = 0;
        for (size_t j = 0; j < p->numel; j++) num += ((double)b[j] - a[j]) * ((double)b[j] - a[j]), den += (double)a[j] * a[j];
        double e = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!(e <= worst)) worst = e, worst_name = p->name;
        if (!(e <= 5e-2)) bad++;
    }
    snprintf(name, sizeof name, "bf16_model_%s_grads", tag);
    TEST_RESULT(name, !bad, "%d tensors beyond 5e-2, worst %s %.3g", bad, worst_name, worst);
    printf("  %s: loss fp32 %.6f bf16 %.6f, worst gradient %s %.3g\n", tag, l32, l16, worst_name, worst);
    free(tok), free(tgt);
    transformer_free(&m32), transformer_free(&m16);
}

int main(void) {
    struct model_config llama, mixtral, deepseek;
    tiny_model(&llama);
    check_family("llama", &llama);
    tiny_model(&mixtral);
    snprintf(mixtral.arch, sizeof mixtral.arch, "mixtral");
    mixtral.num_experts = 4, mixtral.experts_per_token = 4, mixtral.moe_intermediate_size = 48;
    mixtral.moe_layer_freq = 2, mixtral.moe_z_loss_coef = 1e-3;
    check_family("mixtral", &mixtral);
    tiny_model(&deepseek);
    snprintf(deepseek.arch, sizeof deepseek.arch, "deepseek_v3");
    snprintf(deepseek.moe_score_func, sizeof deepseek.moe_score_func, "sigmoid");
    deepseek.num_kv_heads = 4, deepseek.q_lora_rank = 16, deepseek.kv_lora_rank = 16, deepseek.qk_nope_head_dim = 8;
    deepseek.qk_rope_head_dim = 4, deepseek.v_head_dim = 8, deepseek.first_k_dense = 1, deepseek.num_experts = 4;
    deepseek.experts_per_token = 4, deepseek.moe_intermediate_size = 16, deepseek.moe_shared_experts = 1;
    deepseek.moe_n_group = 1, deepseek.moe_topk_group = 1, deepseek.moe_routed_scaling = 2.5;
    deepseek.moe_bias_update_rate = 1e-3, deepseek.moe_seq_aux_loss_coef = 1e-3, deepseek.moe_aux_loss_coef = 0;
    deepseek.moe_z_loss_coef = 0, deepseek.mtp_depth = 1, deepseek.mtp_loss_weight = 0.3;
    check_family("deepseek_v3", &deepseek);
    TEST_EXIT();
}
