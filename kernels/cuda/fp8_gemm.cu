/* FP8 GEMMs with per-tensor scaling on FP8 tensor cores (cuBLASLt),
 * for the fp8 table's linear layers. Each bf16 operand is cast once per use
 * (an input once per group of GEMMs reading it, fp8_recipe.input_group; a
 * weight under current scaling once per forward, its dgrad reusing the
 * codes: the cast sites below):
 * its amax (max of |x| over the tensor, by bits: non-negative floats order
 * like their bits), the power-of-two scale 2^k of kernels/fp8.h (or, under
 * delayed scaling, the recipe's 2^k, the amax recorded for the history), the
 * 8-bit codes of x * 2^k (round to nearest even, saturating), written in the
 * layout the GEMM needs; the GEMM multiplies codes, sums in fp32 and applies
 * the two dequantisation scales 2^-k from device memory (scale pointers), so
 * it computes what the reference path (quantise-dequantise, fp32 GEMM)
 * computes, up to the order of the sums.
 *
 * Hopper's FP8 GEMMs take only the "TN" layout: in row-major terms both
 * operands have the contraction as their inner dimension. So dgrad uses
 * the weight's codes transposed ([K, M]) and wgrad the transposes of the
 * output gradient and the input ([M, Np], [K, Np], below); a tiled cast
 * writes them.
 * Leading dimensions must be multiples of 16 bytes: usable when K and M are
 * multiples of 16 (else the caller falls back on the reference path). The
 * token count N is free (MoE experts get any number of rows): forward and
 * dgrad do not contract over it, and wgrad's transposed operands are
 * written [M, Np] and [K, Np], Np = N rounded up to 16, the extra columns
 * zero codes (they add nothing to the sums).
 * Code buffers grow to the largest operand and are reused. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/profile.h"

#define THREADS 256

#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/site_table.h"

/* device buffers that grow: codes per operand slot, plus amax/scale words */
enum { X_CODES, XT_CODES, W_CODES, WT_CODES, G_CODES, GT_CODES, SLOTS };
static uint8_t *codes[SLOTS];
static size_t cap[SLOTS];
/* amax and inverse scale (a float) of operand i at words[WORD * i] and
 * words[WORD * (3 + i)]: each word 256-byte aligned, because cuBLASLt's
 * Hopper FP8 kernels refuse scale pointers that are not (an H200 with
 * cuBLASLt 13.1 refused every algorithm it had offered while the scales
 * sat 4 bytes apart; a probe with cudaMalloc'd scales ran them all,
 * 2026-11-26) */
#define WORD 64
static unsigned *words;
static unsigned *scale_words(void) {
    if (!words) CUDA_CHECK(cudaMalloc(&words, 6 * WORD * sizeof(unsigned)));
    return words;
}
/* the input's codes kept in X_CODES / XT_CODES for the next GEMM of its
 * group (fp8_recipe.input_group): the x they came from; its inverse scale
 * stays in words[WORD * (3 + FP8_INPUT)] until the next input cast */
static struct { unsigned group; const float *x; int rows, cols, block; } kept[SLOTS];
/* block scaling's inverse scales, per slot (kernels/cuda/fp8_cast.cuh's layouts) */
static float *bscales[SLOTS];
static size_t bscap[SLOTS];
/* GEMMs run on FP8 tensor cores so far: [0] per-tensor scales, [1] block scales */
static long tc_gemms[2];
long cuda_fp8_tensor_core_gemms(int block) { return tc_gemms[block != 0]; }

static uint8_t *slot(int s, size_t bytes) {
    kept[s].group = 0;
    if (bytes > cap[s]) {
        if (codes[s]) CUDA_CHECK(cudaFree(codes[s]));
        CUDA_CHECK(cudaMalloc(&codes[s], bytes));
        cap[s] = bytes;
    }
    return codes[s];
}

void cuda_fp8_record_amax(float *out, const unsigned *amax) {
    record_amax_k<<<1, 1>>>((unsigned *)out, amax);
    LAUNCH_CHECK();
}

/* rows rounded up to 16: the row length of a transposed operand's codes */
static int padded(int rows) { return (rows + 15) / 16 * 16; }

/* Cast sites, one per weight (kernels/cuda/site_table.h: keyed by its address in an open-addressed
 * table that doubles when half full), for per-tensor current scaling:
 *  - spec: each operand's (FP8_INPUT, FP8_WEIGHT, FP8_GRAD) speculative
 *    scale exponent (fp8_cast.cuh's fp8_spec), device memory;
 *  - the weight's transposed codes and inverse scale from its forward cast
 *    (cast_t_k writes both layouts in its one pass), kept for its dgrad,
 *    which then neither reads the weight again nor takes its amax. A
 *    weight does not change between a forward and its backward; the
 *    optimizer's step (cuda_fp8_weights_changed, from the fp8 table's
 *    adamw) drops every kept weight, and only a forward keeps one, so a
 *    dgrad finds its own forward's codes or none (then it casts).
 * Memory: 256 bytes of device memory per speculating site, plus one byte
 * per element of each weight kept, for the life of the process (bounded by the
 * weights that run in FP8). MTRAIN_FP8_KEEP_WEIGHTS=0 turns the kept
 * codes off, MTRAIN_FP8_SPECULATE=1 the speculative exponents on. */
