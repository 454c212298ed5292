/* Flash attention for the bf16 table: causal grouped-query attention on bf16
 * q, k, v [B,T,heads,D] with fp32 accumulation on tensor cores (mma.sync
 * m16n8k16, operands from shared memory by ldmatrix), tiled so the T x T
 * scores never leave registers, online softmax, the kv head of query head h
 * read in place (h / group), no repeated heads materialised. State: each
 * row's natural log-sum-exp of the scaled scores, lse[B*H, T], the same as
 * the reference CUDA attention's, so either path's backward takes either
 * forward's state.
 *
 * Backward recomputes the probabilities from lse and needs the forward's
 * output for Delta = rowsum(dO * O); two kernels, no atomics, so it repeats
 * bitwise: one per query tile for dQ (a loop over kv tiles), one per kv tile
 * for dK and dV (a loop over the group's query heads in order, then query
 * tiles), dK and dV summed over the group in fp32 registers, rounded once.
 * (A variant that added dQ by atomics from the dK/dV kernel measured no
 * faster on an H200, 2026-11-26, and was dropped.)
 *
 * Head dims (query/key D, value Dv) 64/64, 128/128 and DeepSeek-V3's MLA
 * 192/128; other shapes take the reference path. The kernels are in kernels/cuda/flash_attention.cuh
 * (shared with a CPU emulation of warps that CI runs); this file gives
 * them the GPU's primitives (ldmatrix, mma.sync, shuffles) and launches
 * them. A warp owns 16 rows of a 64-row tile: lane = 4 g + t holds rows g
 * and g + 8 of each accumulator, at columns 2t and 2t + 1 of every
 * 8-column block. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

namespace {

#define FA_FN __device__ __forceinline__
#define FA_KERNEL(name) __global__ void __launch_bounds__(THREADS_FA) name
#define FA_SHARED(name) extern __shared__ __align__(16) uint16_t name[]
#define FA_CONST __host__ __device__ constexpr
#define fa_sync() __syncthreads()
#define fa_shfl_xor(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define fa_syncwarp() __syncwarp()

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* the memory clobber keeps ldmatrix after the __syncthreads that publishes its tile */
__device__ __forceinline__ void ldsm(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_t(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* 16 bytes global -> shared without passing through registers; src-size 0 fills zeros */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_n() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#define cp_async_wait(n) cp_async_wait_n<n>()

#include "kernels/cuda/flash_attention.cuh"

/* dynamic shared memory beyond 48 KiB needs the opt-in, once per kernel */
template <typename K>
void allow_smem(K kernel, size_t bytes, int *done) {
    if (*done) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = 1;
}

template <int D, int DV>
void forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int H, int KVH) {
    static int ready;
    size_t smem = forward_smem<D, DV>();
    allow_smem(flash_forward_k<D, DV>, smem, &ready);
    dim3 grid(B * H, (T + TILE - 1) / TILE);
    flash_forward_k<D, DV><<<grid, THREADS_FA, smem>>>((uint16_t *)out, lse, (const uint16_t *)q, (const uint16_t *)k,
                                                   (const uint16_t *)v, T, H, KVH, 1.0f / sqrtf((float)D) * LOG2E,
                                                   fa_blk{});
    LAUNCH_CHECK();
}

template <int D, int DV>
void backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse, const float *q,
              const float *k, const float *v, int B, int T, int H, int KVH) {
    static int ready_dq, ready_dkdv;
    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E; /* the forward's, bit for bit */
    size_t rows = (size_t)B * T * H;
    float *delta = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * rows);
    delta_k<<<blocks_for(rows * 32, THREADS_FA), THREADS_FA>>>(delta, (const uint16_t *)dout, (const uint16_t *)out, B,
                                                               T, H, DV);
    LAUNCH_CHECK();
    size_t smem = dq_smem<D, DV>();
    allow_smem(flash_dq_k<D, DV>, smem, &ready_dq);
    flash_dq_k<D, DV><<<dim3(B * H, (T + TILE - 1) / TILE), THREADS_FA, smem>>>(
        (uint16_t *)dq, (const uint16_t *)dout, lse, delta, (const uint16_t *)q, (const uint16_t *)k,
        (const uint16_t *)v, T, H, KVH, scale_log2, scale, fa_blk{});
    LAUNCH_CHECK();
    smem = dkdv_smem<D, DV>();
    allow_smem(flash_dkdv_k<D, DV>, smem, &ready_dkdv);
    flash_dkdv_k<D, DV><<<dim3(B * KVH, (T + TILE - 1) / TILE), THREADS_FA, smem>>>(
        (uint16_t *)dk, (uint16_t *)dv, (const uint16_t *)dout, lse, delta, (const uint16_t *)q, (const uint16_t *)k,
        (const uint16_t *)v, T, H, KVH, scale_log2, scale, fa_blk{});
    LAUNCH_CHECK();
}

