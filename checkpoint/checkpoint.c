#define _GNU_SOURCE
#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint/safetensors.h"
#include "config/common.h"

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static const char *const section_prefix[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
static const char *const shard_names[] = {"replicated", "tp_rows", "tp_cols"};

void ckpt_snapshot_init(struct ckpt_snapshot *s, const struct recipe *r, const struct param_table *t,
                        const struct ckpt_layout *layout) {
    memset(s, 0, sizeof *s);
    s->recipe = r;
    s->table = t;
    s->layout = *layout;
    /* only a writer reads it: the others take part in gathering the shards and keep nothing (12 bytes per
     * local parameter of host memory: 48 GB on each rank of Llama 3 8B at tp 2) */
    s->host = layout->writer ? xmalloc(sizeof(float) * 3 * (t->total ? t->total : 1)) : NULL;
}

void ckpt_snapshot_free(struct ckpt_snapshot *s) {
    free(s->host);
    json_decref(s->fp8);
}

void ckpt_snapshot_take(struct ckpt_snapshot *s, struct master *ms, struct optimizer *opt,
                        const struct train_state *st) {
    size_t n = s->table->total;
    master_to_host(ms, s->host);
    optimizer_get_moments(opt, s->host ? s->host + n : NULL, s->host ? s->host + 2 * n : NULL);
    s->state = *st;
}

void checkpoint_step_dir(char *out, size_t n, const char *dir, int step) {
    snprintf(out, n, "%s/step-%09d", dir, step);
}

static void tmp_step_dir(char *out, size_t n, const char *dir, int step) {
    snprintf(out, n, "%s/step-%09d.tmp-save", dir, step);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) die("cannot open directory %s: %s", path, strerror(errno));
    if (fsync(fd) != 0) die("cannot fsync %s: %s", path, strerror(errno));
    close(fd);
}

/* Remove a step directory (files only). manifest.json goes first, so an
 * interrupted removal never leaves a directory that looks committed. */
static void remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[4200];
    snprintf(p, sizeof p, "%s/manifest.json", path);
    if (unlink(p) != 0 && errno != ENOENT) warn("cannot remove %s: %s", p, strerror(errno));
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (unlink(p) != 0) warn("cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(path) != 0) warn("cannot remove %s: %s", path, strerror(errno));
}

void checkpoint_remove_step(const char *dir, int step) {
    char path[4400];
    checkpoint_step_dir(path, sizeof path, dir, step);
    remove_dir(path);
    snprintf(path, sizeof path, "%s/latest", dir);
    if (unlink(path) != 0 && errno != ENOENT) warn("cannot remove %s: %s", path, strerror(errno));
    if (rmdir(dir) != 0) warn("cannot remove %s: %s", dir, strerror(errno));
}

static char *recipe_text(const struct recipe *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f);
    recipe_print(r, f);
    CHECK(fclose(f) == 0);
    return buf;
}

void checkpoint_prepare(const char *dir, int step) {
    char tmp[4200];
    if (mkdir_p(dir) != 0) die("cannot create checkpoint.dir %s: %s", dir, strerror(errno));
    tmp_step_dir(tmp, sizeof tmp, dir, step);
    remove_dir(tmp);
    if (mkdir(tmp, 0755) != 0) die("cannot create %s: %s", tmp, strerror(errno));
}

