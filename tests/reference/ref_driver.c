/* Test driver for the PyTorch reference comparison (tests/reference/llama_ref.py).
 *
 *   ref_driver grad  RECIPE WEIGHTS BATCHES OUTDIR
 *       one global batch: writes OUTDIR/logits.safetensors, OUTDIR/grads.safetensors
 *       (gradients of the mean token loss) and OUTDIR/loss.txt; for a MoE model also
 *       OUTDIR/experts.safetensors (each MoE layer's top-k experts per token, as floats)
 *       and OUTDIR/aux.txt (load-balancing and z-loss, means over sequences and layers); with MTP
 *       modules OUTDIR/mtp_loss.txt (mean over depths of each depth's mean token loss)
 *   ref_driver train RECIPE WEIGHTS BATCHES OUTDIR
 *       train.steps optimizer steps through trainer_step (the code path of
 *       `mtrain pretrain`): OUTDIR/losses.txt (loss grad_norm lr mtp_loss per line) and
 *       OUTDIR/params.safetensors
 *
 * BATCHES is raw little-endian int32: [steps][global_batch][seq_len+1]. */
#include <string.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "config/common.h"
#include "model/trainer.h"

static int32_t *read_batches(const char *path, size_t want) {
    size_t size = 0;
    char *buf = read_file(path, &size);
    if (!buf) die("cannot read %s", path);
    if (size != want * sizeof(int32_t)) die("%s: %zu bytes, expected %zu", path, size, want * sizeof(int32_t));
    return (int32_t *)buf;
}

/* Each MoE layer's expert choices of micro batch `first` (slot 0) into
 * experts[layer][sequence][t][k]. */
static void copy_experts(struct transformer *m, float *experts, int first, int n) {
    int T = m->T, k = m->K, B = m->B;
    int32_t *idx = xmalloc(sizeof(int32_t) * B * T * k);
    for (int l = 0, j = 0; l < m->L; l++) {
        if (!m->layers[l].moe) continue;
        m->be->to_host(idx, m->slots[0].acts[l].topi, sizeof(int32_t) * B * T * k);
        for (int i = 0; i < B * T * k; i++) experts[((size_t)j * n + first) * T * k + i] = (float)idx[i];
        j++;
    }
    free(idx);
}

