/* Mixture-of-experts FFN forward and backward (see moe.h). The routing
 * decisions are backend ops on the device (kernels/ops.h moe_route_counts
 * .. moe_expert_order): at ep 1 an MoE layer copies nothing to the host; at
 * ep > 1 one copy of the per-expert row counts sizes the all-to-all. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/common.h"
#include "model/linear.h"
#include "model/moe.h"

struct moe_host {
    float *counts; /* [2E] kept rows per expert sent, then received (ep > 1) */
    float **mats;  /* [2 El]: one matrix of every local expert and its gradient (the experts' GEMMs at once) */
};

long moe_capacity(const struct model_config *cfg, int seq_len) {
    if (cfg->moe_capacity_factor <= 0) return -1;
    /* a sequence selects an expert at most once per token: a larger capacity never drops (nor overflows) */
    double cap = ceil(cfg->moe_capacity_factor * (double)seq_len * cfg->experts_per_token / cfg->num_experts);
    return cap < seq_len ? (long)cap : seq_len;
}

int moe_expert_rows(const struct model_config *cfg, int n, int seq_len, int ep) {
    int E = cfg->num_experts, k = cfg->experts_per_token;
    long rows = (long)n * k; /* what one source rank may send to one EP rank */
    if (cfg->moe_capacity_factor > 0) { /* ... at most `capacity` rows per expert and sequence */
        long cap = moe_capacity(cfg, seq_len);
        long seqs = (n + seq_len - 1) / seq_len + 1; /* sequences n consecutive tokens can touch */
        if (cap * seqs * (E / ep) < rows) rows = cap * seqs * (E / ep);
    }
    return (int)(rows * ep);
}

int moe_initial_rows(const struct model_config *cfg, int n, int seq_len, int ep) {
    int worst = moe_expert_rows(cfg, n, seq_len, ep);
    double mean = (double)n * cfg->experts_per_token, want = ceil(mean * cfg->moe_rows_headroom);
    return ep == 1 || want >= worst ? worst : (int)want;
}

/* rows past need, so that a slowly rising load does not reallocate every step */
static int grown_rows(const struct transformer *m, int need) {
    long rows = (long)need + need / 4;
    return rows > m->moe_R ? m->moe_R : (int)rows;
}

/* the next n elements of activation storage (ints: act_bytes 4 each) from a grown block */
static float *take(const struct transformer *m, char **at, size_t n, size_t bytes_each) {
    float *p = (float *)*at;
    *at += (n * bytes_each + 63) / 64 * 64;
    return p;
}

/* a's expert-major buffers hold at least rows rows: a micro batch that
 * routes more to this rank than they hold gives them an allocation of
 * their own (the arena's slice stays unused), kept for later micro batches.
 * Only in a forward, before they are written; the backward of the same
 * micro batch reads what the forward wrote. Under selective recompute eh is
 * the shared one (recomputed in backward), grown with it. */
static void reserve_rows(struct transformer *m, struct layer_acts *a, int rows) {
    struct layer_acts *sh = &m->shared_acts;
    int shared_eh = m->recompute == RECOMPUTE_SELECTIVE && a != sh;
    if (shared_eh && rows > sh->rows_cap) {
        int cap = grown_rows(m, rows);
        if (sh->rows_mem) m->be->free(sh->rows_mem);
        sh->rows_mem = m->be->alloc(act_size(m, (size_t)cap * m->FM) + 64);
        sh->eh = sh->rows_mem, sh->rows_cap = cap;
        for (int i = 0; i < m->nslots; i++) /* every layer's eh is the shared one */
            for (int l = 0; l < m->NL; l++) m->slots[i].acts[l].eh = sh->eh;
    }
    if (rows <= a->rows_cap) return;
    int cap = grown_rows(m, rows);
    if (!m->moe_grew++) /* once per process: the memory estimate counted moe_R0 */
        fprintf(stderr,
                "mtrain: note: a micro batch routed %d rows to this rank's experts, past the %d that "
                "model.moe_rows_headroom %g provides (the memory estimate counts those); its expert buffers grow to %d "
                "rows\n",
                rows, m->moe_R0, m->cfg.moe_rows_headroom, cap);
    size_t C = m->C, FM = m->FM, ab = m->be->act_bytes, R = (size_t)cap;
    size_t bytes = (R * C * ab + 64) + (3 - shared_eh) * (R * FM * ab + 64) + 2 * (R * 4 + 64);
    if (a->rows_mem) m->be->free(a->rows_mem);
    char *at = a->rows_mem = m->be->alloc(bytes);
    a->xe = take(m, &at, R * C, ab), a->eg = take(m, &at, R * FM, ab), a->eu = take(m, &at, R * FM, ab);
    if (!shared_eh) a->eh = take(m, &at, R * FM, ab);
    a->recv_order = (int32_t *)take(m, &at, R, 4), a->recv_inverse = (int32_t *)take(m, &at, R, 4);
    a->rows_cap = cap;
}

