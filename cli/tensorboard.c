/* TensorBoard event files without TensorFlow: a TFRecord stream (u64 length,
 * masked CRC-32C of the length, the record, masked CRC-32C of the record) of
 * Event protobufs, hand-encoded:
 *   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                Summary summary = 5; SessionLog session_log = 7; }
 *   Summary    { repeated Value value = 1; }
 *   Value      { string tag = 1; float simple_value = 2; }
 *   SessionLog { enum status = 1 (START = 1); } */
#define _GNU_SOURCE
#include "cli/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* ---- CRC-32C, reflected polynomial 0x82F63B78 ---- */

static uint32_t crc_table[256];
static int crc_ready;

uint32_t tb_crc32c(const void *data, size_t n) {
    if (!crc_ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            crc_table[i] = c;
        }
        crc_ready = 1;
    }
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* TFRecord stores CRCs rotated and offset, so a CRC of data holding CRCs stays strong. */
uint32_t tb_masked_crc(const void *data, size_t n) {
    uint32_t c = tb_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* ---- protobuf encoding into a growable buffer ---- */

struct pb {
    uint8_t *p;
    size_t n, cap;
    int oom;
};

static void pb_bytes(struct pb *b, const void *src, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void pb_varint(struct pb *b, uint64_t v) {
    uint8_t out[10];
    int n = 0;
    do {
        out[n] = v & 0x7F;
        v >>= 7;
        if (v) out[n] |= 0x80;
        n++;
    } while (v);
    pb_bytes(b, out, n);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void pb_key(struct pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | wire); }

/* little-endian on every target mtrain builds for (x86-64, aarch64) */
static void pb_double(struct pb *b, int field, double v) {
    pb_key(b, field, WIRE_FIXED64);
    pb_bytes(b, &v, 8);
}

static void pb_float(struct pb *b, int field, float v) {
    pb_key(b, field, WIRE_FIXED32);
    pb_bytes(b, &v, 4);
}

static void pb_len(struct pb *b, int field, const void *data, size_t n) {
    pb_key(b, field, WIRE_LEN);
    pb_varint(b, n);
    pb_bytes(b, data, n);
}

/* ---- records ---- */

static int write_record(struct tb_writer *w, const struct pb *ev) {
    if (ev->oom) {
        errno = ENOMEM;
        return -1;
    }
    uint64_t len = ev->n;
    uint32_t len_crc = tb_masked_crc(&len, 8), data_crc = tb_masked_crc(ev->p, ev->n);
    if (fwrite(&len, 8, 1, w->f) != 1 || fwrite(&len_crc, 4, 1, w->f) != 1 ||
        (ev->n && fwrite(ev->p, ev->n, 1, w->f) != 1) || fwrite(&data_crc, 4, 1, w->f) != 1)
        return -1;
    return fflush(w->f) == 0 ? 0 : -1; /* TensorBoard reads while we train */
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec * 1e-6;
}

/* Event header: wall_time and step. */
static void event_begin(struct pb *ev, long long step) {
    pb_double(ev, 1, wall_time());
    pb_key(ev, 2, WIRE_VARINT);
    pb_varint(ev, (uint64_t)step);
}

int tb_open(struct tb_writer *w, const char *dir, int resume_step) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    long t = (long)wall_time();
    int fd = -1;
    for (int k = 0; fd < 0 && k < 100; k++) {
        if (k == 0) snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%ld.%s", dir, t, host);
        else snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%ld.%s.%d", dir, t, host, k);
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0 && errno != EEXIST) return -1;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        if (fd >= 0) close(fd);
        return -1;
    }
    struct pb ev = {0};
    event_begin(&ev, 0);
    static const char version[] = "brain.Event:2";
    pb_len(&ev, 3, version, sizeof version - 1);
    int rc = write_record(w, &ev);
    if (rc == 0 && resume_step >= 0) {
        ev.n = 0;
        event_begin(&ev, resume_step + 1);
        static const uint8_t start[] = {0x08, 0x01}; /* SessionLog{status: START} */
        pb_len(&ev, 7, start, sizeof start);
        rc = write_record(w, &ev);
    }
    free(ev.p);
    return rc;
}

