/* The step-time model of `mtrain plan` (model/plan.h). */
#include <math.h>
#include <string.h>

#include "config/common.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "model/master.h"
#include "model/params.h"
#include "model/plan.h"
#include "model/transformer.h"
#include "parallel/schedule.h"

struct ctx {
    const struct recipe *r;
    const struct system_spec *s;
    double peak, membw; /* FLOP/s and B/s per accelerator */
    /* fp8 runs: the FP8 blocks' linears at the FP8 peak and gemm_fp8's efficiencies (fp8_lin), everything
     * else kept in bf16 (docs/model.md: attention, the head, routers, MTP, the skipped end blocks) at peak16 */
    double peak16;
    const struct system_curve *gemm, *gemm16;
    int fp8_lin;
    double ab;          /* bytes per stored activation element */
    int cpu;            /* the CPU backend: attention keeps its probabilities */
    /* the step's shape */
    double B, S, Tl, N; /* micro batch, sequence, tokens of a sequence on a rank, tokens of a micro batch on a rank */
    int tp, cp, pp, vpp, dp, ep, etp, sp;
};

/* a block's linear layers (FP8 in an fp8 run's FP8 blocks), and a GEMM kept in bf16 */
static double gemm_s(const struct ctx *c, double flops_call, double calls) {
    return c->fp8_lin ? calls * flops_call / (c->peak * system_curve_at(c->gemm, flops_call))
                      : calls * flops_call / (c->peak16 * system_curve_at(c->gemm16, flops_call));
}
static double gemm16_s(const struct ctx *c, double flops_call, double calls) {
    return calls * flops_call / (c->peak16 * system_curve_at(c->gemm16, flops_call));
}
static double attention_s(const struct ctx *c, double flops) {
    return flops / (c->peak16 * system_curve_at(&c->s->attention, flops));
}
static double mem_s(const struct ctx *c, double bytes) { return bytes / c->membw; }

/* bandwidth (B/s) and latency (s) of a group whose ranks span `span` consecutive ranks */
static void link(const struct ctx *c, long span, double *bw, double *lat) {
    int intra = span <= c->s->per_node || !strcmp(c->s->name, "cpu"); /* CPU ranks: one machine */
    *bw = (intra ? c->s->intra_gbps : c->s->inter_gbps) * 1e9;
    *lat = (intra ? c->s->intra_lat_us : c->s->inter_lat_us) * 1e-6;
}
/* a ring collective of n ranks: factor 2 all-reduce, 1 all-gather / reduce-scatter / all-to-all */
static double coll_s(const struct ctx *c, int n, long span, double bytes, double factor) {
    if (n <= 1) return 0;
    double bw, lat;
    link(c, span, &bw, &lat);
    return factor * ((n - 1.0) / n * bytes / bw + (n - 1) * lat);
}
static double p2p_s(const struct ctx *c, long span, double bytes) {
    double bw, lat;
    link(c, span, &bw, &lat);
    return bytes / bw + lat;
}

/* one layer's forward (compute and the exchanges on its critical path) and backward, per micro batch */
struct cost { double f, b, recompute, w; }; /* w: the weight-gradient GEMMs in b (zb-h1's W) */