/* the shared scratch of the expert rows likewise (moe_ra, moe_rb, d_eg, d_eu, d_eh) */
static void reserve_scratch(struct transformer *m, int rows) {
    if (rows <= m->moe_scratch_rows) return;
    int cap = grown_rows(m, rows);
    size_t C = m->C, FM = m->FM, ab = m->be->act_bytes, R = (size_t)cap;
    size_t f32 = m->etp > 1 && m->be->act_bytes != sizeof(float) ? R * C * sizeof(float) + 64 : 0;
    if (m->moe_scratch_mem) m->be->free(m->moe_scratch_mem);
    char *at = m->moe_scratch_mem = m->be->alloc(2 * (R * C * ab + 64) + 3 * (R * FM * ab + 64) + f32);
    m->moe_ra = take(m, &at, R * C, ab), m->moe_rb = take(m, &at, R * C, ab);
    m->d_eg = take(m, &at, R * FM, ab), m->d_eu = take(m, &at, R * FM, ab), m->d_eh = take(m, &at, R * FM, ab);
    if (f32) m->moe_f32 = take(m, &at, R * C, sizeof(float));
    m->moe_scratch_rows = cap;
}

/* dualpipev's second set of exchange scratch (model/pair.c), what m's fields point at while it is swapped in */
struct moe_lane {
    float *send, *ra, *rb, *d_eg, *d_eu, *d_eh, *f32;
    void *scratch_mem;
    int scratch_rows;
};

static void swap_ptr(float **a, float **b) {
    float *t = *a;
    *a = *b, *b = t;
}

static void lane_exchange(struct transformer *m, struct moe_lane *ln) {
    swap_ptr(&m->moe_send, &ln->send), swap_ptr(&m->moe_ra, &ln->ra), swap_ptr(&m->moe_rb, &ln->rb);
    swap_ptr(&m->d_eg, &ln->d_eg), swap_ptr(&m->d_eu, &ln->d_eu), swap_ptr(&m->d_eh, &ln->d_eh);
    swap_ptr(&m->moe_f32, &ln->f32);
    void *mem = m->moe_scratch_mem;
    m->moe_scratch_mem = ln->scratch_mem, ln->scratch_mem = mem;
    int rows = m->moe_scratch_rows;
    m->moe_scratch_rows = ln->scratch_rows, ln->scratch_rows = rows;
}

void moe_lane_swap(struct transformer *m) {
    struct moe_lane *ln = m->moe_lane;
    if (!ln) { /* first use: a send buffer and moe_R0 rows of scratch of its own */
        ln = m->moe_lane = xcalloc(1, sizeof *ln);
        ln->send = m->be->alloc(act_size(m, (size_t)m->moe_n * m->K * m->C));
        lane_exchange(m, ln);
        reserve_scratch(m, m->moe_R0);
        return;
    }
    lane_exchange(m, ln);
}