static json_t *tensor_json(const struct param_info *p, const char *name, const char *file, int tp_rank, int tp,
                           uint64_t hash) {
    json_t *shape = json_array(), *local = json_array();
    for (int d = 0; d < p->ndim; d++) {
        json_array_append_new(shape, json_integer(p->shape[d]));
        json_array_append_new(local, json_integer(p->local_shape[d]));
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    json_t *t = json_pack("{s:s, s:o, s:o, s:s, s:i, s:i, s:i, s:i, s:s, s:s}", "name", name, "shape", shape,
                          "local_shape", local, "shard", shard_names[p->shard], "parts", p->parts, "part", p->part,
                          "tp_rank", tp_rank, "tp", tp, "file", file, "xxh3", hex);
    CHECK(t);
    return t;
}

/* Supplies the data of tensor p, section sec (0 params, 1, 2 moments);
 * NULL on failure (with the reason in the source's own error buffer). */
typedef const float *(*shard_source)(void *ctx, int sec, const struct param_info *p);

/* An output file written as PATH.tmp.PID and renamed into place on close,
 * that reports I/O errors instead of dying: the async writer thread must not
 * print or exit (the main thread reports a failed save, in one line). */
struct out_file {
    FILE *f;
    char tmp[4480];
    const char *path;
    int err_no; /* first error (0: none) */
};

static int out_open(struct out_file *o, const char *path, char *err, size_t errlen) {
    o->path = path;
    o->err_no = 0;
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%d", path, (int)getpid());
    o->f = fopen(o->tmp, "wb");
    if (!o->f) {
        snprintf(err, errlen, "cannot create %s: %s", o->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

static void out_write(struct out_file *o, const void *buf, size_t n) {
    if (o->err_no || !n) return;
    if (fwrite(buf, 1, n, o->f) != n) o->err_no = errno ? errno : EIO;
}

/* Flush, fsync, close and rename; on any failure remove the temporary file. */
static int out_close(struct out_file *o, char *err, size_t errlen) {
    if (!o->err_no && (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0)) o->err_no = errno ? errno : EIO;
    if (fclose(o->f) != 0 && !o->err_no) o->err_no = errno ? errno : EIO;
    o->f = NULL;
    if (o->err_no) {
        snprintf(err, errlen, "cannot write %s: %s", o->tmp, strerror(o->err_no));
        unlink(o->tmp);
        return -1;
    }
    if (rename(o->tmp, o->path) != 0) {
        snprintf(err, errlen, "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
        unlink(o->tmp);
        return -1;
    }
    return 0;
}

static int write_atomic_checked(const char *path, const void *buf, size_t n, char *err, size_t errlen) {
    struct out_file o;
    if (out_open(&o, path, err, errlen) != 0) return -1;
    out_write(&o, buf, n);
    return out_close(&o, err, errlen);
}

/* The safetensors header of st_writer_open (checkpoint/safetensors.c):
 * 8-byte little-endian length, then the JSON padded with spaces to 8 bytes. */
static char *st_header(const struct st_tensor *ts, int n, const char *step_text, size_t *len_out) {
    json_t *root = json_object(), *meta = json_pack("{s:s, s:s}", "format", "pt", "mtrain_step", step_text);
    CHECK(root && meta);
    CHECK(json_object_set_new(root, "__metadata__", meta) == 0);
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        CHECK(shape);
        for (int d = 0; d < ts[i].ndim; d++) CHECK(json_array_append_new(shape, json_integer(ts[i].shape[d])) == 0);
        json_t *t = json_pack("{s:s, s:o, s:[I,I]}", "dtype", ts[i].dtype, "shape", shape, "data_offsets",
                              (json_int_t)offset, (json_int_t)(offset + ts[i].nbytes));
        CHECK(t && json_object_set_new(root, ts[i].name, t) == 0);
        offset += ts[i].nbytes;
    }
    char *json = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK(json);
    json_decref(root);
    size_t hlen = strlen(json), padded = (hlen + 7) / 8 * 8;
    char *h = xmalloc(8 + padded);
    for (int i = 0; i < 8; i++) h[i] = (char)(uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, json, hlen);
    memset(h + 8 + hlen, ' ', padded - hlen);
    free(json);
    *len_out = 8 + padded;
    return h;
}

/* Write one shard file (tensors of t) and its part of the manifest into the
 * temporary step directory, one tensor in memory at a time. Returns 0, or -1
 * with the reason in err (nothing printed: this may run in the writer thread). */
static int write_shard(const char *tmp, const struct param_table *t, const struct ckpt_layout *L, int step,
                       shard_source get, void *ctx, int crash, char *err, size_t errlen) {
    char path[4400], file[64];
    snprintf(file, sizeof file, "rank-%05d.safetensors", L->world_rank);
    int n = 3 * t->count, rc = -1;
    struct st_tensor *ts = xcalloc(n ? n : 1, sizeof *ts);
    char (*names)[PARAM_NAME_MAX + 32] = xcalloc(n ? n : 1, sizeof *names);
    for (int sec = 0; sec < 3; sec++)
        for (int i = 0; i < t->count; i++) {
            const struct param_info *p = &t->items[i];
            int k = sec * t->count + i;
            snprintf(names[k], sizeof names[k], "%s%s", section_prefix[sec], p->name);
            ts[k] = (struct st_tensor){.name = names[k], .dtype = "F32", .ndim = p->ndim,
                                       .nbytes = sizeof(float) * p->numel};
            for (int d = 0; d < p->ndim; d++) ts[k].shape[d] = p->local_shape[d];
        }
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    char step_text[32];
    snprintf(step_text, sizeof step_text, "%d", step);
    size_t hlen;
    char *header = st_header(ts, n, step_text, &hlen);
    json_t *tensors = json_array();
    struct out_file out;
    if (out_open(&out, path, err, errlen) != 0) goto done;
    out_write(&out, header, hlen);
    for (int k = 0; k < n && !out.err_no; k++) {
        const struct param_info *p = &t->items[k % t->count];
        const float *data = get(ctx, k / t->count, p);
        out_write(&out, data, ts[k].nbytes);
        CHECK(json_array_append_new(tensors, tensor_json(p, names[k], file, L->tp_rank, L->tp,
                                                         XXH3_64bits(data, ts[k].nbytes))) == 0);
    }
    if (out_close(&out, err, errlen) != 0) goto done;
    if (crash) {
        fprintf(stderr, "mtrain: injected crash while saving step %d\n", step);
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    json_t *part = json_pack("{s:s, s:i, s:i, s:O}", "file", file, "tp_rank", L->tp_rank, "pp_rank", L->pp_rank,
                             "tensors", tensors);
    CHECK(part);
    char *text = json_dumps(part, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    CHECK(text);
    snprintf(path, sizeof path, "%s/rank-%05d.json", tmp, L->world_rank);
    rc = write_atomic_checked(path, text, strlen(text), err, errlen);
    free(text);
    json_decref(part);
done:
    json_decref(tensors);
    free(header);
    free(ts);
    free(names);
    return rc;
}

static const float *snapshot_source(void *ctx, int sec, const struct param_info *p) {
    const struct ckpt_snapshot *s = ctx;
    return s->host + (size_t)sec * s->table->total + p->offset;
}

/* write_shard for the tensors this writer stores: all of t, only its
 * routed experts (L->expert_only) or all but them (L->no_experts); never a
 * stage copy (the last stage's embedding: the first stage stores it, and a
 * load reads it by name). */
static int write_own_shard(const char *tmp, const struct param_table *t, const struct ckpt_layout *L, int step,
                           shard_source get, void *ctx, int crash, char *err, size_t errlen) {
    struct param_table own = *t;
    int first = param_table_first_expert(t);
    if (L->expert_only) own.items = t->items + first, own.count = t->count - first;
    if (L->no_experts) own.count = first;
    struct param_info *kept = xcalloc(own.count ? own.count : 1, sizeof *kept);
    int n = 0;
    for (int i = 0; i < own.count; i++)
        if (!own.items[i].stage_copy) kept[n++] = own.items[i];
    own.items = kept, own.count = n;
    int rc = write_shard(tmp, &own, L, step, get, ctx, crash, err, errlen);
    free(kept);
    return rc;
}

int checkpoint_write_rank_checked(const struct ckpt_snapshot *s, const char *dir, int crash, char *err,
                                  size_t errlen) {
    if (!s->layout.writer) return 0;
    char tmp[4200], why[8192];
    tmp_step_dir(tmp, sizeof tmp, dir, s->state.step);
    if (write_own_shard(tmp, s->table, &s->layout, s->state.step, snapshot_source, (void *)s, crash, why,
                        sizeof why) == 0)
        return 0;
    snprintf(err, errlen, "checkpoint step %d: %s", s->state.step, why);
    return -1;
}

void checkpoint_write_rank(const struct ckpt_snapshot *s, const char *dir, int crash) {
    char err[8400];
    if (checkpoint_write_rank_checked(s, dir, crash, err, sizeof err) != 0) die("%s", err);
}

/* Every writer's part (rank-*.json) -> one tensors array and a files list. */
static void merge_parts(const char *tmp, json_t *tensors, json_t *files) {
    DIR *d = opendir(tmp);
    if (!d) die("cannot read %s: %s", tmp, strerror(errno));
    struct dirent *e;
    char path[4400];
    char **parts = NULL;
    int n = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "rank-", 5) || len < 5 || strcmp(e->d_name + len - 5, ".json")) continue;
        parts = xrealloc(parts, sizeof *parts * (n + 1));
        parts[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    qsort(parts, n, sizeof *parts, cmp_names);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, parts[i]);
        json_error_t jerr;
        json_t *part = json_load_file(path, 0, &jerr);
        if (!part) die("%s: cannot read (line %d: %s)", path, jerr.line, jerr.text);
        if (json_array_append(files, json_object_get(part, "file")) != 0 ||
            json_array_extend(tensors, json_object_get(part, "tensors")) != 0)
            die("%s: a rank's manifest part without its file or tensors", path);
        json_decref(part);
        if (unlink(path) != 0) die("cannot remove %s: %s", path, strerror(errno));
        free(parts[i]);
    }
    free(parts);
}

/* The manifest's own checksum: XXH3-64 (hex) of its canonical JSON (compact,
 * keys sorted, ASCII, reals with 17 digits) without the checksum key. Parsing
 * and dumping again gives the same text, so the loader recomputes it exactly. */
#define MANIFEST_SUM_KEY "manifest_xxh3"

static void manifest_sum(const json_t *m, char hex[17]) {
    json_t *c = json_copy((json_t *)m); /* shallow: the values are shared */
    CHECK(c);
    json_object_del(c, MANIFEST_SUM_KEY);
    char *text = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(17));
    CHECK(text);
    snprintf(hex, 17, "%016llx", (unsigned long long)XXH3_64bits(text, strlen(text)));
    free(text);
    json_decref(c);
}

static int ckpt_warnings = 1;
void checkpoint_set_warnings(int on) { ckpt_warnings = on; }

static void write_manifest(const struct ckpt_snapshot *s, const char *path, json_t *tensors, json_t *files) {
    const struct train_state *st = &s->state;
    const struct ckpt_layout *L = &s->layout;
    char *recipe = recipe_text(s->recipe);
    int cp = s->recipe->parallel.cp > 0 ? s->recipe->parallel.cp : 1;
    json_t *m = json_pack("{s:s, s:i, s:s, s:i, s:I, s:i, s:i, s:f, s:i, s:{s:f, s:f, s:i}, "
                          "s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}, s:o, s:o, s:s}",
                          "format", "mtrain-checkpoint", "version", CHECKPOINT_FORMAT_VERSION,
                          MANIFEST_SUM_KEY, "", "step", st->step,
                          "consumed_samples", (json_int_t)st->consumed_samples, "optimizer_step", st->opt_step,
                          "rewinds", st->rewinds, "lr_scale", st->lr_scale, "lr_scale_until", st->lr_scale_until,
                          "monitor", "ema_loss", st->ema_loss, "ema_grad_norm", st->ema_grad_norm, "seen", st->ema_seen,
                          "layout", "tp", L->tp, "pp", L->pp, "vpp", L->vpp, "dp", L->dp,
                          "ep", s->recipe->parallel.ep > 0 ? s->recipe->parallel.ep : 1, "cp", cp,
                          "etp", s->recipe->parallel.etp > 0 ? s->recipe->parallel.etp : 1,
                          "world_size", L->tp * L->pp * L->dp * cp, "files", files, "tensors", tensors, "recipe", recipe);
    CHECK(m);
    if (s->fp8) CHECK(json_object_set(m, "fp8_amax_history", s->fp8) == 0);
    char hex[17];
    manifest_sum(m, hex);
    CHECK(json_object_set_new(m, MANIFEST_SUM_KEY, json_string(hex)) == 0); /* keeps its place, third */
    char *text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    CHECK(text);
    write_file_atomic(path, text, strlen(text));
    free(text);
    free(recipe);
    json_decref(m);
}

/* Drop the oldest committed checkpoints beyond keep_last (the newest is never dropped). */
static void apply_retention(const char *dir, int keep_last) {
    if (keep_last <= 0) return;
    int steps[4096], n = checkpoint_list(dir, steps, 4096);
    char path[4096];
    for (int i = keep_last > 1 ? keep_last : 1; i < n; i++) {
        checkpoint_step_dir(path, sizeof path, dir, steps[i]);
        remove_dir(path);
    }
}

void checkpoint_commit(const struct ckpt_snapshot *s, const char *dir) {
    char final[4096], tmp[4200], path[4400];
    checkpoint_step_dir(final, sizeof final, dir, s->state.step);
    tmp_step_dir(tmp, sizeof tmp, dir, s->state.step);
    json_t *tensors = json_array(), *files = json_array();
    merge_parts(tmp, tensors, files);
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    write_manifest(s, path, tensors, files);
    fsync_path(tmp);
    /* Committed steps newer than this one belong to an abandoned branch (a
     * rewind to an older checkpoint, or --resume of an older step into the
     * same directory): auto-resume takes the newest committed step whatever
     * `latest` says, so they go, before this one is committed. */
    int steps[4096], n = checkpoint_list(dir, steps, 4096);
    for (int i = 0; i < n && steps[i] > s->state.step; i++) {
        checkpoint_step_dir(path, sizeof path, dir, steps[i]);
        warn("removing %s: newer than the step being saved (%d), from an abandoned branch", path, s->state.step);
        remove_dir(path);
    }
    if (path_exists(final)) remove_dir(final); /* a stale copy of this step from an abandoned branch */
    if (rename(tmp, final) != 0) die("cannot rename %s to %s: %s", tmp, final, strerror(errno));
    fsync_path(dir);
    snprintf(path, sizeof path, "%s/latest", dir);
    char latest[64];
    int len = snprintf(latest, sizeof latest, "step-%09d\n", s->state.step);
    write_file_atomic(path, latest, len);
    fsync_path(dir);
    apply_retention(dir, s->recipe->checkpoint.keep_last);
}

void checkpoint_write(const struct ckpt_snapshot *s, const char *dir, int crash_in_save) {
    checkpoint_prepare(dir, s->state.step);
    checkpoint_write_rank(s, dir, crash_in_save);
    checkpoint_commit(s, dir);
}

static int load_fail(char *err, size_t errlen, int code, const char *fmt, const char *a, const char *b) {
    snprintf(err, errlen, fmt, a, b);
    return code;
}

/* The manifest's training state, each field in its range (a manifest without
 * a checksum is not otherwise verified): 0, or -1 with the field in why */
static int read_int(json_t *m, const char *key, int64_t max, int64_t *out, char *why, size_t whylen) {
    json_t *v = json_object_get(m, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max) {
        snprintf(why, whylen, "'%s' must be an integer from 0 to %lld", key, (long long)max);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

static int read_state(json_t *m, struct train_state *st, char *why, size_t whylen) {
    int64_t step, consumed, opt, rewinds, until, seen;
    json_t *mon = json_object_get(m, "monitor"), *scale = json_object_get(m, "lr_scale");
    /* steps name the step directories (step-%09d) */
    if (read_int(m, "step", 999999999, &step, why, whylen) ||
        read_int(m, "consumed_samples", INT64_MAX, &consumed, why, whylen) ||
        read_int(m, "optimizer_step", INT32_MAX, &opt, why, whylen) ||
        read_int(m, "rewinds", INT32_MAX, &rewinds, why, whylen) ||
        read_int(m, "lr_scale_until", INT32_MAX, &until, why, whylen))
        return -1;
    if (!json_is_number(scale) || !(json_number_value(scale) > 0 && json_number_value(scale) <= 1)) {
        snprintf(why, whylen, "'lr_scale' must be a number in (0, 1]");
        return -1;
    }
    if (!json_is_object(mon)) {
        snprintf(why, whylen, "'monitor' must be an object");
        return -1;
    }
    /* the monitor's fields: absent is 0, as mtrain read them before it checked them */
    seen = 0;
    if (json_object_get(mon, "seen") && read_int(mon, "seen", INT32_MAX, &seen, why, whylen)) return -1;
    json_t *l = json_object_get(mon, "ema_loss"), *g = json_object_get(mon, "ema_grad_norm");
    double loss = json_number_value(l), gnorm = json_number_value(g);
    if ((l && !json_is_number(l)) || (g && !json_is_number(g)) || !isfinite(loss) || !isfinite(gnorm)) {
        snprintf(why, whylen, "'monitor' averages must be finite numbers");
        return -1;
    }
    *st = (struct train_state){.step = (int)step, .consumed_samples = consumed, .opt_step = (int)opt,
                               .rewinds = (int)rewinds, .lr_scale = json_number_value(scale),
                               .lr_scale_until = (int)until, .ema_loss = loss, .ema_grad_norm = gnorm,
                               .ema_seen = (int)seen};
    return 0;
}

/* Open shard files of one checkpoint, kept open while loading. */
struct open_files {
    const char *dir;
    struct st_file f[256];
    char *name[256];
    int n;
};

static struct st_file *open_shard(struct open_files *o, const char *file, char *err, size_t errlen) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->name[i], file)) return &o->f[i];
    if (o->n == 256) {
        snprintf(err, errlen, "%s: more than 256 shard files", o->dir);
        return NULL;
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", o->dir, file);
    if (safetensors_open(&o->f[o->n], path, err, errlen) != 0) return NULL;
    o->name[o->n] = xstrdup(file);
    return &o->f[o->n++];
}

static void close_shards(struct open_files *o) {
    for (int i = 0; i < o->n; i++) {
        safetensors_close(&o->f[i]);
        free(o->name[i]);
    }
}

static int64_t ival(json_t *obj, const char *key) { return json_integer_value(json_object_get(obj, key)); }

/* Read one stored shard (whole) into buf and verify its checksum. */
static int read_shard(struct open_files *o, json_t *e, const char *name, float *buf, size_t numel, char *err,
                      size_t errlen) {
    const char *file = json_string_value(json_object_get(e, "file"));
    struct st_file *f = file ? open_shard(o, file, err, errlen) : NULL;
    if (!f) {
        if (!file) snprintf(err, errlen, "%s: tensor %s has no file in the manifest", o->dir, name);
        return -1;
    }
    const struct st_entry *se = safetensors_find(f, name);
    if (!se || strcmp(se->dtype, "F32") || se->end - se->begin != sizeof(float) * numel) {
        snprintf(err, errlen, "%s: tensor %s is missing or malformed", f->path, name);
        return -1;
    }
    if (safetensors_read(f, se, buf, err, errlen) != 0) return -1;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(buf, sizeof(float) * numel));
    json_t *want = json_object_get(e, "xxh3");
    if (!json_is_string(want) || strcmp(json_string_value(want), hex)) {
        snprintf(err, errlen, "%s: tensor %s: checksum mismatch (manifest %s, data %s): the file is damaged", f->path,
                 name, json_is_string(want) ? json_string_value(want) : "?", hex);
        return -1;
    }
    return 0;
}

/* A manifest entry's shard rule if it stores a part of tensor p (its shape, and the stored rule: the target's, or
 * either whole: a routed expert is whole at etp 1, split over etp ranks by rows or columns otherwise), else -1 */
static int entry_rule(json_t *e, const struct param_info *p) {
    json_t *shape = json_object_get(e, "shape"), *sh = json_object_get(e, "shard");
    int rule = -1;
    for (int k = 0; json_is_string(sh) && k < (int)(sizeof shard_names / sizeof *shard_names); k++)
        if (!strcmp(json_string_value(sh), shard_names[k])) rule = k;
    int ok = json_is_array(shape) && (int)json_array_size(shape) == p->ndim &&
             (rule == (int)p->shard || (p->expert && (rule == SHARD_REPLICATED || p->shard == SHARD_REPLICATED) &&
                                        rule >= 0));
    for (int d = 0; ok && d < p->ndim; d++) ok = json_integer_value(json_array_get(shape, d)) == p->shape[d];
    return ok ? rule : -1;
}

/* Fill out (p's local shard in the target layout) from the stored shards of
 * `name`, whatever tensor-parallel size they were saved with. */
static int assemble(struct open_files *o, json_t *tensors, const struct param_info *p, int tp_rank, const char *name,
                    float *out, char *err, size_t errlen) {
    size_t i;
    json_t *e;
    int64_t found = 0; /* elements placed: a tensor may hold more than 2^31 */
    float *buf = NULL;
    int64_t rows = p->shape[0], cols = p->ndim > 1 ? p->shape[1] : 1;
    int64_t lr = p->local_shape[0], lc = p->ndim > 1 ? p->local_shape[1] : 1;
    int64_t r0 = p->shard == SHARD_TP_ROWS ? p->part * lr : 0, c0 = p->shard == SHARD_TP_COLS ? p->part * lc : 0;
    unsigned char seen[4096] = {0}; /* source blocks already copied (kv blocks are stored by every sharer) */
    (void)tp_rank;
    json_array_foreach(tensors, i, e) {
        json_t *n = json_object_get(e, "name");
        if (!json_is_string(n) || strcmp(json_string_value(n), name)) continue;
        int rule = entry_rule(e, p);
        if (rule < 0) {
            free(buf);
            return load_fail(err, errlen, -2, "%s: tensor %s has another shape or shard rule: the checkpoint belongs "
                             "to a different model shape than the recipe", o->dir, name);
        }
        /* which block of how many this stored shard is (older manifests: its TP rank of tp) */
        json_t *jp = json_object_get(e, "parts"), *jq = json_object_get(e, "part");
        int src_parts = (int)(jp ? json_integer_value(jp) : ival(e, "tp"));
        int src_part = (int)(jq ? json_integer_value(jq) : ival(e, "tp_rank"));
        if (rule == SHARD_REPLICATED) src_parts = 1, src_part = 0;
        if (src_parts < 1 || src_parts > 4096 || src_part < 0 || src_part >= src_parts) {
            free(buf);
            return load_fail(err, errlen, -1, "%s: tensor %s: bad parts/part in the manifest", o->dir, name);
        }
        if (seen[src_part]) continue; /* every sharer stored a copy: one is enough */
        /* rows/cols this stored shard covers */
        int64_t sr0 = 0, sr1 = rows, sc0 = 0, sc1 = cols;
        if (rule == SHARD_TP_ROWS) sr0 = src_part * (rows / src_parts), sr1 = sr0 + rows / src_parts;
        if (rule == SHARD_TP_COLS) sc0 = src_part * (cols / src_parts), sc1 = sc0 + cols / src_parts;
        int64_t ir0 = sr0 > r0 ? sr0 : r0, ir1 = sr1 < r0 + lr ? sr1 : r0 + lr;
        int64_t ic0 = sc0 > c0 ? sc0 : c0, ic1 = sc1 < c0 + lc ? sc1 : c0 + lc;
        if (ir0 >= ir1 || ic0 >= ic1) continue;
        size_t numel = (size_t)(sr1 - sr0) * (sc1 - sc0);
        buf = xrealloc(buf, sizeof(float) * (numel ? numel : 1));
        if (read_shard(o, e, name, buf, numel, err, errlen) != 0) {
            free(buf);
            return -1;
        }
        for (int64_t r = ir0; r < ir1; r++)
            memcpy(out + (r - r0) * lc + (ic0 - c0), buf + (r - sr0) * (sc1 - sc0) + (ic0 - sc0),
                   sizeof(float) * (ic1 - ic0));
        found += (ir1 - ir0) * (ic1 - ic0);
        seen[src_part] = 1;
    }
    free(buf);
    if (found != lr * lc)
        return load_fail(err, errlen, -2, "%s: tensor %s is missing (or incomplete): the checkpoint belongs to a "
                         "different model shape than the recipe", o->dir, name);
    return 0;
}

static json_t *load_manifest(const char *step_dir, struct train_state *st, char *err, size_t errlen, int *rc) {
    char path[4400];
    snprintf(path, sizeof path, "%s/manifest.json", step_dir);
    json_error_t jerr;
    json_t *man = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    *rc = -1;
    if (!man) {
        snprintf(err, errlen, "%s: cannot read manifest (line %d: %s)", path, jerr.line, jerr.text);
        return NULL;
    }
    /* the manifest's own checksum first: a damaged but parseable manifest
     * (step, data position, optimizer state, recipe) must not load */
    json_t *sum = json_object_get(man, MANIFEST_SUM_KEY);
    if (sum) {
        char hex[17];
        manifest_sum(man, hex);
        if (!json_is_string(sum) || strcmp(json_string_value(sum), hex)) {
            snprintf(err, errlen, "%s: manifest checksum mismatch (%s %s, content %s): the manifest is damaged or "
                     "was edited", path, MANIFEST_SUM_KEY, json_is_string(sum) ? json_string_value(sum) : "?", hex);
            json_decref(man);
            return NULL;
        }
    } else if (ckpt_warnings) {
        warn("%s carries no checksum (written by an older mtrain): its step, data position and recipe are not "
             "verified", path);
    }
    json_t *fmt = json_object_get(man, "format"), *ver = json_object_get(man, "version");
    char why[160];
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "mtrain-checkpoint") || !json_is_integer(ver) ||
        !json_is_array(json_object_get(man, "tensors"))) {
        snprintf(err, errlen, "%s: not an mtrain checkpoint manifest", path);
    } else if (json_integer_value(ver) != CHECKPOINT_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint format version %lld, this mtrain reads version %d", path,
                 (long long)json_integer_value(ver), CHECKPOINT_FORMAT_VERSION);
    } else if (read_state(man, st, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: bad training state: %s", path, why);
    } else {
        *rc = 0;
        return man;
    }
    json_decref(man);
    return NULL;
}

