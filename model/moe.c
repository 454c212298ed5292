/* Mixture-of-experts FFN forward and backward (see moe.h). The routing
 * decisions come to the host to plan the dispatch (counts, capacity, the
 * permutation): O(n k) integers per layer and micro batch. */
#include <math.h>
#include <string.h>

#include "config/common.h"
#include "model/moe.h"

struct moe_host {
    int32_t *idx, *pos, *send_rows, *recv_order, *recv_inverse;
    float *probs, *lse, *counts;
    double *stats;   /* [(2 + tp) B E + 1]: counts and probability sums per sequence, sum lse^2, per-TP-rank counts */
    double *seq_fill; /* [B E] selections per sequence and expert so far (capacity) */
    int *cnt, *fill; /* [E] */
};

int moe_expert_rows(const struct model_config *cfg, int n, int seq_len, int ep) {
    int E = cfg->num_experts, k = cfg->experts_per_token;
    long rows = (long)n * k; /* what one source rank may send to one EP rank */
    if (cfg->moe_capacity_factor > 0) { /* ... at most `capacity` rows per expert and sequence */
        long cap = (long)ceil(cfg->moe_capacity_factor * (double)seq_len * k / E);
        long seqs = (n + seq_len - 1) / seq_len + 1; /* sequences n consecutive tokens can touch */
        if (cap * seqs * (E / ep) < rows) rows = cap * seqs * (E / ep);
    }
    return (int)(rows * ep);
}

static struct moe_host *host(struct transformer *m) {
    if (m->moe_host) return m->moe_host;
    struct moe_host *h = xcalloc(1, sizeof *h);
    int n = m->moe_n, k = m->K, E = m->E, R = m->moe_R;
    h->idx = xmalloc(sizeof(int32_t) * n * k);
    h->pos = xmalloc(sizeof(int32_t) * n * k);
    h->send_rows = xmalloc(sizeof(int32_t) * n * k);
    h->recv_order = xmalloc(sizeof(int32_t) * (R ? R : 1));
    h->recv_inverse = xmalloc(sizeof(int32_t) * (R ? R : 1));
    h->probs = xmalloc(sizeof(float) * n * E);
    h->lse = xmalloc(sizeof(float) * n);
    h->counts = xmalloc(sizeof(float) * 2 * E);
    h->stats = xmalloc(sizeof(double) * ((size_t)(2 + m->tp) * m->B * E + 1));
    h->seq_fill = xmalloc(sizeof(double) * m->B * E);
    h->cnt = xmalloc(sizeof(int) * E);
    h->fill = xmalloc(sizeof(int) * E);
    m->moe_host = h;
    return h;
}

/* Release the host scratch (transformer_free). */
void moe_host_free(struct transformer *m) {
    struct moe_host *h = m->moe_host;
    if (!h) return;
    free(h->idx), free(h->pos), free(h->send_rows), free(h->recv_order), free(h->recv_inverse);
    free(h->probs), free(h->lse), free(h->counts), free(h->stats), free(h->seq_fill), free(h->cnt), free(h->fill);
    free(h);
    m->moe_host = NULL;
}

/* Per sequence of the micro batch (all TP ranks): expert counts, the
 * load-balancing gradient coefficients, the statistics, and which selections
 * exceed the capacity. Balance and capacity are per sequence so that they do
 * not depend on how sequences are grouped into micro batches (the layout). */
