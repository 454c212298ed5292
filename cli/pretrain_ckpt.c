/* Checkpoints of `mtrain pretrain` across the process grid: every rank
 * snapshots, DP rank 0 of each (tp, pp) shard writes (in a background thread
 * when checkpoint.async), and world rank 0 commits once all writers are done.
 * Loads are collective so every rank agrees on the outcome. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checkpoint/hf_export.h"
#include "checkpoint/weights.h"
#include "cli/pretrain.h"
#include "model/flops.h"
#include "config/common.h"

/* One failure every rank reaches together: ranks that saw it say why (one
 * line each), every rank exits 1. Returns if no rank failed. */
static void fail_if_any(struct run *run, const char *msg) {
    float bad = msg[0] != 0;
    comm_all_reduce_max(&run->grid.world, &bad, 1);
    if (bad == 0) return;
    if (msg[0]) fprintf(stderr, "mtrain: error: %s\n", msg); /* one write: nothing can split the line */
    fflush(NULL);
    trainer_settle(&run->tr); /* no gather in flight at MPI_Finalize */
    parallel_finalize();
    exit(EXIT_RUNTIME);
}

/* Can files be created in dir (made first if create)? A probe file
 * (NAME.tmp.PID, which a later start removes if this one dies) is written
 * and removed. Returns 0, or -1 with the reason in why. */
static int probe_dir(const char *dir, int create, int rank, char *why, size_t n) {
    if (create && mkdir_p(dir) != 0) {
        snprintf(why, n, "cannot create it: %s", strerror(errno));
        return -1;
    }
    char path[RECIPE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/.mtrain-probe-r%d.tmp.%d", dir, rank, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(why, n, "cannot create a file in it: %s", strerror(errno));
        return -1;
    }
    int ok = write(fd, "probe\n", 6) == 6 && fsync(fd) == 0, e = errno;
    if (close(fd) != 0 && ok) ok = 0, e = errno;
    if (unlink(path) != 0 && ok) ok = 0, e = errno;
    if (!ok) {
        snprintf(why, n, "cannot write a file in it: %s", strerror(e));
        unlink(path);
        return -1;
    }
    return 0;
}

/* Before any step: log.dir and checkpoint.dir can be created and written
 * (so an unwritable one is not found at the first save, after training for a
 * while), and leftovers of an interrupted save are removed. */
static void check_dirs(struct run *run, int writer) {
    const struct recipe *r = run->r;
    const char *ck = r->checkpoint.dir;
    char msg[2 * RECIPE_PATH_MAX + 256] = "", why[256];
    if (run->rank0) {
        if (r->log.dir[0] && probe_dir(r->log.dir, 1, 0, why, sizeof why) != 0)
            snprintf(msg, sizeof msg, "log.dir %s: not writable (%s)", r->log.dir, why);
        else if (ck[0] && probe_dir(ck, 1, 0, why, sizeof why) != 0)
            snprintf(msg, sizeof msg, "checkpoint.dir %s: not writable (%s)", ck, why);
        else if (ck[0])
            checkpoint_clean_partial(ck);
    }
    fail_if_any(run, msg);
    if (!ck[0]) return;
    /* every writer (on other nodes too: the directory must be shared) */
    if (!run->rank0 && writer && probe_dir(ck, 0, run->grid.world_rank, why, sizeof why) != 0)
        snprintf(msg, sizeof msg, "checkpoint.dir %s: not writable from rank %d (%s)", ck, run->grid.world_rank, why);
    fail_if_any(run, msg);
}

/* Where this rank sits for checkpoints: DP rank 0 (and CP rank 0) of each
 * (tp, pp) shard writes its dense tensors, and for a MoE model expert-DP rank 0 its
 * experts (each set once: parallel/grid.h). */