struct ckpt_reader {
    json_t *man;
    struct open_files files;
    struct train_state st;
    char *dir;
};

struct ckpt_reader *ckpt_reader_open(const char *step_dir, char *err, size_t errlen, int *rc) {
    struct ckpt_reader *rd = xcalloc(1, sizeof *rd);
    rd->man = load_manifest(step_dir, &rd->st, err, errlen, rc);
    if (!rd->man) {
        free(rd);
        return NULL;
    }
    rd->dir = xstrdup(step_dir);
    rd->files.dir = rd->dir;
    return rd;
}

json_t *ckpt_reader_field(const struct ckpt_reader *rd, const char *key) { return json_object_get(rd->man, key); }

const char *ckpt_reader_recipe(const struct ckpt_reader *rd) {
    json_t *r = json_object_get(rd->man, "recipe");
    return json_is_string(r) ? json_string_value(r) : "";
}

int ckpt_reader_read(struct ckpt_reader *rd, const struct param_info *p, int tp_rank, int section, float *out,
                     char *err, size_t errlen) {
    char name[PARAM_NAME_MAX + 32];
    snprintf(name, sizeof name, "%s%s", section_prefix[section], p->name);
    return assemble(&rd->files, json_object_get(rd->man, "tensors"), p, tp_rank, name, out, err, errlen);
}