__global__ void fill_k(float *x, float value, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = value;
}

/* context parallelism's block op (kernels/ops.h attention_block_forward) on
 * bf16 q, k, v [B, 2c, heads, D]: each chunk pair that sees keys
 * (fa_block_pairs) merged into the fp32 o, lse by the BLK kernels */
template <int D, int DV>
void block_forward(float *o, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v, int B, int c, int H,
                   int KVH, int q0, int q1, int k0, int k1, int first) {
    static int ready;
    size_t smem = forward_smem<D, DV>(), rows = (size_t)B * 2 * c;
    allow_smem(flash_forward_k<D, DV, true>, smem, &ready);
    if (first) { /* the running rows start at o 0, lse -inf */
        CUDA_CHECK(cudaMemsetAsync(o, 0, sizeof(float) * rows * H * DV, 0));
        fill_k<<<blocks_for(rows * H, 256), 256>>>(lse, -INFINITY, rows * H);
        LAUNCH_CHECK();
    }
    float scale_log2 = 1.0f / sqrtf((float)D) * LOG2E;
    fa_block_pairs(c, q0, q1, k0, k1, [&](int qi, int kj, int q_pos) {
        fa_blk blk = {2 * c, q_pos, o + (size_t)qi * c * H * DV, NULL, NULL, NULL};
        flash_forward_k<D, DV, true><<<dim3(B * H, (c + TILE - 1) / TILE), THREADS_FA, smem>>>(
            NULL, lse + (size_t)qi * c, q + (size_t)qi * c * H * D, k + (size_t)kj * c * KVH * D,
            v + (size_t)kj * c * KVH * DV, c, H, KVH, scale_log2, blk);
        LAUNCH_CHECK();
    });
}

/* its backward: Delta from the final out over both halves, then each chunk pair's dQ and dK/dV added to the
 * fp32 gradients */
template <int D, int DV>
void block_backward(float *dq, float *dk, float *dv, const uint16_t *dout, const uint16_t *out, const float *lse,
                    const uint16_t *q, const uint16_t *k, const uint16_t *v, int B, int c, int H, int KVH, int q0,
                    int q1, int k0, int k1) {
    static int ready_dq, ready_dkdv;
    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E;
    size_t rows = (size_t)B * 2 * c * H, sdq = dq_smem<D, DV>(), sdkdv = dkdv_smem<D, DV>();
    float *delta = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * rows);
    delta_k<<<blocks_for(rows * 32, THREADS_FA), THREADS_FA>>>(delta, dout, out, B, 2 * c, H, DV);
    LAUNCH_CHECK();
    allow_smem(flash_dq_k<D, DV, true>, sdq, &ready_dq);
    allow_smem(flash_dkdv_k<D, DV, true>, sdkdv, &ready_dkdv);
    fa_block_pairs(c, q0, q1, k0, k1, [&](int qi, int kj, int q_pos) {
        size_t qo = (size_t)qi * c, ko = (size_t)kj * c;
        fa_blk blk = {2 * c, q_pos, NULL, dq + qo * H * D, dk + ko * KVH * D, dv + ko * KVH * DV};
        const uint16_t *qq = q + qo * H * D, *dd = dout + qo * H * DV, *kk = k + ko * KVH * D, *vv = v + ko * KVH * DV;
        flash_dq_k<D, DV, true><<<dim3(B * H, (c + TILE - 1) / TILE), THREADS_FA, sdq>>>(
            NULL, dd, lse + qo, delta + qo, qq, kk, vv, c, H, KVH, scale_log2, scale, blk);
        LAUNCH_CHECK();
        flash_dkdv_k<D, DV, true><<<dim3(B * KVH, (c + TILE - 1) / TILE), THREADS_FA, sdkdv>>>(
            NULL, NULL, dd, lse + qo, delta + qo, qq, kk, vv, c, H, KVH, scale_log2, scale, blk);
        LAUNCH_CHECK();
    });
}