static struct cost layer_cost(const struct ctx *c, int moe) {
    const struct model_config *m = &c->r->model;
    double N = c->N, C = m->hidden_size, tp = c->tp, ab = c->ab;
    double H = m->num_heads, Hl = H / tp, D = model_head_dim(m), Dv = model_v_head_dim(m);
    double KVl = m->num_kv_heads >= c->tp ? m->num_kv_heads / tp : 1;
    struct cost k = {0};
    /* attention projections */
    double g = 0;
    if (model_is_mla(m)) {
        double QR = m->q_lora_rank, KR = m->kv_lora_rank, Dr = model_rope_dim(m), DN = m->qk_nope_head_dim;
        KVl = Hl;
        g += QR ? gemm_s(c, 2 * N * C * QR, 1) + gemm_s(c, 2 * N * QR * Hl * D, 1) : gemm_s(c, 2 * N * C * Hl * D, 1);
        g += gemm_s(c, 2 * N * C * (KR + Dr), 1) + gemm_s(c, 2 * N * KR * Hl * (DN + Dv), 1);
    } else {
        g += gemm_s(c, 2 * N * C * Hl * D, 1) + gemm_s(c, 2 * N * C * KVl * D, 2);
    }
    g += gemm_s(c, 2 * N * Hl * Dv * C, 1);
    /* the FFN: dense SwiGLU, or router + routed experts (each rank routes N/tp tokens) + shared experts */
    double rows_w = 0; /* FFN activation elements for the memory-bound ops */
    if (!moe) {
        double Fl = m->intermediate_size / tp;
        g += gemm_s(c, 2 * N * C * Fl, 3);
        rows_w = N * Fl;
    } else {
        double E = m->num_experts, kk = m->experts_per_token, FM = model_moe_ffn_size(m), n = N / tp;
        double per_expert = n * kk * c->ep / E; /* rows one local expert receives, balanced */
        g += gemm16_s(c, 2 * n * C * E, 1) + gemm_s(c, 2 * per_expert * C * FM, 3 * E / c->ep); /* router: bf16 */
        double Fs = m->moe_shared_experts * FM / tp;
        if (Fs > 0) g += gemm_s(c, 2 * N * C * Fs, 3);
        rows_w = n * kk * FM + N * Fs;
        /* the token exchange: dispatch and combine, forward and backward (the EP ranks are etp apart) */
        double a2a = coll_s(c, c->ep, (long)c->ep * c->etp, n * kk * C * ab, 1);
        /* etp > 1: the received rows gathered over etp, the partial outputs summed back in fp32; the GEMMs
         * see etp times the rows at 1/etp of the width (the same FLOPs) */
        double rows = c->etp * n * kk * C;
        double etpc = coll_s(c, c->etp, c->etp, rows * ab, 1) + coll_s(c, c->etp, c->etp, rows * 4, 1);
        k.f += 2 * a2a + etpc, k.b += 2 * a2a + etpc;
    }
    /* causal attention of this rank's queries (T/cp of each sequence) over the whole sequence */
    double attn = 2 * (D + Dv) * c->B * Hl * c->S * c->S / (2.0 * c->cp);
    double af = attention_s(c, attn), abw = 2.5 * af;
    /* memory-bound: norms, residual adds, rope, SwiGLU, and on the CPU the kept probabilities */
    double Ns = c->sp ? N / tp : N;
    double mb = ab * (10 * Ns * C + 2 * N * (Hl + KVl) * D + 3 * rows_w);
    if (c->cpu) mb += 4.0 * 3 * c->B * Hl * c->Tl * c->S;
    /* tensor parallel: two all-reduces (or all-gather + reduce-scatter pairs) each way */
    double tpc = coll_s(c, c->tp, c->tp, N * C * ab, 2) * 2;
    /* context parallel: the ring, forward cp-1 hops of K,V; backward as many and cp of their fp32 gradients */
    double kv = N * KVl * (D + Dv), hop = c->cp > 1 ? p2p_s(c, (long)c->tp * c->cp, kv * ab) : 0;
    double ring_f = (c->cp - 1) * hop, ring_b = (c->cp - 1) * hop + (c->cp > 1 ? c->cp * p2p_s(c, (long)c->tp * c->cp, kv * 4) : 0);
    k.f += g + af + mem_s(c, mb) + tpc + ring_f;
    k.b += 2 * g + abw + mem_s(c, 2 * mb) + tpc + ring_b;
    k.w = g; /* each GEMM's backward: the input gradient (B) and as much again for the weights' (W) */
    enum recompute rc = recompute_mode(c->r->train.recompute);
    if (rc == RECOMPUTE_FULL) k.recompute = k.f;
    if (rc == RECOMPUTE_SELECTIVE) k.recompute = af + ring_f;
    return k;
}

