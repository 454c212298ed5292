/* cuDNN's fused flash attention (SDPA) for the bf16 table, through the cuDNN
 * backend C API (kernels/cuda/cudnn_attention.cu). libcudnn.so.9 is loaded
 * when first asked for (dlopen), so mtrain builds and runs without it; where
 * it is missing, or refuses a shape, the caller takes mtrain's own flash
 * kernels. Layouts are mtrain's: q [B,T,H,D], k [B,T,KVH,D], v [B,T,KVH,Dv],
 * out [B,T,H,Dv] bf16; lse [B*H, T] fp32, each row's natural log-sum-exp of
 * the scaled scores (the same state as the flash kernels', so either path's
 * backward takes either forward's state). C and C++. */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One attention shape: batch, sequence, query heads, kv heads, head dims,
 * for the backward whether dQ must repeat bitwise (cuDNN's deterministic
 * backward), and the heads of the tensors in memory (0: H, KVH) when the
 * call covers a head range of wider tensors (pointers at its first head). */
struct sdpa_shape {
    int B, T, H, KVH, D, Dv;
    int deterministic;
    int Hm, KVHm;
};

/* Run on the current CUDA device: 0 done, -1 not done (no libcudnn, or no
 * cuDNN engine for this shape on this GPU; said once on stderr): the
 * caller then writes every output another way (a backward that failed on
 * a later head group has written the earlier groups' gradients). Pointers
 * are device memory, 16-byte aligned. */
int cudnn_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                            const struct sdpa_shape *s);
int cudnn_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                             const void *q, const void *k, const void *v, const struct sdpa_shape *s);

/* Without a GPU: build the forward (backward = 0) or backward graph of s and
 * ask cuDNN for an execution plan on the device described by device_json
 * (cuDNN's device-property JSON, e.g. tests/data/cudnn_h100.json). 1 when
 * an engine accepted the graph (it compiled a plan, or got as far as
 * loading the kernel, which needs a driver), 0 when none did or mtrain
 * refuses the shape for this cuDNN version (as at run time), -1 when
 * libcudnn could not be loaded; why in msg. */
int cudnn_attention_check(const char *device_json, const struct sdpa_shape *s, int backward, char *msg, size_t n);

/* "9.19.0 (/path/libcudnn.so.9)" or why it is not loadable */
void cudnn_describe(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
