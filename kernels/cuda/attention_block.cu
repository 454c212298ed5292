// Context parallelism's block attention on CUDA (kernels/ops.h
// attention_block_forward/backward): the kernels of attention_block.cuh,
// a warp per row, fp32 operands. Correct first; not yet tiled.
#include "kernels/cuda/attention_block.cuh"
#include "kernels/cuda/cuda.h"

static const unsigned THREADS = 128; /* 4 warps a block, a warp a row */

static unsigned blocks_for(long rows) { return (unsigned)((rows * 32 + THREADS - 1) / THREADS); }

static void check_dims(int D, int Dv) {
    if (D > ATTB_MAX_DIM || Dv > ATTB_MAX_DIM)
        die("context-parallel attention on CUDA: head dims %d/%d over the %d its kernels hold", D, Dv, ATTB_MAX_DIM);
}

void cuda_attention_block_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int c,
                                  int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1, int first) {
    check_dims(D, Dv);
    long rows = (long)B * H * 2 * c;
    attb_forward_k<<<blocks_for(rows), THREADS>>>(o, lse, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0, k1, first,
                                                   1.0f / sqrtf((float)D));
    LAUNCH_CHECK();
}

void cuda_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v, int B, int c,
                                   int H, int KVH, int D, int Dv, int q0, int q1, int k0, int k1) {
    check_dims(D, Dv);
    int T = 2 * c;
    float scale = 1.0f / sqrtf((float)D);
    /* rowsum(dout * out) of each query row: the same for every block of the ring, recomputed per block (small) */
    float *delta = (float *)cuda_scratch(SCRATCH_WORK, sizeof(float) * (size_t)B * H * T);
    attb_delta_k<<<blocks_for((long)B * H * T), THREADS>>>(delta, dout, out, B, T, H, Dv);
    LAUNCH_CHECK();
    attb_dq_k<<<blocks_for((long)B * H * T), THREADS>>>(dq, dout, lse, delta, q, k, v, B, c, H, KVH, D, Dv, q0, q1, k0,
                                                         k1, scale);
    LAUNCH_CHECK();
    attb_dkv_k<<<blocks_for((long)B * KVH * T), THREADS>>>(dk, dv, dout, lse, delta, q, k, v, B, c, H, KVH, D, Dv, q0,
                                                            q1, k0, k1, scale);
    LAUNCH_CHECK();
}
