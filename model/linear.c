/* The linear layers of the blocks (model/linear.h): the table's GEMMs, or its
 * FP8 GEMMs in an FP8 block, with the FP8 recipe of each weight. Every block
 * kind (transformer.c, moe.c, mla.c) stands on these. */
#include "config/common.h"
#include "model/linear.h"
#include "model/transformer.h"

/* the FP8 recipe of a GEMM with weight w (in the working copy): under
 * delayed scaling its site's exponents and amax record */
static struct fp8_recipe fp8_recipe_for(const struct transformer *m, const float *w) {
    if (!m->fp8_hist) {
        struct fp8_recipe r = m->fp8;
        r.input_group = m->fp8_input_group;
        return r;
    }
    const char *base = (const char *)m->weights;
    CHECK((const char *)w >= base);
    int site = fp8_history_site_at(m->fp8_hist, (size_t)((const char *)w - base) / m->be->act_bytes);
    CHECK(site >= 0); /* every weight of an FP8 block's linear layers is a site */
    return fp8_history_recipe(m->fp8_hist, m->fp8, site);
}

void linear_forward(struct transformer *m, float *out, const float *x, const float *w, int N, int K, int M,
                    int accumulate) {
    if (m->fp8_now) m->be->fp8_matmul_forward(out, x, w, N, K, M, accumulate, fp8_recipe_for(m, w));
    else m->be->matmul_forward(out, x, w, N, K, M, accumulate);
}

static int defer(struct transformer *m, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                 int M, const struct fp8_recipe *fp8);

void linear_backward(struct transformer *m, float *dx, float *dw, const float *dout, const float *x, const float *w,
                     int N, int K, int M, int accumulate_dx) {
    if (m->fp8_now) {
        /* a deferred W casts dout and x itself, as the whole backward's weight-gradient GEMM would: the same
         * codes (current and block scales depend on the tensor alone; delayed scaling's exponents hold for
         * the step and its amax record takes the max) */
        struct fp8_recipe r = fp8_recipe_for(m, w);
        if (defer(m, dw, dout, x, w, N, K, M, &r)) dw = NULL;
        if (dx || dw) m->be->fp8_matmul_backward(dx, dw, dout, x, w, N, K, M, accumulate_dx, r);
        return;
    }
    linear_backward_plain(m, dx, dw, dout, x, w, N, K, M, accumulate_dx);
}

/* Around linears that read one input one after the other (nothing else in
 * between): their FP8 GEMMs may cast the input once (kernels/ops.h,
 * fp8_recipe.input_group). Not under delayed scaling: each weight's site
 * has its own input scale there. Groups are numbered for the process: the
 * kept codes are the backend's, whichever model runs. */
void linear_same_input(struct transformer *m, int begin) {
    static unsigned groups;
    m->fp8_input_group = 0;
    if (!begin || !m->fp8_reuse || m->fp8_hist) return;
    if (++groups == 0) groups = 1; /* 0 means no group */
    m->fp8_input_group = groups;
}

/* ---- zb-h1's deferred weight gradients (model/linear.h) ---- */

struct wgrad_op {
    float *dw;
    const float *w;
    const float *x, *dout;      /* where the slot keeps them, or NULL: copied, at x_at / dout_at */
    const float *src_x;         /* the x backward handed over (its copy is shared with the next op's if the same) */
    size_t x_at, dout_at;       /* bytes into the queue's buffer */
    int N, K, M, layer;
    int fp8;                    /* an FP8 block's GEMM: with this recipe (no input group: its kept codes are gone) */
    struct fp8_recipe recipe;
};

struct wgrad_queue {
    struct wgrad_op *ops;
    int n, cap;
    char *buf;                  /* backend memory: the copied operands (a pool buffer while ops wait) */
    size_t used, size;
};

/* every slot's queue, and the copy buffers no queue holds: as many buffers exist as Ws ever waited at once */
struct wgrad_state {
    struct wgrad_queue *q;      /* [nslots] */
    struct { char *buf; size_t size; } *spare;
    int nspare;
};

static struct wgrad_state *state(struct transformer *m) {
    if (!m->wgrad) {
        struct wgrad_state *w = xcalloc(1, sizeof *w);
        w->q = xcalloc(m->nslots, sizeof *w->q);
        w->spare = xcalloc(m->nslots, sizeof *w->spare);
        m->wgrad = w;
    }
    return m->wgrad;
}

static int in_slot(const struct transformer *m, const void *p) {
    const struct act_slot *s = &m->slots[m->w_slot];
    return (const char *)p >= s->mem_begin && (const char *)p < s->mem_end;
}

