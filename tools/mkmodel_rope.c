/* mkmodel_rope.c — specd-mkmodel's LongRoPE (Phi-3 128k): the keys and
 * tensors llama.cpp's converter writes for a Phi-3 whose config.json has
 * rope_scaling "longrope" / "su", with random factors. */
#include "mkmodel_hf.h"

#include <math.h>
#include <stdio.h>

double mk_longrope_attn_factor(uint32_t ctx, uint32_t orig) {
    double scale = (double)ctx / (double)orig;
    return scale > 1.0 && orig > 1 ? sqrt(1.0 + log(scale) / log((double)orig)) : 1.0;
}

/* splitmix64, its own stream (the weights' streams are untouched). */
static double next_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

sd_status mk_write_longrope(sd_gguf_writer *w, const char *arch, uint32_t head_dim, uint32_t ctx, uint32_t orig,
                            uint64_t seed) {
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", arch);
    SD_TRY(sd_gguf_writer_set_f32(w, key, (float)mk_longrope_attn_factor(ctx, orig)));
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
    SD_TRY(sd_gguf_writer_set_u32(w, key, orig));
    /* as the published factors run: 1 at the highest frequency, growing
     * towards the lowest; the long ones up to 3, the short ones up to 1.5 */
    const uint32_t half = head_dim / 2;
    float f[512];
    if (half > sizeof f / sizeof f[0]) return SD_ERR_INVALID_ARG;
    uint64_t state = seed ^ 0x6c6f6e67726f7065ull;
    for (int set = 0; set < 2; set++) {
        const double top = set == 0 ? 3.0 : 1.5;
        for (uint32_t i = 0; i < half; i++) {
            double ramp = half > 1 ? (double)i / (double)(half - 1) : 0.0;
            f[i] = (float)(1.0 + (top - 1.0) * ramp * (0.75 + 0.25 * next_uniform(&state)));
        }
        SD_TRY(sd_gguf_writer_add_tensor(w, set == 0 ? "rope_factors_long.weight" : "rope_factors_short.weight",
                                         SD_DTYPE_F32, 1, (uint64_t[]){half}, f));
    }
    return SD_OK;
}