static struct site_table sites;
static unsigned long weights_generation = 1;

void cuda_fp8_weights_changed(void) { weights_generation++; }

/* an environment switch: "0" off, "1" on, else the default */
static int env_flag(const char *name, int def, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : def;
    }
    return *cache;
}
static int keep_weights(void) {
    static int on = -1;
    return env_flag("MTRAIN_FP8_KEEP_WEIGHTS", 1, &on);
}
/* off by default: on an H100 (2026-11-26) the 8B step took 129.0 ms
 * without it and 133.5 with it; its casts take the amax with an atomic per
 * warp on one address, over grids of up to 28k blocks (the amax pass:
 * 1024 blocks), which likely costs more than the read it saves */
static int speculate(void) {
    static int on = -1;
    return env_flag("MTRAIN_FP8_SPECULATE", 0, &on);
}

/* w's site, made on first use; the pointer holds until a site is made
 * for another weight */
static struct fp8_site *site_of(const float *w) {
    struct fp8_site *e = site_find(&sites, w);
    if (!e && !(e = site_insert(&sites, w))) die("out of memory");
    return e;
}

/* the site's speculative exponent of operand i (made on first use, its
 * exponents 0: the first cast redoes), or NULL: the two-pass cast */
static struct fp8_spec *spec_of(const float *w, int i, struct fp8_recipe recipe) {
    if (recipe.scaling != FP8_SCALING_TENSOR || !speculate()) return NULL;
    struct fp8_site *e = site_of(w);
    if (!e->spec) {
        CUDA_CHECK(cudaMalloc(&e->spec, 256));
        CUDA_CHECK(cudaMemset(e->spec, 0, 256));
    }
    return (struct fp8_spec *)e->spec + i;
}

/* room for w's kept codes [cols, rows] (rows x cols: the weight's shape);
 * 0 where the device has no memory for them: keeping stops for the run
 * (said once), the GEMMs cast as before */
static int keep_room(struct fp8_site *e, int rows, int cols) {
    static int out_of_memory;
    size_t bytes = 256 + (size_t)rows * cols;
    e->generation = 0;
    if (e->buf && bytes <= e->bytes) {
        e->rows = rows, e->cols = cols;
        return 1;
    }
    if (out_of_memory) return 0;
    if (e->buf) CUDA_CHECK(cudaFree(e->buf));
    e->buf = NULL, e->bytes = 0;
    cudaError_t rc = cudaMalloc(&e->buf, bytes);
    if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it: the run goes on without kept codes */
        e->buf = NULL, out_of_memory = 1;
        fprintf(stderr, "mtrain: the GPU has no room to keep FP8 weight codes for the backward (%zu bytes more); "
                        "the weights' dgrad casts them again (MTRAIN_FP8_KEEP_WEIGHTS, docs/model.md)\n", bytes);
        return 0;
    }
    CUDA_CHECK(rc);
    e->rows = rows, e->cols = cols, e->bytes = bytes;
    return 1;
}

/* w's kept codes no longer match it: a forward of w that did not come here (the reference path) */
void cuda_fp8_forget_weight(const float *w) {
    struct fp8_site *e = site_find(&sites, w);
    if (e) e->generation = 0;
}

/* operand i's amax (recorded under delayed scaling), then x [rows, cols]
 * cast into q (row-major) and/or qt (transposed, [cols, padded(rows)]); NULL
 * skips a layout; *inv (device memory) := the inverse scale */