/* bytes of n activations at p in q's buffer (grown: the ops hold offsets), or NULL if the slot keeps them */
static const float *keep(struct transformer *m, struct wgrad_queue *q, const float *p, size_t n, size_t *at) {
    if (in_slot(m, p)) return p;
    struct wgrad_state *w = state(m);
    if (!q->buf && w->nspare) { /* the pool's last buffer (all grow alike: sizes are near) */
        w->nspare--;
        q->buf = w->spare[w->nspare].buf, q->size = w->spare[w->nspare].size;
    }
    size_t bytes = (act_size(m, n) + 63) / 64 * 64;
    if (q->used + bytes > q->size) {
        size_t size = (q->used + bytes) + (q->used + bytes) / 4;
        char *grown = m->be->alloc(size);
        if (q->used) m->be->copy(grown, q->buf, q->used);
        if (q->buf) m->be->free(q->buf);
        q->buf = grown, q->size = size;
    }
    m->be->copy(q->buf + q->used, p, act_size(m, n));
    *at = q->used;
    q->used += bytes;
    return NULL;
}

void linear_dout_home(struct transformer *m, float *home, size_t cap) { m->w_home = home, m->w_home_cap = cap; }

/* record dw += dout^T x for later (in FP8 with *fp8, else the table's GEMM); 1 if deferred */
static int defer(struct transformer *m, float *dw, const float *dout, const float *x, const float *w, int N, int K,
                 int M, const struct fp8_recipe *fp8) {
    float *home = m->w_home;
    m->w_home = NULL;
    if (!m->defer_w || !dw) return 0;
    struct wgrad_queue *q = &state(m)->q[m->w_slot];
    if (q->n == q->cap) q->ops = xrealloc(q->ops, sizeof *q->ops * (q->cap = q->cap ? 2 * q->cap : 64));
    struct wgrad_op *op = &q->ops[q->n++];
    *op = (struct wgrad_op){.dw = dw, .w = w, .N = N, .K = K, .M = M, .layer = m->w_layer, .fp8 = fp8 != NULL};
    if (fp8) op->recipe = *fp8, op->recipe.input_group = 0;
    /* projections that read one input (q, k, v; gate, up) share one copy of it */
    const struct wgrad_op *prev = q->n > 1 ? op - 1 : NULL;
    if (prev && prev->src_x == x && prev->N == N && prev->K == K && prev->layer == m->w_layer)
        op->x = prev->x, op->x_at = prev->x_at;
    else
        op->x = keep(m, q, x, (size_t)N * K, &op->x_at);
    op->src_x = x;
    if (home && in_slot(m, home) && (size_t)N * M <= m->w_home_cap) {
        m->be->copy(home, dout, act_size(m, (size_t)N * M));
        op->dout = home;
    } else {
        op->dout = keep(m, q, dout, (size_t)N * M, &op->dout_at);
    }
    return 1;
}

void linear_backward_plain(struct transformer *m, float *dx, float *dw, const float *dout, const float *x,
                           const float *w, int N, int K, int M, int accumulate_dx) {
    if (defer(m, dw, dout, x, w, N, K, M, NULL)) dw = NULL;
    if (dx || dw) m->be->matmul_backward(dx, dw, dout, x, w, N, K, M, accumulate_dx);
}

void wgrad_run(struct transformer *m, int slot) {
    struct wgrad_state *ws = state(m);
    struct wgrad_queue *q = &ws->q[slot];
    int last = m->last_micro_batch && m->layer_grads_done;
    for (int i = 0; i < q->n; i++) {
        const struct wgrad_op *op = &q->ops[i];
        const float *x = op->x ? op->x : (const float *)(q->buf + op->x_at);
        const float *dout = op->dout ? op->dout : (const float *)(q->buf + op->dout_at);
        if (op->fp8) m->be->fp8_matmul_backward(NULL, op->dw, dout, x, op->w, op->N, op->K, op->M, 0, op->recipe);
        else m->be->matmul_backward(NULL, op->dw, dout, x, op->w, op->N, op->K, op->M, 0);
        if (m->pipe_progress) m->pipe_progress(m->pipe_progress_ctx);
        /* a main layer's gradients are whole after its last W (backward met the layers top down) */
        if (last && op->layer >= 0 && (i + 1 == q->n || q->ops[i + 1].layer != op->layer))
            m->layer_grads_done(m->layer_grads_ctx, op->layer);
    }
    q->n = 0, q->used = 0;
    if (q->buf) { /* back to the pool: the next W to wait takes it */
        ws->spare[ws->nspare].buf = q->buf, ws->spare[ws->nspare].size = q->size, ws->nspare++;
        q->buf = NULL, q->size = 0;
    }
}

size_t wgrad_copied_bytes(const struct transformer *m, int slot) {
    const struct wgrad_state *w = m->wgrad;
    return w ? w->q[slot].used : 0;
}

int wgrad_buffers(const struct transformer *m) {
    const struct wgrad_state *w = m->wgrad;
    int n = w ? w->nspare : 0;
    for (int i = 0; w && i < m->nslots; i++) n += w->q[i].buf != NULL;
    return n;
}

void wgrad_free(struct transformer *m) {
    struct wgrad_state *w = m->wgrad;
    if (!w) return;
    for (int i = 0; i < m->nslots; i++) {
        free(w->q[i].ops);
        if (w->q[i].buf) m->be->free(w->q[i].buf);
    }
    for (int i = 0; i < w->nspare; i++) m->be->free(w->spare[i].buf);
    free(w->q), free(w->spare), free(w);
    m->wgrad = NULL;
}
