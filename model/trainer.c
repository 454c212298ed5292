#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/common.h"
#include "model/cp_attention.h"
#include "model/trainer.h"
#include "parallel/timeline.h"

/* A layer's last backward of the step is done: its gradients join the
 * bucket being filled, which starts reducing over data-parallel ranks, while
 * the layers below run backward, once it holds parallel.grad_bucket_mb.
 * Backward visits layers downwards and a layer's tensors sit just before the
 * next one's in the table, so a bucket is one contiguous range. What is left
 * in the bucket at the end is reduced with the rest after backward. */
static void pipeline_progress(void *ctx) { comm_progress(ctx); }

static void layer_grads_done(void *ctx, int layer) {
    struct trainer *tr = ctx;
    int first = tr->layer_first[layer], last = tr->layer_last[layer];
    for (int k = 0; k < tr->opt.ngroups; k++) /* the buckets started so far move on (MPI: only inside its calls) */
        if (tr->opt.group[k].dp) comm_progress(tr->opt.group[k].dp);
    if (first < 0) return;
    const struct param_table *t = &tr->model.table;
    if (tr->bucket_first >= 0 && last + 1 != tr->bucket_first) { /* not adjacent: start what is there */
        optimizer_reduce_bucket_start(&tr->opt, tr->model.grads, tr->bucket_first, tr->bucket_last);
        tr->bucket_first = -1;
    }
    if (tr->bucket_first < 0) tr->bucket_last = last, tr->bucket_bytes = 0;
    tr->bucket_first = first;
    tr->bucket_bytes += sizeof(float) * (t->items[last].offset + t->items[last].numel - t->items[first].offset);
    if (tr->bucket_bytes >= tr->bucket_limit) {
        optimizer_reduce_bucket_start(&tr->opt, tr->model.grads, tr->bucket_first, tr->bucket_last);
        tr->bucket_first = -1;
    }
}

static void layer_params_needed(void *ctx, int l);

