/* The MoE routing decisions as backend ops (kernels/ops.h moe_route_counts ..
 * moe_expert_order) against the host implementation model/moe.c had before
 * they moved to the device, written out here as plain loops: counts,
 * capacity, the stable sort into expert-major order and the received rows'
 * order bitwise, the balance coefficients bitwise, the statistics within
 * 1e-9 relative; for several TP ranks, sequences, capacities, softmax and
 * sigmoid, at fp32 and bf16. Then the copies to the host that one MoE layer
 * (model/moe.c, forward and backward) makes through the backend: none at
 * ep 1; one, in the forward, at ep > 1 (the per-expert counts that size the
 * all-to-all). Run alone it checks ep 1; under mpiexec -n N
 * (tests/integration/moe_parallel.sh) ep N. */
#include <math.h>
#include <string.h>

#include "config/common.h"
#include "model/moe.h"
#include "parallel/grid.h"
#include "tests/unit/check.h"

/* ---- the host implementation before the move (model/moe.c route_stats, plan_dispatch) ---- */
struct ref_plan {
    int32_t *pos, *send_rows, *order, *inverse;
    float *coef;
    int cnt[64], offsets[65];
    double load[64], aux, z, dropped;
};

/* TP rank tpr of tp routes tokens [tpr*n, (tpr+1)*n) of B sequences of T; idx_all [tp*n, k] */
static void ref_route(struct ref_plan *p, const int32_t *idx_all, const float *probs_all, const float *lse_all, int n,
                      int k, int E, int T, int B, int tp, int tpr, int sigmoid, float aux_scale, long cap) {
    size_t BE = (size_t)B * E;
    double *count = xcalloc(BE, sizeof *count), *psum = xcalloc(BE, sizeof *psum), *fill = xcalloc(BE, sizeof *fill);
    double zsum = 0;
    for (int t = 0; t < tp * n; t++) { /* every TP rank's tokens: the all-reduce's result */
        int seq = t / T;
        const float *pr = probs_all + (size_t)t * E;
        double norm = 1;
        if (sigmoid) {
            norm = 0;
            for (int e = 0; e < E; e++) norm += pr[e];
        }
        for (int j = 0; j < k; j++) count[(size_t)seq * E + idx_all[t * k + j]] += 1;
        for (int e = 0; e < E; e++) psum[(size_t)seq * E + e] += pr[e] / norm;
        if (!sigmoid) zsum += (double)lse_all[t] * lse_all[t];
        if (t < tpr * n)
            for (int j = 0; j < k; j++) fill[(size_t)seq * E + idx_all[t * k + j]] += 1;
    }
    double f_scale = sigmoid ? (double)E / ((double)k * T) : (double)E / T, aux = 0;
    for (size_t i = 0; i < BE; i++) aux += count[i] * psum[i];
    p->aux = aux * f_scale / T, p->z = zsum / T, p->dropped = 0;
    memset(p->load, 0, sizeof p->load);
    for (size_t i = 0; i < BE; i++) {
        p->coef[i] = (float)(aux_scale * f_scale * count[i] / T);
        p->load[i % E] += count[i];
        if (cap >= 0 && count[i] > cap) p->dropped += count[i] - cap;
    }
    const int32_t *idx = idx_all + (size_t)tpr * n * k;
    for (int i = 0; i < n * k; i++) {
        size_t slot = (size_t)((tpr * n + i / k) / T) * E + idx[i];
        p->pos[i] = cap < 0 || fill[slot] < cap ? 0 : -1;
        fill[slot] += 1;
    }
    int next[65] = {0};
    memset(p->cnt, 0, sizeof p->cnt);
    for (int i = 0; i < n * k; i++)
        if (p->pos[i] >= 0) p->cnt[idx[i]]++;
    for (int e = 1; e < E; e++) next[e] = next[e - 1] + p->cnt[e - 1];
    int kept = 0;
    for (int i = 0; i < n * k; i++) {
        if (p->pos[i] < 0) continue;
        int row = next[idx[i]]++;
        p->pos[i] = row, p->send_rows[row] = i / k, kept++;
    }
    for (int i = 0; i < n * k; i++) /* the new op puts the dropped selections after the kept ones */
        if (p->pos[i] < 0) p->send_rows[kept++] = i / k;
    free(count), free(psum), free(fill);
}