void ckpt_reader_close(struct ckpt_reader *rd) {
    if (!rd) return;
    close_shards(&rd->files);
    json_decref(rd->man);
    free(rd->dir);
    free(rd);
}

int checkpoint_read_manifest(const char *step_dir, struct train_state *st, char **recipe_text_out, char *err,
                             size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, &rc);
    if (!rd) return rc;
    *st = rd->st;
    *recipe_text_out = xstrdup(ckpt_reader_recipe(rd));
    ckpt_reader_close(rd);
    return 0;
}

int checkpoint_load(const char *step_dir, const struct param_table *t, float *params, float *m, float *v,
                    struct train_state *st, char *err, size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(step_dir, err, errlen, &rc);
    if (!rd) return rc;
    *st = rd->st;
    float *bufs[3] = {params, m, v};
    for (int k = 0; k < 3; k++) memset(bufs[k], 0, sizeof(float) * t->total);
    rc = 0;
    for (int sec = 0; sec < 3 && !rc; sec++)
        for (int i = 0; i < t->count && !rc; i++)
            rc = ckpt_reader_read(rd, &t->items[i], t->tp_rank, sec, bufs[sec] + t->items[i].offset, err, errlen);
    ckpt_reader_close(rd);
    return rc;
}

/* ---- offline resharding ---- */