static void cast_to(int i, const float *x, int rows, int cols, int format, uint8_t *q, uint8_t *qt, float *inv,
                    struct fp8_recipe recipe, struct fp8_spec *spec) {
    int delayed = recipe.scaling == FP8_SCALING_DELAYED, k = delayed ? recipe.scale_exp[i] : FP8_SCALE_CURRENT;
    size_t n = (size_t)rows * cols;
    unsigned *amax = scale_words() + WORD * i;
    CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof *amax, 0));
    if (!spec) { /* the amax first */
        unsigned grid = blocks_for(n, THREADS) < 1024 ? blocks_for(n, THREADS) : 1024;
        amax_bf16_k<<<grid, THREADS>>>(amax, (const uint16_t *)x, n);
        LAUNCH_CHECK();
        if (delayed) cuda_fp8_record_amax(recipe.amax + i, amax);
    }
    /* speculative: pass 1 (the site's last k, the amax taken), this tensor's k, pass 2 (only if k moved) */
    for (int pass = spec ? 1 : 0; pass <= (spec ? 2 : 0); pass++) {
        unsigned *acc = pass == 1 ? amax : NULL;
        if (qt) { /* both layouts: one read of x */
            dim3 grid((rows + TT - 1) / TT, (cols + TT - 1) / TT);
            cast_t_k<<<grid, dim3(32, 8)>>>(qt, q, inv, (const uint16_t *)x, rows, cols, padded(rows), amax, format,
                                            k, spec, acc);
        } else if (q) {
            cast_k<<<blocks_for((n + CAST_VEC - 1) / CAST_VEC, THREADS), THREADS>>>(q, inv, (const uint16_t *)x, n,
                                                                                   amax, format, k, spec, acc);
        }
        LAUNCH_CHECK();
        if (pass == 1) {
            spec_finish_k<<<1, 1>>>(spec, inv, amax, format);
            LAUNCH_CHECK();
        }
    }
}

/* operand i (FP8_INPUT, FP8_WEIGHT, FP8_GRAD): cast x [rows, cols] into the
 * slots asked for (s_cols: transposed, [cols, padded(rows)]), scaled by its
 * current amax or (delayed scaling) by the recipe's exponent, its amax
 * recorded; returns the device address of its inverse scale */
static const float *cast(int i, const float *x, int rows, int cols, int format, int s_rows, int s_cols,
                         uint8_t **q, uint8_t **qt, struct fp8_recipe recipe, const float *site_w) {
    int delayed = recipe.scaling == FP8_SCALING_DELAYED;
    size_t n = (size_t)rows * cols;
    float *inv = (float *)(scale_words() + WORD * (3 + i));
    /* an input cast into one layout may be its group's (the kept codes are per layout) */
    int want = s_rows >= 0 ? s_rows : s_cols;
    int grouped = i == FP8_INPUT && recipe.input_group && !delayed && (s_rows < 0 || s_cols < 0);
    if (grouped && kept[want].group == recipe.input_group && kept[want].x == x && kept[want].rows == rows &&
        kept[want].cols == cols && !kept[want].block) { /* the group's previous GEMM cast this x */
        *q = s_rows >= 0 ? codes[want] : NULL;
        *qt = s_cols >= 0 ? codes[want] : NULL;
        return inv;
    }
    if (i == FP8_INPUT) kept[X_CODES].group = kept[XT_CODES].group = 0; /* its inverse scale changes below */
    *q = s_rows >= 0 ? slot(s_rows, n) : NULL;
    *qt = s_cols >= 0 ? slot(s_cols, (size_t)cols * padded(rows)) : NULL;
    cast_to(i, x, rows, cols, format, *q, *qt, inv, recipe, spec_of(site_w, i, recipe));
    if (grouped)
        kept[want].group = recipe.input_group, kept[want].x = x, kept[want].rows = rows, kept[want].cols = cols,
        kept[want].block = 0;
    return inv;
}

/* the rows of a wgrad operand's transposed codes under block scaling: whole 128-blocks of tokens */
static int padded_block(int rows) { return (rows + BLK - 1) / BLK * BLK; }

/* the rows of a forward or dgrad GEMM under block scaling: its 1 x 128
 * scales' rows are read a multiple of 4 apart, so the codes are padded
 * with zero rows to that (cuda_fp8_forward, cuda_fp8_backward) */
static int rows4(int rows) { return (rows + 3) / 4 * 4; }

/* Block scaling: x [rows, cols] into slot s, in the blocks and layout the
 * slot's GEMM reads (X_CODES, G_CODES: 1 x 128 along the rows, [rows4(rows),
 * cols] with zero rows past rows; XT_CODES,
 * GT_CODES: 128 x 1 down the columns, transposed, [cols, padded_block(rows)];
 * W_CODES: 128 x 128; WT_CODES: 128 x 128 transposed); returns the slot's
 * inverse scales. Stateless: no amax is recorded. */
