/* The linear layers of a block (model/linear.c), what every block kind
 * (dense, MoE, MLA) builds on: the backend's matmul_forward/backward, or
 * its FP8 GEMMs when the block runs in FP8 (transformer_set_fp8). */
#pragma once

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