/* Whether the manifest has an entry for section sec of tensor p with p's shape: checked before a tensor the size
 * the manifest's recipe names is allocated (the recipe of a manifest without a checksum is not otherwise
 * verified, and could name any size). 0, or -1 with err. */
static int reader_holds(const struct ckpt_reader *rd, int sec, const struct param_info *p, char *err, size_t errlen) {
    char name[PARAM_NAME_MAX + 32];
    snprintf(name, sizeof name, "%s%s", section_prefix[sec], p->name);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(rd->man, "tensors"), i, e) {
        json_t *n = json_object_get(e, "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) {
            if (entry_rule(e, p) >= 0) return 0;
            break;
        }
    }
    snprintf(err, errlen, "%s: tensor %s is missing or has another shape or shard rule: the manifest's tensors do "
             "not match its recipe", rd->dir, name);
    return -1;
}

struct convert_ctx {
    struct ckpt_reader *rd;
    int tp_rank;
    float *buf;
    size_t cap;
    char *err;
    size_t errlen;
};

static const float *convert_source(void *ctx, int sec, const struct param_info *p) {
    struct convert_ctx *c = ctx;
    if (reader_holds(c->rd, sec, p, c->err, c->errlen) != 0) die("%s", c->err);
    if (p->numel > c->cap) c->buf = xrealloc(c->buf, sizeof(float) * (c->cap = p->numel));
    if (ckpt_reader_read(c->rd, p, c->tp_rank, sec, c->buf, c->err, c->errlen) != 0) die("%s", c->err);
    return c->buf;
}