static const float *cast_block(const float *x, int rows, int cols, int format, int s, uint8_t **q,
                               struct fp8_recipe recipe, int input) {
    int grouped = input && recipe.input_group;
    if (grouped && kept[s].group == recipe.input_group && kept[s].x == x && kept[s].rows == rows &&
        kept[s].cols == cols && kept[s].block) {
        *q = codes[s];
        return bscales[s];
    }
    int transposed = s == XT_CODES || s == GT_CODES, ld = transposed ? padded_block(rows) : rows4(rows);
    size_t nscales = s == W_CODES || s == WT_CODES ? (size_t)(rows / BLK) * (cols / BLK)
                     : transposed                  ? (size_t)(ld / BLK) * cols
                                                   : (size_t)ld * (cols / BLK);
    *q = slot(s, (size_t)cols * ld); /* (a weight's rows are whole 128-blocks: rows4 leaves them as they are) */
    if (nscales > bscap[s]) {
        if (bscales[s]) CUDA_CHECK(cudaFree(bscales[s]));
        CUDA_CHECK(cudaMalloc(&bscales[s], nscales * sizeof(float)));
        bscap[s] = nscales;
    }
    const uint16_t *xb = (const uint16_t *)x;
    if (s == X_CODES || s == G_CODES) {
        size_t warps = (size_t)ld * (cols / BLK);
        cast_rows128_k<<<blocks_for(warps * 32, THREADS), THREADS>>>(*q, bscales[s], xb, rows, ld, cols, format);
    } else if (transposed) {
        cast_cols128_t_k<<<dim3(ld / BLK, (cols + COLS_T - 1) / COLS_T), dim3(32, 8)>>>(*q, bscales[s], xb, rows, cols,
                                                                                      ld, format);
    } else {
        int t = s == WT_CODES;
        cast_block128_k<<<dim3(rows / BLK, cols / BLK), dim3(32, 8)>>>(t ? NULL : *q, t ? NULL : bscales[s],
                                                                       t ? *q : NULL, t ? bscales[s] : NULL, xb, rows,
                                                                       cols, format);
    }
    LAUNCH_CHECK();
    if (grouped)
        kept[s].group = recipe.input_group, kept[s].x = x, kept[s].rows = rows, kept[s].cols = cols, kept[s].block = 1;
    return bscales[s];
}

/* A block-scaled GEMM of rows not a multiple of 4 (an expert's tokens)
 * runs on rows4 rows, the codes' zero rows giving zero output rows: its
 * bf16 output goes to this scratch (grown to the largest such output, never
 * freed), begun from the caller's output when it accumulates, and its first
 * rows are copied back. Memory: the largest padded output, bf16. */
static uint16_t *pad_out;
static size_t pad_cap;
static float *padded_output(const float *out, int rows, int cols, int accumulate) {
    size_t bytes = (size_t)rows4(rows) * cols * sizeof(uint16_t);
    if (bytes > pad_cap) {
        if (pad_out) CUDA_CHECK(cudaFree(pad_out));
        CUDA_CHECK(cudaMalloc(&pad_out, bytes));
        pad_cap = bytes;
    }
    if (accumulate)
        CUDA_CHECK(cudaMemcpyAsync(pad_out, out, (size_t)rows * cols * sizeof(uint16_t), cudaMemcpyDeviceToDevice, 0));
    return (float *)pad_out;
}
static void padded_output_back(float *out, const float *o, int rows, int cols) {
    if (o != out) CUDA_CHECK(cudaMemcpyAsync(out, o, (size_t)rows * cols * sizeof(uint16_t), cudaMemcpyDeviceToDevice, 0));
}

/* MTRAIN_PROFILE: the casts and the GEMMs of an FP8 op timed as parts of its
 * row (kernels/profile.h), the device waited for around each part */
static double part_begin(void) {
    if (!profile_parts_active()) return 0;
    CUDA_CHECK(cudaDeviceSynchronize());
    return now_seconds();
}
static void part_end(double t0, const char *what, double flops, int N, int K, int M) {
    if (!t0) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    profile_part(what, flops, now_seconds() - t0, "%dx%dx%d", N, K, M);
}

/* say once per kind that cuBLASLt had no FP8 algorithm for a GEMM (the caller takes the reference path) */
static void refused(int block, int rows, int contraction, int cols) {
    static int said[2];
    if (!said[block]++)
        fprintf(stderr,
                "mtrain: cuBLASLt has no %s FP8 GEMM for %dx%dx%d (rows x contraction x columns); such GEMMs take "
                "the reference path (quantise-dequantise, then a bf16-stored fp32 GEMM), which is slower\n",
                block ? "block-scaled (1 x 128 / 128 x 128)" : "per-tensor scaled", rows, contraction, cols);
}