void trainer_create(struct trainer *tr, const struct backend *be, const struct recipe *r, struct grid *g) {
    memset(tr, 0, sizeof *tr);
    tr->recipe = r;
    tr->grid = g;
    /* under context parallelism each rank holds T = seq_len / cp tokens of every sequence (model/cp_attention.h) */
    int B = r->train.micro_batch, T = r->train.seq_len / g->cp, vpp = g->pp > 1 ? g->vpp : 1;
    tr->micro_batches = r->train.global_batch / (B * g->dp);
    int m = tr->micro_batches;
    tr->schedule = xmalloc(sizeof *tr->schedule * SCHED_ITEMS(m, vpp));
    enum sched_kind kind = tr->kind = schedule_kind(r->parallel.schedule, vpp);
    tr->schedule_len = schedule_build(tr->schedule, kind, g->pp, vpp, g->pp_rank, m);
    tr->eval_schedule = xmalloc(sizeof *tr->eval_schedule * m * vpp);
    tr->eval_len = schedule_build_forward(tr->eval_schedule, vpp, m);
    /* activation slots: one per micro batch in flight, or under the V schedules one per chunk of one */
    int per_chunk[2], *slot_chunk = NULL, slots;
    tr->chunk_slots = schedule_chunk_slots(kind, tr->schedule, tr->schedule_len, g->pp, m, per_chunk);
    if (tr->chunk_slots) {
        slots = per_chunk[0] + per_chunk[1];
        slot_chunk = xmalloc(sizeof(int) * slots);
        for (int i = 0; i < slots; i++) slot_chunk[i] = i >= per_chunk[0];
        tr->pool[0] = (struct slot_pool){.base = 0, .count = per_chunk[0]};
        tr->pool[1] = (struct slot_pool){.base = per_chunk[0], .count = per_chunk[1]};
    } else {
        slots = schedule_max_in_flight(tr->schedule, tr->schedule_len, vpp);
        tr->pool[0] = (struct slot_pool){.base = 0, .count = slots};
    }
    for (int c = 0; c < 2; c++) tr->pool[c].free = xmalloc(sizeof(int) * (tr->pool[c].count + 1));
    struct model_part part;
    model_part_for(&part, &r->model, &r->parallel, g->tp_rank, g->pp_rank, g->ep_rank, g->etp_rank);
    /* ZeRO-1 with a working copy: each rank keeps the fp32 master of its shard only (of either group: the
     * dense tensors over dp, the routed experts over edp) */
    int zero = r->optimizer.distributed && (g->dp_comm.size > 1 || (r->model.num_experts > 0 && g->edp > 1));
    int shard_master = zero && be->precision != PRECISION_FP32;
    transformer_create(&tr->model, be, &r->model, &part, &g->tp_comm, r->parallel.sequence_parallel, B, T, slots,
                       slot_chunk, recompute_mode(r->train.recompute), shard_master);
    free(slot_chunk);
    tr->model.ep_comm = &g->ep_comm, tr->model.etp_comm = &g->etp_comm;
    tr->model.defer_w = schedule_splits(kind); /* its backwards leave the weight gradients to its W items */
    if (g->pp > 1 && SCHED_BUFFERED(kind) && g->pp_comm.nccl)
        die_code(EXIT_USAGE, "parallel.schedule %s: its pipeline sends must not wait for their receives, which MPI "
                 "gives (on GPU ranks through host copies: parallel.comm: mpi) but NCCL does not yet: use zb-h1 or "
                 "1f1b over NCCL (docs/parallelism.md)", schedule_name(kind));
    if (strcmp(be->name, "cpu")) tr->item_time[0][1] = -1; /* the host clock does not time device work: zbv keeps
                                                           * the order made for equal costs there */
    if (g->pp > 1 && schedule_splits(kind)) /* their sends are under way while items compute */
        tr->model.pipe_progress = pipeline_progress, tr->model.pipe_progress_ctx = &g->pp_comm;
    if (g->cp > 1 && !be->attention_block_forward)
        die_code(EXIT_USAGE, "parallel.cp %d: the %s backend has no context-parallel attention (kernels/ops.h "
                 "attention_block_forward)", g->cp, be->name);
    transformer_set_cp(&tr->model, g->cp, g->cp_rank, &g->cp_comm, r->train.seq_len);
    const char *sc = r->train.fp8_scaling;
    struct fp8_recipe fp8 = {.scaling = !strcmp(sc, "block")     ? FP8_SCALING_BLOCK
                                        : !strcmp(sc, "delayed") ? FP8_SCALING_DELAYED
                                                                 : FP8_SCALING_TENSOR,
                             .grad_e5m2 = !strcmp(r->train.fp8_grad_format, "e5m2")};
    transformer_set_fp8(&tr->model, fp8, r->train.fp8_skip_layers, r->train.fp8_amax_history);
    transformer_set_moe_sequences(&tr->model, r->train.global_batch);
    optimizer_create(&tr->opt, be, &tr->model.master, &r->optimizer, &g->dp_comm, &g->tp_comm,
                     r->parallel.sequence_parallel, &g->edp_comm);
    for (int k = 0; k < tr->opt.ngroups; k++) /* a gathered group's working copy comes from its owners */
        CHECK(!tr->opt.group[k].distributed || shard_master || be->precision == PRECISION_FP32);
    tr->slot_of = xmalloc(sizeof(int) * m * vpp);
    /* gradient buckets: one per layer, its dense tensors (contiguous in the
     * table; routed experts are stored after everything else) */
    const struct param_table *t = &tr->model.table;
    tr->layer_first = xmalloc(sizeof(int) * r->model.num_layers);
    tr->layer_last = xmalloc(sizeof(int) * r->model.num_layers);
    for (int l = 0; l < r->model.num_layers; l++) {
        char prefix[PARAM_NAME_MAX];
        int n = snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        tr->layer_first[l] = tr->layer_last[l] = -1;
        for (int i = 0; i < t->count; i++)
            if (!t->items[i].expert && !strncmp(t->items[i].name, prefix, n)) {
                if (tr->layer_first[l] < 0) tr->layer_first[l] = i;
                tr->layer_last[l] = i;
            }
    }
    int moe_layers = model_moe_layer_count_all(&r->model);
    if (moe_layers) tr->moe_load = xcalloc((size_t)moe_layers * r->model.num_experts, sizeof(double));
    if (r->parallel.overlap_grad_reduce) {
        tr->model.layer_grads_done = layer_grads_done;
        tr->model.layer_grads_ctx = tr;
    }
    tr->bucket_first = -1;
    tr->bucket_limit = (size_t)(r->parallel.grad_bucket_mb * 1048576.0);
    if (r->parallel.overlap_param_gather && tr->opt.group[0].distributed) {
        tr->opt.defer_gather = 1;
        tr->gather_ticket = xcalloc(r->model.num_layers, sizeof(int));
        tr->model.layer_params_needed = layer_params_needed;
        tr->model.layer_params_ctx = tr;
    }
    if (g->pp > 1) {
        size_t act = act_size(&tr->model, (size_t)tr->model.Ns * tr->model.C);
        tr->nsend = schedule_send_buffers(kind, g->pp, vpp, m, NULL, g->pp_comm.nccl != NULL);
        tr->send = be->alloc(act * tr->nsend);
        tr->send_ticket = xcalloc(tr->nsend, sizeof(int));
        tr->recv_grad = be->alloc(act);
    }
    if (g->embed_comm.size > 1 && model_head_uses_embed(&r->model)) {
        tr->embed_shared = param_find(t, "model.embed_tokens.weight");
        CHECK(tr->embed_shared);
    }
    tr->inputs = xmalloc(sizeof(int32_t) * B * T);
    tr->targets = xmalloc(sizeof(int32_t) * B * T);
    if (g->cp > 1) tr->seq_targets = xmalloc(sizeof(int32_t) * B * r->train.seq_len);
}

