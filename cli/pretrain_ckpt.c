/* Checkpoints of `mtrain pretrain` across the process grid: every rank
 * snapshots, DP rank 0 of each (tp, pp) shard writes (in a background thread
 * when checkpoint.async), and world rank 0 commits once all writers are done.
 * Loads are collective so every rank agrees on the outcome. */
#include <string.h>

#include "cli/pretrain.h"
#include "config/common.h"

void ckpt_setup(struct run *run) {
    const struct recipe *r = run->r;
    const struct grid *g = &run->grid;
    if (!r->checkpoint.dir[0]) return;
    struct ckpt_layout L = {.world_rank = g->world_rank, .tp = g->tp, .tp_rank = g->tp_rank, .pp = g->pp,
                            .pp_rank = g->pp_rank, .dp = g->dp, .vpp = run->tr.model.part.nchunks,
                            .writer = g->dp_rank == 0 || (g->edp_rank == 0 && r->model.num_experts > 0),
                            .expert_only = g->dp_rank != 0};
    ckpt_snapshot_init(&run->snap, r, &run->tr.model.table, &L);
}

void finish_save(struct run *run, int block) {
    if (!run->commit_pending) return;
    double t0 = now_seconds();
    /* commit only when no rank's writer is still busy */
    float not_done = block ? 0.0f : (float)!async_saver_finished(&run->saver);
    comm_all_reduce_max(&run->grid.world, &not_done, 1);
    if (not_done != 0) return;
    async_saver_wait(&run->saver);
    comm_barrier(&run->grid.world); /* every shard file is on disk */
    if (run->rank0) checkpoint_commit(&run->snap, run->r->checkpoint.dir);
    comm_barrier(&run->grid.world); /* ... and committed before anyone reads `latest` */
    run->commit_pending = 0;
    event(run, "{\"event\":\"checkpoint_committed\",\"step\":%d,\"write_ms\":%.2f,\"commit_wait_ms\":%.2f}",
          run->snap.state.step, run->saver.write_seconds * 1e3, (now_seconds() - t0) * 1e3);
}

void save_checkpoint(struct run *run) {
    const struct recipe *r = run->r;
    double t0 = now_seconds();
    finish_save(run, 1); /* a second save waits for the first */
    double waited = now_seconds() - t0;
    ckpt_snapshot_take(&run->snap, run->be, run->tr.model.params, &run->tr.opt, &run->st);
    if (run->rank0) checkpoint_prepare(r->checkpoint.dir, run->st.step);
    comm_barrier(&run->grid.world);
    int crash = run->o->inject_crash_in_save == run->st.step;
    run->commit_pending = 1;
    run->saver.write_seconds = 0;
    if (r->checkpoint.async) {
        async_saver_start(&run->saver, &run->snap, r->checkpoint.dir, crash);
    } else {
        double w0 = now_seconds();
        checkpoint_write_rank(&run->snap, r->checkpoint.dir, crash);
        run->saver.write_seconds = now_seconds() - w0;
        finish_save(run, 1);
    }
    double stall = now_seconds() - t0;
    run->saved_step = run->st.step;
    run->consecutive_rewinds = 0;
    event(run, "{\"event\":\"checkpoint\",\"step\":%d,\"async\":%s,\"stall_ms\":%.2f,\"waited_ms\":%.2f}",
          run->st.step, r->checkpoint.async ? "true" : "false", stall * 1e3, waited * 1e3);
    if (run->rank0)
        printf("checkpoint step %d %s (training stalled %.0f ms)\n", run->st.step,
               r->checkpoint.async ? "snapshot taken, writing in background" : "written", stall * 1e3);
}

int load_checkpoint(struct run *run, const char *step_dir, char *err, size_t errlen) {
    struct transformer *m = &run->tr.model;
    size_t n = m->table.total;
    float *host = xmalloc(sizeof(float) * 3 * (n ? n : 1));
    struct train_state st;
    err[0] = 0;
    int rc = checkpoint_load(step_dir, &m->table, host, host + n, host + 2 * n, &st, err, errlen);
    /* the worst outcome on any rank decides for all: -2 (other model) over -1 (damaged) over 0 */
    float worst = (float)-rc;
    comm_all_reduce_max(&run->grid.world, &worst, 1);
    rc = -(int)worst;
    if (rc == 0) {
        m->be->from_host(m->params, host, sizeof(float) * n);
        optimizer_set_moments(&run->tr.opt, host + n, host + 2 * n);
        run->st = st;
        run->tr.opt.step = st.opt_step;
    } else if (!err[0]) {
        snprintf(err, errlen, "%s: another rank could not load its part", step_dir);
    }
    free(host);
    return rc;
}

/* Every rank reports a failure the same way; only ranks that saw it say why. */
static void fail_all(struct run *run, int code, const char *err) {
    if (!strstr(err, "another rank")) fprintf(stderr, "mtrain: error: cannot resume: %s\n", err);
    fflush(stderr);
    parallel_finalize();
    exit(code);
}

const char *resume(struct run *run) {
    const struct recipe *r = run->r;
    const char *how = run->o->resume;
    char err[2048];
    static char path[RECIPE_PATH_MAX + 32];
    if (!strcmp(how, "never")) return NULL;
    if (strcmp(how, "auto")) { /* an explicit step directory: no fallback */
        int rc = load_checkpoint(run, how, err, sizeof err);
        if (rc != 0) fail_all(run, rc == -2 ? EXIT_USAGE : EXIT_RUNTIME, err);
    } else {
        if (!r->checkpoint.dir[0]) return NULL;
        if (run->rank0) checkpoint_clean_partial(r->checkpoint.dir);
        comm_barrier(&run->grid.world);
        int steps[4096], n = checkpoint_list(r->checkpoint.dir, steps, 4096), latest = checkpoint_latest(r->checkpoint.dir);
        int loaded = 0;
        for (int i = 0; i < n && !loaded; i++) {
            if (latest >= 0 && steps[i] > latest) continue; /* committed but `latest` not yet updated: skip */
            checkpoint_step_dir(path, sizeof path, r->checkpoint.dir, steps[i]);
            int rc = load_checkpoint(run, path, err, sizeof err);
            if (rc == -2) fail_all(run, EXIT_USAGE, err);
            if (rc == 0) loaded = 1;
            else if (!strstr(err, "another rank")) warn("%s; falling back to the previous checkpoint", err);
        }
        if (!loaded) {
            if (n > 0) {
                snprintf(err, sizeof err, "no loadable checkpoint in %s", r->checkpoint.dir);
                fail_all(run, EXIT_RUNTIME, err);
            }
            return NULL;
        }
        how = path;
    }
    if (run->rank0)
        printf("resumed from %s at step %d (%lld samples consumed)\n", how, run->st.step,
               (long long)run->st.consumed_samples);
    return how;
}