static cudaDataType_t fp8_type(int format) { return format == FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

/* MTRAIN_FP8_GEMM=reference turns this path off (docs/model.md); the
 * outputs must be 16-byte aligned (the code buffers are); any N > 0. Block
 * scaling needs cuBLASLt 12.9 or later (its block-scaled FP8 GEMMs on
 * Hopper) and K and M multiples of 512: whole 128-blocks along both
 * contractions (forward's K, dgrad's M) and in the weights, and rows of
 * 128 x 128 scales (K / 128 or M / 128 of them) a multiple of 16 bytes,
 * as PyTorch's torch._scaled_mm asks of them (whether cuBLASLt reads
 * other row lengths right is unknown here; every Llama, Mixtral and
 * DeepSeek-V3 width is a multiple of 512); any N: the forward's and the
 * dgrad's rows are padded to a multiple of 4 (rows4), where the 1 x 128
 * scales' rows are the same with or without the padding to 4 that
 * Transformer Engine gives them (which one cuBLASLt reads:
 * cuda_fp8_block_layout_probe), so an expert's token count never sends its
 * GEMMs to the reference path. */
int cuda_fp8_gemm_usable(int N, int K, int M, const void *const *outs, int nouts, int block) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = getenv("MTRAIN_FP8_GEMM");
        enabled = !(e && !strcmp(e, "reference"));
    }
    if (!enabled || N <= 0 || K <= 0 || M <= 0 || K % 16 || M % 16) return 0;
    if (block && (K % (4 * BLK) || M % (4 * BLK) || cuda_blaslt_version() < 120900)) return 0;
    for (int i = 0; i < nouts; i++)
        if ((uintptr_t)outs[i] & 15) return 0;
    return 1;
}

/* The forward GEMM accumulates in the tensor cores' own (fast) mode, the
 * gradients' GEMMs promote to fp32 as they go: Transformer Engine's and
 * torchao's default split (they accept the forward's small precision loss
 * for its speed, not the gradients'). MTRAIN_FP8_FAST_ACCUM=0 turns it off. */
static int fast_accum(void) {
    static int on = -1;
    return env_flag("MTRAIN_FP8_FAST_ACCUM", 1, &on);
}

/* out [N, M] (bf16) = x [N, K] w [M, K]^T (+ out); 0, or -1 where
 * cuBLASLt has no FP8 algorithm for it (nothing written: the caller takes
 * the reference path) */
int cuda_fp8_forward(float *out, const float *x, const float *w, int N, int K, int M, int accumulate,
                     struct fp8_recipe recipe) {
    uint8_t *qx, *qw, *unused;
    int blk = recipe.scaling == FP8_SCALING_BLOCK;
    double t = part_begin();
    const float *sx = blk ? cast_block(x, N, K, FP8_E4M3, X_CODES, &qx, recipe, 1)
                          : cast(FP8_INPUT, x, N, K, FP8_E4M3, X_CODES, -1, &qx, &unused, recipe, w);
    const float *sw;
    struct fp8_site *e = recipe.scaling == FP8_SCALING_TENSOR && keep_weights() ? site_of(w) : NULL;
    if (e && keep_room(e, M, K)) { /* both layouts, the transposed kept for the dgrad */
        qw = slot(W_CODES, (size_t)M * K);
        cast_to(FP8_WEIGHT, w, M, K, FP8_E4M3, qw, e->buf + 256, (float *)e->buf, recipe, spec_of(w, FP8_WEIGHT, recipe));
        e->generation = weights_generation;
        sw = (const float *)e->buf;
    } else {
        sw = blk ? cast_block(w, M, K, FP8_E4M3, W_CODES, &qw, recipe, 0)
                 : cast(FP8_WEIGHT, w, M, K, FP8_E4M3, W_CODES, -1, &qw, &unused, recipe, w);
    }
    part_end(t, "fp8_forward_casts", 0, N, K, M);
    t = part_begin();
    /* block scaling: DeepSeek-V3 promotes its FP8 sums to fp32 in every GEMM, so no fast accumulation; its
     * rows padded to 4 (the codes' extra rows are zero) */
    int Nq = blk ? rows4(N) : N;
    float *o = Nq != N ? padded_output(out, N, M, accumulate) : out;
    int rc = lt_matmul(0, 1, Nq, M, K, qx, CUDA_R_8F_E4M3, K, qw, CUDA_R_8F_E4M3, K, accumulate ? 1.0f : 0.0f, o,
                       CUDA_R_16BF, M, sx, sw, blk ? LT_SCALE_VEC128 : 0, blk ? LT_SCALE_BLK128 : 0,
                       blk ? 0 : fast_accum());
    if (!rc) padded_output_back(out, o, N, M);
    part_end(t, "fp8_forward_gemm", 2.0 * N * K * M, N, K, M);
    if (rc) refused(blk, Nq, K, M);
    else tc_gemms[blk]++;
    return rc;
}

/* dx [N, K] (bf16) = dout [N, M] w [M, K] (+ dx), dw [M, K] (fp32) += dout^T x;
 * 0; -1 where cuBLASLt has no FP8 algorithm for the first GEMM (nothing
 * written); 1 where dx was written but cuBLASLt has none for dw (the
 * caller computes dw alone another way) */