static struct ckpt_layout layout_of(const struct run *run) {
    const struct grid *g = &run->grid;
    int experts = g->edp_rank == 0 && run->r->model.num_experts > 0;
    int dense = g->dp_rank == 0 && g->cp_rank == 0; /* cp peers hold the same parameters */
    return (struct ckpt_layout){.world_rank = g->world_rank, .tp = g->tp, .tp_rank = g->tp_rank, .pp = g->pp,
                                .pp_rank = g->pp_rank, .dp = g->dp, .vpp = run->tr.model.part.nchunks,
                                .writer = dense || experts, .expert_only = !dense, .no_experts = !experts};
}

void ckpt_setup(struct run *run) {
    const struct recipe *r = run->r;
    struct ckpt_layout L = layout_of(run);
    checkpoint_set_warnings(run->rank0);
    check_dirs(run, L.writer);
    if (!r->checkpoint.dir[0]) return;
    ckpt_snapshot_init(&run->snap, r, &run->tr.model.table, &L);
}

/* LOG_DIR/model.recipe.yaml: the resolved recipe beside the final weights, so
 * `mtrain generate` / `mtrain eval` know the model they hold. */
static void save_final_recipe(const struct recipe *r) {
    char path[RECIPE_PATH_MAX + 32], *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f);
    recipe_print(r, f);
    CHECK(fclose(f) == 0);
    snprintf(path, sizeof path, "%s/model.recipe.yaml", r->log.dir);
    write_file_atomic(path, text, len);
    free(text);
}

void check_final_space(const struct run *run) {
    const struct recipe *r = run->r;
    if (!run->rank0) return;
    /* model.safetensors in fp32; several ranks first write a scratch checkpoint beside it (weights and moments) */
    double gib = 1024.0 * 1024 * 1024, need = 4.0 * model_param_count(&r->model) * (run->grid.world_size > 1 ? 4 : 1);
    struct statvfs v;
    struct rlimit lim;
    double free_b = statvfs(r->log.dir, &v) == 0 ? (double)v.f_bavail * v.f_frsize : -1;
    double limit = getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? (double)lim.rlim_cur : -1;
    char why[160];
    if (free_b >= 0 && free_b < need) snprintf(why, sizeof why, "only %.2f GiB are free there", free_b / gib);
    else if (limit >= 0 && limit < need) snprintf(why, sizeof why, "the file size limit (ulimit -f) is %.2f GiB", limit / gib);
    else return;
    warn("%s: the final weights need about %.2f GiB but %s: %s", r->log.dir, need / gib, why,
         r->checkpoint.dir[0] ? "if their write fails, the last checkpoint is the way back (mtrain convert --hf)"
                              : "without checkpoint.dir a failed write loses the training; free space, choose another "
                                "log.dir, or set checkpoint.dir");
}

