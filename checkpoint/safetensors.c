#define _GNU_SOURCE
#include "checkpoint/safetensors.h"
#include "kernels/bf16.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/common.h"

static const struct {
    const char *name;
    int size;
} dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
              {"I8", 1},  {"U8", 1},  {"U16", 2}, {"U32", 4},  {"U64", 8}, {"BOOL", 1}};

int safetensors_dtype_size(const char *dtype) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, dtype)) return dtypes[i].size;
    return 0;
}

/* A write that fails (a full disk, a file size limit) removes the partial
 * temporary file before saying so: nothing half-written is left behind, and
 * what was there under the final name is untouched. */
static void put(struct st_writer *w, const void *data, size_t nbytes) {
    if (!nbytes || fwrite(data, 1, nbytes, w->f) == nbytes) return;
    int e = errno;
    fclose(w->f);
    unlink(w->tmp);
    die("cannot write %s: %s (the partial file is removed; %s is as it was)", w->tmp, strerror(e), w->path);
}

void st_writer_open(struct st_writer *w, const char *path, const struct st_tensor *tensors, int n,
                    const char *const *meta_keys, const char *const *meta_values, int n_meta) {
    memset(w, 0, sizeof *w);
    json_t *root = json_object();
    CHECK(root);
    uint64_t offset = 0;
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (int i = 0; i < n_meta; i++) CHECK(json_object_set_new(meta, meta_keys[i], json_string(meta_values[i])) == 0);
        CHECK(json_object_set_new(root, "__metadata__", meta) == 0);
    }
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < tensors[i].ndim; d++) CHECK(json_array_append_new(shape, json_integer(tensors[i].shape[d])) == 0);
        json_t *t = json_pack("{s:s, s:o, s:[I,I]}", "dtype", tensors[i].dtype, "shape", shape, "data_offsets",
                              (json_int_t)offset, (json_int_t)(offset + tensors[i].nbytes));
        CHECK(t);
        if (json_object_set_new(root, tensors[i].name, t) != 0) die("%s: cannot add tensor %s", path, tensors[i].name);
        offset += tensors[i].nbytes;
    }
    char *header = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK(header);
    json_decref(root);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    w->f = xfopen(tmp, "wb");
    w->tmp = xstrdup(tmp);
    w->path = xstrdup(path);
    w->meta = tensors;
    w->n = n;
    uint8_t len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    put(w, len_le, 8);
    put(w, header, hlen);
    for (size_t i = hlen; i < padded; i++) put(w, " ", 1);
    free(header);
}

void st_writer_put(struct st_writer *w, const void *data, size_t nbytes) {
    CHECK(w->next < w->n && w->meta[w->next].nbytes == nbytes);
    w->next++;
    put(w, data, nbytes);
}

