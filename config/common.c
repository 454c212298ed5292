#define _GNU_SOURCE
#include "config/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void verror_message(const char *fmt, va_list ap) {
    fflush(stdout);
    fprintf(stderr, "mtrain: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}

void (*die_abort_hook)(int code);

void die_code(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror_message(fmt, ap);
    va_end(ap);
    if (die_abort_hook && gettid() == getpid()) die_abort_hook(code); /* does not return */
    /* From a helper thread (the data prefetcher, the checkpoint writer) the
     * main thread is still computing: exit() would run library destructors
     * (cuBLAS, OpenBLAS) under its feet, so end the process at once. */
    if (gettid() != getpid()) {
        fflush(NULL);
        _exit(code);
    }
    exit(code);
}

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "mtrain: warning: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

int set_error(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die("out of memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s) {
    char *p = strdup(s);
    if (!p) die("out of memory");
    return p;
}

FILE *xfopen(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    return f;
}

void xfwrite(const void *buf, size_t size, FILE *f, const char *path) {
    if (size && fwrite(buf, 1, size, f) != size) die("cannot write %s: %s", path, strerror(errno));
}

void xfclose(FILE *f, const char *path) {
    /* ferror: a buffered write that failed earlier (glibc drops the bytes; a later flush may succeed) */
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        die("cannot flush %s: %s", path, strerror(errno ? errno : EIO)); /* ferror alone leaves errno as it was */
    if (fclose(f) != 0) die("cannot close %s: %s", path, strerror(errno));
}

void write_file_atomic(const char *path, const void *buf, size_t size) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = xfopen(tmp, "wb");
    xfwrite(buf, size, f, tmp);
    xfclose(f, tmp);
    if (rename(tmp, path) != 0) die("cannot rename %s to %s: %s", tmp, path, strerror(errno));
}

void copy_file(const char *src, const char *dst) {
    FILE *in = xfopen(src, "rb");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dst, (int)getpid());
    FILE *out = xfopen(tmp, "wb");
    char *buf = xmalloc(1 << 20);
    size_t got;
    while ((got = fread(buf, 1, 1 << 20, in)) > 0) xfwrite(buf, got, out, tmp);
    if (ferror(in)) die("cannot read %s: %s", src, strerror(errno));
    free(buf);
    fclose(in);
    xfclose(out, tmp);
    if (rename(tmp, dst) != 0) die("cannot rename %s to %s: %s", tmp, dst, strerror(errno));
}

char *read_file(const char *path, size_t *size_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap + 1);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = xrealloc(buf, (cap *= 2) + 1);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return NULL; }
    buf[n] = 0;
    if (size_out) *size_out = n;
    return buf;
}

int mkdir_p(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* absent only when the system says so (ENOENT, ENOTDIR): an I/O or
 * permission error must not pass for "absent" (a checkpoint step would be
 * taken for an interrupted one and removed) */
int path_exists(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    if (errno != ENOENT && errno != ENOTDIR) die("cannot stat %s: %s", path, strerror(errno));
    return 0;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t hash_string(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}