void save_final_weights(struct run *run, char *path, size_t n) {
    const struct recipe *r = run->r;
    snprintf(path, n, "%s/model.safetensors", r->log.dir);
    if (run->rank0) save_final_recipe(r);
    if (run->grid.world_size == 1) {
        weights_save(run->be, run->tr.model.params, &run->tr.model.table, path);
        return;
    }
    /* several ranks: each writes its shard of a scratch checkpoint, rank 0
     * assembles the whole tensors (any layout) and removes the scratch; with
     * checkpoints on, their host snapshot is reused (no second copy) */
    char dir[RECIPE_PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/final-weights.tmp", r->log.dir);
    struct ckpt_layout L = layout_of(run);
    struct ckpt_snapshot local, *sp = &run->snap;
    finish_save(run, 1); /* the snapshot is free once its save is committed */
    if (!r->checkpoint.dir[0]) ckpt_snapshot_init(sp = &local, r, &run->tr.model.table, &L);
    trainer_settle(&run->tr);
    ckpt_snapshot_take(sp, &run->tr.model.master, &run->tr.opt, &run->st);
    if (run->rank0) checkpoint_prepare(dir, run->st.step);
    comm_barrier(&run->grid.world);
    checkpoint_write_rank(sp, dir, 0);
    comm_barrier(&run->grid.world);
    if (run->rank0) {
        checkpoint_commit(sp, dir);
        char step_dir[RECIPE_PATH_MAX + 96], err[4096];
        checkpoint_step_dir(step_dir, sizeof step_dir, dir, run->st.step);
        if (checkpoint_export_weights(step_dir, path, err, sizeof err) != 0) die("final weights: %s", err);
        checkpoint_remove_step(dir, run->st.step);
    }
    comm_barrier(&run->grid.world);
    if (sp == &local) ckpt_snapshot_free(&local);
}

void finish_save(struct run *run, int block) {
    if (!run->commit_pending) return;
    double t0 = now_seconds();
    /* commit only when no rank's writer is still busy */
    float not_done = block ? 0.0f : (float)!async_saver_finished(&run->saver);
    comm_all_reduce_max(&run->grid.world, &not_done, 1);
    if (not_done != 0) return;
    /* a failed write (any rank) ends the run: one line from each rank that
     * failed, printed here on the main thread, never by the writer thread */
    int failed = async_saver_join(&run->saver, NULL) != 0;
    run->commit_pending = 0;
    fail_if_any(run, failed ? run->saver.err : "");
    comm_barrier(&run->grid.world); /* every shard file is on disk */
    if (run->rank0) {
        /* logged (and flushed) before the commit: the job may be torn down at
         * any moment once a rank has died, and a committed checkpoint the
         * metrics do not record would make the rerun's log.dir claim, which
         * resumes only from recorded ones, refuse it. Killed in between, the
         * event names a step that did not commit; the rerun resumes from an
         * older one and trims the metrics after it, this line with them. */
        event(run, "{\"event\":\"checkpoint_committed\",\"step\":%d,\"write_ms\":%.2f,\"commit_wait_ms\":%.2f}",
              run->snap.state.step, run->saver.write_seconds * 1e3, (now_seconds() - t0) * 1e3);
        checkpoint_commit(&run->snap, run->r->checkpoint.dir);
    }
    comm_barrier(&run->grid.world); /* ... and committed before anyone reads `latest` */
}

void save_checkpoint(struct run *run) {
    const struct recipe *r = run->r;
    double t0 = now_seconds();
    finish_save(run, 1); /* a second save waits for the first */
    double waited = now_seconds() - t0;
    trainer_settle(&run->tr);
    ckpt_snapshot_take(&run->snap, &run->tr.model.master, &run->tr.opt, &run->st);
    ckpt_snapshot_set_fp8(&run->snap, run->tr.model.fp8_hist);
    if (run->rank0) checkpoint_prepare(r->checkpoint.dir, run->st.step);
    comm_barrier(&run->grid.world);
    int crash = run->o->inject_crash_in_save == run->st.step;
    run->commit_pending = 1;
    run->saver.write_seconds = 0;
    if (r->checkpoint.async) {
        async_saver_start(&run->saver, &run->snap, r->checkpoint.dir, crash);
    } else {
        double w0 = now_seconds();
        run->saver.failed = checkpoint_write_rank_checked(&run->snap, r->checkpoint.dir, crash, run->saver.err,
                                                          sizeof run->saver.err) != 0;
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
    trainer_settle(&run->tr); /* no gather may still be writing the parameters */
    float *host = xmalloc(sizeof(float) * 3 * (n ? n : 1));
    struct train_state st;
    err[0] = 0;
    int rc = checkpoint_load(step_dir, &m->table, host, host + n, host + 2 * n, &st, err, errlen);
    /* delayed FP8 scaling continues from the saved amaxes (none saved: from scratch) */
    if (rc == 0 && m->fp8_hist) rc = checkpoint_load_fp8_history(step_dir, m->fp8_hist, err, errlen);
    /* the worst outcome on any rank decides for all: -2 (other model) over -1 (damaged) over 0 */
    float worst = (float)-rc;
    comm_all_reduce_max(&run->grid.world, &worst, 1);
    rc = -(int)worst;
    if (rc == 0) {
        master_put_all(&m->master, host);
        transformer_params_changed(m);
        optimizer_set_moments(&run->tr.opt, host + n, host + 2 * n);
        run->st = st;
        run->tr.opt.step = st.opt_step;
    } else if (!err[0]) {
        snprintf(err, errlen, "%s: another rank could not load its part", step_dir);
    }
    free(host);
    return rc;
}

/* Should this rank print a load error? Only ranks that saw it, and of a
 * manifest problem (every rank reads the same manifest) only rank 0. */
static int says_why(const struct run *run, const char *err) {
    return !strstr(err, "another rank") && (run->rank0 || !strstr(err, "/manifest.json:"));
}

/* Every rank reports a failure the same way; only ranks that saw it say why. */
static void fail_all(struct run *run, int code, const char *err) {
    if (says_why(run, err)) fprintf(stderr, "mtrain: error: cannot resume: %s\n", err);
    fflush(stderr);
    parallel_finalize();
    exit(code);
}

/* Auto-resume: what `latest` says, against the newest committed step (n > 0:
 * steps[0]). The newest committed step is taken whatever `latest` says (a
 * crash between the rename and the update of `latest`, a damaged or stale
 * `latest`): warn when they differ. */
static void check_latest(const char *dir, const int *steps, int n) {
    int latest = checkpoint_latest(dir);
    char path[RECIPE_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/latest", dir);
    if (n > 0 && latest == steps[0]) return;
    if (n == 0) {
        if (latest >= 0) warn("%s names step-%09d but %s holds no committed checkpoint; starting fresh", path, latest, dir);
        return;
    }
    if (latest < 0)
        warn("%s is %s; resuming from the newest committed checkpoint, step-%09d", path,
             path_exists(path) ? "unreadable or garbled" : "missing", steps[0]);
    else
        warn("%s names step-%09d but the newest committed checkpoint is step-%09d; resuming from the newest that "
             "verifies", path, latest, steps[0]);
}

/* The dataset sampler's version decides which samples the saved position
 * counts (docs/data.md): refuse to continue another version's order. A
 * manifest whose recipe has no data.sampler_version predates version 2. */
static void check_sampler_version(struct run *run, const char *step_dir) {
    struct train_state st;
    char *text = NULL, err[4096];
    if (checkpoint_read_manifest(step_dir, &st, &text, err, sizeof err) != 0) fail_all(run, EXIT_RUNTIME, err);
    const char *at = strstr(text, "\n  sampler_version: ");
    int saved = at ? atoi(at + strlen("\n  sampler_version: ")) : 1, now = run->r->data.sampler_version;
    free(text);
    if (saved == now) return;
    snprintf(err, sizeof err, "%s/manifest.json: saved with data.sampler_version %d (%s) but this run samples with version %d: "
             "resume with --set data.sampler_version=%d to continue its data order, or start a new run "
             "(--resume never)", step_dir, saved, saved == 1 ? "Fisher-Yates tables, mtrain before 2026-11-22" :
             "a keyed Feistel permutation", now, saved);
    fail_all(run, EXIT_USAGE, err);
}

/* The newest committed step under root that loads (older ones on damage,
 * with a warning); NULL when root has none. */
static const char *resume_newest(struct run *run, const char *root, char *path, size_t n) {
    char err[8448];
    int steps[4096], count = checkpoint_list(root, steps, 4096);
    if (run->rank0) check_latest(root, steps, count);
    for (int i = 0; i < count; i++) {
        checkpoint_step_dir(path, n, root, steps[i]);
        int rc = load_checkpoint(run, path, err, sizeof err);
        if (rc == -2) fail_all(run, EXIT_USAGE, err);
        if (rc == 0) return path;
        if (says_why(run, err)) warn("%s; falling back to the previous checkpoint", err);
    }
    if (count > 0) {
        snprintf(err, sizeof err, "no loadable checkpoint in %s", root);
        fail_all(run, EXIT_RUNTIME, err);
    }
    return NULL;
}

/* The keys that give the saved data position its meaning: resuming with
 * another value would silently read other samples. Refused (exit 2, naming
 * each key) unless --allow-data-change. */
static void check_data_semantics(struct run *run, const char *step_dir) {
    if (run->o->allow_data_change) return;
    static struct recipe saved;
    char err[8192];
    int rc, n = 0;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, sizeof err, &rc);
    if (!rd || ckpt_reader_load_recipe(rd, &saved, err, sizeof err) != 0) {
        ckpt_reader_close(rd);
        fail_all(run, EXIT_RUNTIME, err);
    }
    ckpt_reader_close(rd);
    const struct recipe *r = run->r;
    n = snprintf(err, sizeof err, "%s/manifest.json: this run changes what the saved data position means:", step_dir);
#define DIFF_INT(key, a, b)                                                                                  \
    if ((long long)(a) != (long long)(b) && n < (int)sizeof err - 160)                                      \
        n += snprintf(err + n, sizeof err - n, " %s %lld (checkpoint %lld);", key, (long long)(b), (long long)(a));
    DIFF_INT("train.seq_len", saved.train.seq_len, r->train.seq_len)
    DIFF_INT("train.global_batch", saved.train.global_batch, r->train.global_batch)
    DIFF_INT("train.micro_batch", saved.train.micro_batch, r->train.micro_batch)
    DIFF_INT("train.seed", saved.train.seed, r->train.seed)
    DIFF_INT("model.vocab_size", saved.model.vocab_size, r->model.vocab_size)
#undef DIFF_INT
    int blend_same = saved.data.blend.n == r->data.blend.n;
    for (int i = 0; blend_same && i < r->data.blend.n; i++)
        blend_same = !strcmp(saved.data.blend.e[i].path, r->data.blend.e[i].path) &&
                     saved.data.blend.e[i].weight == r->data.blend.e[i].weight;
    if (strcmp(saved.data.path, r->data.path) && n < (int)sizeof err - 160)
        n += snprintf(err + n, sizeof err - n, " data.path %.60s (checkpoint %.60s);", r->data.path, saved.data.path);
    if (!blend_same && n < (int)sizeof err - 160) n += snprintf(err + n, sizeof err - n, " data.blend differs;");
    if (saved.data.valid_fraction != r->data.valid_fraction && n < (int)sizeof err - 160)
        n += snprintf(err + n, sizeof err - n, " data.valid_fraction %g (checkpoint %g);", r->data.valid_fraction,
                      saved.data.valid_fraction);
    if (err[n - 1] == ':') return; /* nothing differs */
    snprintf(err + n - 1, sizeof err - n + 1, ". Resume with the checkpoint's values, or pass --allow-data-change to "
             "continue anyway");
    fail_all(run, EXIT_USAGE, err);
}

/* The model section of r as "  key: value" lines (recipe_print's), in memory. */
static char *model_lines(const struct recipe *r) {
    char *text = NULL, *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) die("open_memstream: out of memory");
    recipe_print(r, f);
    if (fclose(f) != 0) die("open_memstream: out of memory");
    const char *at = strstr(text, "model:\n"), *end = at ? strstr(at, "\n\n") : NULL;
    out = xstrdup(at ? at + strlen("model:\n") : "");
    if (at && end) out[end - at - strlen("model:\n") + 1] = 0;
    free(text);
    return out;
}

/* The value of key in model_lines text (a pointer to its line's value, up to the newline). */
static const char *model_value(const char *lines, const char *key, int *len) {
    char probe[128];
    snprintf(probe, sizeof probe, "  %s: ", key);
    const char *at = strstr(lines, probe);
    if (!at) return *len = 0, "";
    at += strlen(probe);
    const char *nl = strchr(at, '\n');
    *len = nl ? (int)(nl - at) : (int)strlen(at);
    return at;
}

/* Every model key that changes what the network computes must be the
 * checkpoint's: tensors of the same shape can mean another model (heads,
 * routing, norms), and a shallower recipe would drop the extra layers in
 * silence. Keys that only start a run (init_std, init_from) or size buffers
 * (max_seq_len, moe_rows_headroom) may differ. Refused with exit 2, naming
 * each key. */
static void check_model_semantics(struct run *run, const char *step_dir) {
    static struct recipe saved;
    static const char *free_keys[] = {"init_std", "init_from", "max_seq_len", "moe_rows_headroom", NULL};
    char err[8192];
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, sizeof err, &rc);
    if (!rd || ckpt_reader_load_recipe(rd, &saved, err, sizeof err) != 0) {
        ckpt_reader_close(rd);
        fail_all(run, EXIT_RUNTIME, err);
    }
    ckpt_reader_close(rd);
    char *mine = model_lines(run->r), *theirs = model_lines(&saved);
    int n = snprintf(err, sizeof err, "%s/manifest.json: the checkpoint holds another model:", step_dir), differs = 0;
    for (const char *line = mine; *line;) {
        const char *colon = strstr(line, ": "), *nl = strchr(line, '\n');
        if (!colon || !nl) break;
        char key[96];
        snprintf(key, sizeof key, "%.*s", (int)(colon - line - 2 > 95 ? 95 : colon - line - 2), line + 2);
        int free_key = 0, la, lb;
        for (int i = 0; free_keys[i]; i++) free_key |= !strcmp(key, free_keys[i]);
        const char *a = model_value(mine, key, &la), *b = model_value(theirs, key, &lb);
        if (!free_key && (la != lb || memcmp(a, b, la)) && n < (int)sizeof err - 200) {
            n += snprintf(err + n, sizeof err - n, " model.%s %.*s (checkpoint %.*s);", key, la > 60 ? 60 : la, a,
                          lb > 60 ? 60 : lb, b);
            differs = 1;
        }
        line = nl + 1;
    }
    free(mine), free(theirs);
    if (!differs) return;
    snprintf(err + n - 1, sizeof err - n + 1, ". Resume with the checkpoint's model, or start a new run from its "
             "weights with model.init_from (a safetensors export) and --resume never");
    fail_all(run, EXIT_USAGE, err);
}