/* the received rows' expert-major order of the old plan_dispatch, from in [ep, El] */
static void ref_order(struct ref_plan *p, const float *in, int ep, int El) {
    int row = 0, recv[8] = {0};
    for (int s = 0; s < ep; s++)
        for (int e = 0; e < El; e++) recv[s] += (int)in[s * El + e];
    for (int e = 0; e < El; e++) {
        p->offsets[e] = row;
        for (int s = 0; s < ep; s++) {
            int src = 0;
            for (int s2 = 0; s2 < s; s2++) src += recv[s2];
            for (int e2 = 0; e2 < e; e2++) src += (int)in[s * El + e2];
            for (int r = 0; r < (int)in[s * El + e]; r++, row++) p->order[row] = src + r, p->inverse[src + r] = row;
        }
    }
    p->offsets[El] = row;
}

static int same_i32(const int32_t *a, const int32_t *b, size_t n) { return !memcmp(a, b, sizeof(int32_t) * n); }

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

/* one routing case on backend be: every TP rank's view in turn */
static void route_case(const struct backend *be, const char *tag, int n, int k, int E, int T, int tp, int sigmoid,
                       double capacity_factor, unsigned long long seed) {
    int B = tp * n / T, nk = n * k;
    size_t BE = (size_t)B * E;
    int32_t *idx_all = xmalloc(sizeof(int32_t) * tp * nk);
    float *probs_all = xmalloc(sizeof(float) * tp * n * E), *lse_all = xmalloc(sizeof(float) * tp * n);
    for (int t = 0; t < tp * n; t++) { /* skewed choices: some experts overflow */
        for (int j = 0; j < k; j++) {
            int e;
            do {
                double u = (test_rand(&seed) + 1) / 2;
                e = (int)(u * u * E) % E;
                for (int m = 0; m < j; m++) e = idx_all[t * k + m] == e ? -1 : e;
            } while (e < 0);
            idx_all[t * k + j] = e;
        }
        double sum = 0;
        for (int e = 0; e < E; e++) sum += probs_all[(size_t)t * E + e] = (test_rand(&seed) + 1.5f) / 3;
        if (!sigmoid)
            for (int e = 0; e < E; e++) probs_all[(size_t)t * E + e] /= (float)sum;
        lse_all[t] = test_rand(&seed) * 4;
    }
    long cap = capacity_factor > 0 ? (long)ceil(capacity_factor * T * k / E) : -1;
    float aux_scale = 0.37f;
    struct ref_plan ref = {.pos = xmalloc(sizeof(int32_t) * nk), .send_rows = xmalloc(sizeof(int32_t) * nk),
                           .coef = xmalloc(sizeof(float) * BE)};
    /* backend memory */
    int32_t *idx = be->alloc(sizeof(int32_t) * nk), *pos = be->alloc(sizeof(int32_t) * nk);
    int32_t *send_rows = be->alloc(sizeof(int32_t) * nk);
    float *probs = be->alloc(sizeof(float) * n * E), *lse = be->alloc(sizeof(float) * n);
    float *all = be->alloc(sizeof(float) * tp * BE), *coef = be->alloc(sizeof(float) * BE);
    float *ecount = be->alloc(sizeof(float) * E);
    double *metrics = be->alloc(sizeof(double) * (E + 3));
    int ok_counts = 1, ok_coef = 1, ok_stats = 1, ok_pos = 1, ok_rows = 1, ok_ecount = 1;
    double aux = 0, z = 0, load[64] = {0}, dropped = 0;
    /* every rank's counts first: the all-gather */
    for (int r = 0; r < tp; r++) {
        be->from_host(idx, idx_all + (size_t)r * nk, sizeof(int32_t) * nk);
        be->moe_route_counts(all + r * BE, idx, n, k, E, T, r * n, B);
    }
    float *hall = xmalloc(sizeof(float) * tp * BE);
    be->to_host(hall, all, sizeof(float) * tp * BE);
    for (size_t i = 0; i < BE; i++) { /* rank r's counts are the selections of its tokens */
        double want = 0, got = 0;
        for (int r = 0; r < tp; r++) got += hall[r * BE + i];
        for (int t = 0; t < tp * n; t++)
            for (int j = 0; j < k; j++) want += t / T == (int)(i / E) && idx_all[t * k + j] == (int)(i % E);
        ok_counts &= got == want;
    }
    for (int r = 0; r < tp; r++) {
        ref_route(&ref, idx_all, probs_all, lse_all, n, k, E, T, B, tp, r, sigmoid, aux_scale, cap);
        be->from_host(idx, idx_all + (size_t)r * nk, sizeof(int32_t) * nk);
        be->from_host(probs, probs_all + (size_t)r * n * E, sizeof(float) * n * E);
        be->from_host(lse, lse_all + (size_t)r * n, sizeof(float) * n);
        be->zero(metrics, sizeof(double) * (E + 3));
        be->moe_route_balance(coef, metrics, all, probs, lse, n, E, k, T, r * n, B, tp, r, sigmoid, aux_scale, cap);
        be->moe_dispatch(pos, send_rows, ecount, idx, all, n, k, E, T, r * n, B, r, cap);
        float *hcoef = xmalloc(sizeof(float) * BE), *hec = xmalloc(sizeof(float) * E);
        int32_t *hpos = xmalloc(sizeof(int32_t) * nk), *hrows = xmalloc(sizeof(int32_t) * nk);
        double hm[67];
        be->to_host(hcoef, coef, sizeof(float) * BE);
        be->to_host(hm, metrics, sizeof(double) * (E + 3));
        be->to_host(hpos, pos, sizeof(int32_t) * nk);
        be->to_host(hrows, send_rows, sizeof(int32_t) * nk);
        be->to_host(hec, ecount, sizeof(float) * E);
        ok_coef &= !memcmp(hcoef, ref.coef, sizeof(float) * BE);
        ok_pos &= same_i32(hpos, ref.pos, nk);
        ok_rows &= same_i32(hrows, ref.send_rows, nk);
        for (int e = 0; e < E; e++) ok_ecount &= hec[e] == ref.cnt[e];
        aux += hm[E], z += hm[E + 1], dropped += hm[E + 2];
        for (int e = 0; e < E; e++) load[e] += hm[e];
        free(hcoef), free(hec), free(hpos), free(hrows);
    }
    /* the statistics: each rank's share, summed as the trainer does */
    ok_stats = rel(aux, ref.aux) < 1e-9 && (sigmoid || rel(z, ref.z) < 1e-9) && dropped == ref.dropped;
    for (int e = 0; e < E; e++) ok_stats &= load[e] == ref.load[e];
    char name[128];
#define RESULT(what, ok, ...)                                                 \
    snprintf(name, sizeof name, "moe_plan_%s_%s_%s_%s", be->name, precision_name(be->precision), what, tag); \
    TEST_RESULT(name, ok, __VA_ARGS__)
    RESULT("counts", ok_counts, "per-sequence counts differ from the selections");
    RESULT("coef", ok_coef, "balance coefficients differ (bitwise) from the host's");
    RESULT("stats", ok_stats, "statistics differ: aux %.12g vs %.12g, z %.12g vs %.12g, dropped %g vs %g", aux, ref.aux,
           z, ref.z, dropped, ref.dropped);
    RESULT("pos", ok_pos, "kept selections' rows differ from the host's sort");
    RESULT("send_rows", ok_rows, "send order differs from the host's");
    RESULT("expert_counts", ok_ecount, "kept rows per expert differ");
    be->free(idx), be->free(pos), be->free(send_rows), be->free(probs), be->free(lse), be->free(all);
    be->free(coef), be->free(ecount), be->free(metrics);
    free(idx_all), free(probs_all), free(lse_all), free(hall), free(ref.pos), free(ref.send_rows), free(ref.coef);
}