static void route_stats(struct transformer *m, struct layer_acts *a, int l, struct moe_host *h) {
    const struct backend *be = m->be;
    int n = m->moe_n, k = m->K, E = m->E, tp = m->tp, T = m->T, B = m->B, r0 = m->moe_r0;
    be->to_host(h->idx, a->topi, sizeof(int32_t) * n * k);
    be->to_host(h->probs, a->probs, sizeof(float) * n * E);
    be->to_host(h->lse, a->lse, sizeof(float) * n);
    size_t BE = (size_t)B * E, len = 2 * BE + 1 + tp * BE;
    double *count = h->stats, *psum = count + BE, *zsum = psum + BE, *by_rank = zsum + 1;
    memset(h->stats, 0, sizeof(double) * len);
    for (int t = 0; t < n; t++) {
        int seq = (r0 + t) / T;
        const float *p = h->probs + (size_t)t * E;
        /* the balance loss's probabilities: softmax, or the sigmoid scores normalised over all experts */
        double norm = 1;
        if (m->sigmoid) {
            norm = 0;
            for (int e = 0; e < E; e++) norm += p[e];
        }
        for (int j = 0; j < k; j++) count[(size_t)seq * E + h->idx[t * k + j]] += 1;
        for (int e = 0; e < E; e++) psum[(size_t)seq * E + e] += p[e] / norm;
        if (!m->sigmoid) *zsum += (double)h->lse[t] * h->lse[t];
    }
    memcpy(by_rank + (size_t)m->part.tp_rank * BE, count, sizeof(double) * BE);
    if (tp > 1) comm_all_reduce_sum_f64(m->tp_comm, h->stats, len);
    /* aux = sum_e f_e P_e per sequence, P_e the mean probability and f_e = E count_e / T
     * (Switch) or E count_e / (k T) (DeepSeek-V3's sequence-wise loss) */
    double aux = 0, f_scale = m->sigmoid ? (double)E / ((double)k * T) : (double)E / T;
    for (size_t i = 0; i < BE; i++) aux += count[i] * psum[i];
    aux *= f_scale / T;
    for (int t = 0; t < n; t++) {
        const double *c = count + (size_t)((r0 + t) / T) * E;
        for (int e = 0; e < E; e++) h->probs[(size_t)t * E + e] = (float)(m->moe_aux_scale * f_scale * c[e] / T);
    }
    be->from_host(a->aux_coef, h->probs, sizeof(float) * n * E);
    a->plan.z_scale = m->moe_z_scale / T;
    /* capacity per sequence, selections in token order (TP rank r's tokens follow ranks < r) */
    long cap = m->cfg.moe_capacity_factor > 0 ? (long)ceil(m->cfg.moe_capacity_factor * (double)T * k / E) : -1;
    double *fill = h->seq_fill;
    memset(fill, 0, sizeof(double) * BE);
    for (int r = 0; r < m->part.tp_rank; r++)
        for (size_t i = 0; i < BE; i++) fill[i] += by_rank[(size_t)r * BE + i];
    for (int i = 0; i < n * k; i++) {
        size_t slot = (size_t)((r0 + i / k) / T) * E + h->idx[i];
        h->pos[i] = cap < 0 || fill[slot] < cap ? 0 : -1;
        fill[slot] += 1;
    }
    if (m->moe_collect && m->part.tp_rank == 0) {
        for (size_t i = 0; i < BE; i++) {
            m->moe_load[(size_t)l * E + i % E] += count[i];
            if (cap >= 0 && count[i] > cap) m->moe_dropped += count[i] - cap;
        }
        m->moe_aux_sum += aux;
        m->moe_z_sum += *zsum / T;
    }
}

/* Sort the kept selections by expert (stable in token order), exchange the
 * per-expert counts over EP and build the receive permutation. */
static void plan_dispatch(struct transformer *m, struct layer_acts *a, struct moe_host *h) {
    const struct backend *be = m->be;
    int n = m->moe_n, k = m->K, E = m->E, El = m->El, ep = m->ep, C = m->C;
    struct moe_plan *p = &a->plan;
    memset(h->cnt, 0, sizeof(int) * E);
    for (int i = 0; i < n * k; i++)
        if (h->pos[i] >= 0) h->cnt[h->idx[i]]++;
    memset(h->fill, 0, sizeof(int) * E);
    for (int e = 1; e < E; e++) h->fill[e] = h->fill[e - 1] + h->cnt[e - 1];
    p->nsend = 0;
    for (int i = 0; i < n * k; i++) {
        if (h->pos[i] < 0) continue;
        int row = h->fill[h->idx[i]]++;
        h->pos[i] = row;
        h->send_rows[row] = i / k;
        p->nsend++;
    }
    for (int r = 0; r < ep; r++) {
        p->send_counts[r] = 0;
        for (int e = r * El; e < (r + 1) * El; e++) p->send_counts[r] += h->cnt[e] * C;
    }
    /* rows of each of my experts from each source rank: in[s * El + e] */
    for (int e = 0; e < E; e++) h->counts[e] = (float)h->cnt[e];
    if (ep > 1) {
        be->from_host(m->moe_counts, h->counts, sizeof(float) * E);
        comm_all_to_all(m->ep_comm, m->moe_counts, m->moe_counts + E, El);
        be->to_host(h->counts + E, m->moe_counts + E, sizeof(float) * E);
    } else {
        memcpy(h->counts + E, h->counts, sizeof(float) * E);
    }
    const float *in = h->counts + E;
    p->nrecv = 0;
    for (int s = 0; s < ep; s++) {
        p->recv_counts[s] = 0;
        for (int e = 0; e < El; e++) p->recv_counts[s] += (int)in[s * El + e] * C;
        p->nrecv += p->recv_counts[s] / C;
    }
    CHECK(p->nrecv <= m->moe_R);
    /* received rows are source-major (s, e); the experts want them expert-major (e, s) */
    int row = 0;
    for (int e = 0; e < El; e++) {
        p->expert_rows[e] = 0;
        for (int s = 0; s < ep; s++) {
            int src = 0;
            for (int s2 = 0; s2 < s; s2++) src += p->recv_counts[s2] / C;
            for (int e2 = 0; e2 < e; e2++) src += (int)in[s * El + e2];
            for (int r = 0; r < (int)in[s * El + e]; r++, row++) {
                h->recv_order[row] = src + r;
                h->recv_inverse[src + r] = row;
            }
            p->expert_rows[e] += (int)in[s * El + e];
        }
    }
    be->from_host(a->pos, h->pos, sizeof(int32_t) * n * k);
    be->from_host(a->send_rows, h->send_rows, sizeof(int32_t) * (p->nsend ? p->nsend : 1));
    be->from_host(a->recv_order, h->recv_order, sizeof(int32_t) * (p->nrecv ? p->nrecv : 1));
    be->from_host(a->recv_inverse, h->recv_inverse, sizeof(int32_t) * (p->nrecv ? p->nrecv : 1));
}

