/* safetensors files: 8-byte little-endian header length, JSON header
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the raw little-endian data. Any tool that reads safetensors reads ours. */
#pragma once
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

struct st_tensor {
    const char *name;
    const char *dtype;          /* "F32", "BF16", "F16", "I32", "I64", "U8" ... */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;           /* host memory */
    size_t nbytes;
};

/* Write tensors (and optional string->string metadata pairs) to path
 * atomically. Dies with the path on an I/O error. */
void safetensors_save(const char *path, const struct st_tensor *tensors, int n, const char *const *meta_keys,
                      const char *const *meta_values, int n_meta);

/* Streaming writer: the header (names, dtypes, shapes) first, then each
 * tensor's bytes in order, so a file is written with one tensor in memory.
 * Written to PATH.tmp.PID and renamed on close. */
struct st_writer {
    FILE *f;
    char *path, *tmp;
    const struct st_tensor *meta;
    int n, next;
};
void st_writer_open(struct st_writer *w, const char *path, const struct st_tensor *meta, int n,
                    const char *const *meta_keys, const char *const *meta_values, int n_meta);
void st_writer_put(struct st_writer *w, const void *data, size_t nbytes);
void st_writer_close(struct st_writer *w);

struct st_entry {
    char *name;
    char dtype[16];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;        /* relative to the data section */
};

struct st_file {
    char *path;
    int fd;
    uint64_t data_start;
    struct st_entry *entries;
    int count;
    char *metadata_json;        /* the __metadata__ object as JSON text, or NULL */
};

/* Open and validate the header (offsets contiguous, in bounds, sizes match
 * dtype and shape). Returns 0, or -1 with a message naming the file in err. */
int safetensors_open(struct st_file *f, const char *path, char *err, size_t errlen);
void safetensors_close(struct st_file *f);
const struct st_entry *safetensors_find(const struct st_file *f, const char *name);
/* Bytes per element of a dtype string, 0 if unknown. */
int safetensors_dtype_size(const char *dtype);
/* Read one tensor's raw bytes into dst (entry->end - entry->begin bytes). */
int safetensors_read(const struct st_file *f, const struct st_entry *e, void *dst, char *err, size_t errlen);
/* Read a tensor as fp32 (converting BF16/F16), into dst of numel floats. */
int safetensors_read_f32(const struct st_file *f, const struct st_entry *e, float *dst, char *err, size_t errlen);
