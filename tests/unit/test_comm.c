/* The comm layer: every collective and point-to-point call against values
 * computed by hand, on the world group and on a split grid: over MPI on host
 * memory, staged (the CPU backend standing in for a device), and over NCCL
 * on GPU memory where each rank has a GPU (skipped with the reason
 * elsewhere). Run alone (size 1: the no-op paths, and NCCL's group of one)
 * by the unit pass, and under mpiexec -n 4 by tests/integration/comm.sh. */
#include <mpi.h>
#include <string.h>

#include "kernels/ops.h"
#include "parallel/comm_nccl.h"
#include "parallel/grid.h"
#include "tests/unit/check.h"

/* test name + suffix (one at a time) */
static const char *nm(const char *base, const char *sfx) {
    static char buf[96];
    snprintf(buf, sizeof buf, "%s%s", base, sfx);
    return buf;
}

static int ok_all(struct comm *c, int ok) { /* every rank must agree it passed */
    float bad = !ok;
    comm_all_reduce_max(c, &bad, 1);
    return bad == 0;
}

/* Where a pass keeps the buffers it hands the calls: host memory (mem NULL)
 * or a backend's (device) memory, copied in and out around each call. */
static const struct backend *mem;
static void *put(const void *h, size_t bytes) {
    if (!mem) return (void *)h;
    void *d = mem->alloc(bytes);
    mem->from_host(d, h, bytes);
    return d;
}
static void get(void *h, void *d, size_t bytes) { /* copy back and release */
    if (!mem) return;
    mem->to_host(h, d, bytes);
    mem->free(d);
}

/* Every call on w, against values computed by hand; agree (host memory,
 * MPI) collects the verdicts. sfx names the pass. */
