/* DeepSeek-V3's rotary rows: mtrain keeps them in rotate_half order (pairs
 * i, i + d/2, as its Llama), Hugging Face DeepseekV3 checkpoints keep them
 * interleaved (pairs 2i, 2i + 1; config rope_interleave, which transformers
 * de-interleaves at run time). The rows concerned: the last qk_rope_head_dim
 * rows of every head of q_b_proj (q_proj), and the last qk_rope_head_dim rows
 * of kv_a_proj_with_mqa (the shared rotary key). */
#pragma once
#include <stdint.h>

#include "model/params.h"

struct mla_dims {
    int heads, qk_head_dim, rope_dim; /* rope_dim 0: not an MLA table */
};

/* The MLA head layout a parameter table implies (from its tensor shapes, so
 * it always agrees with what is loaded); rope_dim 0 when it has no MLA. */
void mla_dims_from_table(const struct param_table *t, struct mla_dims *d);
/* Permute the rotary rows of tensor `name` (whole, [rows, cols]) in place:
 * to_hf 1 rotate_half -> interleaved, 0 back. Other tensors are left alone.
 * Returns 1 when it moved rows. */
int hf_rope_permute(const struct mla_dims *d, const char *name, float *w, int64_t rows, int64_t cols, int to_hf);