static void grad_mode(struct trainer *tr, const int32_t *samples, const char *outdir) {
    const struct recipe *r = tr->recipe;
    struct transformer *m = &tr->model;
    int n = r->train.global_batch, B = r->train.micro_batch, T = r->train.seq_len, V = r->model.vocab_size;
    int nm = model_moe_layer_count(&r->model);
    float *logits = xmalloc(sizeof(float) * (size_t)n * T * V);
    float *experts = nm ? xmalloc(sizeof(float) * (size_t)nm * n * T * m->K) : NULL;
    double loss = 0;
    for (int first = 0; first < n; first += B) {
        for (int b = 0; b < B; b++) {
            memcpy(tr->inputs + b * T, samples + (size_t)(first + b) * (T + 1), sizeof(int32_t) * T);
            memcpy(tr->targets + b * T, samples + (size_t)(first + b) * (T + 1) + 1, sizeof(int32_t) * T);
        }
        loss += transformer_step(m, tr->inputs, tr->targets, 0.0f);
        m->be->to_host(logits + (size_t)first * T * V, m->slots[0].logits, sizeof(float) * B * T * V);
        if (nm) copy_experts(m, experts, first, n);
    }
    char path[2048];
    struct st_tensor t = {.name = "logits", .dtype = "F32", .ndim = 3, .shape = {n, T, V}, .data = logits,
                          .nbytes = sizeof(float) * (size_t)n * T * V};
    snprintf(path, sizeof path, "%s/logits.safetensors", outdir);
    safetensors_save(path, &t, 1, NULL, NULL, 0);
    /* gradients of the mean loss, accumulated over micro batches exactly as trainer_step does */
    m->be->zero(m->grads, sizeof(float) * m->table.total);
    transformer_reset_moe_stats(m);
    for (int first = 0; first < n; first += B) {
        for (int b = 0; b < B; b++) {
            memcpy(tr->inputs + b * T, samples + (size_t)(first + b) * (T + 1), sizeof(int32_t) * T);
            memcpy(tr->targets + b * T, samples + (size_t)(first + b) * (T + 1) + 1, sizeof(int32_t) * T);
        }
        transformer_step(m, tr->inputs, tr->targets, 1.0f / ((float)n * T));
    }
    snprintf(path, sizeof path, "%s/grads.safetensors", outdir);
    weights_save(m->be, m->grads, &m->table, path);
    snprintf(path, sizeof path, "%s/loss.txt", outdir);
    FILE *f = xfopen(path, "w");
    fprintf(f, "%.9g\n", loss / ((double)n * T));
    xfclose(f, path);
    if (nm) {
        struct st_tensor e = {.name = "experts", .dtype = "F32", .ndim = 4, .shape = {nm, n, T, m->K}, .data = experts,
                              .nbytes = sizeof(float) * (size_t)nm * n * T * m->K};
        snprintf(path, sizeof path, "%s/experts.safetensors", outdir);
        safetensors_save(path, &e, 1, NULL, NULL, 0);
        snprintf(path, sizeof path, "%s/aux.txt", outdir);
        f = xfopen(path, "w");
        double per = (double)n * model_moe_layer_count_all(&r->model);
        transformer_fetch_moe_stats(m);
        fprintf(f, "%.9g %.9g\n", m->moe_aux_sum / per, m->moe_z_sum / per);
        xfclose(f, path);
    }
    int D = model_mtp_depth(&r->model);
    if (D) {
        double mtp = 0;
        for (int d = 0; d < D; d++) mtp += m->mtp_loss[d] / ((double)n * (T - d - 1)) / D;
        snprintf(path, sizeof path, "%s/mtp_loss.txt", outdir);
        f = xfopen(path, "w");
        fprintf(f, "%.9g\n", mtp);
        xfclose(f, path);
    }
    free(experts);
    free(logits);
}

static void train_mode(struct trainer *tr, const int32_t *samples, const char *outdir) {
    const struct recipe *r = tr->recipe;
    size_t per_step = (size_t)r->train.global_batch * (r->train.seq_len + 1);
    char path[2048];
    snprintf(path, sizeof path, "%s/losses.txt", outdir);
    FILE *f = xfopen(path, "w");
    for (int s = 0; s < r->train.steps; s++) {
        struct step_stats st = trainer_step(tr, samples + s * per_step, r->train.global_batch);
        fprintf(f, "%.9g %.9g %.9g %.9g\n", st.loss, st.grad_norm, st.lr, st.mtp_loss);
    }
    xfclose(f, path);
    snprintf(path, sizeof path, "%s/params.safetensors", outdir);
    weights_save(tr->model.be, tr->model.params, &tr->model.table, path);
}

int main(int argc, char **argv) {
    if (argc != 6) die("usage: ref_driver grad|train RECIPE WEIGHTS BATCHES OUTDIR");
    static struct recipe r;
    recipe_defaults(&r);
    if (recipe_load(&r, argv[2]) != 0) return 2;
    struct trainer tr;
    struct grid g;
    grid_single(&g);
    trainer_create(&tr, backend_get("cpu", "fp32"), &r, &g);
    weights_load(tr.model.be, tr.model.params, &tr.model.table, argv[3]);
    int train = !strcmp(argv[1], "train");
    size_t steps = train ? r.train.steps : 1;
    int32_t *samples = read_batches(argv[4], steps * r.train.global_batch * (r.train.seq_len + 1));
    if (train) train_mode(&tr, samples, argv[5]);
    else grad_mode(&tr, samples, argv[5]);
    free(samples);
    trainer_free(&tr);
    return 0;
}