/* the received rows' order for ep sources of El local experts each */
static void order_case(const struct backend *be, int ep, int El, unsigned long long seed) {
    float in[64];
    int total = 0;
    for (int i = 0; i < ep * El; i++) total += (int)(in[i] = (float)(int)((test_rand(&seed) + 1) * 3)); /* 0..5 */
    struct ref_plan ref = {.order = xmalloc(sizeof(int32_t) * (total + 1)),
                           .inverse = xmalloc(sizeof(int32_t) * (total + 1))};
    ref_order(&ref, in, ep, El);
    float *din = be->alloc(sizeof in);
    int32_t *order = be->alloc(sizeof(int32_t) * (total + 1)), *inverse = be->alloc(sizeof(int32_t) * (total + 1));
    int32_t *off = be->alloc(sizeof(int32_t) * (El + 1)), *hoff = xmalloc(sizeof(int32_t) * (El + 1));
    be->from_host(din, in, sizeof in);
    be->moe_expert_order(order, inverse, off, din, ep, El, total);
    int32_t *ho = xmalloc(sizeof(int32_t) * (total + 1)), *hi = xmalloc(sizeof(int32_t) * (total + 1));
    be->to_host(ho, order, sizeof(int32_t) * total);
    be->to_host(hi, inverse, sizeof(int32_t) * total);
    be->to_host(hoff, off, sizeof(int32_t) * (El + 1));
    int ok = same_i32(ho, ref.order, total) && same_i32(hi, ref.inverse, total) && same_i32(hoff, ref.offsets, El + 1);
    be->moe_expert_order(NULL, NULL, off, din, ep, El, total); /* offsets only */
    be->to_host(hoff, off, sizeof(int32_t) * (El + 1));
    ok &= same_i32(hoff, ref.offsets, El + 1);
    char name[96];
    snprintf(name, sizeof name, "moe_plan_%s_expert_order_ep%d_el%d", be->name, ep, El);
    TEST_RESULT(name, ok, "expert-major order, its inverse or the offsets differ from the host's");
    be->free(din), be->free(order), be->free(inverse), be->free(off);
    free(hoff), free(ho), free(hi), free(ref.order), free(ref.inverse);
}

