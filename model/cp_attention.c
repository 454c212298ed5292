/* Ring attention over the context-parallel group (see cp_attention.h). */
#include <string.h>

#include "config/common.h"
#include "model/cp_attention.h"
#include "parallel/timeline.h"

struct cp_scratch {
    float *kv[2];   /* a block's keys then values, stored: the one in hand and the one arriving */
    float *dkv[2];  /* their fp32 gradients, travelling with them in backward */
    float *o, *dq;  /* fp32: the running output [B,T,Hl,Dv], the query gradient [B,T,Hl,D] */
};

int cp_position(int cp_rank, int cp, int c, int t) { return t < c ? cp_rank * c + t : (2 * cp - 1 - cp_rank) * c + t - c; }

static size_t kv_elems(const struct transformer *m) { return (size_t)m->N * m->KVl * (m->D + m->Dv); }

size_t cp_attention_scratch_bytes(const struct transformer *m) {
    size_t kv = kv_elems(m), heads = (size_t)m->N * m->Hl;
    return 2 * act_size(m, kv) + 2 * sizeof(float) * kv + sizeof(float) * heads * (m->Dv + m->D);
}

static struct cp_scratch *scratch(struct transformer *m) {
    if (m->cp_scratch) return m->cp_scratch;
    const struct backend *be = m->be;
    struct cp_scratch *s = xcalloc(1, sizeof *s);
    size_t kv = kv_elems(m), heads = (size_t)m->N * m->Hl;
    for (int i = 0; i < 2; i++) {
        s->kv[i] = be->alloc(act_size(m, kv));
        s->dkv[i] = be->alloc(sizeof(float) * kv);
    }
    s->o = be->alloc(sizeof(float) * heads * m->Dv);
    s->dq = be->alloc(sizeof(float) * heads * m->D);
    m->cp_scratch = s;
    return s;
}

void cp_attention_free(struct transformer *m) {
    struct cp_scratch *s = m->cp_scratch;
    if (!s) return;
    for (int i = 0; i < 2; i++) {
        m->be->free(s->kv[i]);
        m->be->free(s->dkv[i]);
    }
    m->be->free(s->o);
    m->be->free(s->dq);
    free(s);
    m->cp_scratch = NULL;
}

/* the keys and values of a block: k [N, KVl*D] then v [N, KVl*Dv] */
static float *block_v(const struct transformer *m, float *kv) { return act_at(m, kv, (size_t)m->N * m->KVl * m->D); }
static float *grad_v(const struct transformer *m, float *dkv) { return dkv + (size_t)m->N * m->KVl * m->D; }

/* The floating-point work of rank r's queries against the block of rank src: the ops compute each pair of
 * chunks (c x c scores) whose key chunk is not later than the query chunk and skip the rest, per sequence
 * and head; forward two GEMMs (scores, times values), backward five (scores again, the probabilities'
 * gradient, dv, dq, dk). On the timeline, where the ring's balance across ranks is read. */
static uint64_t block_flops(const struct transformer *m, int r, int src, int backward) {
    int qc[2] = {r, 2 * m->cp - 1 - r}, kc[2] = {src, 2 * m->cp - 1 - src}, pairs = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) pairs += kc[j] <= qc[i];
    uint64_t c = (uint64_t)m->T / 2, per = backward ? 3 * (uint64_t)m->D + 2 * (uint64_t)m->Dv : (uint64_t)m->D + m->Dv;
    return (uint64_t)pairs * m->B * m->Hl * 2 * c * c * per;
}

/* send `bytes` of `out` to the next rank of the ring and receive as many into `in` from the previous one;
 * begun only (a ticket for comm_wait_ticket), so the block in hand is computed meanwhile */
