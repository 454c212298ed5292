/* Checkpoint throughput: write (sync), read + verify, and the training stall
 * of an async save, for the state of a Llama with about 1 GB of fp32
 * parameters + AdamW moments.
 *
 *   bench_checkpoint DIR
 *
 * Prints one JSON object. */
#include <string.h>

#include "checkpoint/async_save.h"
#include "checkpoint/checkpoint.h"
#include "config/common.h"
#include "model/init.h"

int main(int argc, char **argv) {
    if (argc != 2) die("usage: bench_checkpoint DIR");
    static struct recipe r;
    recipe_defaults(&r);
    r.model.num_layers = 12, r.model.hidden_size = 768, r.model.num_heads = 12, r.model.num_kv_heads = 4;
    r.model.intermediate_size = 2048, r.model.vocab_size = 8192;
    snprintf(r.checkpoint.dir, sizeof r.checkpoint.dir, "%s", argv[1]);
    r.checkpoint.keep_last = 1;
    const struct backend *be = backend_get("cpu", "fp32");
    struct param_table t;
    struct model_part part;
    model_part_full(&part, &r.model);
    param_table_build(&t, &r.model, &part);
    size_t bytes = sizeof(float) * t.total;
    float *p = be->alloc(bytes);
    struct optimizer opt;
    struct master ms;
    master_create(&ms, be, &t, p, p);
    optimizer_create(&opt, be, &ms, &r.optimizer, NULL, NULL, 0, NULL);
    params_init(be, p, &t, 1, 0);
    params_init(be, opt.group[0].m, &t, 2, 0);
    params_init(be, opt.group[0].v, &t, 3, 0);
    struct train_state st = {.step = 1, .lr_scale = 1};
    struct ckpt_snapshot snap;
    struct ckpt_layout layout = {.tp = 1, .pp = 1, .dp = 1, .vpp = 1, .writer = 1};
    ckpt_snapshot_init(&snap, &r, &t, &layout);

    ckpt_snapshot_take(&snap, &ms, &opt, &st); /* first touch of the host buffer, as in a run's first save */
    double t0 = now_seconds();
    ckpt_snapshot_take(&snap, &ms, &opt, &st);
    double snap_s = now_seconds() - t0;
    checkpoint_write(&snap, r.checkpoint.dir, 0);
    double write_s = now_seconds() - t0;

    char dir[4096], err[2048];
    checkpoint_step_dir(dir, sizeof dir, r.checkpoint.dir, 1);
    struct train_state back;
    float *host = xmalloc(3 * bytes);
    double read_first_s = 0, read_s = 0;
    for (int round = 0; round < 2; round++) { /* the first also faults the fresh buffer in */
        t0 = now_seconds();
        if (checkpoint_load(dir, &t, host, host + t.total, host + 2 * t.total, &back, err, sizeof err) != 0) die("%s", err);
        *(round ? &read_s : &read_first_s) = now_seconds() - t0;
    }

    st.step = 2; /* async: the stall is the snapshot; the write overlaps "training" */
    struct async_saver saver = {0};
    t0 = now_seconds();
    ckpt_snapshot_take(&snap, &ms, &opt, &st);
    checkpoint_prepare(r.checkpoint.dir, st.step);
    async_saver_start(&saver, &snap, r.checkpoint.dir, 0);
    double stall_s = now_seconds() - t0;
    async_saver_wait(&saver);
    checkpoint_commit(&snap, r.checkpoint.dir);
    double async_total_s = now_seconds() - t0;

    double gb = 3.0 * bytes / 1e9;
    printf("{\"state_gb\":%.3f,\"write_s\":%.3f,\"write_gbps\":%.3f,\"read_verify_s\":%.3f,\"read_gbps\":%.3f,"
           "\"read_first_s\":%.3f,\"snapshot_s\":%.3f,\"async_stall_s\":%.3f,\"async_total_s\":%.3f}\n",
           gb, write_s, gb / write_s, read_s, gb / read_s, read_first_s, snap_s, stall_s, async_total_s);
    ckpt_snapshot_free(&snap);
    free(host);
    optimizer_free(&opt);
    master_free(&ms);
    be->free(p);
    param_table_free(&t);
    return 0;
}