/* ---- blocking copies to the host in one MoE layer, through the backend ---- */
static void copies_case(const struct backend *be, struct grid *g, int capacity, int sigmoid) {
    static struct recipe r;
    recipe_defaults(&r);
    struct model_config *mc = &r.model;
    int C = 32, E = 8, N = 32;
    snprintf(mc->arch, sizeof mc->arch, "mixtral");
    mc->hidden_size = C, mc->num_layers = 1, mc->num_heads = 2, mc->num_kv_heads = 2, mc->vocab_size = 64;
    mc->num_experts = E, mc->experts_per_token = 2, mc->moe_intermediate_size = 16, mc->moe_layer_freq = 1;
    mc->intermediate_size = 16, mc->moe_capacity_factor = capacity ? 1.0 : 0;
    if (sigmoid) {
        snprintf(mc->moe_score_func, sizeof mc->moe_score_func, "sigmoid");
        mc->moe_n_group = 2, mc->moe_topk_group = 1, mc->moe_routed_scaling = 2.5;
    }
    struct parallel_config par = {.tp = 1, .pp = 1, .cp = 1, .ep = g->ep, .etp = g->etp, .vpp = 1};
    struct model_part part;
    model_part_for(&part, mc, &par, 0, 0, g->ep_rank, g->etp_rank);
    struct transformer m;
    transformer_create(&m, be, mc, &part, NULL, 0, 2, N / 2, 1, NULL, RECOMPUTE_NONE, 0);
    m.ep_comm = &g->ep_comm, m.etp_comm = &g->etp_comm;
    transformer_init_params(&m, 3);
    transformer_sync_weights(&m);
    transformer_set_moe_sequences(&m, 2);
    float *h = xmalloc(sizeof(float) * N * C);
    unsigned long long s = 11 + g->ep_rank;
    for (int i = 0; i < N * C; i++) h[i] = test_rand(&s);
    struct layer_acts *a = &m.slots[0].acts[0];
    float *x = a->ln2, *dout = m.tmp_full, *tmp = xmalloc(sizeof(float) * N * C);
    float *f32 = be->alloc(sizeof(float) * N * C);
    be->from_host(f32, h, sizeof(float) * N * C);
    be->to_storage(x, f32, (size_t)N * C);
    be->to_storage(dout, f32, (size_t)N * C);
    m.moe_collect = 1;
    long before = backend_d2h_copies();
    moe_forward(&m, a, 0, x, m.moe_out);
    long forward = backend_d2h_copies() - before;
    moe_backward(&m, a, 0, dout, m.d_moe_in);
    long backward = backend_d2h_copies() - before - forward;
    be->to_host(tmp, m.d_moe_in, 4); /* (after the count) */
    long want = g->ep > 1 || g->etp > 1; /* the counts, which size the all-to-all and the etp gather */
    char name[96], etp[16] = "";
    if (g->etp > 1) snprintf(etp, sizeof etp, "_etp%d", g->etp);
    snprintf(name, sizeof name, "moe_layer_host_copies_%s_%s_ep%d%s%s", be->name, precision_name(be->precision), g->ep,
             etp, capacity ? "_capacity" : sigmoid ? "_sigmoid" : "");
    double bad = forward != want || backward != 0;
    comm_all_reduce_sum_f64(&g->world, &bad, 1);
    int all_ok = bad == 0;
    if (g->world_rank == 0)
        TEST_RESULT(name, all_ok, "forward %ld, backward %ld blocking copies to the host (want %ld and 0)", forward,
                    backward, want);
    be->free(f32);
    free(h), free(tmp);
    transformer_free(&m);
}