static void check_calls(struct comm *w, struct comm *agree, const char *sfx) {
    int n = w->size, r = w->rank, ok;
    float x[8], all[64], out[8];
    void *d, *d2;

    for (int i = 0; i < 3; i++) x[i] = r + i;
    comm_all_reduce_sum(w, d = put(x, sizeof x), 3);
    get(x, d, sizeof x);
    ok = 1;
    for (int i = 0; i < 3; i++) ok &= x[i] == n * (n - 1) / 2.0f + n * i;
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_reduce_sum", sfx), ok, "wrong sums");

    x[0] = (float)r;
    comm_all_reduce_max(w, d = put(x, sizeof x), 1);
    get(x, d, sizeof x);
    ok = ok_all(agree, x[0] == n - 1);
    if (r == 0) TEST_RESULT(nm("comm_all_reduce_max", sfx), ok, "wrong max");

    if (!w->nccl) { /* host memory only, and MPI's */
        double dd = r + 0.5;
        comm_all_reduce_sum_f64(w, &dd, 1);
        ok = ok_all(agree, dd == n * (n - 1) / 2.0 + 0.5 * n);
        if (r == 0) TEST_RESULT(nm("comm_all_reduce_sum_f64", sfx), ok, "wrong sum");
    }

    for (int k = 0; k < n; k++) all[2 * k] = all[2 * k + 1] = (float)(r * 10 + k); /* block k goes to rank k */
    comm_reduce_scatter_sum(w, d = put(all, sizeof all), d2 = put(out, sizeof out), 2);
    get(all, d, sizeof all), get(out, d2, sizeof out);
    float want = 0;
    for (int q = 0; q < n; q++) want += q * 10 + r;
    ok = ok_all(agree, out[0] == want && out[1] == want);
    if (r == 0) TEST_RESULT(nm("comm_reduce_scatter_sum", sfx), ok, "got %g want %g", out[0], want);

    x[0] = (float)r, x[1] = (float)(-r);
    comm_all_gather(w, d = put(x, sizeof x), d2 = put(all, sizeof all), 2);
    get(x, d, sizeof x), get(all, d2, sizeof all);
    ok = 1;
    for (int k = 0; k < n; k++) ok &= all[2 * k] == k && all[2 * k + 1] == -k;
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_gather", sfx), ok, "wrong blocks");

    int v = r == n - 1 ? 42 : 0;
    comm_broadcast(w, d = put(&v, sizeof v), sizeof v, n - 1);
    get(&v, d, sizeof v);
    ok = ok_all(agree, v == 42);
    if (r == 0) TEST_RESULT(nm("comm_broadcast", sfx), ok, "got %d", v);

    for (int k = 0; k < n; k++) all[k] = (float)(r * 100 + k); /* element k goes to rank k */
    comm_all_to_all(w, d = put(all, sizeof all), d2 = put(out, sizeof out), 1);
    get(all, d, sizeof all), get(out, d2, sizeof out);
    /* out is only 8 long: check with n <= 8 */
    ok = 1;
    for (int k = 0; k < n && k < 8; k++) ok &= out[k] == k * 100 + r;
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_to_all", sfx), ok, "wrong exchange");

    /* variable sizes: rank r sends k+1 copies of r to rank k */
    int sc[8], rc[8], ns = 0, nr = 0;
    for (int k = 0; k < n && k < 8; k++) {
        sc[k] = k + 1, rc[k] = r + 1;
        for (int j = 0; j <= k; j++) all[ns++] = (float)r;
        nr += rc[k];
    }
    float got_v[64];
    for (int i = 0; i < 64; i++) got_v[i] = -1;
    if (n <= 8) {
        comm_all_to_all_v(w, d = put(all, sizeof all), sc, d2 = put(got_v, sizeof got_v), rc);
        get(all, d, sizeof all), get(got_v, d2, sizeof got_v);
    }
    ok = 1;
    for (int k = 0, o = 0; k < n && n <= 8; k++)
        for (int j = 0; j < rc[k]; j++) ok &= got_v[o++] == (float)k;
    ok = ok_all(agree, ok && (n > 8 || got_v[nr] == -1));
    if (r == 0) TEST_RESULT(nm("comm_all_to_all_v", sfx), ok, "wrong exchange");

    /* the same begun, with a blocking all-reduce issued while it is under way (dualpipev's pairs), then
     * completed: the same rows; nothing written before the wait but what it delivers */
    float back[64], one[1] = {1.0f};
    for (int i = 0; i < 64; i++) back[i] = -1;
    if (n <= 8) {
        void *db = put(back, sizeof back), *d1 = put(one, sizeof one);
        int ticket = comm_all_to_all_v_start(w, d = put(all, sizeof all), sc, db, rc);
        comm_all_reduce_sum(w, d1, 1);
        comm_wait_ticket(w, ticket);
        get(all, d, sizeof all), get(back, db, sizeof back), get(one, d1, sizeof one);
    }
    ok = one[0] == (float)n || n > 8;
    for (int i = 0; i < 64 && n <= 8; i++) ok &= back[i] == got_v[i];
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_all_to_all_v_start", sfx), ok, "begun all-to-all differs from the blocking one");

    /* non-blocking: an all-reduce, and a sum onto the last rank (the others' buffers unchanged), moved
     * along by comm_progress (the requests it finds complete are waited for again at once) */
    for (int i = 0; i < 3; i++) x[i] = r + i, out[i] = 2 * r + i;
    d = put(x, sizeof x), d2 = put(out, sizeof out);
    comm_all_reduce_sum_start(w, d, 3);
    comm_reduce_sum_start(w, d2, 3, n - 1);
    for (int i = 0; i < 100; i++) comm_progress(w);
    comm_wait_all(w);
    get(x, d, sizeof x), get(out, d2, sizeof out);
    ok = 1;
    for (int i = 0; i < 3; i++) {
        ok &= x[i] == n * (n - 1) / 2.0f + n * i;
        ok &= r == n - 1 ? out[i] == n * (n - 1) + n * i : out[i] == 2 * r + i;
    }
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_started_reductions", sfx), ok, "wrong sums after comm_wait_all");

    /* a larger in-place sum onto a root other than 0 (4096 floats: MPICH 4.0.2's blocking in-place
     * MPI_Reduce crashes there, parallel/comm_mpi.c) */
    {
        enum { BIG = 4096 };
        float *big = malloc(sizeof(float) * BIG);
        for (int i = 0; i < BIG; i++) big[i] = (float)(r + i % 5);
        d = put(big, sizeof(float) * BIG);
        comm_reduce_sum_start(w, d, BIG, n - 1);
        comm_wait_all(w);
        get(big, d, sizeof(float) * BIG);
        ok = 1;
        for (int i = 0; i < BIG && r == n - 1; i++) ok &= big[i] == n * (n - 1) / 2.0f + n * (i % 5);
        free(big);
        ok = ok_all(agree, ok);
        if (r == 0) TEST_RESULT(nm("comm_reduce_large_onto_last", sfx), ok, "wrong sums");
    }

    /* uneven parts onto their owners (ZeRO-1's shards of a bucket, etp's rows): rank k's part k+2 floats,
     * rank 1's none, laid out in reverse rank order with a gap; the gap and the others' parts unchanged */
    if (n <= 8) {
        float a[64];
        size_t lo[8], cnt[8], at = 1;
        for (int k = n - 1; k >= 0; k--) cnt[k] = k == 1 ? 0 : (size_t)k + 2, lo[k] = at, at += cnt[k];
        for (int i = 0; i < 64; i++) a[i] = (float)(r * 100 + i);
        void *da = put(a, sizeof a);
        comm_reduce_to_owners_start(w, da, lo, cnt);
        comm_wait_all(w);
        get(a, da, sizeof a);
        ok = 1;
        for (int i = 0; i < 64; i++) {
            int mine = (size_t)i >= lo[r] && (size_t)i < lo[r] + cnt[r];
            ok &= a[i] == (mine ? 100.0f * n * (n - 1) / 2 + (float)n * i : (float)(r * 100 + i));
        }
        ok = ok_all(agree, ok);
        if (r == 0) TEST_RESULT(nm("comm_reduce_to_owners", sfx), ok, "wrong sums, or a part not its owner's changed");
    }

    /* two in-place gathers of uneven pieces (rank k owns k+1 floats, rank 1 none), started together:
     * waiting for the second ticket completes both */
    if (n <= 8) {
        float a[2][64];
        int cnt[8], dsp[8], tot = 0;
        for (int k = 0; k < n; k++) cnt[k] = k == 1 ? 0 : k + 1, dsp[k] = tot, tot += cnt[k];
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 64; i++) a[s][i] = -1;
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < cnt[r]; j++) a[s][dsp[r] + j] = (float)(100 * s + 10 * r + j);
        void *da = put(a[0], sizeof a[0]), *db = put(a[1], sizeof a[1]);
        int t1 = comm_all_gather_v_start(w, da, sizeof(float), cnt, dsp);
        for (int i = 0; i < 100; i++) comm_progress(w); /* the first may complete here: its wait still frees it */
        int t2 = comm_all_gather_v_start(w, db, sizeof(float), cnt, dsp);
        comm_wait_ticket(w, t2);
        get(a[0], da, sizeof a[0]), get(a[1], db, sizeof a[1]);
        ok = t1 > 0 && t2 > t1;
        for (int s = 0; s < 2; s++) {
            for (int k = 0; k < n; k++)
                for (int j = 0; j < cnt[k]; j++) ok &= a[s][dsp[k] + j] == (float)(100 * s + 10 * k + j);
            ok &= a[s][tot] == -1;
        }
        ok = ok_all(agree, ok);
        if (r == 0) TEST_RESULT(nm("comm_all_gather_v_tickets", sfx), ok, "wrong pieces after comm_wait_ticket");
    }

    /* the same on 2-byte values (the bf16 working copy), pieces at odd element offsets */
    if (n <= 8) {
        uint16_t h[64];
        int cnt[8], dsp[8], tot = 1;
        for (int k = 0; k < n; k++) cnt[k] = k == 1 ? 0 : k + 2, dsp[k] = tot, tot += cnt[k];
        for (int i = 0; i < 64; i++) h[i] = 0xffff;
        for (int j = 0; j < cnt[r]; j++) h[dsp[r] + j] = (uint16_t)(1000 * r + 7 * j + 1);
        void *dh = put(h, sizeof h);
        comm_wait_ticket(w, comm_all_gather_v_start(w, dh, sizeof(uint16_t), cnt, dsp));
        get(h, dh, sizeof h);
        ok = h[0] == 0xffff && h[tot] == 0xffff;
        for (int k = 0; k < n; k++)
            for (int j = 0; j < cnt[k]; j++) ok &= h[dsp[k] + j] == (uint16_t)(1000 * k + 7 * j + 1);
        ok = ok_all(agree, ok);
        if (r == 0) TEST_RESULT(nm("comm_all_gather_v_2byte", sfx), ok, "wrong 2-byte pieces");
    }

    /* one exchange group around the ring: two messages to the next rank and
     * one to the previous, received in posting order (no tags) */
    float mine[3] = {(float)r, 100.0f + r, 200.0f + r}, got[3] = {-1, -1, -1};
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (n > 1) {
        void *dm[3], *dg[3];
        for (int i = 0; i < 3; i++) dm[i] = put(&mine[i], sizeof(float)), dg[i] = put(&got[i], sizeof(float));
        struct comm_p2p ops[6] = {
            {dg[0], sizeof(float), prev, 1, 0}, {dm[0], sizeof(float), next, 0, 0}, {dm[1], sizeof(float), next, 0, 0},
            {dg[1], sizeof(float), prev, 1, 0}, {dm[2], sizeof(float), prev, 0, 0}, {dg[2], sizeof(float), next, 1, 0},
        };
        uint64_t before = w->bytes;
        comm_exchange(w, ops, 6);
        ok = w->bytes - before == 3 * sizeof(float);
        for (int i = 0; i < 3; i++) get(&mine[i], dm[i], sizeof(float)), get(&got[i], dg[i], sizeof(float));
    } else {
        got[0] = mine[0], got[1] = mine[1], got[2] = mine[2], ok = 1;
    }
    ok = ok_all(agree, ok && got[0] == (float)prev && got[1] == 100.0f + prev && got[2] == 200.0f + next);
    if (r == 0) TEST_RESULT(nm("comm_exchange_ring", sfx), ok, "got %g %g %g", got[0], got[1], got[2]);

    /* tags (MPI: the buffered pipeline schedules): two sends to the next rank, begun in tag order 1, 2,
     * received in the other order, each into its own buffer */
    if (n > 1 && !w->nccl) {
        float v[2] = {10.0f + r, 20.0f + r}, in[2] = {-1, -1};
        void *dv[2], *di[2];
        for (int i = 0; i < 2; i++) dv[i] = put(&v[i], sizeof(float)), di[i] = put(&in[i], sizeof(float));
        int t[2];
        for (int i = 0; i < 2; i++) {
            struct comm_p2p send = {dv[i], sizeof(float), next, 0, 1 + i};
            t[i] = comm_exchange_start(w, &send, 1);
        }
        for (int i = 1; i >= 0; i--) {
            struct comm_p2p recv = {di[i], sizeof(float), prev, 1, 1 + i};
            comm_exchange(w, &recv, 1);
        }
        for (int i = 0; i < 2; i++) comm_wait_ticket(w, t[i]);
        for (int i = 0; i < 2; i++) get(&v[i], dv[i], sizeof(float)), get(&in[i], di[i], sizeof(float));
        ok = ok_all(agree, in[0] == 10.0f + prev && in[1] == 20.0f + prev);
        if (r == 0) TEST_RESULT(nm("comm_exchange_tags", sfx), ok, "got %g %g", in[0], in[1]);
    }
}

