#include <stdlib.h>
#include <string.h>

#include "config/common.h"
#include "kernels/cpu/cpu.h"

/* 64-byte aligned so AVX-512 loads never split cache lines. */
void *cpu_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) die("out of host memory allocating %zu bytes", bytes);
    memset(p, 0, rounded);
    return p;
}

void cpu_free(void *p) { free(p); }
void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}

/* a copy like any other, counted as the device's would be (kernels/ops.h) */
static void cpu_to_host(void *dst, const void *src, size_t bytes) {
    backend_count_d2h();
    cpu_copy(dst, src, bytes);
}
const void *cpu_host_view(const void *p) { return p; }

/* the softmax probabilities [B,H,T,T] */
size_t cpu_attention_state_floats(int B, int H, int T) { return (size_t)B * H * T * T; }

/* fp32 storage: a copy */
static void fp32_storage(float *dst, const float *src, size_t n) { cpu_copy(dst, src, sizeof(float) * n); }

const struct backend cpu_backend = {
    .name = "cpu",
    .act_bytes = sizeof(float),
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_host = cpu_to_host,
    .host_view = cpu_host_view,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .rope = cpu_rope,
    .attention_forward = cpu_attention_forward,
    .attention_state_floats = cpu_attention_state_floats,
    .attention_backward = cpu_attention_backward,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_block_backward = cpu_attention_block_backward,
    .attention_decode = cpu_attention_decode,
    .copy_cols = cpu_copy_cols,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .moe_route_forward = cpu_moe_route_forward,
    .moe_route_backward = cpu_moe_route_backward,
    .moe_route_sigmoid_forward = cpu_moe_route_sigmoid_forward,
    .moe_route_sigmoid_backward = cpu_moe_route_sigmoid_backward,
    .gather_rows = cpu_gather_rows,
    .moe_combine = cpu_moe_combine,
    .moe_combine_backward = cpu_moe_combine_backward,
    .moe_route_counts = cpu_moe_route_counts,
    .moe_route_balance = cpu_moe_route_balance,
    .moe_dispatch = cpu_moe_dispatch,
    .moe_expert_order = cpu_moe_expert_order,
    .cross_entropy = cpu_cross_entropy,
    .ce_row_max = cpu_ce_row_max,
    .ce_row_sumexp = cpu_ce_row_sumexp,
    .ce_finish = cpu_ce_finish,
    .to_storage = fp32_storage,
    .from_storage = fp32_storage,
    .add = cpu_add,
    .scale = cpu_scale,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
};