void trainer_free(struct trainer *tr) {
    const struct backend *be = tr->model.be;
    trainer_settle(tr);
    free(tr->gather_ticket);
    if (tr->send) {
        be->free(tr->send);
        be->free(tr->recv_grad);
        free(tr->send_ticket);
    }
    optimizer_free(&tr->opt);
    transformer_free(&tr->model);
    free(tr->schedule);
    free(tr->eval_schedule);
    free(tr->slot_of);
    for (int c = 0; c < 2; c++) free(tr->pool[c].free);
    free(tr->layer_first);
    free(tr->layer_last);
    free(tr->moe_load);
    free(tr->inputs);
    free(tr->targets);
    free(tr->seq_targets);
}

/* Micro batch mb of samples -> slot: inputs are the first seq_len tokens,
 * targets the same shifted by one; under context parallelism this rank's
 * two chunks of them (model/cp_attention.h). */
static void stage_micro_batch(struct trainer *tr, const int32_t *samples, int mb, int slot) {
    const struct transformer *m = &tr->model;
    int S = tr->recipe->train.seq_len, B = tr->recipe->train.micro_batch, T = m->T, c = T / 2;
    for (int b = 0; b < B; b++) {
        const int32_t *s = samples + (size_t)(mb * B + b) * (S + 1);
        if (m->cp > 1) memcpy(tr->seq_targets + (size_t)b * S, s + 1, sizeof(int32_t) * S);
        for (int half = 0; half < (m->cp > 1 ? 2 : 1); half++) { /* a run of positions each */
            int t0 = m->cp > 1 ? half * c : 0, n = m->cp > 1 ? c : T, p = cp_position(m->cp_rank, m->cp, c, t0);
            memcpy(tr->inputs + (size_t)b * T + t0, s + p, sizeof(int32_t) * n);
            memcpy(tr->targets + (size_t)b * T + t0, s + p + 1, sizeof(int32_t) * n);
        }
    }
    transformer_stage(&tr->model, slot, tr->inputs, tr->targets, m->cp > 1 ? tr->seq_targets : NULL);
}

/* ---- pipeline plumbing: virtual stages (schedule_stage) ---- */

/* The send buffer pos: run_schedule's set of a unit (SCHED_UNIT_MAX each)
 * plus the item's position in it; run_buffered's one of its pool. */
static float *send_buf(struct trainer *tr, int pos) {
    CHECK(pos < tr->nsend);
    return act_at(&tr->model, tr->send, (size_t)pos * tr->model.Ns * tr->model.C);
}

/* ---- activation slots ---- */

static int *slot_at(struct trainer *tr, int mb, int chunk) { return &tr->slot_of[mb * tr->model.part.nchunks + chunk]; }

/* every slot free (each step and evaluation starts so) */
static void slots_reset(struct trainer *tr) {
    for (int c = 0; c < 2; c++) tr->pool[c].next = tr->pool[c].nfree = 0;
}

/* micro batch mb's slot for a forward of chunk (its first visit: a slot of the chunk's pool, or of the one pool
 * on chunk 0, holding every chunk), with its tokens staged; evaluation uses the first slot of each pool */
static void take_slot(struct trainer *tr, const int32_t *samples, int mb, int chunk, int eval) {
    if (!tr->chunk_slots && chunk > 0) return;
    struct slot_pool *p = &tr->pool[tr->chunk_slots ? chunk : 0];
    int slot = eval ? p->base : p->nfree ? p->free[--p->nfree] : p->base + p->next++;
    CHECK(slot < p->base + p->count);
    for (int c = 0; c < tr->model.part.nchunks; c++)
        if (tr->chunk_slots ? c == chunk : 1) *slot_at(tr, mb, c) = slot;
    stage_micro_batch(tr, samples, mb, slot);
}

/* the slot of micro batch mb's chunk free again (after its last pass: its backward, or its W when split) */
static void release_slot(struct trainer *tr, int mb, int chunk) {
    if (!tr->chunk_slots && chunk > 0) return;
    struct slot_pool *p = &tr->pool[tr->chunk_slots ? chunk : 0];
    CHECK(p->nfree < p->count);
    p->free[p->nfree++] = *slot_at(tr, mb, chunk);
}