/* Every call again at sizes where MPI libraries switch to their large-message
 * algorithms and rendezvous protocols (a million floats a rank): the small
 * checks above run the eager paths only. Values are small integers, so
 * every sum is exact. */
static void check_large(struct comm *w, struct comm *agree, const char *sfx) {
    enum { L = 1 << 20 };
    int n = w->size, r = w->rank, ok;
    float *a = malloc(sizeof(float) * L * (n > 4 ? n : 4)), *b = malloc(sizeof(float) * L * (n > 4 ? n : 4));
    void *d, *d2;
    size_t per = L / n; /* a rank's block */

    for (size_t i = 0; i < L; i++) a[i] = (float)(r + i % 7);
    comm_all_reduce_sum(w, d = put(a, sizeof(float) * L), L);
    get(a, d, sizeof(float) * L);
    ok = 1;
    for (size_t i = 0; i < L; i++) ok &= a[i] == n * (n - 1) / 2.0f + n * (float)(i % 7);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_all_reduce_sum", sfx), ok, "wrong sums");

    for (size_t i = 0; i < per * n; i++) a[i] = (float)(r + i % 5);
    comm_reduce_scatter_sum(w, d = put(a, sizeof(float) * per * n), d2 = put(b, sizeof(float) * per), per);
    get(a, d, sizeof(float) * per * n), get(b, d2, sizeof(float) * per);
    ok = 1;
    for (size_t i = 0; i < per; i++) ok &= b[i] == n * (n - 1) / 2.0f + n * (float)((r * per + i) % 5);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_reduce_scatter_sum", sfx), ok, "wrong block");

    for (size_t i = 0; i < per; i++) a[i] = (float)(r * 3 + i % 3);
    comm_all_gather(w, d = put(a, sizeof(float) * per), d2 = put(b, sizeof(float) * per * n), per);
    get(a, d, sizeof(float) * per), get(b, d2, sizeof(float) * per * n);
    ok = 1;
    for (size_t i = 0; i < per * n; i++) ok &= b[i] == (float)((i / per) * 3 + (i % per) % 3);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_all_gather", sfx), ok, "wrong blocks");

    for (size_t i = 0; i < L; i++) a[i] = r == n - 1 ? (float)(i % 11) : -1.0f;
    comm_broadcast(w, d = put(a, sizeof(float) * L), sizeof(float) * L, n - 1);
    get(a, d, sizeof(float) * L);
    ok = 1;
    for (size_t i = 0; i < L; i++) ok &= a[i] == (float)(i % 11);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_broadcast", sfx), ok, "wrong values");

    /* rank r sends (k + 1) * per / n floats of value r * 10 + k to rank k */
    int sc[64], rc[64];
    size_t so = 0, ro = 0;
    for (int k = 0; k < n && n <= 64; k++) {
        sc[k] = (int)((k + 1) * per / n), rc[k] = (int)((r + 1) * per / n);
        for (int j = 0; j < sc[k]; j++) a[so + j] = (float)(r * 10 + k);
        so += sc[k], ro += rc[k];
    }
    if (n <= 64) {
        comm_all_to_all_v(w, d = put(a, sizeof(float) * so), sc, d2 = put(b, sizeof(float) * ro), rc);
        get(a, d, sizeof(float) * so), get(b, d2, sizeof(float) * ro);
    }
    ok = 1;
    for (int k = 0, o = 0; k < n && n <= 64; k++)
        for (int j = 0; j < rc[k]; j++) ok &= b[o++] == (float)(k * 10 + r);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_all_to_all_v", sfx), ok, "wrong exchange");

    /* started: an all-reduce and a sum onto each rank in turn (ZeRO-1's buckets), then one wait */
    for (size_t i = 0; i < L; i++) a[i] = (float)(r + i % 3), b[i] = (float)(2 * r + i % 4);
    d = put(a, sizeof(float) * L), d2 = put(b, sizeof(float) * L);
    comm_all_reduce_sum_start(w, d, L);
    for (int k = 0; k < n; k++) comm_reduce_sum_start(w, (float *)d2 + k * per, per, k);
    comm_wait_all(w);
    get(a, d, sizeof(float) * L), get(b, d2, sizeof(float) * L);
    ok = 1;
    for (size_t i = 0; i < L; i++) ok &= a[i] == n * (n - 1) / 2.0f + n * (float)(i % 3);
    for (size_t i = r * per; i < (r + 1) * per; i++) ok &= b[i] == n * (float)(n - 1) + n * (float)(i % 4);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_started_reductions", sfx), ok, "wrong sums after comm_wait_all");

    /* an in-place gather of each rank's block (ZeRO-1's parameters) */
    int cnt[64], dsp[64];
    for (int k = 0; k < n && n <= 64; k++) cnt[k] = (int)per, dsp[k] = (int)(k * per);
    for (size_t i = 0; i < per * n; i++) a[i] = i / per == (size_t)r ? (float)(r + i % 9) : -1.0f;
    if (n <= 64) {
        d = put(a, sizeof(float) * per * n);
        comm_wait_ticket(w, comm_all_gather_v_start(w, d, sizeof(float), cnt, dsp));
        get(a, d, sizeof(float) * per * n);
    }
    ok = 1;
    for (size_t i = 0; i < per * n && n <= 64; i++) ok &= a[i] == (float)(i / per + i % 9);
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_all_gather_v", sfx), ok, "wrong pieces");

    /* the pipeline's exchange with large messages: to the next rank and back from the previous, both ways */
    if (n > 1) {
        int next = (r + 1) % n, prev = (r + n - 1) % n;
        for (size_t i = 0; i < L; i++) a[i] = (float)(r * 4 + i % 4), b[i] = -1;
        float *c = malloc(sizeof(float) * L);
        for (size_t i = 0; i < L; i++) c[i] = -1;
        void *da = put(a, sizeof(float) * L), *db = put(b, sizeof(float) * L), *dc = put(c, sizeof(float) * L);
        struct comm_p2p ops[4] = {
            {db, sizeof(float) * L, prev, 1, 0}, {da, sizeof(float) * L, next, 0, 0},
            {da, sizeof(float) * L, prev, 0, 0}, {dc, sizeof(float) * L, next, 1, 0},
        };
        comm_exchange(w, ops, 4);
        get(a, da, sizeof(float) * L), get(b, db, sizeof(float) * L), get(c, dc, sizeof(float) * L);
        ok = 1;
        for (size_t i = 0; i < L; i++) ok &= b[i] == (float)(prev * 4 + i % 4) && c[i] == (float)(next * 4 + i % 4);
        free(c);
    } else {
        ok = 1;
    }
    ok = ok_all(agree, ok);
    if (r == 0) TEST_RESULT(nm("comm_large_exchange", sfx), ok, "wrong messages");
    free(a), free(b);
}

