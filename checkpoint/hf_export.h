/* Export a checkpoint (any layout) as a Hugging Face model directory:
 * model.safetensors (fp32, HF tensor names) + config.json for
 * LlamaForCausalLM, MixtralForCausalLM or DeepseekV3ForCausalLM, loadable
 * with transformers' from_pretrained. DeepSeek-V3's rotary rows are written
 * interleaved, as its Hugging Face checkpoints keep them (hf_rope_layout.h),
 * with the MTP layer's embed_tokens / shared_head.head copies. */
#pragma once
#include <stddef.h>

int checkpoint_export_hf(const char *step_dir, const char *out_dir, char *err, size_t errlen);
struct model_config;
/* -2 with a message naming `what` when transformers has no class for m. */
int checkpoint_hf_check_model(const struct model_config *m, const char *what, char *err, size_t errlen);
/* OUT_DIR/config.json for m (the directory exists). */
void checkpoint_hf_write_config(const struct model_config *m, const char *out_dir);
/* Set bos_token_id / eos_token_id (-1: null) in OUT_DIR/config.json, which
 * generate() reads; the tokenizer's ids come from the dataset's record. */
int checkpoint_hf_set_token_ids(const char *out_dir, long long bos, long long eos, char *err, size_t errlen);
/* model.safetensors of a Hugging Face directory from a weights file in
 * mtrain's layout (a run's final weights): copied as it is for Llama/Mixtral,
 * rewritten in Hugging Face's layout for DeepSeek-V3. */
int checkpoint_hf_weights_from_file(const struct model_config *m, const char *src, const char *dst, char *err,
                                    size_t errlen);
/* Just the weights, in mtrain's layout: every tensor of the model, whole, with its Hugging Face
 * name, into one safetensors file (any model, any layout). */
int checkpoint_export_weights(const char *step_dir, const char *path, char *err, size_t errlen);