size_t moe_lane_bytes(const struct transformer *m) {
    size_t C = m->C, FM = m->FM, ab = m->be->act_bytes, R = (size_t)grown_rows(m, m->moe_R0);
    size_t f32 = m->etp > 1 && ab != sizeof(float) ? R * C * sizeof(float) + 64 : 0;
    return act_size(m, (size_t)m->moe_n * m->K * C) + 2 * (R * C * ab + 64) + 3 * (R * FM * ab + 64) + f32;
}

void moe_lane_free(struct transformer *m) {
    struct moe_lane *ln = m->moe_lane;
    if (!ln) return;
    m->be->free(ln->send);
    if (ln->scratch_mem) m->be->free(ln->scratch_mem);
    free(ln);
    m->moe_lane = NULL;
}

size_t moe_counts_len(const struct transformer *m) { return (size_t)(2 + (m->etp > 1 ? m->etp : 0)) * m->E; }

static struct moe_host *host(struct transformer *m) {
    if (m->moe_host) return m->moe_host;
    struct moe_host *h = xcalloc(1, sizeof *h);
    h->counts = xmalloc(sizeof(float) * moe_counts_len(m));
    h->mats = xmalloc(sizeof(float *) * 2 * m->El);
    m->moe_host = h;
    return h;
}

/* Release the host scratch (transformer_free). */
void moe_host_free(struct transformer *m) {
    struct moe_host *h = m->moe_host;
    if (!h) return;
    free(h->counts), free(h->mats);
    free(h);
    m->moe_host = NULL;
}

static long capacity(const struct transformer *m) { return moe_capacity(&m->cfg, m->T); }

/* Counts per sequence and expert over the TP group, the balance loss's
 * coefficients and the step's statistics, the capacity and the sort into
 * expert-major order, all on the device. Balance and capacity are per
 * sequence so that they do not depend on how sequences are grouped into
 * micro batches (the layout). */
static void route_decisions(struct transformer *m, struct layer_acts *a, int l) {
    const struct backend *be = m->be;
    int n = m->moe_n, k = m->K, E = m->E, T = m->T, B = m->B, r0 = m->moe_r0, tp = m->tp, tpr = m->part.tp_rank;
    size_t BE = (size_t)B * E;
    float *all = m->moe_tp_counts, *mine = tp > 1 ? all + (size_t)tp * BE : all; /* [tp, B, E], then [B, E] */
    be->moe_route_counts(mine, a->topi, n, k, E, T, r0, B);
    if (tp > 1) comm_all_gather(m->tp_comm, mine, all, BE);
    /* context parallelism: a sequence's selections on every cp rank (its other chunks); the ops normalise by
     * this rank's T = seq_len / cp, so the balance coefficients (~ counts / T^2) and the z-loss (~ 1 / T)
     * are scaled to the whole sequence's (the capacity is refused with cp) */
    int cp = m->cp;
    if (cp > 1) comm_all_reduce_sum(m->cp_comm, all, (size_t)tp * BE);
    double *metrics = m->moe_collect ? m->moe_metrics + (size_t)l * (E + 3) : NULL;
    be->moe_route_balance(a->aux_coef, metrics, all, a->probs, a->lse, n, E, k, T, r0, B, tp, tpr, m->sigmoid,
                          m->moe_aux_scale / (float)(cp * cp), capacity(m));
    a->plan.z_scale = m->moe_z_scale / ((float)T * cp);
    be->moe_dispatch(a->pos, a->send_rows, m->moe_counts, a->topi, all, n, k, E, T, r0, B, tpr, capacity(m));
}

/* ep > 1 or etp > 1: exchange the per-expert counts over EP, gather the
 * etp peers' (what each received), copy them to the host once (the sizes
 * of the all-to-all and of the gather) and order the gathered rows by
 * expert. The etp peers' received rows are gathered peer after peer, each
 * source-major: etp*ep sources of El experts for moe_expert_order. */