/* The same calls over NCCL on device memory, where every rank of this node
 * has a GPU of its own; skipped with the reason elsewhere. */
static int check_nccl(struct grid *g) {
    char why[320] = "";
    if (!cuda_backend_available()) snprintf(why, sizeof why, "no CUDA device (or no CUDA backend in this build)");
    else nccl_available(why, sizeof why);
    if (cuda_backend_available()) cuda_use_device(g->local_rank);
    int shared = grid_ranks_sharing_gpu(g); /* collective: every rank asks */
    if (!why[0] && shared)
        snprintf(why, sizeof why, "%d ranks on this node share %d GPU%s (NCCL needs one per rank)", g->local_size,
                 cuda_device_count(), cuda_device_count() == 1 ? "" : "s");
    float bad = why[0] != 0;
    comm_all_reduce_max(&g->world, &bad, 1);
    if (bad) {
        if (g->world_rank == 0) printf("SKIP comm_nccl: %s\n", why[0] ? why : "another rank cannot use NCCL");
        return 0;
    }
    struct comm nw = g->world; /* the world's MPI group, with an NCCL communicator of its own */
    nw.host[0] = nw.host[1] = NULL, nw.host_bytes[0] = nw.host_bytes[1] = 0, nw.bytes = 0;
    nw.stage = &cuda_backend;
    comm_nccl_init(&nw);
    mem = &cuda_backend;
    check_calls(&nw, &g->world, "_nccl");
    check_large(&nw, &g->world, "_nccl");
    mem = NULL;
    int ok = ok_all(&g->world, nw.bytes > 0);
    if (g->world_rank == 0) TEST_RESULT("comm_nccl_counts_payload", ok, "no bytes counted");
    comm_nccl_free(&nw);
    comm_free_staging(&nw);
    return 1;
}

