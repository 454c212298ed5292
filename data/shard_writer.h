/* Writes a token dataset (docs/formats.md): tokens and document ends go in,
 * zstd frames and shard files come out, the index is written last. The whole
 * directory is built in OUT.tmp-PID/ and renamed to OUT only when complete,
 * so a crash or failure never leaves a partial OUT behind. */
#pragma once
#include <stdint.h>

#define SHARD_DEFAULT_FRAME_TOKENS 16384
#define SHARD_DEFAULT_SHARD_BYTES (256ll << 20)
#define SHARD_DEFAULT_LEVEL 3

struct shard_writer_opts {
    int vocab_size;          /* ids are 0..vocab_size-1; > 65536 stores uint32 */
    int64_t eod_id;          /* recorded in the index; -1: no EOD token */
    int64_t frame_tokens;    /* tokens per zstd frame (0: default) */
    int64_t shard_bytes;     /* compressed bytes per shard before rolling over (0: default) */
    int level;               /* zstd level (0: default) */
    int force;               /* replace an existing dataset at OUT */
    const char *tokenizer_record; /* JSON stored in the index (data/tokenizer_record.h); NULL: none */
};

struct shard_writer_stats {
    int64_t docs, tokens, frames, shards;
    int64_t raw_bytes;        /* token bytes before compression */
    int64_t compressed_bytes; /* sum of shard sizes */
};

struct shard_writer;

/* Checks OUT (refuses a non-empty OUT unless opts->force), removes stale
 * OUT.tmp-PID directories of dead builds, creates OUT.tmp-PID/. Dies on error. */
struct shard_writer *shard_writer_open(const char *out_dir, const struct shard_writer_opts *opts);
/* Append tokens to the current document. */
void shard_writer_add(struct shard_writer *w, const int32_t *tokens, int64_t n);
/* End the current document (the caller appends an EOD token first if wanted). */
void shard_writer_end_doc(struct shard_writer *w);
/* Flush, write the index, rename into place, free w. Tokens after the last
 * end_doc form a final document. stats may be NULL. */
void shard_writer_finish(struct shard_writer *w, struct shard_writer_stats *stats);
/* Remove the temporary directory and free w (for callers that hit an error). */
void shard_writer_abort(struct shard_writer *w);
/* Directory being written (OUT.tmp-PID), for messages. */
const char *shard_writer_tmp_dir(const struct shard_writer *w);
/* Recursively delete a directory tree; returns 0 or -1 with errno set. */
int remove_tree(const char *path);