/* rows source-major (as sent) <-> the EP group; counts are per peer */
static void exchange(struct transformer *m, const float *in, const int *send, float *out, const int *recv) {
    if (m->ep == 1) {
        if (out != in) m->be->copy(out, in, act_size(m, (size_t)send[0]));
        return;
    }
    if (m->be->act_bytes == sizeof(float)) {
        comm_all_to_all_v(m->ep_comm, in, send, out, recv);
        return;
    }
    /* the communicator counts floats: rows of C 2-byte elements are C/2 of them (C even) */
    int *counts = xmalloc(sizeof(int) * 2 * m->ep);
    for (int r = 0; r < m->ep; r++)
        counts[r] = (int)act_floats(m, (size_t)send[r]), counts[m->ep + r] = (int)act_floats(m, (size_t)recv[r]);
    comm_all_to_all_v(m->ep_comm, in, counts, out, counts + m->ep);
    free(counts);
}

void moe_forward(struct transformer *m, struct layer_acts *a, int l, const float *x, float *out) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct moe_host *h = host(m);
    struct moe_plan *p = &a->plan;
    int n = m->moe_n, k = m->K, E = m->E, C = m->C, FM = m->FM;
    be->matmul_forward(a->logits, x, w->router, n, C, E, 0);
    if (m->sigmoid)
        be->moe_route_sigmoid_forward(a->probs, a->topi, a->topw, a->logits, w->bias, n, E, k, m->cfg.moe_n_group,
                                      m->cfg.moe_topk_group, (float)m->cfg.moe_routed_scaling);
    else
        be->moe_route_forward(a->probs, a->lse, a->topi, a->topw, a->logits, n, E, k);
    route_stats(m, a, l, h);
    plan_dispatch(m, a, h);
    /* tokens to their experts' ranks, then expert-major */
    be->gather_rows(m->moe_send, x, a->send_rows, p->nsend, C);
    exchange(m, m->moe_send, p->send_counts, m->moe_ra, p->recv_counts);
    be->gather_rows(a->xe, m->moe_ra, a->recv_order, p->nrecv, C);
    for (int e = 0, o = 0; e < m->El; o += p->expert_rows[e], e++) {
        int rows = p->expert_rows[e];
        if (!rows) continue;
        float *const *ew = w->experts + 3 * e;
        size_t of = (size_t)o * FM;
        float *xe = act_at(m, a->xe, (size_t)o * C), *eg = act_at(m, a->eg, of), *eu = act_at(m, a->eu, of);
        float *eh = act_at(m, a->eh, of);
        linear_forward(m, eg, xe, ew[0], rows, C, FM, 0);
        linear_forward(m, eu, xe, ew[2], rows, C, FM, 0);
        be->swiglu_forward(eh, eg, eu, (size_t)rows * FM);
        linear_forward(m, act_at(m, m->moe_rb, (size_t)o * C), eh, ew[1], rows, FM, C, 0);
    }
    /* outputs back to the source ranks, in the order they were sent */
    be->gather_rows(m->moe_ra, m->moe_rb, a->recv_inverse, p->nrecv, C);
    exchange(m, m->moe_ra, p->recv_counts, a->y, p->send_counts);
    be->moe_combine(out, a->y, a->pos, a->topw, n, k, C, 0);
}

