/* Reading build inputs: plain files, or zstd-compressed ones (.zst, or any
 * file starting with the zstd magic) decompressed while streaming. Gzip is
 * recognized and refused with a clear message: zlib is not a dependency. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct text_input;

/* Opens path; returns NULL with a one-line reason in err. */
struct text_input *text_input_open(const char *path, char *err, size_t errsz);
/* Reads up to cap decompressed bytes; returns the count (0 at the end) or -1
 * with the reason (naming the file and the compressed offset) in err. */
long text_input_read(struct text_input *in, char *buf, size_t cap, char *err, size_t errsz);
/* Bytes read from disk so far (compressed bytes for .zst), for progress. */
uint64_t text_input_disk_bytes(const struct text_input *in);
void text_input_close(struct text_input *in);
/* Size on disk, or -1 if unknown (a pipe). Also refuses .gz up front:
 * returns -2 with a message in err. */
int64_t text_input_check(const char *path, char *err, size_t errsz);
