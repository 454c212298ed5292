/* Where `mtrain generate` and `mtrain eval` get a model from (docs/inference.md):
 *   a checkpoint step directory (any layout: tp/pp/ep shards are assembled),
 *   a checkpoint directory (its newest step that loads, older ones on damage),
 *   a run's final weights LOG_DIR/model.safetensors (the model from the
 *     model.recipe.yaml beside it, or --recipe), or LOG_DIR itself,
 *   a Hugging Face directory (config.json + model.safetensors, Llama or Mixtral).
 * The model is built whole on one device (tp = pp = ep = 1). */
#pragma once
#include <stddef.h>

#include "config/recipe.h"
#include "model/transformer.h"

enum model_source_kind { SOURCE_CHECKPOINT, SOURCE_WEIGHTS, SOURCE_HF };

struct model_source {
    enum model_source_kind kind;
    struct recipe recipe;       /* model config; train/data keys only when has_run_recipe */
    int has_run_recipe;         /* the recipe is a training run's (seed, seq_len, data split mean something) */
    int max_positions;          /* longest sequence the model was made for (RoPE tables) */
    char path[4400];            /* weights file / HF directory / the first step directory to try */
    char root[4096];            /* a checkpoint directory whose older steps are fallbacks ("" none) */
};

/* Resolve path (recipe_path, or NULL, gives the model of a bare weights
 * file) for generate or eval: every family. Returns 0, or EXIT_USAGE /
 * EXIT_RUNTIME with a message in err. */
int model_source_open(struct model_source *s, const char *path, const char *recipe_path, char *err, size_t errlen);
/* The same without the position limit (convert --hf). */
int model_source_resolve(struct model_source *s, const char *path, const char *recipe_path, char *err, size_t errlen);
/* Fill the parameters of m (created for s->recipe.model, whole model).
 * Returns 0, or EXIT_RUNTIME / EXIT_USAGE with a message in err. Prints
 * what it loaded to stderr. */
int model_source_load(const struct model_source *s, struct transformer *m, char *err, size_t errlen);
/* Parse a Hugging Face config.json (LlamaForCausalLM, MixtralForCausalLM)
 * into cfg (other keys keep their value). Returns 0 or -1 with err. */
int hf_config_read(const char *path, struct model_config *cfg, char *err, size_t errlen);

/* backend_get(device), then m created for s's model (whole, micro batches of
 * B x T, one activation slot) and loaded. Returns 0 or an exit code (a
 * message is in err, or was printed by backend_get when err is empty). */
int model_source_build(const struct model_source *s, const char *device, int B, int T, struct transformer *m,
                       char *err, size_t errlen);

/* Token ids "1,2,3" (or spaces/newlines between them) -> *ids (malloc'd),
 * each in [0, vocab). Returns the count, or -1 with err naming `what` and the
 * offending item. */
long parse_token_ids(const char *text, int vocab, const char *what, int32_t **ids, char *err, size_t errlen);