int cuda_fp8_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int K, int M,
                      int accumulate_dx, struct fp8_recipe recipe) {
    int gf = recipe.grad_e5m2 ? FP8_E5M2 : FP8_E4M3, wrote = 0, blk = recipe.scaling == FP8_SCALING_BLOCK;
    int row_mode = blk ? LT_SCALE_VEC128 : 0; /* 1 x 128 along the contraction, or one scale */
    uint8_t *qg = NULL, *qgt = NULL, *qwt, *qxt, *unused;
    const float *sg = NULL, *sgt = NULL;
    double t = part_begin();
    if (blk) { /* the two layouts' blocks run along different dimensions: two casts */
        if (dx) sg = cast_block(dout, N, M, gf, G_CODES, &qg, recipe, 0);
        if (dw) sgt = cast_block(dout, N, M, gf, GT_CODES, &qgt, recipe, 0);
    } else {
        sg = sgt = cast(FP8_GRAD, dout, N, M, gf, dx ? G_CODES : -1, dw ? GT_CODES : -1, &qg, &qgt, recipe, w);
    }
    part_end(t, "fp8_backward_casts", 0, N, K, M);
    if (dx) { /* dx = dout (w^T)^T: w's codes transposed, [K, M] */
        const float *sw;
        struct fp8_site *e = recipe.scaling == FP8_SCALING_TENSOR && keep_weights() ? site_find(&sites, w) : NULL;
        if (e && e->buf && e->generation == weights_generation && e->rows == M && e->cols == K) {
            /* the forward's codes (M is a multiple of 16: no padding) */
            qwt = e->buf + 256;
            sw = (const float *)e->buf;
        } else {
            t = part_begin();
            sw = blk ? cast_block(w, M, K, FP8_E4M3, WT_CODES, &qwt, recipe, 0)
                     : cast(FP8_WEIGHT, w, M, K, FP8_E4M3, -1, WT_CODES, &unused, &qwt, recipe, w);
            part_end(t, "fp8_backward_casts", 0, N, K, M);
        }
        t = part_begin();
        int Nq = blk ? rows4(N) : N; /* (as the forward's) */
        float *o = Nq != N ? padded_output(dx, N, K, accumulate_dx) : dx;
        int rc = lt_matmul(0, 1, Nq, K, M, qg, fp8_type(gf), M, qwt, CUDA_R_8F_E4M3, M, accumulate_dx ? 1.0f : 0.0f,
                           o, CUDA_R_16BF, K, sg, sw, row_mode, blk ? LT_SCALE_BLK128 : 0, 0);
        if (!rc) padded_output_back(dx, o, N, K);
        part_end(t, "fp8_dgrad_gemm", 2.0 * N * K * M, N, K, M);
        if (rc) {
            refused(blk, Nq, M, K);
            return -1;
        }
        tc_gemms[blk]++;
        wrote = 1;
    }
    if (dw) { /* dw += dout^T (x^T)^T: [M, Np] and [K, Np] codes, the contraction padded with zeros */
        t = part_begin();
        const float *sx = blk ? cast_block(x, N, K, FP8_E4M3, XT_CODES, &qxt, recipe, 1)
                              : cast(FP8_INPUT, x, N, K, FP8_E4M3, -1, XT_CODES, &unused, &qxt, recipe, w);
        part_end(t, "fp8_backward_casts", 0, N, K, M);
        int Np = blk ? padded_block(N) : padded(N);
        t = part_begin();
        int rc = lt_matmul(0, 1, M, K, Np, qgt, fp8_type(gf), Np, qxt, CUDA_R_8F_E4M3, Np, 1.0f, dw, CUDA_R_32F, K,
                           sgt, sx, row_mode, row_mode, 0);
        part_end(t, "fp8_wgrad_gemm", 2.0 * N * K * M, N, K, M);
        if (rc) {
            refused(blk, M, Np, K);
            return wrote ? 1 : -1;
        }
        tc_gemms[blk]++;
    }
    return 0;
}

/* One block-scaled forward GEMM of random e4m3 codes, N x K times M x K,
 * every block's scale a different power of two, written as mtrain's casts
 * write them (1 x 128: [kb][n], rows N apart; 128 x 128: [mb][kb]; the 1 x
 * 128 array sized for rows of N rounded up to 4). err[r]: the output's
 * norm-wise distance from the host's double sums under reading r of the
 * scale arrays (bit 0: 1 x 128 blocks fastest, [n][kb]; bit 1: 128 x 128
 * column-major, [kb][mb]; bit 2: 1 x 128 rows N rounded up to 4 apart).
 * Returns -1 if cuBLASLt has no block-scaled GEMM for it. */
