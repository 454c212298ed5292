#define _GNU_SOURCE
#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
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
    s->host = xmalloc(sizeof(float) * 3 * (t->total ? t->total : 1));
}

void ckpt_snapshot_free(struct ckpt_snapshot *s) { free(s->host); }

void ckpt_snapshot_take(struct ckpt_snapshot *s, const struct backend *be, const float *params,
                        struct optimizer *opt, const struct train_state *st) {
    size_t n = s->table->total;
    be->to_host(s->host, params, sizeof(float) * n);
    optimizer_get_moments(opt, s->host + n, s->host + 2 * n);
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

static void remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (unlink(p) != 0) warn("cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(path) != 0) warn("cannot remove %s: %s", path, strerror(errno));
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
    json_t *t = json_pack("{s:s, s:o, s:o, s:s, s:i, s:i, s:s, s:s}", "name", name, "shape", shape, "local_shape",
                          local, "shard", shard_names[p->shard], "tp_rank", tp_rank, "tp", tp, "file", file, "xxh3", hex);
    CHECK(t);
    return t;
}

void checkpoint_write_rank(const struct ckpt_snapshot *s, const char *dir, int crash) {
    const struct param_table *t = s->table;
    const struct ckpt_layout *L = &s->layout;
    if (!L->writer) return;
    char tmp[4200], path[4400], file[64];
    tmp_step_dir(tmp, sizeof tmp, dir, s->state.step);
    snprintf(file, sizeof file, "rank-%05d.safetensors", L->world_rank);
    int n = 3 * t->count;
    struct st_tensor *ts = xcalloc(n ? n : 1, sizeof *ts);
    char (*names)[PARAM_NAME_MAX + 32] = xcalloc(n ? n : 1, sizeof *names);
    json_t *tensors = json_array();
    for (int sec = 0; sec < 3; sec++)
        for (int i = 0; i < t->count; i++) {
            const struct param_info *p = &t->items[i];
            int k = sec * t->count + i;
            snprintf(names[k], sizeof names[k], "%s%s", section_prefix[sec], p->name);
            const float *data = s->host + (size_t)sec * t->total + p->offset;
            ts[k] = (struct st_tensor){.name = names[k], .dtype = "F32", .ndim = p->ndim, .data = data,
                                       .nbytes = sizeof(float) * p->numel};
            for (int d = 0; d < p->ndim; d++) ts[k].shape[d] = p->local_shape[d];
            json_array_append_new(tensors, tensor_json(p, names[k], file, L->tp_rank, L->tp,
                                                       XXH3_64bits(data, ts[k].nbytes)));
        }
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    char step_text[32];
    snprintf(step_text, sizeof step_text, "%d", s->state.step);
    const char *mk[] = {"format", "mtrain_step"}, *mv[] = {"pt", step_text};
    safetensors_save(path, ts, n, mk, mv, 2);
    if (crash) {
        fprintf(stderr, "mtrain: injected crash while saving step %d\n", s->state.step);
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    json_t *part = json_pack("{s:s, s:i, s:i, s:o}", "file", file, "tp_rank", L->tp_rank, "pp_rank", L->pp_rank,
                             "tensors", tensors);
    CHECK(part);
    char *text = json_dumps(part, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    CHECK(text);
    snprintf(path, sizeof path, "%s/rank-%05d.json", tmp, L->world_rank);
    write_file_atomic(path, text, strlen(text));
    free(text);
    json_decref(part);
    free(ts);
    free(names);
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
        json_array_append(files, json_object_get(part, "file"));
        json_array_extend(tensors, json_object_get(part, "tensors"));
        json_decref(part);
        if (unlink(path) != 0) die("cannot remove %s: %s", path, strerror(errno));
        free(parts[i]);
    }
    free(parts);
}

static void write_manifest(const struct ckpt_snapshot *s, const char *path, json_t *tensors, json_t *files) {
    const struct train_state *st = &s->state;
    const struct ckpt_layout *L = &s->layout;
    char *recipe = recipe_text(s->recipe);
    json_t *m = json_pack("{s:s, s:i, s:i, s:I, s:i, s:i, s:f, s:i, s:{s:f, s:f, s:i}, "
                          "s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i}, s:o, s:o, s:s}",
                          "format", "mtrain-checkpoint", "version", CHECKPOINT_FORMAT_VERSION, "step", st->step,
                          "consumed_samples", (json_int_t)st->consumed_samples, "optimizer_step", st->opt_step,
                          "rewinds", st->rewinds, "lr_scale", st->lr_scale, "lr_scale_until", st->lr_scale_until,
                          "monitor", "ema_loss", st->ema_loss, "ema_grad_norm", st->ema_grad_norm, "seen", st->ema_seen,
                          "layout", "tp", L->tp, "pp", L->pp, "vpp", L->vpp, "dp", L->dp, "ep", 1, "cp", 1,
                          "world_size", L->tp * L->pp * L->dp, "files", files, "tensors", tensors, "recipe", recipe);
    CHECK(m);
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

static int read_state(json_t *m, struct train_state *st) {
    json_t *v;
#define GET_INT(key, field)                                        \
    if (!json_is_integer(v = json_object_get(m, key))) return -1; \
    st->field = json_integer_value(v)
    GET_INT("step", step);
    GET_INT("consumed_samples", consumed_samples);
    GET_INT("optimizer_step", opt_step);
    GET_INT("rewinds", rewinds);
    GET_INT("lr_scale_until", lr_scale_until);
#undef GET_INT
    if (!json_is_number(v = json_object_get(m, "lr_scale"))) return -1;
    st->lr_scale = json_number_value(v);
    json_t *mon = json_object_get(m, "monitor");
    if (!json_is_object(mon)) return -1;
    st->ema_loss = json_number_value(json_object_get(mon, "ema_loss"));
    st->ema_grad_norm = json_number_value(json_object_get(mon, "ema_grad_norm"));
    st->ema_seen = (int)json_integer_value(json_object_get(mon, "seen"));
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

/* Fill out (p's local shard in the target layout) from the stored shards of
 * `name`, whatever tensor-parallel size they were saved with. */
static int assemble(struct open_files *o, json_t *tensors, const struct param_info *p, int tp_rank, const char *name,
                    float *out, char *err, size_t errlen) {
    size_t i;
    json_t *e;
    int found = 0;
    float *buf = NULL;
    int64_t rows = p->shape[0], cols = p->ndim > 1 ? p->shape[1] : 1;
    int64_t lr = p->local_shape[0], lc = p->ndim > 1 ? p->local_shape[1] : 1;
    int64_t r0 = p->shard == SHARD_TP_ROWS ? tp_rank * lr : 0, c0 = p->shard == SHARD_TP_COLS ? tp_rank * lc : 0;
    json_array_foreach(tensors, i, e) {
        json_t *n = json_object_get(e, "name");
        if (!json_is_string(n) || strcmp(json_string_value(n), name)) continue;
        json_t *shape = json_object_get(e, "shape"), *sh = json_object_get(e, "shard");
        int ok = json_is_array(shape) && (int)json_array_size(shape) == p->ndim && json_is_string(sh) &&
                 !strcmp(json_string_value(sh), shard_names[p->shard]);
        for (int d = 0; ok && d < p->ndim; d++) ok = json_integer_value(json_array_get(shape, d)) == p->shape[d];
        if (!ok) {
            free(buf);
            return load_fail(err, errlen, -2, "%s: tensor %s has another shape or shard rule: the checkpoint belongs "
                             "to a different model shape than the recipe", o->dir, name);
        }
        int src_tp = (int)ival(e, "tp"), src_rank = (int)ival(e, "tp_rank");
        if (src_tp < 1 || src_rank < 0 || src_rank >= src_tp) {
            free(buf);
            return load_fail(err, errlen, -1, "%s: tensor %s: bad tp/tp_rank in the manifest", o->dir, name);
        }
        /* rows/cols this stored shard covers */
        int64_t sr0 = 0, sr1 = rows, sc0 = 0, sc1 = cols;
        if (p->shard == SHARD_TP_ROWS) sr0 = src_rank * (rows / src_tp), sr1 = sr0 + rows / src_tp;
        if (p->shard == SHARD_TP_COLS) sc0 = src_rank * (cols / src_tp), sc1 = sc0 + cols / src_tp;
        if (p->shard == SHARD_REPLICATED && found) continue; /* every TP rank stored a copy: one is enough */
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
        found += (int)((ir1 - ir0) * (ic1 - ic0));
    }
    free(buf);
    if (found != lr * lc)
        return load_fail(err, errlen, -2, "%s: tensor %s is missing (or incomplete): the checkpoint belongs to a "
                         "different model shape than the recipe", o->dir, name);
    return 0;
}

static int load_tensors(const char *step_dir, json_t *tensors, const struct param_table *t, float *bufs[3],
                        char *err, size_t errlen) {
    struct open_files o = {.dir = step_dir};
    char name[PARAM_NAME_MAX + 32];
    int rc = 0;
    for (int sec = 0; sec < 3 && !rc; sec++)
        for (int i = 0; i < t->count && !rc; i++) {
            const struct param_info *p = &t->items[i];
            snprintf(name, sizeof name, "%s%s", section_prefix[sec], p->name);
            rc = assemble(&o, tensors, p, t->tp_rank, name, bufs[sec] + p->offset, err, errlen);
        }
    close_shards(&o);
    return rc;
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
    json_t *fmt = json_object_get(man, "format"), *ver = json_object_get(man, "version");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "mtrain-checkpoint") || !json_is_integer(ver) ||
        !json_is_array(json_object_get(man, "tensors")) || read_state(man, st) != 0) {
        snprintf(err, errlen, "%s: not an mtrain checkpoint manifest", path);
    } else if (json_integer_value(ver) != CHECKPOINT_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint format version %lld, this mtrain reads version %d", path,
                 (long long)json_integer_value(ver), CHECKPOINT_FORMAT_VERSION);
    } else {
        *rc = 0;
        return man;
    }
    json_decref(man);
    return NULL;
}

int checkpoint_read_manifest(const char *step_dir, struct train_state *st, char **recipe_text_out, char *err,
                             size_t errlen) {
    int rc;
    json_t *man = load_manifest(step_dir, st, err, errlen, &rc);
    if (!man) return rc;
    json_t *rt = json_object_get(man, "recipe");
    *recipe_text_out = xstrdup(json_is_string(rt) ? json_string_value(rt) : "");
    json_decref(man);
    return 0;
}

int checkpoint_load(const char *step_dir, const struct param_table *t, float *params, float *m, float *v,
                    struct train_state *st, char *err, size_t errlen) {
    int rc;
    json_t *man = load_manifest(step_dir, st, err, errlen, &rc);
    if (!man) return rc;
    float *bufs[3] = {params, m, v};
    for (int k = 0; k < 3; k++) memset(bufs[k], 0, sizeof(float) * t->total);
    rc = load_tensors(step_dir, json_object_get(man, "tensors"), t, bufs, err, errlen);
    json_decref(man);
    return rc;
}

static int parse_step_name(const char *name) {
    int step, len;
    if (sscanf(name, "step-%9d%n", &step, &len) == 1 && len == 14 && name[len] == 0) return step;
    return -1;
}

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

int checkpoint_list(const char *dir, int *steps, int max) {
    DIR *d = opendir(dir);
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

void checkpoint_clean_partial(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step-", 5) || !strstr(e->d_name, ".tmp-")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        warn("removing %s, left by an interrupted save", path);
        remove_dir(path);
    }
    closedir(d);
}