static int pass_on_start(struct transformer *m, void *out, void *in, size_t bytes) {
    int cp = m->cp, r = m->cp_rank;
    struct comm_p2p ops[2] = {{in, bytes, (r + cp - 1) % cp, 1, 0}, {out, bytes, (r + 1) % cp, 0, 0}};
    return comm_exchange_start(m->cp_comm, ops, 2);
}
static void pass_on(struct transformer *m, void *out, void *in, size_t bytes) {
    comm_wait_ticket(m->cp_comm, pass_on_start(m, out, in, bytes));
}

void cp_attention_forward(struct transformer *m, float *out, float *lse, const float *q, const float *k,
                          const float *v) {
    const struct backend *be = m->be;
    struct cp_scratch *s = scratch(m);
    int cp = m->cp, r = m->cp_rank, c = m->T / 2;
    size_t nk = (size_t)m->N * m->KVl * m->D, nv = (size_t)m->N * m->KVl * m->Dv;
    be->copy(s->kv[0], k, act_size(m, nk));
    be->copy(block_v(m, s->kv[0]), v, act_size(m, nv));
    for (int step = 0; step < cp; step++) { /* the block of rank r - step is in hand */
        float *kv = s->kv[step % 2];
        int src = (r - step + cp) % cp;
        /* the next block arrives while this one is computed */
        int ticket = step + 1 < cp ? pass_on_start(m, kv, s->kv[(step + 1) % 2], act_size(m, nk + nv)) : 0;
        int span = timeline_compute_begin("attention_block", -1, -1); /* the ring's balance, on the timeline */
        timeline_work(span, block_flops(m, r, src, 0));
        be->attention_block_forward(s->o, lse, q, kv, block_v(m, kv), m->B, c, m->Hl, m->KVl, m->D, m->Dv, r,
                                    2 * cp - 1 - r, src, 2 * cp - 1 - src, step == 0);
        timeline_end(span, NULL);
        comm_wait_ticket(m->cp_comm, ticket);
    }
    be->to_storage(out, s->o, (size_t)m->N * m->Hl * m->Dv);
}

void cp_attention_backward(struct transformer *m, float *dq, float *dk, float *dv, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v) {
    const struct backend *be = m->be;
    struct cp_scratch *s = scratch(m);
    int cp = m->cp, r = m->cp_rank, c = m->T / 2;
    size_t nk = (size_t)m->N * m->KVl * m->D, nv = (size_t)m->N * m->KVl * m->Dv, nq = (size_t)m->N * m->Hl * m->D;
    be->copy(s->kv[0], k, act_size(m, nk));
    be->copy(block_v(m, s->kv[0]), v, act_size(m, nv));
    be->zero(s->dkv[0], sizeof(float) * (nk + nv));
    be->zero(s->dq, sizeof(float) * nq);
    int at = 0;
    for (int step = 0; step < cp; step++, at ^= 1) {
        /* the block goes on to the next rank while its gradient here is computed; then the gradient so far
         * follows it (the last hop brings each block's home) */
        int ticket = step + 1 < cp ? pass_on_start(m, s->kv[at], s->kv[at ^ 1], act_size(m, nk + nv)) : 0;
        int src = (r - step + cp) % cp, span = timeline_compute_begin("attention_block", -1, -1);
        timeline_work(span, block_flops(m, r, src, 1));
        be->attention_block_backward(s->dq, s->dkv[at], grad_v(m, s->dkv[at]), dout, out, lse, q, s->kv[at],
                                     block_v(m, s->kv[at]), m->B, c, m->Hl, m->KVl, m->D, m->Dv, r, 2 * cp - 1 - r,
                                     src, 2 * cp - 1 - src);
        timeline_end(span, NULL);
        comm_wait_ticket(m->cp_comm, ticket);
        pass_on(m, s->dkv[at], s->dkv[at ^ 1], sizeof(float) * (nk + nv));
    }
    /* after cp hops the gradient of this rank's own block is in hand */
    be->to_storage(dq, s->dq, nq);
    be->to_storage(dk, s->dkv[at], nk);
    be->to_storage(dv, grad_v(m, s->dkv[at]), nv);
}