static int probe_gemm(int N, int K, int M, double err[8]) {
    const int KB = K / BLK, MB = M / BLK, N4 = (N + 3) / 4 * 4;
    size_t nx = (size_t)N * K, nw = (size_t)M * K, nsx = (size_t)N4 * KB;
    uint8_t *hx = (uint8_t *)malloc(nx), *hw = (uint8_t *)malloc(nw);
    float *sx = (float *)malloc(sizeof(float) * nsx), *sw = (float *)malloc(sizeof(float) * MB * KB);
    uint16_t *ho = (uint16_t *)malloc(2 * (size_t)N * M);
    double *part = (double *)malloc(sizeof(double) * N * M * KB); /* each block's sum of products */
    if (!hx || !hw || !sx || !sw || !ho || !part) die("out of memory");
    unsigned long long st = 99;
    for (size_t i = 0; i < nx + nw; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((st >> 40) / (double)(1ull << 24) * 2.0 - 1.0) * 400.0f;
        (i < nx ? hx[i] : hw[i - nx]) = fp8_bits(v, FP8_E4M3);
    }
    for (size_t i = 0; i < nsx; i++) sx[i] = fp8_pow2(-(int)(i % 7));
    for (int i = 0; i < MB * KB; i++) sw[i] = fp8_pow2(-(i % 5) - 3);
    uint8_t *dx, *dw;
    float *dsx, *dsw;
    void *dout;
    CUDA_CHECK(cudaMalloc(&dx, nx));
    CUDA_CHECK(cudaMalloc(&dw, nw));
    CUDA_CHECK(cudaMalloc(&dsx, sizeof(float) * nsx));
    CUDA_CHECK(cudaMalloc(&dsw, sizeof(float) * MB * KB));
    CUDA_CHECK(cudaMalloc(&dout, 2 * (size_t)N * M));
    CUDA_CHECK(cudaMemcpy(dx, hx, nx, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dw, hw, nw, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dsx, sx, sizeof(float) * nsx, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dsw, sw, sizeof(float) * MB * KB, cudaMemcpyHostToDevice));
    int rc = lt_matmul(0, 1, N, M, K, dx, CUDA_R_8F_E4M3, K, dw, CUDA_R_8F_E4M3, K, 0.0f, dout, CUDA_R_16BF, M, dsx, dsw,
                       LT_SCALE_VEC128, LT_SCALE_BLK128, 0);
    if (!rc) {
        CUDA_CHECK(cudaMemcpy(ho, dout, 2 * (size_t)N * M, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++)
            for (int j = 0; j < M; j++)
                for (int kb = 0; kb < KB; kb++) {
                    double acc = 0;
                    for (int k = kb * BLK; k < (kb + 1) * BLK; k++)
                        acc += (double)fp8_to_float(hx[(size_t)i * K + k], FP8_E4M3) *
                               fp8_to_float(hw[(size_t)j * K + k], FP8_E4M3);
                    part[((size_t)i * M + j) * KB + kb] = acc;
                }
        for (int r = 0; r < 8; r++) {
            double num = 0, den = 0;
            for (int i = 0; i < N; i++)
                for (int j = 0; j < M; j++) {
                    double want = 0;
                    for (int kb = 0; kb < KB; kb++) {
                        double a = r & 1 ? sx[i * KB + kb] : sx[(size_t)kb * (r & 4 ? N4 : N) + i];
                        double b = r & 2 ? sw[kb * MB + j / BLK] : sw[(j / BLK) * KB + kb];
                        want += part[((size_t)i * M + j) * KB + kb] * a * b;
                    }
                    double got = fp8_f32_from_bits((uint32_t)ho[(size_t)i * M + j] << 16);
                    num += (got - want) * (got - want), den += want * want;
                }
            err[r] = sqrt(num / (den > 0 ? den : 1));
        }
    }
    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dw));
    CUDA_CHECK(cudaFree(dsx));
    CUDA_CHECK(cudaFree(dsw));
    CUDA_CHECK(cudaFree(dout));
    free(hx), free(hw), free(sx), free(sw), free(ho), free(part);
    return rc ? -1 : 0;
}

/* Which layout cuBLASLt reads block scales in, on this GPU: a GEMM whose
 * 128 x 128 scales are not square (K 512, M 1024: a row-major and a
 * column-major reading differ) under the four readings of bits 0 and 1,
 * then one whose token count is not a multiple of 4 (N 258), read with
 * rows N apart (PyTorch's torch._scaled_mm layout, mtrain's) or N rounded
 * up to 4 apart (the padding Transformer Engine gives these scales). A wrong
 * reading moves outputs by factors of two. Returns 1 if mtrain's 128 x 128
 * and 1 x 128 readings match, 0 if another reading does or none (msg says
 * which), -1 if cuBLASLt has no block-scaled GEMM here. The 258-token
 * readings are information only: mtrain's GEMMs pad token counts to a
 * multiple of 4 (rows4), where the two strides agree. */