/* The grid's groups over NCCL (grid_use_nccl, as a GPU run sets them up):
 * each group of more than one rank gets its own communicator; a sum over
 * it equals MPI's over the same group. */
static void check_nccl_grid(struct grid *g) {
    grid_use_nccl(g, 1, 1);
    struct comm *cs[] = {&g->tp_comm, &g->dp_comm};
    int ok = 1, groups = 0;
    for (int i = 0; i < 2; i++) {
        struct comm *c = cs[i];
        if (c->size < 2) continue;
        groups++;
        float v = (float)(g->world_rank + 1), want = v;
        ok &= c->nccl != NULL;
        MPI_Allreduce(MPI_IN_PLACE, &want, 1, MPI_FLOAT, MPI_SUM, *(MPI_Comm *)c->handle);
        mem = &cuda_backend;
        void *d = put(&v, sizeof v);
        comm_all_reduce_sum(c, d, 1);
        get(&v, d, sizeof v);
        mem = NULL;
        ok &= v == want;
    }
    ok = ok_all(&g->world, ok);
    char name[64];
    snprintf(name, sizeof name, "comm_nccl_grid_groups_tp%d_dp%d", g->tp, g->dp);
    if (g->world_rank == 0 && groups) TEST_RESULT(name, ok, "a group's NCCL sum differs from MPI's");
}