/* The receive an item needs, added to the group: a forward's input (after
 * giving a micro batch its slot on its first visit) or a backward's output
 * gradient. */
static void add_receive(struct trainer *tr, const int32_t *samples, struct sched_item it, int eval,
                        struct comm_p2p *ops, int *nops) {
    struct transformer *m = &tr->model;
    struct grid *g = tr->grid;
    if (it.op == SCHED_FORWARD) take_slot(tr, samples, it.mb, it.chunk, eval);
    struct sched_links l = schedule_links(it, tr->kind, g->pp, m->part.nchunks, g->pp_rank);
    if (l.recv_from < 0) return;
    void *buf = it.op == SCHED_FORWARD ? transformer_chunk_input(m, *slot_at(tr, it.mb, it.chunk), it.chunk)
                                       : tr->recv_grad;
    int vs = schedule_stage(tr->kind, g->pp, it.chunk, g->pp_rank);
    int tag = SCHED_BUFFERED(tr->kind) ? schedule_tag(it.op, vs) : 0; /* buffered: matched by tag */
    ops[(*nops)++] = (struct comm_p2p){buf, act_size(m, (size_t)m->Ns * m->C), l.recv_from, 1, tag};
}

/* A W item: the weight gradients of micro batch mb's chunk (split
 * schedules); its slot is free again after it */
static void run_weights(struct trainer *tr, struct sched_item it) {
    struct transformer *m = &tr->model;
    int slot = *slot_at(tr, it.mb, it.chunk), span = timeline_compute_begin("weights", it.mb, it.chunk);
    m->last_micro_batch = it.mb == tr->micro_batches - 1;
    transformer_weight_grads_chunk(m, slot, it.chunk);
    timeline_end(span, NULL);
    release_slot(tr, it.mb, it.chunk);
}

/* A forward or backward item, its input in place; a forward's result goes to
 * out (NULL: the last virtual stage, whose loss is returned), a backward's is
 * in m->d_resid. Returns this item's share of the loss. */
static double run_item(struct trainer *tr, struct sched_item it, float *out, float dscale, int eval) {
    struct transformer *m = &tr->model;
    int mb = it.mb, c = it.chunk, slot = *slot_at(tr, mb, c);
    if (it.op == SCHED_FORWARD) {
        int span = timeline_compute_begin("forward", mb, c);
        double lk = transformer_forward_chunk(m, slot, c, out, dscale);
        timeline_end(span, NULL);
        return !out && tr->grid->tp_rank == 0 ? lk : 0; /* the last virtual stage */
    }
    m->last_micro_batch = !eval && mb == tr->micro_batches - 1;
    int span = timeline_compute_begin("backward", mb, c);
    transformer_backward_chunk(m, slot, c, tr->recv_grad);
    timeline_end(span, NULL);
    if (!m->defer_w) release_slot(tr, mb, c); /* (split: released by its W) */
    return 0;
}

/* A dualpipev pair: the forward f and the backward b (of the other chunk) as one
 * unit, their passes interleaved so that one's expert all-to-alls run while
 * the other computes (model/pair.c); the backward's result is in m->d_resid.
 * Returns the forward's share of the loss. */
static double run_pair(struct trainer *tr, struct sched_item f, struct sched_item b, float *out, float dscale) {
    struct transformer *m = &tr->model;
    m->last_micro_batch = b.mb == tr->micro_batches - 1;
    int span = timeline_compute_begin("forward+backward", f.mb, f.chunk);
    double lk = transformer_pair_chunks(m, *slot_at(tr, f.mb, f.chunk), f.chunk, out, dscale,
                                        *slot_at(tr, b.mb, b.chunk), b.chunk, tr->recv_grad);
    timeline_end(span, NULL);
    return !out && tr->grid->tp_rank == 0 ? lk : 0; /* the last virtual stage */
}

/* a send buffer whose send has completed, other than `taken` (all in use: whichever completes first) */
static int free_send_buffer(struct trainer *tr, int taken) {
    struct comm *pp = &tr->grid->pp_comm;
    for (;;) {
        for (int j = 0; j < tr->nsend; j++)
            if (j != taken && (!tr->send_ticket[j] || comm_ticket_done(pp, tr->send_ticket[j]))) {
                tr->send_ticket[j] = 0;
                return j;
            }
        comm_progress(pp);
    }
}

static double now_s(void) {
    struct timespec t;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t) == 0);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* a training item's time on the host clock (CPU ranks: a device's work is asynchronous to it), until the
 * order is made for them */
static void time_item(struct trainer *tr, enum sched_op op, double t0, int eval) {
    if (eval || tr->item_time[0][1] < 0) return;
    tr->item_time[op][0] += now_s() - t0, tr->item_time[op][1] += 1;
}