static void plan_exchange(struct transformer *m, struct layer_acts *a) {
    int E = m->E, El = m->El, ep = m->ep, etp = m->etp, C = m->C;
    struct moe_plan *p = &a->plan;
    struct moe_host *h = host(m);
    float *sent = m->moe_counts, *recv = sent + E, *peers = recv + E;
    if (ep > 1) comm_all_to_all(m->ep_comm, sent, recv, El);
    else m->be->copy(recv, sent, sizeof(float) * E);
    if (etp > 1) comm_all_gather(m->etp_comm, recv, peers, E);
    m->be->to_host(h->counts, m->moe_counts, sizeof(float) * moe_counts_len(m)); /* the layer's one copy to the host */
    const float *cnt = h->counts, *in = h->counts + E, *all = etp > 1 ? h->counts + 2 * E : in;
    p->nsend = p->nrecv = 0;
    for (int r = 0; r < ep; r++) {
        p->send_counts[r] = p->recv_counts[r] = 0;
        for (int e = 0; e < El; e++) {
            p->send_counts[r] += (int)cnt[r * El + e] * C;
            p->recv_counts[r] += (int)in[r * El + e] * C;
        }
        p->nsend += p->send_counts[r] / C, p->nrecv += p->recv_counts[r] / C;
    }
    p->rows = 0;
    for (int j = 0; j < etp; j++) {
        p->etp_displ[j] = p->rows, p->etp_rows[j] = 0;
        for (int e = 0; e < E; e++) p->etp_rows[j] += (int)all[(size_t)j * E + e];
        p->rows += p->etp_rows[j];
    }
    CHECK(p->rows <= m->moe_R);
    reserve_rows(m, a, p->rows);
    reserve_scratch(m, p->rows);
    p->host_off[0] = 0;
    for (int e = 0; e < El; e++) {
        p->host_off[e + 1] = p->host_off[e];
        for (int s = 0; s < etp * ep; s++) p->host_off[e + 1] += (int)all[s * El + e];
    }
    p->host_off_valid = 1;
    m->be->moe_expert_order(a->recv_order, a->recv_inverse, a->expert_off, etp > 1 ? peers : recv, etp * ep, El,
                            p->rows);
}

/* The first expert-major row of each local expert, [El+1], readable by the
 * host: the plan's (ep > 1), the device's memory itself where the host can
 * read it, else one copy (the per-expert GEMMs need the row counts on the
 * host: the CUDA backend until its expert GEMMs read them on the device). */
static const int32_t *expert_offsets(struct transformer *m, struct layer_acts *a) {
    struct moe_plan *p = &a->plan;
    if (p->host_off_valid) return p->host_off;
    const int32_t *v = m->be->host_view ? m->be->host_view(a->expert_off) : NULL;
    if (v) return v;
    m->be->to_host(p->host_off, a->expert_off, sizeof(int32_t) * (m->El + 1));
    p->host_off_valid = 1;
    return p->host_off;
}

/* One GEMM kind for all local experts: the table's experts_matmul_* where it
 * takes them, else expert by expert (the same calls linear_forward /
 * linear_backward make outside FP8 without a deferred W). x, out, dout, dx
 * expert-major; w[e], dw[e] expert e's matrix [M, K] and its gradient. */
