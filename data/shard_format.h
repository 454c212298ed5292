/* On-disk layout of a token dataset (docs/formats.md, format version 2),
 * shared by the writer and the reader so the two cannot drift apart.
 * Everything is little-endian; the helpers below encode byte by byte so the
 * files are the same on any host. */
#pragma once
#include <stdint.h>
#include <string.h>

#define DATASET_MAGIC "MTRNDSET"       /* 8 bytes, no terminator on disk */
#define DATASET_VERSION 2              /* 2 adds the tokenizer record; version 1 is still read */
#define DATASET_RECORD_MAX (16u << 20) /* largest tokenizer record a reader accepts */
#define DATASET_INDEX_NAME "index.mtd"
#define DATASET_SHARD_FMT "shard-%05d.zst"
#define DATASET_NO_EOD 0xFFFFFFFFu     /* eod field when the tokenizer has none */

#define INDEX_HEADER_BYTES 64
#define INDEX_FRAME_BYTES 32
#define INDEX_TRAILER_BYTES 8          /* XXH3-64 of everything before it */

/* Header field offsets. */
enum {
    IDX_MAGIC = 0, IDX_VERSION = 8, IDX_DTYPE = 12, IDX_VOCAB = 16, IDX_EOD = 20,
    IDX_SHARDS = 24, IDX_FRAME_TOKENS = 28, IDX_FRAMES = 32, IDX_DOCS = 40,
    IDX_TOKENS = 48, IDX_RECORD_BYTES = 56, /* version 2: tokenizer record length; version 1: reserved */
    IDX_RESERVED = IDX_RECORD_BYTES,
};
/* Frame record field offsets. */
enum { FR_SHARD = 0, FR_TOKENS = 4, FR_OFFSET = 8, FR_CSIZE = 16, FR_HASH = 24 };

static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
/* Little-endian loads: a plain (vectorisable) load on little-endian hosts,
 * byte by byte elsewhere. */
static inline uint16_t get_u16(const uint8_t *p) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#else
    return (uint16_t)(p[0] | p[1] << 8);
#endif
}
static inline uint32_t get_u32(const uint8_t *p) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#else
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
#endif
}
static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Token width on disk for a vocabulary: uint16 when every id fits. */
static inline int dataset_dtype_bytes(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }
