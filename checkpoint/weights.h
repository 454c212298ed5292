/* Model weights <-> safetensors with Hugging Face tensor names (the names of
 * the parameter table), fp32 on disk. */
#pragma once
#include "kernels/ops.h"
#include "model/init.h"
#include "model/params.h"

/* Load every tensor of the table from path into the device buffer: a
 * safetensors file, or a Hugging Face model directory (model.safetensors, or
 * shards listed by model.safetensors.index.json). Global shapes must match;
 * each rank keeps its tensor-parallel block; BF16/F16 are widened. Tensors
 * not in the table are ignored (e.g. the copies in DeepSeek's MTP layer). A
 * DeepSeek-V3 Hugging Face directory (config.json: deepseek_v3,
 * rope_interleave) has its rotary rows put back in mtrain's order
 * (hf_rope_layout.h). Errors name the file and tensor and exit 1. */
void weights_load(const struct backend *be, float *buf, const struct param_table *t, const char *path);
/* Only the check: every parameter of model m (whole) is in path with its
 * global shape (before a model that size is allocated: the shapes come from
 * a config.json or recipe that may not match the file). Errors name the file
 * and tensor and exit 1. */
void weights_check(const struct model_config *m, const char *path);
/* The same, each tensor handed to put (model/master.h master_put). */
void weights_load_each(const struct param_table *t, const char *path, param_put_fn put, void *ctx);
/* Save the device buffer (e.g. parameters or gradients) as fp32 safetensors. */
void weights_save(const struct backend *be, const float *buf, const struct param_table *t, const char *path);
