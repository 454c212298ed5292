/* The names of Llama 3's 256 special tokens (ids 128000..128255 of Meta's
 * rank file). Meta's rank file holds only the 128000 ranks; the specials are
 * defined by code, and Llama 3.1 renamed some reserved ones:
 *
 *   id      Llama 3.0                      Llama 3.1 - 3.3
 *   +0      <|begin_of_text|>              <|begin_of_text|>
 *   +1      <|end_of_text|>                <|end_of_text|>
 *   +2, +3  <|reserved_special_token_0|>, <|reserved_special_token_1|> (both)
 *   +4      <|reserved_special_token_2|>   <|finetune_right_pad_id|>
 *   +5      <|reserved_special_token_3|>   <|reserved_special_token_2|>
 *   +6, +7  <|start_header_id|>, <|end_header_id|> (both)
 *   +8      <|reserved_special_token_4|>   <|eom_id|>
 *   +9      <|eot_id|>                     <|eot_id|>
 *   +10     <|reserved_special_token_5|>   <|python_tag|>
 *   rest    reserved 6..250                reserved 3..247
 *
 * as in the tokenizer.json files published for each version (transformers'
 * convert_llama_weights_to_hf.py lists both). */
#include <stdio.h>
#include <string.h>

#include "data/tokenizer_bpe.h"

void bpe_llama3_specials_version(int version, int base, struct bpe_special out[BPE_LLAMA3_SPECIALS],
                                 char names[BPE_LLAMA3_SPECIALS][40]) {
    static const char *const v30[] = {"<|begin_of_text|>", "<|end_of_text|>", NULL, NULL, NULL, NULL,
                                      "<|start_header_id|>", "<|end_header_id|>", NULL, "<|eot_id|>", NULL};
    static const char *const v31[] = {"<|begin_of_text|>", "<|end_of_text|>", NULL, NULL, "<|finetune_right_pad_id|>",
                                      NULL, "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                      "<|python_tag|>"};
    const char *const *named = version == 30 ? v30 : v31;
    int reserved = 0;
    for (int i = 0; i < BPE_LLAMA3_SPECIALS; i++) {
        if (i < 11 && named[i]) snprintf(names[i], 40, "%s", named[i]);
        else snprintf(names[i], 40, "<|reserved_special_token_%d|>", reserved++);
        out[i].text = names[i];
        out[i].id = base + i;
    }
}

void bpe_llama3_specials(int base, struct bpe_special out[BPE_LLAMA3_SPECIALS], char names[BPE_LLAMA3_SPECIALS][40]) {
    bpe_llama3_specials_version(31, base, out, names);
}
