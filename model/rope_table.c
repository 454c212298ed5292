/* RoPE frequency tables. Computed in float32 as Hugging Face does, so the
 * rotation angles agree with the reference model bit for bit where possible. */
#include <math.h>

#include "model/transformer.h"

/* Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept,
 * and the band in between interpolated smoothly. */
static float scale_frequency(float freq, const struct model_config *cfg) {
    float factor = cfg->rope_scaling_factor, low = cfg->rope_low_freq_factor, high = cfg->rope_high_freq_factor;
    float old_len = (float)cfg->rope_original_max_pos;
    float low_wavelen = old_len / low, high_wavelen = old_len / high;
    float wavelen = 2.0f * (float)M_PI / freq;
    if (wavelen < high_wavelen) return freq;
    if (wavelen > low_wavelen) return freq / factor;
    float smooth = (old_len / wavelen - low) / (high - low);
    return (1.0f - smooth) * freq / factor + smooth * freq;
}

void rope_tables(float *cos_out, float *sin_out, const struct model_config *cfg, int T) {
    int D = cfg->hidden_size / cfg->num_heads, half = D / 2;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)D);
        if (cfg->rope_scaling_factor > 0) freq = scale_frequency(freq, cfg);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * freq;
            cos_out[t * half + i] = cosf(angle);
            sin_out[t * half + i] = sinf(angle);
        }
    }
}