/* ---- metrics.jsonl lines ---- */

#define TB_MAX_FIELDS 64

struct field {
    char key[64];
    double value;
};

/* Past a JSON string starting at p (on its opening quote); copies up to
 * n-1 characters (escapes kept as written) into out if given. NULL if unterminated. */
static const char *skip_string(const char *p, char *out, size_t n) {
    size_t k = 0;
    for (p++; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1]) p++;
        if (out && k + 1 < n) out[k++] = *p;
    }
    if (out && n) out[k] = 0;
    return *p == '"' ? p + 1 : NULL;
}

/* Past a JSON array or object starting at p. NULL if unbalanced. */
static const char *skip_nested(const char *p) {
    int depth = 0;
    do {
        if (*p == '"') {
            if (!(p = skip_string(p, NULL, 0))) return NULL;
            continue;
        }
        if (*p == '[' || *p == '{') depth++;
        else if (*p == ']' || *p == '}') depth--;
        else if (!*p) return NULL;
        p++;
    } while (depth > 0);
    return p;
}

/* The top-level numbers of one JSON object line, and its "event" name.
 * Returns the count, or -1 if the line is not an object we can read. */
static int scan_line(const char *p, struct field *fields, char *event, size_t event_n) {
    int n = 0;
    event[0] = 0;
    while (*p == ' ') p++;
    if (*p++ != '{') return -1;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == '}') return n;
        if (*p != '"') return -1;
        char key[64];
        if (!(p = skip_string(p, key, sizeof key))) return -1;
        while (*p == ' ') p++;
        if (*p++ != ':') return -1;
        while (*p == ' ') p++;
        if (*p == '"') {
            if (!(p = skip_string(p, !strcmp(key, "event") ? event : NULL, event_n))) return -1;
        } else if (*p == '[' || *p == '{') {
            if (!(p = skip_nested(p))) return -1;
        } else {
            char *end;
            double v = strtod(p, &end);
            if (end == p) { /* true, false, null */
                while (*p && *p != ',' && *p != '}') p++;
                continue;
            }
            if (n < TB_MAX_FIELDS) {
                snprintf(fields[n].key, sizeof fields[n].key, "%s", key);
                fields[n++].value = v;
            }
            p = end;
        }
    }
}

int tb_log_json_line(struct tb_writer *w, const char *line) {
    struct field fields[TB_MAX_FIELDS];
    char event[32];
    int n = scan_line(line, fields, event, sizeof event);
    if (n <= 0 || (event[0] && strcmp(event, "eval"))) return 0;
    long long step = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(fields[i].key, "step")) step = (long long)fields[i].value;
    if (step < 0) return 0;
    struct pb summary = {0}, value = {0}, ev = {0};
    int count = 0;
    for (int i = 0; i < n; i++) {
        const char *k = fields[i].key;
        if (!strcmp(k, "step") || !strcmp(k, "consumed_samples") || (event[0] && strcmp(k, "val_loss"))) continue;
        value.n = 0;
        pb_len(&value, 1, k, strlen(k));
        pb_float(&value, 2, (float)fields[i].value);
        if (value.oom) summary.oom = 1;
        else pb_len(&summary, 1, value.p, value.n);
        count++;
    }
    int rc = 0;
    if (count) {
        event_begin(&ev, step);
        if (summary.oom) ev.oom = 1;
        else pb_len(&ev, 5, summary.p, summary.n);
        rc = write_record(w, &ev);
    }
    free(summary.p), free(value.p), free(ev.p);
    return rc;
}

int tb_close(struct tb_writer *w) {
    if (!w->f) return 0;
    int rc = fclose(w->f);
    w->f = NULL;
    return rc == 0 ? 0 : -1;
}