/* After the first training step: zbv's order made again for the mean F, B and W times measured on every
 * rank (all ranks agree on them, so every pipeline runs one order: the data-parallel buckets start in
 * the same order everywhere). Each chunk's items keep micro-batch order, so no number changes. */
static void retime_schedule(struct trainer *tr) {
    if (tr->item_time[0][1] < 0 || tr->kind != SCHED_ZBV || tr->grid->pp == 1) return;
    double v[6];
    for (int k = 0; k < 3; k++) v[2 * k] = tr->item_time[k][0], v[2 * k + 1] = tr->item_time[k][1];
    comm_all_reduce_sum_f64(&tr->grid->world, v, 6);
    tr->item_time[0][1] = -1;
    if (v[1] <= 0 || v[3] <= 0 || v[5] <= 0 || v[0] <= 0 || v[2] <= 0 || v[4] <= 0) return;
    double f = v[0] / v[1], cost[3] = {1.0, v[2] / v[3] / f, v[4] / v[5] / f};
    struct grid *g = tr->grid;
    int vpp = tr->model.part.nchunks, m = tr->micro_batches;
    tr->schedule_len = schedule_build_timed(tr->schedule, tr->kind, g->pp, vpp, g->pp_rank, m, cost);
    int per_chunk[2];
    CHECK(schedule_chunk_slots(tr->kind, tr->schedule, tr->schedule_len, g->pp, m, per_chunk) &&
          per_chunk[0] <= tr->pool[0].count && per_chunk[1] <= tr->pool[1].count);
    int need = schedule_send_buffers(tr->kind, g->pp, vpp, m, cost, g->pp_comm.nccl != NULL);
    if (need > tr->nsend) { /* every send of the step completed: the buffers are free */
        const struct backend *be = tr->model.be;
        be->free(tr->send);
        tr->send = be->alloc(act_size(&tr->model, (size_t)tr->model.Ns * tr->model.C) * need);
        free(tr->send_ticket);
        tr->send_ticket = xcalloc(need, sizeof(int));
        tr->nsend = need;
    }
}

/* A V order (zbv, dualpipev) a unit at a time: an item, or a dualpipev pair;
 * its inputs received (blocking), its results sent at once, each from a send
 * buffer of its own, free again when the send completes (parallel/schedule.h
 * schedule_send_buffers). Transfers are matched by tag (schedule_tag). */
static double run_buffered(struct trainer *tr, const int32_t *samples, const struct sched_item *s, int n,
                           float dscale, int eval) {
    struct transformer *m = &tr->model;
    struct grid *g = tr->grid;
    size_t act_bytes = act_size(m, (size_t)m->Ns * m->C);
    double loss = 0;
    slots_reset(tr);
    for (int i = 0; i < n;) {
        double t0 = now_s();
        if (s[i].op == SCHED_WEIGHTS) {
            run_weights(tr, s[i]);
            time_item(tr, s[i].op, t0, eval);
            i++;
            continue;
        }
        int unit = schedule_unit(tr->kind, s, n, i), buf[SCHED_UNIT_MAX], nops = 0;
        struct comm_p2p ops[SCHED_UNIT_MAX];
        struct sched_links l[SCHED_UNIT_MAX];
        for (int k = 0; k < unit; k++) add_receive(tr, samples, s[i + k], eval, ops, &nops);
        comm_exchange(&g->pp_comm, ops, nops);
        for (int k = 0; k < unit; k++) {
            l[k] = schedule_links(s[i + k], tr->kind, g->pp, m->part.nchunks, g->pp_rank);
            buf[k] = l[k].send_to >= 0 ? free_send_buffer(tr, k ? buf[0] : -1) : -1;
        }
        float *out = buf[0] >= 0 ? send_buf(tr, buf[0]) : NULL; /* the (first) forward's result */
        t0 = now_s(); /* the unit itself, not its wait for the inputs */
        if (unit == 2) {
            loss += run_pair(tr, s[i], s[i + 1], out, dscale);
        } else {
            loss += run_item(tr, s[i], s[i].op == SCHED_FORWARD ? out : NULL, dscale, eval);
            time_item(tr, s[i].op, t0, eval);
        }
        for (int k = 0; k < unit; k++) {
            if (buf[k] < 0) continue;
            struct sched_item it = s[i + k];
            float *o = send_buf(tr, buf[k]);
            if (it.op == SCHED_BACKWARD) m->be->copy(o, m->d_resid, act_bytes);
            int vs = schedule_stage(tr->kind, g->pp, it.chunk, g->pp_rank);
            struct comm_p2p send = {o, act_bytes, l[k].send_to, 0,
                                    schedule_tag(it.op, it.op == SCHED_FORWARD ? vs + 1 : vs - 1)};
            tr->send_ticket[buf[k]] = comm_exchange_start(&g->pp_comm, &send, 1);
        }
        i += unit;
    }
    for (int j = 0; j < tr->nsend; j++) comm_wait_ticket(&g->pp_comm, tr->send_ticket[j]), tr->send_ticket[j] = 0;
    m->last_micro_batch = 0;
    return loss;
}

/* Run a list of forwards/backwards a unit at a time (parallel/schedule.h),
 * each after one exchange with the neighbours: this unit's inputs in, the
 * previous unit's results out (begun before a W too, which runs meanwhile).
 * Over MPI the sends are begun apart from the receives and complete later:
 * a unit writes its results into the set of send buffers the unit before
 * last used, waiting only for those sends, so that a rank does not wait for
 * its peer to take its results (zb-h1's last stage runs a W before it takes
 * the next forward's input) before it takes its own inputs. Over NCCL
 * sends and receives go as one group (one set of buffers). Returns this
 * rank's summed token loss (counted on TP rank 0 of the last stage only).
 * (Buffered schedules: run_buffered.) */
static double run_schedule(struct trainer *tr, const int32_t *samples, const struct sched_item *s, int n,
                           float dscale, int eval) {
    if (SCHED_BUFFERED(tr->kind) && tr->grid->pp > 1) return run_buffered(tr, samples, s, n, dscale, eval);
    struct transformer *m = &tr->model;
    struct grid *g = tr->grid;
    struct comm *pp_comm = &g->pp_comm;
    int pp = g->pp, vpp = m->part.nchunks, apart = tr->nsend >= 2 * SCHED_UNIT_MAX;
    size_t act_bytes = act_size(m, (size_t)m->Ns * m->C);
    int nops = 0, set = 0, out_set = 0, sending[2] = {0, 0};
    slots_reset(tr);
    struct comm_p2p ops[COMM_EXCHANGE_MAX] = {{0}};
    double loss = 0;
    for (int i = 0; i < n;) {
        if (apart && nops) { /* the last results out, under way while what follows computes */
            sending[out_set] = comm_exchange_start(pp_comm, ops, nops);
            nops = 0;
        }
        if (s[i].op == SCHED_WEIGHTS) { /* zb-h1's W (grouped: its sends begin now, completed below) */
            if (nops) {
                CHECK(!sending[0]);
                sending[0] = comm_exchange_start(pp_comm, ops, nops);
                nops = 0;
            }
            run_weights(tr, s[i]);
            i++;
            continue;
        }
        int unit = schedule_unit(tr->kind, s, n, i);
        for (int k = i; k < i + unit; k++)
            add_receive(tr, samples, s[k], eval, ops, &nops);
        comm_exchange(pp_comm, ops, nops);
        nops = 0;
        /* this unit's results go into a set whose sends have completed */
        comm_wait_ticket(pp_comm, sending[set]), sending[set] = 0;
        for (int k = i; k < i + unit; k++) {
            struct sched_links l = schedule_links(s[k], tr->kind, pp, vpp, g->pp_rank);
            float *out = l.send_to >= 0 ? send_buf(tr, set * SCHED_UNIT_MAX + k - i) : NULL;
            loss += run_item(tr, s[k], s[k].op == SCHED_FORWARD ? out : NULL, dscale, eval);
            if (out && s[k].op == SCHED_BACKWARD) m->be->copy(out, m->d_resid, act_bytes);
            if (out) ops[nops++] = (struct comm_p2p){out, act_bytes, l.send_to, 0, 0};
        }
        out_set = set;
        if (apart) set ^= 1;
        i += unit;
    }
    comm_exchange(pp_comm, ops, nops); /* the last unit's results */
    for (int k = 0; k < 2; k++) comm_wait_ticket(pp_comm, sending[k]);
    m->last_micro_batch = 0;
    return loss;
}

/* The first stage's embedding and the last stage's copy get the sum of both
 * gradients, so both take the same update. Without ZeRO this runs after the
 * data-parallel reduction: a sum of two is the same bits on both ends. */
static void embed_grads_sum(struct trainer *tr) {
    const struct param_info *p = tr->embed_shared;
    if (p) comm_all_reduce_sum(&tr->grid->embed_comm, tr->model.grads + p->offset, p->numel);
}

/* Under ZeRO-1 the two ends' shards split the embedding at different places,
 * so their reduce-scatters may add the data-parallel ranks' gradients in
 * different orders: the first stage's updated embedding, as the ops read
 * it (the working copy, or at fp32 the master), is sent to the copy. The
 * copy's own master shard is then stale, which nothing reads: checkpoints
 * skip copies and loads fill them from the owner's tensor. */