/* the most dynamic shared memory any kernel of a head size asks for */
template <int D, int DV>
size_t most_smem() {
    size_t a = forward_smem<D, DV>(), b = dq_smem<D, DV>(), c = dkdv_smem<D, DV>();
    size_t ab = a > b ? a : b;
    return ab > c ? ab : c;
}

} // namespace

/* The kernels need tensor-core bf16 (compute capability 8.0 or newer) and
 * the shared memory their head size asks for (up to 109 KiB at D 192: an
 * A100 or H100 has it; sm_86/sm_89 cards have 99 KiB and take the reference
 * path there). Pointers: 16-byte aligned (kernels/cuda/attention_choice.cu
 * checks, and reads MTRAIN_ATTENTION). */
int cuda_flash_attention_usable(int D, int Dv) {
    static int enabled = -1, optin = 0;
    if (enabled < 0) {
        int dev = 0, major = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        enabled = major >= 8;
    }
    if (!enabled || !((D == 64 && Dv == 64) || (D == 128 && Dv == 128) || (D == 192 && Dv == 128))) return 0;
    size_t need = D == 64 ? most_smem<64, 64>() : D == 128 ? most_smem<128, 128>() : most_smem<192, 128>();
    return need <= (size_t)optin;
}

void cuda_flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int H, int KVH, int D, int Dv) {
    if (!B || !T || !H) return;
    if (D == 64) forward<64, 64>(out, lse, q, k, v, B, T, H, KVH);
    else if (D == 128) forward<128, 128>(out, lse, q, k, v, B, T, H, KVH);
    else forward<192, 128>(out, lse, q, k, v, B, T, H, KVH);
}

void cuda_flash_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B,
                                        int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1,
                                        int first) {
    if (!B || !c || !H) return;
    const uint16_t *qb = (const uint16_t *)q, *kb = (const uint16_t *)k, *vb = (const uint16_t *)v;
    if (D == 64) block_forward<64, 64>(o, lse, qb, kb, vb, B, c, H, KVH, q0, q1, k0, k1, first);
    else if (D == 128) block_forward<128, 128>(o, lse, qb, kb, vb, B, c, H, KVH, q0, q1, k0, k1, first);
    else block_forward<192, 128>(o, lse, qb, kb, vb, B, c, H, KVH, q0, q1, k0, k1, first);
}

void cuda_flash_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                         const float *lse, const float *q, const float *k, const float *v, int B,
                                         int c, int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1) {
    if (!B || !c || !H) return;
    const uint16_t *db = (const uint16_t *)dout, *ob = (const uint16_t *)out, *qb = (const uint16_t *)q;
    const uint16_t *kb = (const uint16_t *)k, *vb = (const uint16_t *)v;
    if (D == 64) block_backward<64, 64>(dq, dk, dv, db, ob, lse, qb, kb, vb, B, c, H, KVH, q0, q1, k0, k1);
    else if (D == 128) block_backward<128, 128>(dq, dk, dv, db, ob, lse, qb, kb, vb, B, c, H, KVH, q0, q1, k0, k1);
    else block_backward<192, 128>(dq, dk, dv, db, ob, lse, qb, kb, vb, B, c, H, KVH, q0, q1, k0, k1);
}

void cuda_flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                   int H, int KVH, int D, int Dv) {
    if (!B || !T || !H) return;
    if (D == 64) backward<64, 64>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH);
    else if (D == 128) backward<128, 128>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH);
    else backward<192, 128>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH);
}
