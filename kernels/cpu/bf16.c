/* The CPU backend at bf16 precision: kernels/bf16_table.h on the fp32 CPU
 * table, with the storage functions as host loops. Its numbers are the
 * ones a GPU's bf16 buffers hold, so the mixed-precision path (casts,
 * master weights, accumulation, checkpoints, parallel layouts, the model's
 * 2-byte buffers) runs in CI, and the GPU's bf16 ops are compared with it. */
#include <string.h>

#include "config/common.h"
#include "kernels/bf16.h"
#include "kernels/fp8.h"
#include "kernels/cpu/cpu.h"

static void bf16_widen(float *dst, const float *src, size_t n) {
    const uint16_t *b = (const uint16_t *)src;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(b[i]);
}

static void bf16_narrow(float *dst, const float *src, size_t n) {
    uint16_t *b = (uint16_t *)dst;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) b[i] = bf16_bits(src[i]);
}

/* rows of the bf16 table, or zeros outside this rank's vocabulary slice */
static void bf16_embedding(float *out, const int32_t *tokens, const float *table, int N, int C, int vstart, int V) {
    uint16_t *o = (uint16_t *)out;
    const uint16_t *t = (const uint16_t *)table;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vstart;
        if (row >= 0 && row < V) memcpy(o + (size_t)n * C, t + (size_t)row * C, sizeof(uint16_t) * C);
        else memset(o + (size_t)n * C, 0, sizeof(uint16_t) * C);
    }
}

static void bf16_gather_rows(float *out, const float *x, const int32_t *rows, int n, int C) {
    uint16_t *o = (uint16_t *)out;
    const uint16_t *s = (const uint16_t *)x;
#pragma omp parallel for schedule(static) if ((size_t)n * C > 65536)
    for (int i = 0; i < n; i++) memcpy(o + (size_t)i * C, s + (size_t)rows[i] * C, sizeof(uint16_t) * C);
}

/* a copy of bf16 values is exact; accumulating adds in fp32 and rounds */
static void bf16_copy_cols(float *dst, int ldd, const float *src, int lds, int rows, int cols, int accumulate) {
    uint16_t *d = (uint16_t *)dst;
    const uint16_t *s = (const uint16_t *)src;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            uint16_t *o = d + (size_t)r * ldd + c;
            uint16_t v = s[(size_t)r * lds + c];
            *o = accumulate ? bf16_bits(bf16_to_float(*o) + bf16_to_float(v)) : v;
        }
}

/* Each br x bc block of the row-major x [rows, cols] (edge blocks smaller)
 * through its FP8 code: scaled by 2^k from the block's amax (or by the
 * given 2^k: delayed scaling, one block), rounded, scaled back. Blocks with
 * a non-finite amax pass through, so a NaN or an infinity reaches the loss
 * and the step is rewound, as in bf16. amax_out (NULL: none) takes the max
 * of itself and the blocks' amaxes; a NaN sticks. */
static void fp8_qdq_blocks(float *x, int rows, int cols, int br, int bc, int format, int k_fixed, float *amax_out) {
    int nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    float worst = 0;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > 65536) reduction(max : worst)
    for (int b = 0; b < nbr * nbc; b++) {
        int r0 = b / nbc * br, c0 = b % nbc * bc;
        int r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
        float amax = 0;
        for (int r = r0; r < r1; r++)
            for (int c = c0; c < c1; c++) {
                float a = fabsf(x[(size_t)r * cols + c]);
                if (a > amax || a != a) amax = a; /* NaN sticks */
            }
        worst = isfinite(amax) ? (amax > worst ? amax : worst) : INFINITY;
        if (!isfinite(amax)) continue;
        int k = k_fixed == FP8_SCALE_CURRENT ? fp8_scale_exp(amax, format) : k_fixed;
        for (int r = r0; r < r1; r++)
            for (int c = c0; c < c1; c++) x[(size_t)r * cols + c] = fp8_qdq(x[(size_t)r * cols + c], k, format);
    }
    if (amax_out && (worst > *amax_out || !isfinite(worst))) *amax_out = isfinite(worst) ? worst : NAN;
}

/* the cross-entropy's chunks: 4 MiB of fp32 here (tests reach several chunks with small shapes) */
#define BF16_CE_CHUNK_FLOATS ((size_t)1 << 20)
#define BF16_TABLE cpu_bf16_backend
#define BF16_FP8_TABLE cpu_fp8_backend
#define BF16_INNER cpu_backend
#define BF16_NAME "cpu"
#define BF16_MEM NULL
#define BF16_PEAK NULL
#define BF16_HOST_VIEW cpu_host_view
#include "kernels/bf16_table.h"