int cuda_fp8_block_layout_probe(char *msg, size_t n) {
    if (cuda_blaslt_version() < 120900) {
        snprintf(msg, n, "cuBLASLt %zu has no block-scaled FP8 GEMMs (12.9 or later)", cuda_blaslt_version());
        return -1;
    }
    double a[8], b[8];
    if (probe_gemm(256, 512, 1024, a)) {
        snprintf(msg, n, "cuBLASLt %zu has no block-scaled FP8 GEMM for 256x512x1024", cuda_blaslt_version());
        return -1;
    }
    int odd = probe_gemm(258, 512, 512, b) == 0; /* (said, not judged: the GEMMs pad such token counts to 4 rows) */
    const char *names[4] = {"1x128 rows fastest, 128x128 row-major (mtrain's)", "1x128 blocks fastest, 128x128 row-major",
                            "1x128 rows fastest, 128x128 column-major", "1x128 blocks fastest, 128x128 column-major"};
    int best = 0;
    for (int r = 1; r < 4; r++)
        if (a[r] < a[best]) best = r;
    int ok = best == 0 && a[0] <= 1e-2;
    int len = snprintf(msg, n, "closest reading: %s (norm-wise %.2g; mtrain's %.2g, the others %.2g %.2g %.2g)",
                       names[best], a[best], a[0], a[1], a[2], a[3]);
    if (len >= 0 && (size_t)len < n) {
        if (odd) snprintf(msg + len, n - len, "; 258 tokens: rows 258 apart (mtrain's) %.2g, 260 apart %.2g", b[0], b[4]);
        else snprintf(msg + len, n - len, "; cuBLASLt refused 258 tokens (mtrain pads token counts to multiples of 4)");
    }
    return ok;
}

/* Every bf16 value (all 65536 bit patterns) times 2^k cast on the GPU by
 * cast_k (row-major) and by cast_t_k (as a 256 x 256 tensor, both layouts)
 * against the host's fp8_bits, bit for bit (a NaN input may give either
 * NaN code): the convert instruction the casts use on FP8 GPUs
 * (fp8_code2) must round as kernels/fp8.h does. Returns the number of
 * codes that differ (msg names the first), -1 on a launch failure. */
long cuda_fp8_cast_check(int format, int k, char *msg, size_t n) {
    enum { V = 65536, S = 256 };
    uint16_t *hx = (uint16_t *)malloc(sizeof(uint16_t) * V);
    uint8_t *got = (uint8_t *)malloc(3 * V);
    if (!hx || !got) die("out of memory");
    for (int i = 0; i < V; i++) hx[i] = (uint16_t)i;
    uint16_t *dx;
    uint8_t *dq;
    unsigned *dw;
    CUDA_CHECK(cudaMalloc(&dx, sizeof(uint16_t) * V));
    CUDA_CHECK(cudaMalloc(&dq, 3 * V));
    CUDA_CHECK(cudaMalloc(&dw, 2 * WORD * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(dw, 0, 2 * WORD * sizeof(unsigned)));
    CUDA_CHECK(cudaMemcpy(dx, hx, sizeof(uint16_t) * V, cudaMemcpyHostToDevice));
    float *inv = (float *)(dw + WORD);
    cast_k<<<blocks_for(V / CAST_VEC, THREADS), THREADS>>>(dq, inv, dx, V, dw, format, k);
    cast_t_k<<<dim3(S / TT, S / TT), dim3(32, 8)>>>(dq + 2 * V, dq + V, inv, dx, S, S, S, dw, format, k);
    long bad = cudaGetLastError() == cudaSuccess ? 0 : -1;
    if (bad) snprintf(msg, n, "a cast kernel failed to launch");
    CUDA_CHECK(cudaMemcpy(got, dq, 3 * V, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dq));
    CUDA_CHECK(cudaFree(dw));
    float s = fp8_pow2(k);
    for (int layout = 0; layout < 3 && bad >= 0; layout++)
        for (int i = 0; i < V; i++) {
            int at = layout < 2 ? i : (i % S) * S + i / S; /* the transposed layout: x[r][c] at qt[c][r] */
            float v = fp8_f32_from_bits((uint32_t)hx[i] << 16);
            uint8_t want = fp8_bits(v * s, format), g = got[(size_t)layout * V + at];
            int both_nan = v != v && fp8_to_float(g, format) != fp8_to_float(g, format);
            if (g != want && !both_nan && bad++ == 0)
                snprintf(msg, n, "%s, 2^%d: bf16 0x%04x (%g) gave code 0x%02x, the host 0x%02x (%s)",
                         format == FP8_E5M2 ? "e5m2" : "e4m3", k, hx[i], v, g, want,
                         layout == 0 ? "cast_k" : layout == 1 ? "cast_t_k row-major" : "cast_t_k transposed");
        }
    if (!bad) snprintf(msg, n, "every bf16 value bitwise");
    free(hx), free(got);
    return bad;
}
