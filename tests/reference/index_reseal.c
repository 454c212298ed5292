/* Test tool: recompute a dataset index's trailer (XXH3-64 of everything
 * before it, data/shard_format.h) after a test edited the index, so that the
 * edit reaches the parsers behind the checksum.
 *   index_reseal DIR/index.mtd */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#include "config/common.h"
#include "data/shard_format.h"

int main(int argc, char **argv) {
    if (argc != 2) die("usage: index_reseal INDEX");
    size_t size = 0;
    uint8_t *b = (uint8_t *)read_file(argv[1], &size);
    if (!b || size < INDEX_TRAILER_BYTES) die("%s: cannot read it or too short", argv[1]);
    uint64_t h = XXH3_64bits(b, size - INDEX_TRAILER_BYTES);
    for (int i = 0; i < 8; i++) b[size - INDEX_TRAILER_BYTES + i] = (uint8_t)(h >> (8 * i));
    write_file_atomic(argv[1], b, size);
    free(b);
    return 0;
}