static void embed_params_sync(struct trainer *tr) {
    const struct param_info *p = tr->embed_shared;
    size_t elem = tr->model.be->act_bytes;
    if (p && tr->opt.group[0].distributed)
        comm_broadcast(&tr->grid->embed_comm, (char *)tr->model.weights + elem * p->offset, elem * p->numel, 0);
}

/* The MoE statistics of this step over every rank: each (micro batch,
 * layer)'s load and drops were counted once, on TP rank 0 of the rank that
 * ran it, and each TP rank added its tokens' share of the losses, which are
 * sums over sequences. */
static void moe_step_stats(struct trainer *tr, struct step_stats *st) {
    const struct recipe *r = tr->recipe;
    struct transformer *m = &tr->model;
    int E = m->E, L = m->NL, nm = model_moe_layer_count_all(&r->model);
    size_t n = (size_t)nm * E + 3;
    double *v = tr->moe_load; /* [nm][E] then aux, z, dropped: one all-reduce */
    double *all = xcalloc(n, sizeof *all);
    transformer_fetch_moe_stats(m);
    for (int l = 0, j = 0; l < L; l++) {
        if (!model_layer_is_moe(&r->model, l)) continue;
        memcpy(all + (size_t)j * E, m->moe_load + (size_t)l * E, sizeof(double) * E);
        j++;
    }
    all[n - 3] = m->moe_aux_sum, all[n - 2] = m->moe_z_sum, all[n - 1] = m->moe_dropped;
    comm_all_reduce_sum_f64(&tr->grid->world, all, n);
    memcpy(v, all, sizeof(double) * nm * E);
    double per = (double)r->train.global_batch * nm;
    st->aux_loss = all[n - 3] / per, st->z_loss = all[n - 2] / per, st->dropped = all[n - 1];
    st->load_max = 0;
    for (int j = 0; j < nm; j++) {
        double mx = 0, sum = 0;
        for (int e = 0; e < E; e++) sum += v[(size_t)j * E + e], mx = v[(size_t)j * E + e] > mx ? v[(size_t)j * E + e] : mx;
        if (sum > 0 && mx * E / sum > st->load_max) st->load_max = mx * E / sum;
    }
    st->load = v;
    free(all);
}

/* The MTP loss: mean over depths of each depth's mean token loss (the
 * depths' sums live on TP rank 0 of the last stage; zeros elsewhere). */
static void mtp_step_stats(struct trainer *tr, struct step_stats *st) {
    const struct recipe *r = tr->recipe;
    int D = model_mtp_depth(&r->model), T = r->train.seq_len;
    double *sums = xcalloc(D, sizeof *sums);
    if (tr->model.mtp_depth) memcpy(sums, tr->model.mtp_loss, sizeof(double) * D);
    comm_all_reduce_sum_f64(&tr->grid->world, sums, D);
    st->mtp_loss = 0;
    for (int d = 0; d < D; d++) st->mtp_loss += sums[d] / ((double)r->train.global_batch * (T - d - 1)) / D;
    free(sums);
}

struct step_stats trainer_compute(struct trainer *tr, const int32_t *samples, int n) {
    const struct recipe *r = tr->recipe;
    struct transformer *m = &tr->model;
    CHECK(n == tr->micro_batches * r->train.micro_batch);
    struct step_stats st = {0};
    st.tokens = (long)r->train.global_batch * r->train.seq_len;
    /* the loss is the mean over every token of the global batch, so each
     * micro batch's gradient is scaled by 1 / (all tokens) */
    float dscale = 1.0f / (float)st.tokens;
    m->be->zero(m->grads, sizeof(float) * m->table.total);
    transformer_sync_weights(m);
    transformer_reset_moe_stats(m);
    if (m->fp8_hist) fp8_history_begin_step(m->fp8_hist);
    double loss = run_schedule(tr, samples, tr->schedule, tr->schedule_len, dscale, 0);
    retime_schedule(tr);
    comm_all_reduce_sum_f64(&tr->grid->world, &loss, 1);
    /* the step's amaxes (every rank, every micro batch) join the history;
     * a rejected step's are undone with the rest when the run rewinds */
    if (m->fp8_hist) fp8_history_end_step(m->fp8_hist, &tr->grid->world);
    st.loss = loss / st.tokens;
    if (tr->moe_load) moe_step_stats(tr, &st);
    if (model_mtp_depth(&r->model)) mtp_step_stats(tr, &st);
    tr->bucket_first = -1; /* a bucket left unstarted is reduced below with the rest */
    int zero = tr->opt.group[0].distributed; /* ZeRO reduces the gradients away from m->grads */
    int span = timeline_compute_begin("reduce_grads", -1, -1);
    if (zero) embed_grads_sum(tr);
    optimizer_reduce_grads(&tr->opt, m->grads);
    if (!zero) embed_grads_sum(tr);
    st.grad_norm = optimizer_grad_norm(&tr->opt, m->grads, &tr->grid->world);
    timeline_end(span, NULL);
    return st;
}

