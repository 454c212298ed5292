/* The linear layers of a block (model/linear.c), what every block kind
 * (dense, MoE, MLA) builds on: the backend's matmul_forward/backward, or
 * its FP8 GEMMs when the block runs in FP8 (transformer_set_fp8). */
#pragma once
#include <stddef.h>

struct transformer;

/* Begin (1) or end (0) a group of linears that read one input one after
 * the other: their FP8 GEMMs cast it once (fp8_recipe.input_group). */
void linear_same_input(struct transformer *m, int begin);
/* The matmul_forward / matmul_backward of the blocks' linear layers: the
 * table's, or its FP8 GEMMs in an FP8 block (model/moe.c, model/mla.c). */
void linear_forward(struct transformer *m, float *out, const float *x, const float *w, int N, int K, int M,
                    int accumulate);
void linear_backward(struct transformer *m, float *dx, float *dw, const float *dout, const float *x, const float *w,
                     int N, int K, int M, int accumulate_dx);
/* The table's matmul_backward whatever the block's precision (routers, the
 * output heads, MTP's projection), deferred like linear_backward's. */
void linear_backward_plain(struct transformer *m, float *dx, float *dw, const float *dout, const float *x,
                           const float *w, int N, int K, int M, int accumulate_dx);

/* zb-h1's split backward (parallel/schedule.h): with m->defer_w set, the two
 * functions above compute only dx and record the weight-gradient GEMM (in
 * FP8 with the GEMM's recipe in an FP8 block, its operands cast when it runs) in
 * slot m->w_slot's queue, with copies of its operands that the slot does
 * not keep (scratch, or recomputed activations; device buffers that grow
 * to the largest micro batch's need, as many as Ws wait at once: a W's
 * buffer goes back to a pool once it ran). wgrad_run then accumulates them into
 * the gradients in the order backward met them, so the sums are 1F1B's, and
 * calls m->layer_grads_done for each main layer when last_micro_batch. */
void wgrad_run(struct transformer *m, int slot);
/* The next linear_backward's output gradient, if its W is deferred, is kept
 * at home (cap elements: a tensor of the slot that this backward has read
 * for the last time, e.g. the projection's own output) instead of in a copy
 * that the W holds besides the slot. Ignored where home is not the slot's
 * (full recompute's shared activations) or too small. */
void linear_dout_home(struct transformer *m, float *home, size_t cap);
/* The bytes of copies slot's waiting W holds (0 once it ran), and the copy
 * buffers that exist (held or pooled): tests of the estimate */
size_t wgrad_copied_bytes(const struct transformer *m, int slot);
int wgrad_buffers(const struct transformer *m);
void wgrad_free(struct transformer *m);