void st_writer_close(struct st_writer *w) {
    CHECK(w->next == w->n);
    if (fflush(w->f) != 0 || ferror(w->f) || fsync(fileno(w->f)) != 0 || fclose(w->f) != 0) {
        int e = errno ? errno : EIO;
        unlink(w->tmp);
        die("cannot write %s: %s (the partial file is removed; %s is as it was)", w->tmp, strerror(e), w->path);
    }
    if (rename(w->tmp, w->path) != 0) die("cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
    free(w->tmp);
    free(w->path);
    memset(w, 0, sizeof *w);
}

void safetensors_save(const char *path, const struct st_tensor *tensors, int n, const char *const *meta_keys,
                      const char *const *meta_values, int n_meta) {
    struct st_writer w;
    st_writer_open(&w, path, tensors, n, meta_keys, meta_values, n_meta);
    for (int i = 0; i < n; i++) st_writer_put(&w, tensors[i].data, tensors[i].nbytes);
    st_writer_close(&w);
}

static int fail(char *err, size_t errlen, const char *path, const char *what) {
    snprintf(err, errlen, "%s: %s", path, what);
    return -1;
}

static int cmp_begin(const void *a, const void *b) {
    const struct st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parse one tensor entry of the header into e; returns an error text or NULL.
 * e->name is set (allocated) only when the entry is good, so a failed entry
 * owns no memory. */
static const char *parse_entry(const char *name, json_t *v, struct st_entry *e) {
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
        return "entry needs dtype, shape and data_offsets";
    int size = safetensors_dtype_size(json_string_value(dtype));
    if (!size) return "unknown dtype";
    if (json_array_size(shape) > ST_MAX_DIMS) return "too many dimensions";
    snprintf(e->dtype, sizeof e->dtype, "%s", json_string_value(dtype));
    e->ndim = (int)json_array_size(shape);
    /* the byte count must fit in 63 bits; a zero dimension makes any shape empty */
    uint64_t numel = 1, limit = (uint64_t)INT64_MAX / (uint64_t)size;
    int zero = 0, big = 0;
    for (int d = 0; d < e->ndim; d++) {
        json_t *x = json_array_get(shape, d);
        if (!json_is_integer(x) || json_integer_value(x) < 0) return "shape must be non-negative integers";
        e->shape[d] = json_integer_value(x);
        if (!e->shape[d]) zero = 1;
        else if (numel > limit / (uint64_t)e->shape[d]) big = 1;
        else numel *= (uint64_t)e->shape[d];
    }
    if (zero) numel = 0;
    else if (big) return "shape too large";
    json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return "bad data_offsets";
    e->begin = json_integer_value(b), e->end = json_integer_value(en);
    if (e->end - e->begin != numel * (uint64_t)size) return "data_offsets do not match dtype x shape";
    e->name = xstrdup(name);
    return NULL;
}

int safetensors_open(struct st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    f->fd = open(path, O_RDONLY);
    if (f->fd < 0) return fail(err, errlen, path, strerror(errno));
    f->path = xstrdup(path);
    struct stat st;
    uint8_t len_le[8];
    if (fstat(f->fd, &st) != 0 || pread(f->fd, len_le, 8, 0) != 8) {
        safetensors_close(f);
        return fail(err, errlen, path, "file shorter than the 8-byte header length");
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len_le[i] << (8 * i);
    if (hlen > 100000000 || 8 + hlen > (uint64_t)st.st_size) {
        safetensors_close(f);
        return fail(err, errlen, path, "header length past the end of the file");
    }
    char *text = xmalloc(hlen + 1);
    if (pread(f->fd, text, hlen, 8) != (ssize_t)hlen) {
        free(text);
        safetensors_close(f);
        return fail(err, errlen, path, "cannot read header");
    }
    text[hlen] = 0;
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(root)) {
        char what[300];
        snprintf(what, sizeof what, "header is not valid JSON (offset %d: %s)", jerr.position + 8, jerr.text);
        json_decref(root);
        safetensors_close(f);
        return fail(err, errlen, path, what);
    }
    f->data_start = 8 + hlen;
    f->entries = xcalloc(json_object_size(root), sizeof *f->entries);
    const char *key;
    json_t *v;
    const char *problem = NULL;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            f->metadata_json = json_dumps(v, JSON_COMPACT);
            continue;
        }
        if ((problem = parse_entry(key, v, &f->entries[f->count]))) break;
        f->count++;
    }
    json_decref(root);
    if (!problem) {
        /* tensors must tile the data section exactly, as the reference reader demands */
        struct st_entry *sorted = xmalloc(sizeof *sorted * (f->count ? f->count : 1));
        memcpy(sorted, f->entries, sizeof *sorted * f->count);
        qsort(sorted, f->count, sizeof *sorted, cmp_begin);
        uint64_t pos = 0;
        for (int i = 0; i < f->count && !problem; i++) {
            if (sorted[i].begin != pos) problem = "tensor data is not contiguous";
            pos = sorted[i].end;
        }
        if (!problem && f->data_start + pos != (uint64_t)st.st_size) problem = "file size does not match the header";
        free(sorted);
    }
    if (problem) {
        safetensors_close(f);
        return fail(err, errlen, path, problem);
    }
    return 0;
}

void safetensors_close(struct st_file *f) {
    if (f->path) close(f->fd); /* path is set only once the file is open */
    for (int i = 0; i < f->count; i++) free(f->entries[i].name);
    free(f->entries);
    free(f->path);
    free(f->metadata_json);
    memset(f, 0, sizeof *f);
}

const struct st_entry *safetensors_find(const struct st_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
    return NULL;
}

int safetensors_read(const struct st_file *f, const struct st_entry *e, void *dst, char *err, size_t errlen) {
    size_t n = e->end - e->begin, done = 0;
    while (done < n) {
        ssize_t got = pread(f->fd, (char *)dst + done, n - done, f->data_start + e->begin + done);
        if (got <= 0) {
            snprintf(err, errlen, "%s: tensor %s: read failed at offset %llu", f->path, e->name,
                     (unsigned long long)(f->data_start + e->begin + done));
            return -1;
        }
        done += got;
    }
    return 0;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, mant = h & 1023, bits;
    if (exp == 0) {
        float v = mant / 16777216.0f; /* subnormal: mant * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
    else bits = sign | ((exp + 112) << 23) | (mant << 13);
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

int safetensors_read_f32(const struct st_file *f, const struct st_entry *e, float *dst, char *err, size_t errlen) {
    if (!strcmp(e->dtype, "F32")) return safetensors_read(f, e, dst, err, errlen);
    if (strcmp(e->dtype, "BF16") && strcmp(e->dtype, "F16")) {
        snprintf(err, errlen, "%s: tensor %s has dtype %s, expected F32, BF16 or F16", f->path, e->name, e->dtype);
        return -1;
    }
    size_t n = (e->end - e->begin) / 2;
    uint16_t *raw = xmalloc(n * 2);
    int rc = safetensors_read(f, e, raw, err, errlen);
    int bf16 = !strcmp(e->dtype, "BF16");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        dst[i] = bf16 ? bf16_to_float(raw[i]) : half_to_float(raw[i]);
    }
    free(raw);
    return rc;
}