int main(int argc, char **argv) {
    parallel_init(&argc, &argv);
    struct parallel_config layout = {.tp = 1, .pp = 1, .cp = 1, .ep = parallel_world_size(), .vpp = 1};
    struct grid g;
    grid_create(&g, &layout);
    const struct backend *tables[] = {&cpu_backend, &cpu_bf16_backend};
    if (g.world_rank == 0) {
        /* n tokens per TP rank, k, E, T, tp, sigmoid, capacity factor */
        route_case(&cpu_backend, "softmax_tp1", 24, 2, 8, 8, 1, 0, 0, 1);
        route_case(&cpu_backend, "softmax_tp2_capacity", 12, 2, 8, 8, 2, 0, 1.0, 2);
        route_case(&cpu_backend, "sigmoid_tp3_capacity_split_sequences", 8, 3, 16, 12, 3, 1, 1.25, 3);
        route_case(&cpu_backend, "sigmoid_tp2", 20, 4, 32, 10, 2, 1, 0, 4);
        route_case(&cpu_bf16_backend, "softmax_tp2_capacity", 12, 2, 8, 8, 2, 0, 0.5, 5);
        order_case(&cpu_backend, 1, 8, 6);
        order_case(&cpu_backend, 2, 4, 7);
        order_case(&cpu_backend, 4, 3, 8);
    }
    for (int i = 0; i < 2; i++) {
        copies_case(tables[i], &g, 0, 0);
        copies_case(tables[i], &g, 1, 0);
        copies_case(tables[i], &g, 0, 1);
    }
    grid_free(&g);
    if (parallel_world_size() > 1) { /* each expert's width split over 2 ranks (etp), ep the rest */
        layout.etp = 2, layout.ep = parallel_world_size() / 2;
        grid_create(&g, &layout);
        for (int i = 0; i < 2; i++) copies_case(tables[i], &g, 0, 0);
        grid_free(&g);
    }
    parallel_finalize();
    TEST_EXIT();
}
