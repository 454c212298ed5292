/* RoPE frequency tables. Computed in float32 as Hugging Face does, so the
 * rotation angles agree with the reference model bit for bit where possible. */
#include <math.h>
#include <string.h>

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

static int yarn(const struct model_config *cfg) {
    return cfg->rope_scaling_factor > 0 && !strcmp(cfg->rope_scaling_type, "yarn");
}

/* YaRN's attention-temperature factor for a context `scale` times longer. */
static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

/* The (fractional) dimension index whose wavelength makes `rotations` turns
 * over the original context. */
static double yarn_correction_dim(double rotations, int D, double base, int original) {
    return D * log(original / (rotations * 2 * M_PI)) / (2 * log(base));
}

/* YaRN (DeepSeek-V3): dimensions that turn more than beta_fast times over
 * the original context keep their frequency, those that turn fewer than
 * beta_slow times are divided by the factor, with a linear ramp between. */
static float yarn_frequency(float freq, int i, int D, const struct model_config *cfg) {
    double base = cfg->rope_theta;
    int orig = cfg->rope_original_max_pos;
    double low = floor(yarn_correction_dim(cfg->yarn_beta_fast, D, base, orig));
    double high = ceil(yarn_correction_dim(cfg->yarn_beta_slow, D, base, orig));
    if (low < 0) low = 0;
    if (high > D - 1) high = D - 1;
    if (low == high) high += 0.001;
    float ramp = ((float)i - (float)low) / (float)(high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    float keep = 1.0f - ramp; /* 1: extrapolate (keep freq), 0: interpolate (freq / factor) */
    return freq / (float)cfg->rope_scaling_factor * (1.0f - keep) + freq * keep;
}

float rope_softmax_scale(const struct model_config *cfg) {
    if (!yarn(cfg) || cfg->yarn_mscale_all_dim == 0) return 1.0f;
    double m = yarn_mscale(cfg->rope_scaling_factor, cfg->yarn_mscale_all_dim);
    return (float)(m * m);
}

void rope_tables(float *cos_out, float *sin_out, const struct model_config *cfg, int T) {
    int D = model_rope_dim(cfg), half = D / 2;
    /* YaRN scales cos and sin by mscale(factor, mscale) / mscale(factor, mscale_all_dim) */
    float amp = yarn(cfg) ? (float)(yarn_mscale(cfg->rope_scaling_factor, cfg->yarn_mscale) /
                                    yarn_mscale(cfg->rope_scaling_factor, cfg->yarn_mscale_all_dim))
                          : 1.0f;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)D);
        if (yarn(cfg)) freq = yarn_frequency(freq, i, D, cfg);
        else if (cfg->rope_scaling_factor > 0) freq = scale_frequency(freq, cfg);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * freq;
            cos_out[t * half + i] = cosf(angle) * amp;
            sin_out[t * half + i] = sinf(angle) * amp;
        }
    }
}

int model_max_positions(const struct model_config *cfg, int seq_len) {
    if (cfg->rope_scaling_factor > 0 && !strcmp(cfg->rope_scaling_type, "yarn")) /* YaRN's extended context */
        return (int)(cfg->rope_scaling_factor * cfg->rope_original_max_pos);
    return cfg->max_seq_len ? cfg->max_seq_len : seq_len;
}
