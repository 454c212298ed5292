/* Shared helpers every folder may use: fatal errors with file:line, checked
 * allocation and stdio, timing. Exit codes follow the CLI contract:
 * 0 ok, 1 runtime failure, 2 usage or recipe error. */
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* Print "mtrain: error: ..." (and a newline) to stderr. */
void verror_message(const char *fmt, va_list ap);
/* Print "mtrain: error: ..." and exit with code. */
void die_code(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
#define die(...) die_code(EXIT_RUNTIME, __VA_ARGS__)
/* Set on multi-rank runs (parallel/grid.c parallel_abort_on_error): after
 * its message die_code calls it on the main thread to end every rank at
 * once (MPI_Abort), instead of leaving the others waiting for this one. */
extern void (*die_abort_hook)(int code);
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Format a message into err[n] for the caller to report; returns -1. */
int set_error(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Report an internal failure of a library call with the call site. */
#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) die("%s:%d: check failed: %s", __FILE__, __LINE__, #cond); \
    } while (0)

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* Checked stdio: the path is used in error messages. */
FILE *xfopen(const char *path, const char *mode);
void xfwrite(const void *buf, size_t size, FILE *f, const char *path);
void xfclose(FILE *f, const char *path);
/* Write the whole buffer to path atomically (tmp file, fsync, rename). */
void write_file_atomic(const char *path, const void *buf, size_t size);
/* Copy src to dst atomically, 1 MiB at a time (dies naming the file on error). */
void copy_file(const char *src, const char *dst);
/* Read a whole file; returns NULL and sets *err (static string) on failure. */
char *read_file(const char *path, size_t *size_out);
int mkdir_p(const char *path);
int path_exists(const char *path);

double now_seconds(void);
/* 64-bit hash of a string (FNV-1a), used to key per-tensor RNG streams. */
uint64_t hash_string(const char *s);