int ckpt_reader_check(const struct ckpt_reader *rd, const struct model_config *m, char *err, size_t errlen) {
    struct model_part part;
    struct param_table t;
    model_part_full(&part, m);
    param_table_build(&t, m, &part);
    int rc = 0;
    for (int i = 0; i < t.count && !rc; i++) rc = reader_holds(rd, 0, &t.items[i], err, errlen);
    param_table_free(&t);
    return rc;
}

int ckpt_reader_load_recipe(const struct ckpt_reader *rd, struct recipe *r, char *err, size_t errlen) {
    char path[] = "/tmp/mtrain-recipe-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create a temporary file: %s", strerror(errno));
        return -1;
    }
    const char *text = ckpt_reader_recipe(rd);
    int ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
    close(fd);
    recipe_defaults(r);
    ok = ok && recipe_load(r, path) == 0;
    unlink(path);
    /* messages about the recipe name the checkpoint, not the temporary file */
    snprintf(r->source, sizeof r->source, "%.900s/manifest.json recipe", rd->dir);
    if (!ok) snprintf(err, errlen, "%s: the manifest's recipe cannot be read back", rd->dir);
    return ok ? 0 : -1;
}

int checkpoint_convert(const char *src_step_dir, const char *dst_dir, int tp, int pp, int vpp, int dp, int ep, int etp,
                       int cp, char *err, size_t errlen) {
    int rc;
    struct ckpt_reader *rd = ckpt_reader_open(src_step_dir, err, errlen, &rc);
    if (!rd) return rc;
    static struct recipe r;
    if (ckpt_reader_load_recipe(rd, &r, err, errlen) != 0) {
        ckpt_reader_close(rd);
        return -1;
    }
    r.parallel.tp = tp, r.parallel.pp = pp, r.parallel.vpp = vpp, r.parallel.ep = ep, r.parallel.etp = etp;
    r.parallel.cp = cp;
    /* any layout loads any checkpoint, so the stage split here is the even one */
    r.parallel.first_stage_layers = r.parallel.last_stage_layers = 0;
    /* the layout is checked here, not the data: validate a copy without it
     * (the written manifest keeps the recipe's data, which resume compares) */
    static struct recipe check;
    check = r;
    snprintf(check.data.path, sizeof check.data.path, "/");
    check.data.blend.n = 0;
    check.model.init_from[0] = 0;
    /* batch sizes are the resumed run's choice (--set train.micro_batch=...) */
    check.train.micro_batch = 1;
    check.train.global_batch = dp;
    if (recipe_validate(&check, tp * pp * dp * cp) != 0) {
        snprintf(err, errlen, "layout tp %d pp %d vpp %d dp %d ep %d etp %d cp %d does not fit this model (see above)",
                 tp, pp, vpp, dp, ep, etp, cp);
        ckpt_reader_close(rd);
        return -2;
    }
    /* the amax history is named by tensor, the same for any layout: kept as it is */
    struct ckpt_snapshot s = {.recipe = &r, .state = rd->st,
                              .layout = {.tp = tp, .pp = pp, .dp = dp, .vpp = vpp, .writer = 1},
                              .fp8 = json_incref(ckpt_reader_field(rd, "fp8_amax_history"))};
    checkpoint_prepare(dst_dir, s.state.step);
    char tmp[4200];
    tmp_step_dir(tmp, sizeof tmp, dst_dir, s.state.step);
    struct convert_ctx ctx = {.rd = rd, .err = err, .errlen = errlen};
    /* the writers of `mtrain pretrain` (parallel/grid.h, cli/pretrain_ckpt.c):
     * of the tp x cp x dp ranks q of each stage, DP and CP rank 0 writes its
     * dense tensors, expert-DP rank 0 (q = etp_rank + etp * ep_rank) its
     * experts (slice etp_rank of those of ep_rank) */
    for (int p = 0; p < pp; p++)
        for (int q = 0; q < tp * cp * dp; q++) {
            int t = q % tp, dense = q / tp == 0, experts = q / (etp * ep) == 0 && r.model.num_experts > 0;
            if (!dense && !experts) continue;
            struct model_part part;
            struct param_table table;
            model_part_for(&part, &r.model, &r.parallel, t, p, q / etp % ep, q % etp);
            param_table_build(&table, &r.model, &part);
            struct ckpt_layout L = {.world_rank = q + tp * cp * dp * p, .tp = tp, .tp_rank = t, .pp = pp, .pp_rank = p,
                                    .dp = dp, .vpp = vpp, .writer = 1, .expert_only = !dense, .no_experts = !experts};
            ctx.tp_rank = t;
            char why[8192];
            if (write_own_shard(tmp, &table, &L, s.state.step, convert_source, &ctx, 0, why, sizeof why) != 0)
                die("%s", why);
            param_table_free(&table);
        }
    checkpoint_commit(&s, dst_dir);
    json_decref(s.fp8);
    free(ctx.buf);
    ckpt_reader_close(rd);
    return 0;
}

