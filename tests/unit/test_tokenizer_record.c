/* The dataset's tokenizer record (format version 2): written into the index
 * by the writer, read back field for field; a version 1 index (no record,
 * made here by rewriting a version 2 one as mtrain before 2026-11 wrote it)
 * still opens with the same tokens; `model.vocab_size: auto` resolves from
 * the record and fails with a message without one. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "config/common.h"
#include "config/recipe.h"
#include "data/dataset.h"
#include "data/shard_format.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "tests/unit/check.h"

static char base[] = "/tmp/mtrain-test-record.XXXXXX";

static void write_dataset(const char *dir, const char *record, int vocab, int ndocs) {
    struct shard_writer_opts o = {.vocab_size = vocab, .eod_id = vocab - 1, .frame_tokens = 7, .force = 1,
                                  .tokenizer_record = record};
    struct shard_writer *w = shard_writer_open(dir, &o);
    for (int d = 0; d < ndocs; d++) {
        int32_t t[5] = {d % vocab, (d * 7) % vocab, 3, 1, vocab - 1};
        shard_writer_add(w, t, 5);
        shard_writer_end_doc(w);
    }
    shard_writer_finish(w, NULL);
}

/* Rewrite DIR's version 2 index as version 1: no record, a new trailer. */
static void downgrade_to_v1(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, DATASET_INDEX_NAME);
    size_t n;
    uint8_t *b = (uint8_t *)read_file(path, &n);
    uint64_t rlen = get_u64(b + IDX_RECORD_BYTES);
    size_t body = n - INDEX_TRAILER_BYTES - rlen;
    put_u32(b + IDX_VERSION, 1);
    put_u64(b + IDX_RECORD_BYTES, 0);
    put_u64(b + body, XXH3_64bits(b, body));
    write_file_atomic(path, b, body + INDEX_TRAILER_BYTES);
    free(b);
}

static int same_tokens(const char *a, const char *b) {
    struct dataset *x = dataset_open(a), *y = dataset_open(b);
    int64_t n = dataset_num_tokens(x);
    int ok = n == dataset_num_tokens(y) && dataset_num_docs(x) == dataset_num_docs(y);
    int32_t *tx = xmalloc((size_t)n * sizeof *tx), *ty = xmalloc((size_t)n * sizeof *ty);
    if (ok) {
        dataset_read(x, 0, n, tx);
        dataset_read(y, 0, n, ty);
        ok = !memcmp(tx, ty, (size_t)n * sizeof *tx);
    }
    free(tx);
    free(ty);
    dataset_close(x);
    dataset_close(y);
    return ok;
}

int main(void) {
    if (!mkdtemp(base)) die("mkdtemp: cannot create %s", base);
    char v2[256], v1[256], bad[256];
    snprintf(v2, sizeof v2, "%s/v2", base);
    snprintf(v1, sizeof v1, "%s/v1", base);

    /* the bytes tokenizer's record, through the writer and back */
    char err[512];
    struct tokenizer *t = tokenizer_open("bytes", NULL, err, sizeof err);
    char *json = tokenizer_record_json(t, 1, 0);
    tokenizer_close(t);
    write_dataset(v2, json, 257, 40);
    write_dataset(v1, json, 257, 40);
    downgrade_to_v1(v1);
    char *back = NULL;
    int version = 0;
    int rc = tokenizer_record_read(v2, &back, &version, err, sizeof err);
    TEST_RESULT("record_roundtrip", rc == 1 && version == 2 && back && !strcmp(back, json), "rc %d version %d: %s", rc,
                version, rc < 0 ? err : back ? back : "(none)");
    struct tokenizer_record rec;
    rc = back ? tokenizer_record_parse(back, &rec, err, sizeof err) : -1;
    TEST_RESULT("record_fields", rc == 0 && !strcmp(rec.kind, "bytes") && rec.vocab_size == 257 &&
                rec.eos_id == 256 && rec.eod_id == 256 && rec.bos_id == -1,
                "rc %d kind '%s' vocab %d eos %lld eod %lld bos %lld", rc, rec.kind, rec.vocab_size,
                (long long)rec.eos_id, (long long)rec.eod_id, (long long)rec.bos_id);
    if (rc == 0) tokenizer_record_free(&rec);
    free(back);
    free(json);

    /* version 1: opens, same tokens, no record */
    back = NULL;
    rc = tokenizer_record_read(v1, &back, &version, err, sizeof err);
    TEST_RESULT("record_v1_has_none", rc == 0 && version == 1 && !back, "rc %d version %d", rc, version);
    TEST_RESULT("record_v1_reads_same_tokens", same_tokens(v1, v2), "the version 1 copy reads other tokens");

    /* a damaged record is caught by the trailer checksum */
    snprintf(bad, sizeof bad, "%s/bad", base);
    write_dataset(bad, "{\"tokenizer\":\"bytes\",\"vocab_size\":257}", 257, 3);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", bad, DATASET_INDEX_NAME);
    size_t n;
    char *idx = read_file(path, &n);
    idx[n - INDEX_TRAILER_BYTES - 3] ^= 1;
    write_file_atomic(path, idx, n);
    free(idx);
    rc = tokenizer_record_read(bad, &back, NULL, err, sizeof err);
    TEST_RESULT("record_damage_detected", rc == -1 && strstr(err, "damaged"), "rc %d: %s", rc, err);

    /* vocab auto */
    static struct recipe r;
    recipe_defaults(&r);
    r.model.vocab_size = RECIPE_VOCAB_AUTO;
    snprintf(r.data.path, sizeof r.data.path, "%s", v2);
    rc = tokenizer_record_resolve_vocab(&r);
    TEST_RESULT("vocab_auto_from_record", rc == 0 && r.model.vocab_size == 257, "rc %d vocab %d", rc, r.model.vocab_size);
    r.model.vocab_size = RECIPE_VOCAB_AUTO;
    snprintf(r.data.path, sizeof r.data.path, "%s", v1);
    fprintf(stderr, "(an error line about %s is expected)\n", v1);
    rc = tokenizer_record_resolve_vocab(&r);
    TEST_RESULT("vocab_auto_without_record_fails", rc == -1 && r.model.vocab_size == RECIPE_VOCAB_AUTO, "rc %d", rc);

    remove_tree(base);
    TEST_EXIT();
}