static void experts_gemm_forward(struct transformer *m, float *out, const float *x, const float *const *w,
                                 const int32_t *off, int K, int M) {
    const struct backend *be = m->be;
    if (be->experts_matmul_forward && !be->experts_matmul_forward(out, x, w, off, m->El, K, M)) return;
    for (int e = 0; e < m->El; e++) {
        int o = off[e], n = off[e + 1] - o;
        if (n) be->matmul_forward(act_at(m, out, (size_t)o * M), act_at(m, x, (size_t)o * K), w[e], n, K, M, 0);
    }
}
static void experts_gemm_backward(struct transformer *m, float *dx, float *const *dw, const float *dout, const float *x,
                                  const float *const *w, const int32_t *off, int K, int M, int accumulate_dx) {
    const struct backend *be = m->be;
    int (*op)(float *, float *const *, const float *, const float *, const float *const *, const int32_t *, int, int,
              int, int) = be->experts_matmul_backward;
    /* one gradient a call: the table may take one and not the other (cuBLAS's grouped call and the fp32 dw) */
    int dx_done = op && !op(dx, NULL, dout, x, w, off, m->El, K, M, accumulate_dx);
    int dw_done = op && !op(NULL, dw, dout, x, w, off, m->El, K, M, 0);
    if (dx_done && dw_done) return;
    for (int e = 0; e < m->El; e++) {
        int o = off[e], n = off[e + 1] - o;
        if (n)
            be->matmul_backward(dx_done ? NULL : act_at(m, dx, (size_t)o * K), dw_done ? NULL : dw[e],
                                act_at(m, dout, (size_t)o * M), act_at(m, x, (size_t)o * K), w[e], n, K, M,
                                accumulate_dx);
    }
}

/* matrix j (0 gate, 1 down, 2 up) of every local expert */
static void expert_matrices(const struct transformer *m, float *const *experts, int j, float **out) {
    for (int e = 0; e < m->El; e++) out[e] = experts[3 * e + j];
}

/* rows [R, C] = the local experts' SwiGLU MLPs of a->xe, expert-major: outside FP8 one GEMM kind at a time for all
 * experts and one SwiGLU over all rows; in an FP8 block expert by expert (each GEMM's own casts, gate and up sharing
 * the cast of their input) */
static void experts_forward(struct transformer *m, struct layer_acts *a, int l, float *rows) {
    const struct layer_weights *w = &m->layers[l];
    const int32_t *off = expert_offsets(m, a);
    int C = m->C, FM = m->FM;
    if (!m->fp8_now) {
        float **mats = host(m)->mats;
        expert_matrices(m, w->experts, 0, mats);
        experts_gemm_forward(m, a->eg, a->xe, (const float *const *)mats, off, C, FM);
        expert_matrices(m, w->experts, 2, mats);
        experts_gemm_forward(m, a->eu, a->xe, (const float *const *)mats, off, C, FM);
        m->be->swiglu_forward(a->eh, a->eg, a->eu, (size_t)off[m->El] * FM);
        expert_matrices(m, w->experts, 1, mats);
        experts_gemm_forward(m, rows, a->eh, (const float *const *)mats, off, FM, C);
        return;
    }
    for (int e = 0; e < m->El; e++) {
        int o = off[e], n = off[e + 1] - o;
        if (!n) continue;
        float *const *ew = w->experts + 3 * e;
        size_t of = (size_t)o * FM;
        float *xe = act_at(m, a->xe, (size_t)o * C), *eg = act_at(m, a->eg, of), *eu = act_at(m, a->eu, of);
        float *eh = act_at(m, a->eh, of);
        linear_same_input(m, 1); /* gate and up read xe: in FP8 one cast of it */
        linear_forward(m, eg, xe, ew[0], n, C, FM, 0);
        linear_forward(m, eu, xe, ew[2], n, C, FM, 0);
        linear_same_input(m, 0);
        m->be->swiglu_forward(eh, eg, eu, (size_t)n * FM);
        linear_forward(m, act_at(m, rows, (size_t)o * C), eh, ew[1], n, FM, C, 0);
    }
}

/* d_x_rows [R, C] = the experts' input gradients from d_rows, their output
 * gradients (both expert-major); weight gradients accumulate. Outside FP8
 * and without a deferred W (zero-bubble schedules), and where the scratch
 * holds every row, one GEMM kind at a time for all experts; else expert by
 * expert through linear_backward. */
static void experts_backward(struct transformer *m, struct layer_acts *a, int l, const float *d_rows, float *d_x_rows) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct layer_weights *dw = &m->dlayers[l];
    const int32_t *off = expert_offsets(m, a);
    int C = m->C, FM = m->FM, rows = off[m->El];
    if (m->recompute == RECOMPUTE_SELECTIVE) be->swiglu_forward(a->eh, a->eg, a->eu, (size_t)rows * FM);
    if (!m->fp8_now && !m->defer_w && rows <= m->moe_scratch_rows) {
        float **mats = host(m)->mats, **grads = mats + m->El;
        expert_matrices(m, w->experts, 1, mats), expert_matrices(m, dw->experts, 1, grads);
        experts_gemm_backward(m, m->d_eh, grads, d_rows, a->eh, (const float *const *)mats, off, FM, C, 0);
        be->swiglu_backward(m->d_eg, m->d_eu, m->d_eh, a->eg, a->eu, (size_t)rows * FM);
        expert_matrices(m, w->experts, 0, mats), expert_matrices(m, dw->experts, 0, grads);
        experts_gemm_backward(m, d_x_rows, grads, m->d_eg, a->xe, (const float *const *)mats, off, C, FM, 0);
        expert_matrices(m, w->experts, 2, mats), expert_matrices(m, dw->experts, 2, grads);
        experts_gemm_backward(m, d_x_rows, grads, m->d_eu, a->xe, (const float *const *)mats, off, C, FM, 1);
        return;
    }
    for (int e = 0; e < m->El; e++) {
        int o = off[e], n = off[e + 1] - o;
        if (!n) continue;
        float *const *ew = w->experts + 3 * e, *const *dew = dw->experts + 3 * e;
        size_t of = (size_t)o * FM, oc = (size_t)o * C;
        float *xe = act_at(m, a->xe, oc), *dx = act_at(m, d_x_rows, oc);
        linear_backward(m, m->d_eh, dew[1], act_at(m, d_rows, oc), act_at(m, a->eh, of), ew[1], n, FM, C, 0);
        be->swiglu_backward(m->d_eg, m->d_eu, m->d_eh, act_at(m, a->eg, of), act_at(m, a->eu, of), (size_t)n * FM);
        /* the expert's gate and up rows were read for the last time: a deferred W keeps its gradients there */
        linear_dout_home(m, act_at(m, a->eg, of), (size_t)n * FM);
        linear_backward(m, dx, dew[0], m->d_eg, xe, ew[0], n, C, FM, 0);
        linear_dout_home(m, act_at(m, a->eu, of), (size_t)n * FM);
        linear_backward(m, dx, dew[2], m->d_eu, xe, ew[2], n, C, FM, 1);
    }
}

/* rows source-major (as sent) <-> the EP group, begun (counts per peer; ep 1: a copy): the ticket to
 * complete it on m->ep_comm (0: done) */
static int exchange_start(struct transformer *m, const float *in, const int *send, float *out, const int *recv) {
    if (m->ep == 1) {
        m->be->copy(out, in, act_size(m, (size_t)send[0]));
        return 0;
    }
    if (m->be->act_bytes == sizeof(float)) return comm_all_to_all_v_start(m->ep_comm, in, send, out, recv);
    /* the communicator counts floats: rows of C 2-byte elements are C/2 of them (C even) */
    int *counts = xmalloc(sizeof(int) * 2 * m->ep);
    for (int r = 0; r < m->ep; r++)
        counts[r] = (int)act_floats(m, (size_t)send[r]), counts[m->ep + r] = (int)act_floats(m, (size_t)recv[r]);
    int ticket = comm_all_to_all_v_start(m->ep_comm, in, counts, out, counts + m->ep);
    free(counts);
    return ticket;
}

/* this rank's own received rows within the etp peers' gathered rows */
static float *own_rows(const struct transformer *m, const struct moe_plan *p, float *rows) {
    return act_at(m, rows, (size_t)p->etp_displ[m->etp > 1 ? m->etp_comm->rank : 0] * m->C);
}