static int parse_step_name(const char *name) {
    int step, len;
    if (sscanf(name, "step-%9d%n", &step, &len) == 1 && len == 14 && name[len] == 0) return step;
    return -1;
}

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

int checkpoint_list(const char *dir, int *steps, int max) {
    DIR *d = opendir(dir);
    if (!d && errno != ENOENT && errno != ENOTDIR) die("cannot list checkpoint directory %s: %s", dir, strerror(errno));
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)) && n < max) {
        int step = parse_step_name(e->d_name);
        if (step < 0) continue;
        snprintf(path, sizeof path, "%s/%s/manifest.json", dir, e->d_name);
        if (path_exists(path)) steps[n++] = step;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, cmp_desc);
    return n;
}

int checkpoint_latest(const char *dir) {
    char path[4400];
    snprintf(path, sizeof path, "%s/latest", dir);
    char *text = read_file(path, NULL);
    if (!text) return -1;
    text[strcspn(text, "\r\n")] = 0;
    int step = parse_step_name(text);
    free(text);
    return step;
}

/* "NAME.tmp.PID" (write_file_atomic's temporary files, the start-up probe
 * .mtrain-probe-rR.tmp.PID): the PID, or -1. */
static long tmp_file_pid(const char *name) {
    const char *t = NULL;
    for (const char *q = strstr(name, ".tmp."); q; q = strstr(q + 1, ".tmp.")) t = q;
    if (!t || t == name || !t[5]) return -1;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    return *end || pid <= 0 || pid > 0x7fffffff ? -1 : pid;
}