/* forward and backward of one micro batch on pipeline stage p (all its chunks) */
static struct cost stage_cost(const struct ctx *c, int p) {
    const struct model_config *m = &c->r->model;
    struct model_part part;
    model_part_for(&part, m, &c->r->parallel, 0, p, 0, 0);
    struct ctx c16 = *c; /* blocks kept in bf16 */
    c16.fp8_lin = 0;
    struct cost dense = layer_cost(c, 0), moe = m->num_experts ? layer_cost(c, 1) : dense, t = {0};
    struct cost dense16 = c->fp8_lin ? layer_cost(&c16, 0) : dense; /* bf16 runs: the same */
    struct cost moe16 = c->fp8_lin && m->num_experts ? layer_cost(&c16, 1) : c->fp8_lin ? dense16 : moe;
    int skip = c->fp8_lin ? c->r->train.fp8_skip_layers : 0, L = m->num_layers;
    for (int ch = 0; ch < part.nchunks; ch++)
        for (int l = part.layer_begin[ch]; l < part.layer_end[ch]; l++) {
            int fp8_block = l >= skip && l < L - skip;
            struct cost k = model_layer_is_moe(m, l) ? (fp8_block ? moe : moe16) : (fp8_block ? dense : dense16);
            t.f += k.f, t.b += k.b + k.recompute, t.w += k.w;
        }
    double C = m->hidden_size, V = m->vocab_size, N = c->N, ab = c->ab;
    if (part.has_embed) t.f += mem_s(c, N * C * ab), t.b += mem_s(c, 2 * N * C * 4);
    if (part.has_head) { /* the output head and the loss (fp32 logits), and each MTP module's block and head */
        double Vl = V / c->tp, head_f = gemm16_s(c, 2 * N * C * Vl, 1) + mem_s(c, 3 * N * Vl * 4);
        double head_b = 2 * gemm16_s(c, 2 * N * C * Vl, 1) + mem_s(c, 2 * N * Vl * 4);
        for (int d = 0; d <= model_mtp_depth(m); d++) {
            t.f += head_f, t.b += head_b, t.w += gemm16_s(c, 2 * N * C * Vl, 1);
            if (!d) continue;
            struct cost k = m->num_experts ? moe16 : dense16; /* MTP modules: bf16 */
            double proj = gemm16_s(c, 2 * N * 2 * C * C, 1);
            t.f += k.f + proj, t.b += k.b + k.recompute + 2 * proj;
            t.w += k.w + proj;
        }
    }
    if (c->pp > 1) { /* the activation to the next stage and the gradient back, per chunk */
        double a = p2p_s(c, (long)c->tp * c->cp * c->dp + 1, (c->sp ? N / c->tp : N) * C * ab);
        t.f += part.nchunks * a, t.b += part.nchunks * a;
    }
    return t;
}