/* etp > 1: every etp peer's received rows on every peer (each placed its own at own_rows) */
static void etp_gather(struct transformer *m, const struct moe_plan *p, float *rows) {
    if (m->etp == 1) return;
    int etp = m->etp, C = m->C, *counts = xmalloc(sizeof(int) * 2 * etp), *displs = counts + etp;
    /* the communicator counts elements in int (MPI's counts): a rank's gathered rows must fit */
    if ((long long)p->rows * C > INT_MAX)
        die("MoE layer: the expert-tensor-parallel peers received %d rows of %d, %lld elements, more than an int "
            "counts: use a smaller train.micro_batch (or a capacity factor)", p->rows, C, (long long)p->rows * C);
    for (int j = 0; j < etp; j++) counts[j] = p->etp_rows[j] * C, displs[j] = p->etp_displ[j] * C;
    comm_wait_ticket(m->etp_comm, comm_all_gather_v_start(m->etp_comm, rows, m->be->act_bytes, counts, displs));
    free(counts);
}

/* etp > 1: the peers' partial rows (each expert slice's share of the output
 * or input gradient) summed into each peer's own rows (own_rows): a reduce
 * onto each peer of its part, in fp32 */
static void etp_reduce(struct transformer *m, const struct moe_plan *p, float *rows) {
    if (m->etp == 1) return;
    size_t n = (size_t)p->rows * m->C;
    float *f = m->moe_f32 ? m->moe_f32 : rows;
    if (m->moe_f32) m->be->from_storage(f, rows, n);
    size_t *lo = xmalloc(sizeof(size_t) * 2 * m->etp), *cnt = lo + m->etp;
    for (int j = 0; j < m->etp; j++) lo[j] = (size_t)p->etp_displ[j] * m->C, cnt[j] = (size_t)p->etp_rows[j] * m->C;
    comm_reduce_to_owners_start(m->etp_comm, f, lo, cnt);
    free(lo);
    comm_wait_all(m->etp_comm);
    if (m->moe_f32) {
        size_t own = (size_t)p->etp_displ[m->etp_comm->rank] * m->C;
        m->be->to_storage(act_at(m, rows, own), f + own, (size_t)p->etp_rows[m->etp_comm->rank] * m->C);
    }
}

int moe_phases(const struct transformer *m) { return m->ep > 1 || m->etp > 1 ? 3 : 1; }

int moe_forward_phase(struct transformer *m, struct layer_acts *a, int l, const float *x, float *out, int phase) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct moe_plan *p = &a->plan;
    int n = m->moe_n, k = m->K, E = m->E, C = m->C;
    /* tokens to their experts' ranks (and every etp peer's to each), then expert-major; the outputs (summed
     * over the etp slices) back in the order they were sent */
    float *own = own_rows(m, p, m->moe_ra);
    if (phase == 1) {
        etp_gather(m, p, m->moe_ra);
        be->gather_rows(a->xe, m->moe_ra, a->recv_order, p->rows, C);
        experts_forward(m, a, l, m->moe_rb);
        be->gather_rows(m->moe_ra, m->moe_rb, a->recv_inverse, p->rows, C);
        etp_reduce(m, p, m->moe_ra);
        return exchange_start(m, own, p->recv_counts, a->y, p->send_counts);
    }
    if (phase == 2) {
        be->moe_combine(out, a->y, a->pos, a->topw, n, k, C, 0);
        return 0;
    }
    be->matmul_forward(a->logits, x, w->router, n, C, E, 0);
    if (m->sigmoid)
        be->moe_route_sigmoid_forward(a->probs, a->topi, a->topw, a->logits, w->bias, n, E, k, m->cfg.moe_n_group,
                                      m->cfg.moe_topk_group, (float)m->cfg.moe_routed_scaling);
    else
        be->moe_route_forward(a->probs, a->lse, a->topi, a->topw, a->logits, n, E, k);
    route_decisions(m, a, l);
    p->host_off_valid = 0;
    if (moe_phases(m) == 1) {
        /* the kept rows come first in send order, which is expert-major, and fit R (moe_expert_rows) */
        p->rows = n * k < m->moe_R ? n * k : m->moe_R;
        be->gather_rows(a->xe, x, a->send_rows, p->rows, C);
        be->moe_expert_order(NULL, NULL, a->expert_off, m->moe_counts, 1, E, p->rows);
        experts_forward(m, a, l, a->y);
        be->moe_combine(out, a->y, a->pos, a->topw, n, k, C, 0);
        return 0;
    }
    plan_exchange(m, a);
    own = own_rows(m, p, m->moe_ra); /* (the scratch may have grown) */
    be->gather_rows(m->moe_send, x, a->send_rows, p->nsend, C);
    return exchange_start(m, m->moe_send, p->send_counts, own, p->recv_counts);
}