/* ---- ZeRO-1 parameter gather overlapped with the next forward
 * (parallel.overlap_param_gather): after AdamW the dense group's parameters
 * outside the main layers are gathered at once and each local layer's
 * dense tensors start their own gather, in layer order; the forward waits
 * for layer l's just before running it and refreshes its working copy. */

static void layer_range(const struct trainer *tr, int l, size_t *begin, size_t *end) {
    const struct param_table *t = &tr->model.table;
    const struct param_info *a = &t->items[tr->layer_first[l]], *b = &t->items[tr->layer_last[l]];
    *begin = a->offset, *end = b->offset + b->numel;
}

static void gather_now(struct trainer *tr, size_t begin, size_t end) {
    int ticket = optimizer_gather_start(&tr->opt, begin, end);
    if (ticket) comm_wait_ticket(tr->opt.group[0].dp, ticket);
}

static void layer_params_needed(void *ctx, int l) {
    struct trainer *tr = ctx;
    if (!tr->gather_ticket[l]) return;
    comm_progress(tr->opt.group[0].dp); /* the later layers' gathers too */
    comm_wait_ticket(tr->opt.group[0].dp, tr->gather_ticket[l]);
    tr->gather_ticket[l] = 0;
}

void trainer_settle(struct trainer *tr) {
    if (!tr->gather_ticket) return;
    for (int l = 0; l < tr->recipe->model.num_layers; l++) layer_params_needed(tr, l);
}

/* after optimizer_step left the dense group's gather to us (the routed
 * experts' it gathered itself) */
static void gather_deferred(struct trainer *tr) {
    struct optimizer *o = &tr->opt;
    struct opt_group *g = &o->group[0];
    int L = tr->recipe->model.num_layers;
    size_t at = g->base, stop = g->base + g->total, begin, end;
    for (int l = 0; l < L; l++) { /* the gaps between local layers, and what follows them, now */
        if (tr->layer_first[l] < 0) continue;
        layer_range(tr, l, &begin, &end);
        CHECK(begin >= at);
        if (begin > at) gather_now(tr, at, begin);
        at = end;
    }
    if (stop > at) gather_now(tr, at, stop);
    for (int l = 0; l < L; l++) {
        if (tr->layer_first[l] < 0) continue;
        layer_range(tr, l, &begin, &end);
        tr->gather_ticket[l] = optimizer_gather_start(o, begin, end);
    }
}

void trainer_update(struct trainer *tr, struct step_stats *st, double lr_scale) {
    st->lr = lr_at(&tr->recipe->optimizer, tr->recipe->train.steps, tr->opt.step) * lr_scale;
    /* AdamW writes the bf16 working copy as it updates (MTRAIN_FUSED_ADAMW=0:
     * the separate conversion pass instead, for comparison) */
    struct transformer *m = &tr->model;
    const char *e = getenv("MTRAIN_FUSED_ADAMW");
    uint16_t *work = m->weights != m->params && !(e && !strcmp(e, "0")) ? (uint16_t *)m->weights : NULL;
    timeline_phase(TIMELINE_UPDATE);
    int span = timeline_compute_begin("optimizer", -1, -1);
    trainer_settle(tr); /* AdamW rewrites this rank's shard, which a pending gather may still be sending */
    /* the expert bias (state AdamW skips, read from the fp32 master) moves alike on every rank, so before
     * the update: under ZeRO-1 the gathers then carry the moved values */
    if (tr->moe_load) transformer_update_expert_bias(m, tr->moe_load);
    m->weights_fresh = optimizer_step(&tr->opt, m->grads, st->lr, st->grad_norm, work);
    if (tr->opt.defer_gather) gather_deferred(tr);
    embed_params_sync(tr);
    timeline_end(span, NULL);
}

struct step_stats trainer_step(struct trainer *tr, const int32_t *samples, int n) {
    struct step_stats st = trainer_compute(tr, samples, n);
    trainer_update(tr, &st, 1.0);
    return st;
}

double trainer_eval(struct trainer *tr, const int32_t *samples, int n) {
    const struct recipe *r = tr->recipe;
    CHECK(n == tr->micro_batches * r->train.micro_batch);
    transformer_sync_weights(&tr->model);
    double loss = run_schedule(tr, samples, tr->eval_schedule, tr->eval_len, 0.0f, 1);
    comm_all_reduce_sum_f64(&tr->grid->world, &loss, 1);
    return loss / ((double)r->train.global_batch * r->train.seq_len);
}
