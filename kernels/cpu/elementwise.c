/* Embedding, SwiGLU, cross-entropy and vector helpers. Reductions use fixed
 * chunking (independent of the thread count) so results are bitwise repeatable. */
#include <math.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec_exp.h"

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vstart;
        if (row >= 0 && row < V) memcpy(out + (size_t)n * C, table + (size_t)row * C, sizeof(float) * C);
        else memset(out + (size_t)n * C, 0, sizeof(float) * C);
    }
}

/* Tokens are visited in order; threads split the channels, so every row of
 * dtable sums its contributions in the same order on every run. */
void cpu_embedding_backward(float *dtable, const int32_t *tokens, const float *dout, int N, int C, int vstart,
                            int V) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 64) {
        int c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < N; n++) {
            int r = tokens[n] - vstart;
            if (r < 0 || r >= V) continue;
            float *row = dtable + (size_t)r * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) row[c] += g[c];
        }
    }
}

static inline float silu(float x) { return x / (1.0f + vec_exp(-x)); }

void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = silu(gate[i]) * up[i];
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                         size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], sig = 1.0f / (1.0f + vec_exp(-g));
        float s = g * sig;
        dup[i] = dout[i] * s;
        dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    }
}

void cpu_cross_entropy(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * V;
        int tgt = targets[n];
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++) maxv = row[i] > maxv ? row[i] : maxv;
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - maxv);
        double logz = log(sum) + maxv;
        losses[n] = tgt < 0 ? 0.0f : (float)(logz - row[tgt]);
        if (dscale == 0.0f) continue;
        if (tgt < 0) {
            memset(row, 0, sizeof(float) * V);
            continue;
        }
        for (int i = 0; i < V; i++) row[i] = (float)exp((double)row[i] - logz) * dscale;
        row[tgt] -= dscale;
    }
}

void cpu_ce_row_max(float *rowmax, const float *logits, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++) maxv = row[i] > maxv ? row[i] : maxv;
        rowmax[n] = maxv;
    }
}

void cpu_ce_row_sumexp(float *sumexp, float *target_logit, const float *logits, const int32_t *targets,
                       const float *rowmax, int N, int V, int vstart) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - rowmax[n]);
        sumexp[n] = (float)sum;
        int t = targets[n] - vstart;
        target_logit[n] = (t >= 0 && t < V) ? row[t] : 0.0f;
    }
}

void cpu_ce_finish(float *losses, float *logits, const int32_t *targets, const float *rowmax, const float *sumexp,
                   const float *target_logit, int N, int V, int vstart, float dscale) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        double logz = log((double)sumexp[n]) + rowmax[n];
        int ignore = targets[n] < 0;
        losses[n] = ignore ? 0.0f : (float)(logz - target_logit[n]);
        if (dscale == 0.0f) continue;
        float *row = logits + (size_t)n * V;
        if (ignore) {
            memset(row, 0, sizeof(float) * V);
            continue;
        }
        for (int i = 0; i < V; i++) row[i] = (float)exp((double)row[i] - logz) * dscale;
        int t = targets[n] - vstart;
        if (t >= 0 && t < V) row[t] -= dscale;
    }
}

void cpu_add(float *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void cpu_scale(float *x, float s, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

#define REDUCE_CHUNKS 64
static double reduce(const float *x, size_t n, int square) {
    double part[REDUCE_CHUNKS];
    size_t per = (n + REDUCE_CHUNKS - 1) / REDUCE_CHUNKS;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < REDUCE_CHUNKS; c++) {
        size_t lo = c * per, hi = lo + per < n ? lo + per : n;
        double acc = 0;
        for (size_t i = lo; i < hi; i++) acc += square ? (double)x[i] * x[i] : x[i];
        part[c] = acc;
    }
    double total = 0;
    for (int c = 0; c < REDUCE_CHUNKS; c++) total += part[c];
    return total;
}

double cpu_sum(const float *x, size_t n) { return reduce(x, n, 0); }
double cpu_sum_squares(const float *x, size_t n) { return reduce(x, n, 1); }

/* Matches torch.optim.AdamW (decoupled decay applied before the moment update). */
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
               float eps, float weight_decay, float grad_scale, int step, uint16_t *work) {
    /* bias corrections in double, as torch computes them in Python floats */
    double bc1 = 1.0 - pow(beta1, step);
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    float step_size = (float)(lr / bc1);
    float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        param[i] = param[i] * decay - step_size * m[i] / denom;
        if (work) work[i] = bf16_bits(param[i]);
    }
}

void cpu_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * ldd;
        const float *s = src + (size_t)r * lds;
        if (accumulate)
            for (int c = 0; c < cols; c++) d[c] += s[c];
        else
            memcpy(d, s, sizeof(float) * cols);
    }
}
