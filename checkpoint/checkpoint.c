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

static const char *const section_prefix[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
static const char *const shard_names[] = {"replicated", "tp_rows", "tp_cols"};
#define RANK_FILE "rank-00000.safetensors"

void ckpt_snapshot_init(struct ckpt_snapshot *s, const struct recipe *r, const struct param_table *t) {
    memset(s, 0, sizeof *s);
    s->recipe = r;
    s->table = t;
    s->host = xmalloc(sizeof(float) * 3 * (t->total ? t->total : 1));
}

void ckpt_snapshot_free(struct ckpt_snapshot *s) { free(s->host); }

void ckpt_snapshot_take(struct ckpt_snapshot *s, const struct backend *be, const float *params, const float *m,
                        const float *v, const struct train_state *st) {
    size_t n = s->table->total;
    be->to_host(s->host, params, sizeof(float) * n);
    be->to_host(s->host + n, m, sizeof(float) * n);
    be->to_host(s->host + 2 * n, v, sizeof(float) * n);
    s->state = *st;
}

void checkpoint_step_dir(char *out, size_t n, const char *dir, int step) {
    snprintf(out, n, "%s/step-%09d", dir, step);
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

static json_t *tensor_json(const struct param_info *p, const char *name, uint64_t hash) {
    json_t *shape = json_array();
    for (int d = 0; d < p->ndim; d++) json_array_append_new(shape, json_integer(p->shape[d]));
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    json_t *t = json_pack("{s:s, s:o, s:s, s:s, s:s}", "name", name, "shape", shape, "shard", shard_names[p->shard],
                          "file", RANK_FILE, "xxh3", hex);
    CHECK(t);
    return t;
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

static void write_manifest(const struct ckpt_snapshot *s, const char *path, json_t *tensors) {
    const struct train_state *st = &s->state;
    const struct parallel_config *p = &s->recipe->parallel;
    char *recipe = recipe_text(s->recipe);
    json_t *m = json_pack("{s:s, s:i, s:i, s:I, s:i, s:i, s:f, s:i, s:{s:f, s:f, s:i}, "
                          "s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:[s], s:o, s:s}",
                          "format", "mtrain-checkpoint", "version", CHECKPOINT_FORMAT_VERSION, "step", st->step,
                          "consumed_samples", (json_int_t)st->consumed_samples, "optimizer_step", st->opt_step,
                          "rewinds", st->rewinds, "lr_scale", st->lr_scale, "lr_scale_until", st->lr_scale_until,
                          "monitor", "ema_loss", st->ema_loss, "ema_grad_norm", st->ema_grad_norm, "seen", st->ema_seen,
                          "layout", "tp", p->tp, "pp", p->pp, "dp", 1, "ep", p->ep, "cp", p->cp, "world_size", 1,
                          "files", RANK_FILE, "tensors", tensors, "recipe", recipe);
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

void checkpoint_write(const struct ckpt_snapshot *s, const char *dir, int crash_in_save) {
    const struct param_table *t = s->table;
    char final[4096], tmp[4200], path[4400];
    if (mkdir_p(dir) != 0) die("cannot create checkpoint.dir %s: %s", dir, strerror(errno));
    checkpoint_step_dir(final, sizeof final, dir, s->state.step);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", final, (int)getpid());
    remove_dir(tmp);
    if (mkdir(tmp, 0755) != 0) die("cannot create %s: %s", tmp, strerror(errno));
    int n = 3 * t->count;
    struct st_tensor *ts = xcalloc(n, sizeof *ts);
    char (*names)[PARAM_NAME_MAX + 32] = xcalloc(n, sizeof *names);
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
            json_array_append_new(tensors, tensor_json(p, names[k], XXH3_64bits(data, ts[k].nbytes)));
        }
    snprintf(path, sizeof path, "%s/%s", tmp, RANK_FILE);
    char step_text[32];
    snprintf(step_text, sizeof step_text, "%d", s->state.step);
    const char *mk[] = {"format", "mtrain_step"}, *mv[] = {"pt", step_text};
    safetensors_save(path, ts, n, mk, mv, 2);
    if (crash_in_save) {
        fprintf(stderr, "mtrain: injected crash while saving step %d\n", s->state.step);
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    write_manifest(s, path, tensors);
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
    free(ts);
    free(names);
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

/* Find the manifest entry of name; check its shape against p. */
static json_t *find_entry(json_t *tensors, const char *name) {
    size_t i;
    json_t *e;
    json_array_foreach(tensors, i, e) {
        json_t *n = json_object_get(e, "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) return e;
    }
    return NULL;
}

static int shape_matches(json_t *e, const struct param_info *p) {
    json_t *shape = json_object_get(e, "shape");
    if (!json_is_array(shape) || (int)json_array_size(shape) != p->ndim) return 0;
    for (int d = 0; d < p->ndim; d++)
        if (json_integer_value(json_array_get(shape, d)) != p->shape[d]) return 0;
    return 1;
}

static int load_tensors(const char *step_dir, json_t *tensors, const struct param_table *t, const struct backend *be,
                        float *bufs[3], char *err, size_t errlen) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", step_dir, RANK_FILE);
    struct st_file f;
    if (safetensors_open(&f, path, err, errlen) != 0) return -1;
    if ((int)json_array_size(tensors) != 3 * t->count) {
        safetensors_close(&f);
        return load_fail(err, errlen, -2, "%s: holds a model with a different set of tensors%s", step_dir, "");
    }
    int rc = 0;
    float *host = NULL;
    char name[PARAM_NAME_MAX + 32];
    for (int sec = 0; sec < 3 && !rc; sec++)
        for (int i = 0; i < t->count && !rc; i++) {
            const struct param_info *p = &t->items[i];
            snprintf(name, sizeof name, "%s%s", section_prefix[sec], p->name);
            json_t *e = find_entry(tensors, name);
            const struct st_entry *se = safetensors_find(&f, name);
            if (!e || !shape_matches(e, p)) {
                rc = load_fail(err, errlen, -2, "%s: tensor %s is missing or has another shape: the checkpoint "
                               "belongs to a different model shape than the recipe", step_dir, name);
                break;
            }
            if (!se || strcmp(se->dtype, "F32") || se->end - se->begin != sizeof(float) * p->numel) {
                rc = load_fail(err, errlen, -1, "%s: tensor %s is missing or malformed", path, name);
                break;
            }
            host = xrealloc(host, sizeof(float) * (p->numel ? p->numel : 1));
            if (safetensors_read(&f, se, host, err, errlen) != 0) {
                rc = -1;
                break;
            }
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(host, sizeof(float) * p->numel));
            json_t *want = json_object_get(e, "xxh3");
            if (!json_is_string(want) || strcmp(json_string_value(want), hex)) {
                snprintf(err, errlen, "%s: tensor %s: checksum mismatch (manifest %s, data %s): the file is damaged",
                         path, name, json_is_string(want) ? json_string_value(want) : "?", hex);
                rc = -1;
                break;
            }
            be->from_host(bufs[sec] + p->offset, host, sizeof(float) * p->numel);
        }
    free(host);
    safetensors_close(&f);
    return rc;
}

int checkpoint_load(const char *step_dir, const struct param_table *t, const struct backend *be, float *params,
                    float *m, float *v, struct train_state *st, char *err, size_t errlen) {
    char path[4400];
    snprintf(path, sizeof path, "%s/manifest.json", step_dir);
    json_error_t jerr;
    json_t *man = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!man) {
        snprintf(err, errlen, "%s: cannot read manifest (line %d: %s)", path, jerr.line, jerr.text);
        return -1;
    }
    int rc;
    json_t *fmt = json_object_get(man, "format"), *ver = json_object_get(man, "version");
    json_t *tensors = json_object_get(man, "tensors");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "mtrain-checkpoint") || !json_is_integer(ver) ||
        !json_is_array(tensors) || read_state(man, st) != 0) {
        rc = load_fail(err, errlen, -1, "%s: not an mtrain checkpoint manifest%s", path, "");
    } else if (json_integer_value(ver) != CHECKPOINT_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint format version %lld, this mtrain reads version %d", path,
                 (long long)json_integer_value(ver), CHECKPOINT_FORMAT_VERSION);
        rc = -1;
    } else {
        float *bufs[3] = {params, m, v};
        rc = load_tensors(step_dir, tensors, t, be, bufs, err, errlen);
    }
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
