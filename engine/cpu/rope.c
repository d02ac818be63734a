/* rope.c — rotary position embedding in llama.cpp's two layouts: "normal",
 * where the adjacent pairs (x[2i], x[2i+1]) of each head rotate by
 * theta = pos * inv_freq[i], and NeoX (Qwen2/3, Gemma 3), where the pair is
 * (x[i], x[i + head_dim/2]). One loop serves both: a layout is where pair i
 * starts and how far apart its two elements are. theta, cos and sin are
 * computed in double from (pos, inv_freq[i]) alone and rounded once to
 * float, so a token's rotation depends on nothing but its position (no
 * running products across positions, no per-batch tables). inv_freq already
 * holds base^(-2i/head_dim) with any frequency scaling. */
#include "cpu/cpu_impl.h"

typedef struct rope_args {
    float *x;
    const int32_t *pos;
    const float *inv_freq;
    size_t n_tokens, n_heads, head_dim;
    bool neox; /* pairs (i, i + head_dim/2) rather than (2i, 2i + 1) */
} rope_args;

static void rope_token(void *p, int64_t t, int32_t ith) {
    const rope_args *a = p;
    size_t half = a->head_dim / 2, gap = a->neox ? half : 1;
    float *row = a->x + (size_t)t * a->n_heads * a->head_dim;
    for (size_t i = 0; i < half; i++) {
        double theta = (double)a->pos[t] * (double)a->inv_freq[i];
        float c = (float)cos(theta), s = (float)sin(theta);
        size_t first = a->neox ? i : 2 * i;
        for (size_t h = 0; h < a->n_heads; h++) {
            float *v = row + h * a->head_dim + first;
            float x0 = v[0], x1 = v[gap];
            v[0] = x0 * c - x1 * s;
            v[gap] = x0 * s + x1 * c;
        }
    }
}

static sd_status rope(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                      const float *inv_freq, bool neox) {
    if (n_tokens <= 0) return SD_OK;
    rope_args a = {x, pos, inv_freq, (size_t)n_tokens, (size_t)n_heads, (size_t)head_dim, neox};
    sd_cpu_parallel(be, rope_token, &a, n_tokens, (size_t)n_tokens * (size_t)head_dim * 64);
    return SD_OK;
}

sd_status sd_cpu_rope(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                      const float *inv_freq) {
    return rope(be, x, n_tokens, n_heads, head_dim, pos, inv_freq, false);
}

sd_status sd_cpu_rope_neox(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                           const int32_t *pos, const float *inv_freq) {
    return rope(be, x, n_tokens, n_heads, head_dim, pos, inv_freq, true);
}