void moe_forward(struct transformer *m, struct layer_acts *a, int l, const float *x, float *out) {
    for (int phase = 0; phase < moe_phases(m); phase++)
        comm_wait_ticket(m->ep_comm, moe_forward_phase(m, a, l, x, out, phase));
}

int moe_backward_phase(struct transformer *m, struct layer_acts *a, int l, const float *d_out, float *d_x, int phase) {
    const struct backend *be = m->be;
    const struct layer_weights *w = &m->layers[l];
    struct layer_weights *dw = &m->dlayers[l];
    struct moe_plan *p = &a->plan;
    int n = m->moe_n, k = m->K, E = m->E, C = m->C;
    if (phase == 0) {
        /* d(gate-weighted sum): rows for the experts, gradients of the gate weights */
        be->moe_combine_backward(m->moe_send, m->d_topw, d_out, a->y, a->pos, a->topw, n, k, C);
        if (moe_phases(m) > 1) { /* this pass's scratch (model/pair.c may lend it another) holds the rows */
            reserve_scratch(m, p->rows);
            return exchange_start(m, m->moe_send, p->send_counts, own_rows(m, p, m->moe_ra), p->recv_counts);
        }
        /* the input gradients' rows go where y was (read for the last time above) */
        experts_backward(m, a, l, m->moe_send, a->y);
        be->moe_combine(d_x, a->y, a->pos, NULL, n, k, C, 0); /* summed per token */
    } else if (phase == 1) {
        etp_gather(m, p, m->moe_ra);
        be->gather_rows(m->moe_rb, m->moe_ra, a->recv_order, p->rows, C);
        experts_backward(m, a, l, m->moe_rb, m->moe_ra);
        /* input gradients (summed over the etp slices) back to the source ranks, then summed per token */
        be->gather_rows(m->moe_rb, m->moe_ra, a->recv_inverse, p->rows, C);
        etp_reduce(m, p, m->moe_rb);
        return exchange_start(m, own_rows(m, p, m->moe_rb), p->recv_counts, m->moe_send, p->send_counts);
    } else {
        be->moe_combine(d_x, m->moe_send, a->pos, NULL, n, k, C, 0);
    }
    /* the router: gate weights, load-balancing and z-loss gradients */
    if (m->sigmoid)
        be->moe_route_sigmoid_backward(m->d_logits, m->d_topw, a->probs, a->topi, a->topw, a->aux_coef, n, E, k,
                                       (float)m->cfg.moe_routed_scaling, m->T, m->moe_r0);
    else
        be->moe_route_backward(m->d_logits, m->d_topw, a->probs, a->lse, a->topi, a->topw, a->aux_coef, p->z_scale, n,
                               E, k, m->T, m->moe_r0);
    linear_backward_plain(m, d_x, dw->router, m->d_logits, act_at(m, a->ln2, (size_t)m->moe_r0 * C), w->router, n, C, E,
                          1);
    return 0;
}

void moe_backward(struct transformer *m, struct layer_acts *a, int l, const float *d_out, float *d_x) {
    for (int phase = 0; phase < moe_phases(m); phase++)
        comm_wait_ticket(m->ep_comm, moe_backward_phase(m, a, l, d_out, d_x, phase));
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