void moe_backward(struct transformer *m, struct layer_acts *a, int l, const float *d_out, float *d_x) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct layer_weights *dw = &m->dlayers[l];
    struct moe_plan *p = &a->plan;
    int n = m->moe_n, k = m->K, E = m->E, C = m->C, FM = m->FM;
    /* d(gate-weighted sum): rows for the experts, gradients of the gate weights */
    be->moe_combine_backward(m->moe_send, m->d_topw, d_out, a->y, a->pos, a->topw, n, k, C);
    exchange(m, m->moe_send, p->send_counts, m->moe_ra, p->recv_counts);
    be->gather_rows(m->moe_rb, m->moe_ra, a->recv_order, p->nrecv, C);
    if (m->recompute == RECOMPUTE_SELECTIVE) be->swiglu_forward(a->eh, a->eg, a->eu, (size_t)p->nrecv * FM);
    for (int e = 0, o = 0; e < m->El; o += p->expert_rows[e], e++) {
        int rows = p->expert_rows[e];
        if (!rows) continue;
        float *const *ew = w->experts + 3 * e, *const *dew = dw->experts + 3 * e;
        size_t of = (size_t)o * FM, oc = (size_t)o * C;
        float *xe = act_at(m, a->xe, oc), *ra = act_at(m, m->moe_ra, oc);
        linear_backward(m, m->d_eh, dew[1], act_at(m, m->moe_rb, oc), act_at(m, a->eh, of), ew[1], rows, FM, C, 0);
        be->swiglu_backward(m->d_eg, m->d_eu, m->d_eh, act_at(m, a->eg, of), act_at(m, a->eu, of), (size_t)rows * FM);
        linear_backward(m, ra, dew[0], m->d_eg, xe, ew[0], rows, C, FM, 0);
        linear_backward(m, ra, dew[2], m->d_eu, xe, ew[2], rows, C, FM, 1);
    }
    /* input gradients back to the source ranks, then summed per token */
    be->gather_rows(m->moe_rb, m->moe_ra, a->recv_inverse, p->nrecv, C);
    exchange(m, m->moe_rb, p->recv_counts, m->moe_send, p->send_counts);
    be->moe_combine(d_x, m->moe_send, a->pos, NULL, n, k, C, 0);
    /* the router: gate weights, load-balancing and z-loss gradients */
    if (m->sigmoid)
        be->moe_route_sigmoid_backward(m->d_logits, m->d_topw, a->probs, a->topi, a->topw, a->aux_coef, n, E, k,
                                       (float)m->cfg.moe_routed_scaling);
    else
        be->moe_route_backward(m->d_logits, m->d_topw, a->probs, a->lse, a->topi, a->topw, a->aux_coef, p->z_scale, n,
                               E, k);
    be->matmul_backward(d_x, dw->router, m->d_logits, act_at(m, a->ln2, (size_t)m->moe_r0 * C), w->router, n, C, E, 1);
}

void transformer_update_expert_bias(struct transformer *m, const double *load) {
    int E = m->E;
    float rate = (float)m->cfg.moe_bias_update_rate;
    if (!m->n_moe_layers || rate <= 0) return;
    float *bias = xmalloc(sizeof(float) * E);
    for (int l = 0, j = 0; l < m->NL; l++) {
        if (!model_layer_is_moe(&m->cfg, l)) continue;
        const double *ld = load + (size_t)j++ * E;
        if (!m->layers[l].bias) continue; /* not on this pipeline stage */
        double mean = 0;
        for (int e = 0; e < E; e++) mean += ld[e];
        mean /= E;
        m->be->to_host(bias, m->layers[l].bias, sizeof(float) * E);
        for (int e = 0; e < E; e++) bias[e] += ld[e] < mean ? rate : ld[e] > mean ? -rate : 0.0f;
        m->be->from_host(m->layers[l].bias, bias, sizeof(float) * E);
    }
    free(bias);
}