int main(int argc, char **argv) {
    parallel_init(&argc, &argv);
    struct parallel_config layout = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1};
    if (parallel_world_size() % 2 == 0) layout.tp = 2;
    struct grid g;
    grid_create(&g, &layout);
    struct comm *w = &g.world;
    int n = w->size, r = w->rank, ok;
    char name[64];
    float x[8];

    check_calls(w, w, "");
    check_large(w, w, "");
    /* the same through host staging (GPU ranks under parallel.comm mpi), with
     * the CPU backend standing in for device memory */
    w->stage = &cpu_backend;
    mem = &cpu_backend;
    check_calls(w, w, "_staged");
    check_large(w, w, "_staged");
    mem = NULL;
    w->stage = NULL;
    int nccl = check_nccl(&g);

    /* the grid's groups: tp pairs when the world is even */
    x[0] = 1;
    comm_all_reduce_sum(&g.tp_comm, x, 1);
    ok = ok_all(w, x[0] == g.tp && g.tp_comm.size == g.tp && g.dp_comm.size == n / g.tp);
    snprintf(name, sizeof name, "comm_grid_groups_tp%d_dp%d", g.tp, g.dp);
    if (r == 0) TEST_RESULT(name, ok, "group sizes or sums wrong");
    ok = ok_all(w, w->bytes > 0 || n == 1);
    if (r == 0) TEST_RESULT("comm_counts_payload", ok, "no bytes counted");
    if (nccl) check_nccl_grid(&g); /* last: the grid's groups then run over NCCL */
    comm_barrier(w);
    grid_free(&g);
    parallel_finalize();
    TEST_EXIT();
}