/* Seconds since the epoch when process pid started (Linux /proc), or -1. */
static double process_start_time(long pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    char *stat_text = read_file(path, NULL), *proc_stat = read_file("/proc/stat", NULL);
    double t = -1;
    const char *p = stat_text ? strrchr(stat_text, ')') : NULL, *b = proc_stat ? strstr(proc_stat, "\nbtime ") : NULL;
    if (p && b) {
        unsigned long long start = 0;
        /* after "(comm)": state (field 3) ... starttime (field 22) */
        int field = 2, ok = 0;
        for (const char *q = p + 1; *q && !ok; q++)
            if (*q == ' ' && ++field == 22) ok = sscanf(q + 1, "%llu", &start) == 1;
        long hz = sysconf(_SC_CLK_TCK);
        if (ok && hz > 0) t = strtod(b + 7, NULL) + (double)start / hz;
    }
    free(stat_text);
    free(proc_stat);
    return t;
}

/* Could the live process pid have written a file last modified at mtime?
 * No if it does not exist, or (PIDs are reused, in containers above all)
 * if it started after the file was last written. */
static int may_own(long pid, time_t mtime) {
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
    double started = process_start_time(pid);
    return started < 0 || started <= (double)mtime + 1;
}

void checkpoint_clean_partial(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char **names = NULL;
    int n = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        names = xrealloc(names, sizeof *names * (n + 1));
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    char path[4400], man[4500];
    struct stat sb;
    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        long pid;
        if (!strncmp(name, "step-", 5) && strstr(name, ".tmp-")) {
            /* a step directory still being written (step 1 of the protocol) */
            warn("removing %s, left by an interrupted save", path);
            remove_dir(path);
        } else if (parse_step_name(name) >= 0 && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) &&
                   (snprintf(man, sizeof man, "%s/manifest.json", path), !path_exists(man))) {
            /* a committed name without a manifest: an interrupted removal (retention) */
            warn("removing %s, a step directory without a manifest (left by an interrupted removal)", path);
            remove_dir(path);
        } else if ((!strncmp(name, "latest.tmp.", 11) || !strncmp(name, ".mtrain-probe-", 14)) &&
                   (pid = tmp_file_pid(name)) > 0 && lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            /* a temporary file of an interrupted `latest` update (or a start-up probe);
             * one of a live process on this machine is left alone */
            if (pid != (long)getpid() && may_own(pid, sb.st_mtime)) continue;
            warn("removing %s, left by an interrupted save", path);
            if (unlink(path) != 0) warn("cannot remove %s: %s", path, strerror(errno));
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}
