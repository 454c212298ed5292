/* Writing a tokenizer as Hugging Face files (tokenizer.json +
 * tokenizer_config.json) so that transformers' AutoTokenizer encodes text
 * exactly as mtrain did when it built the dataset. */
#pragma once
#include <stddef.h>

#include "data/tokenizer.h"

/* Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json:
 *   hf:FILE       tokenizer.json is FILE, copied byte for byte;
 *   tiktoken:FILE converted: byte-level BPE whose vocabulary is the ranks in
 *                 GPT-2's byte-to-unicode alphabet, merges derived from the
 *                 ranks (every way to cut a token into two tokens, ordered by
 *                 the token's rank, as transformers' own converter does),
 *                 ignore_merges, the pre-tokenizer regex as a Split, and the
 *                 special tokens as added tokens;
 *   bytes         a byte-level BPE of 256 one-byte tokens (id = byte) and no
 *                 merges, with the EOD 256 as the added token "<eod>".
 * tokenizer_config.json names PreTrainedTokenizerFast, the BOS/EOS tokens and
 * model_max_length. Neither file adds a BOS when encoding (pretraining data
 * has none), except a copied tokenizer.json whose post_processor does.
 * Returns 0, or -1 with a message in err. */
int tokenizer_export_hf(const struct tokenizer *t, const char *out_dir, int model_max_length, char *err,
                        size_t errsz);