void plan_predict(const struct recipe *r, int world, const struct system_spec *s, const struct backend *be,
                  struct plan_cost *out) {
    memset(out, 0, sizeof *out);
    const struct parallel_config *par = &r->parallel;
    struct ctx c = {.r = r, .s = s, .cpu = !strcmp(be->name, "cpu")};
    c.tp = par->tp, c.cp = par->cp, c.pp = par->pp, c.vpp = par->pp > 1 ? par->vpp : 1, c.ep = par->ep;
    c.etp = par->etp > 0 ? par->etp : 1;
    c.dp = world / (c.tp * c.cp * c.pp);
    c.sp = par->sequence_parallel && c.tp > 1;
    c.ab = be->act_bytes;
    c.fp8_lin = be->precision == PRECISION_FP8;
    c.peak16 = 1e12 * (be->precision == PRECISION_FP32 ? s->tflops_fp32 : s->tflops_bf16);
    c.peak = c.fp8_lin ? 1e12 * s->tflops_fp8 : c.peak16;
    c.gemm16 = &s->gemm;
    c.gemm = c.fp8_lin && s->gemm_fp8.n ? &s->gemm_fp8 : &s->gemm;
    c.membw = s->mem_gbps * 1e9 * s->mem_eff;
    /* CPU ranks on one machine beyond the ones it was calibrated with (its cores) share them */
    if (!strcmp(s->name, "cpu") && world > s->per_node) {
        double share = (double)s->per_node / world;
        c.peak *= share, c.peak16 *= share, c.membw *= share;
    }
    c.B = r->train.micro_batch, c.S = r->train.seq_len, c.Tl = c.S / c.cp, c.N = c.B * c.Tl;
    int m = r->train.global_batch / (r->train.micro_batch * c.dp);
    /* the busiest stage sets the pace; its memory is the estimate's */
    struct cost worst = {0};
    for (int p = 0; p < c.pp; p++) {
        struct cost t = stage_cost(&c, p);
        if (t.f + t.b > worst.f + worst.b) worst = t;
        struct memory_estimate e = model_memory_estimate_stage(r, c.dp, be, p);
        double gib = (double)e.total / (1ull << 30);
        if (gib > out->mem_gib) out->mem_gib = gib;
    }
    out->fits = out->mem_gib <= s->mem_gib;
    out->forward_s = worst.f, out->backward_s = worst.b;
    double bubble = 0;
    enum sched_kind kind = schedule_kind(par->schedule, c.vpp);
    /* zbv's order is made for the costs the trainer measures in its first step: these */
    double bc = worst.b / worst.f, ws = worst.w / worst.b, made_for[3] = {1, bc * (1 - ws), bc * ws};
    if (made_for[1] <= 0 || made_for[2] <= 0) made_for[1] = made_for[2] = 1;
    if (c.pp > 1 && schedule_simulate_timed(kind, c.pp, c.vpp, m, 0, bc, ws, made_for, &bubble) != 0) bubble = 0;
    out->bubble = bubble;
    double compute = m * (worst.f + worst.b) / (1 - bubble);
    /* data parallel over dp x cp: an all-reduce of the gradients, or ZeRO-1's reduce-scatter and gather;
     * overlapped with the last micro batch's backward (and the gather with the next forward) when on */
    struct param_table t;
    struct model_part part;
    model_part_for(&part, &r->model, par, 0, 0, 0, 0);
    param_table_build(&t, &r->model, &part);
    double local = (double)t.total;
    int fe = param_table_first_expert(&t);
    double experts = fe < t.count ? (double)(t.total - t.items[fe].offset) : 0, dense = local - experts, gains = 0;
    for (int i = 0; i < fe; i++)
        if (master_packed(&t.items[i])) gains += (double)t.items[i].numel;
    param_table_free(&t);
    int dpcp = c.dp * c.cp, zero = r->optimizer.distributed && dpcp > 1;
    long span = (long)c.tp * c.cp * c.dp;
    double red = zero ? coll_s(&c, dpcp, span, dense * 4, 1) : coll_s(&c, dpcp, span, dense * 4, 2);
    double gather = zero ? coll_s(&c, dpcp, span, dense * c.ab, 1) : 0;
    double hide_r = par->overlap_grad_reduce ? worst.b : 0, hide_g = zero && par->overlap_param_gather ? worst.f : 0;
    double dp_exposed = fmax(0, red - hide_r) + fmax(0, gather - hide_g);
    /* AdamW: master, gradient, two moments read and written, the working copy written */
    double shard = zero ? dense / dpcp + experts : local;
    out->optimizer_s = mem_s(&c, shard * 34.0);
    out->step_s = compute + dp_exposed + out->optimizer_s;
    out->comm_s = dp_exposed;
    double tokens = (double)r->train.global_batch * c.S;
    out->tokens_per_s = tokens / out->step_s / world;
    out->tflops = model_flops_per_token(&r->model, r->train.seq_len) * out->tokens_per_s / 1e12;
    out->mfu = out->tflops / s->tflops_bf16;
    /* bytes per rank per step as the comm accounting counts them (each call's payload) */
    /* ZeRO-1 with a working copy (a sharded master) also all-gathers the norm gains it keeps whole (model/master.h) */
    out->bytes[PLAN_DP] = dpcp > 1 ? dense * 4 + (zero ? dense * c.ab + (c.ab < 4 ? gains * 4 : 0) : 0) : 0;
    double layers = 0; /* stage 0's main layers, all its chunks */
    for (int ch = 0; ch < part.nchunks; ch++) layers += part.layer_end[ch] - part.layer_begin[ch];
    if (c.pp > 1) { /* stage 0 sends every chunk's forward and every chunk's backward but virtual stage 0's (zbv:
                     * its chunk 1 is the last virtual stage, whose forward sends nothing) */
        double a = (c.sp ? c.N / c.tp : c.N) * r->model.hidden_size * c.ab;
        out->bytes[PLAN_PP] = a * m * (schedule_v_shaped(kind) ? 2 : 2 * c.vpp - 1);
    }
    if (c.tp > 1) { /* as model/transformer.c calls them on stage 0, for dense GQA layers (MoE and MLA add more) */
        const struct model_config *mc = &r->model;
        double C = mc->hidden_size, N = c.N, ab = c.ab;
        int head = part.has_head, full = recompute_mode(r->train.recompute) == RECOMPUTE_FULL;
        /* per micro batch: each layer's two row-parallel outputs (forward, again under full recompute) and
         * two column-parallel input gradients; the embedding's output; the head's input gradient */
        double k = (4 + 2 * full) * layers + 1 + head;
        if (c.sp) /* each an all-gather and a reduce-scatter of the whole rows; the norms' gains once a step */
            out->bytes[PLAN_TP] = 2 * m * k * N * C * ab + 4 * C * (2 * layers + head);
        else
            out->bytes[PLAN_TP] = m * k * N * C * ab;
        if (head) out->bytes[PLAN_TP] += 3.0 * m * N * 4; /* vocab-parallel cross-entropy: max, sum, target logit */
    }
    if (c.cp > 1) {
        const struct model_config *mc = &r->model;
        double D = model_head_dim(mc), Dv = model_v_head_dim(mc);
        double KVl = model_is_mla(mc) ? mc->num_heads / c.tp : mc->num_kv_heads >= c.tp ? mc->num_kv_heads / c.tp : 1;
        double kv = c.N * KVl * (D + Dv), ring_layers = layers + model_mtp_depth(mc) * (c.pp == 1);
        enum recompute rc = recompute_mode(r->train.recompute);
        double fwd = rc == RECOMPUTE_NONE ? 1 : 2;
        out->bytes[PLAN_CP] = m * ring_layers * ((fwd + 1) * (c.cp - 1) * kv * c.ab + c.cp * kv * 4);
    }
}