const char *resume(struct run *run) {
    const struct recipe *r = run->r;
    const char *how = run->o->resume;
    char err[8448], probe[RECIPE_PATH_MAX + 32];
    static char path[RECIPE_PATH_MAX + 32];
    if (!strcmp(how, "never")) return NULL;
    if (!strcmp(how, "auto")) {
        /* leftovers of interrupted saves were removed by ckpt_setup */
        if (!r->checkpoint.dir[0] || !(how = resume_newest(run, r->checkpoint.dir, path, sizeof path))) return NULL;
    } else if (snprintf(probe, sizeof probe, "%s/manifest.json", how), path_exists(probe)) {
        int rc = load_checkpoint(run, how, err, sizeof err); /* an explicit step directory: no fallback */
        if (rc != 0) fail_all(run, rc == -2 ? EXIT_USAGE : EXIT_RUNTIME, err);
    } else {
        /* a checkpoint root: its newest committed step */
        const char *given = how;
        if (!(how = resume_newest(run, given, path, sizeof path))) {
            snprintf(err, sizeof err, "--resume %s: %s; expected a checkpoint step directory (with manifest.json), a "
                     "checkpoint directory holding step-NNNNNNNNN directories, auto or never", given,
                     path_exists(given) ? "no committed checkpoint in it" : "no such directory");
            fail_all(run, EXIT_USAGE, err);
        }
    }
    check_sampler_version(run, how);
    check_model_semantics(run, how);
    check_data_semantics(run, how);
    if (run->rank0)
        printf("resumed from %s at step %d (%lld samples consumed)\n", how, run->st.step,
               (long long)run->st.consumed_samples);
    return how;
}
