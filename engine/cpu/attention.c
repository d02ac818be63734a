/* attention.c — causal attention over the paged KV cache, and the cache write.
 *
 * One work item is (token, query head); items are dealt round-robin to
 * threads so long and short contexts mix. For an item the scores over
 * positions 0..pos are sd_cpu_dot(q, k) * scale, the softmax subtracts the
 * maximum and sums the exponentials in position order, and the output
 * accumulates weight * v in position order with fused multiply-adds before
 * one division by the sum. Everything depends only on the token's own
 * sequence and position, never on the rest of the batch. Keys and values are
 * read through the sequence's block table (bt + bt_off[t]).
 *
 * An f16 cache (sd_cpu_kv_write_f16 / sd_cpu_attention_f16) rounds each
 * value once when it is written (to nearest, ties to even); attention
 * widens a position's K or V row to f32 (exact) and then does the very
 * arithmetic of the f32 cache, so batch invariance holds as it does there.
 * The widening uses F16C where the build has AVX2 (every x86-64-v3 CPU has
 * F16C), else the bit-exact software conversion (sd_f16_to_f32). */
#include <string.h>

#include "cpu/cpu_impl.h"
#include "specd/gguf.h"

sd_status sd_cpu_kv_write(sd_backend *be, float *pool, int32_t block_size, int32_t row_width, const float *src,
                          int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off) {
    (void)be;
    for (int32_t t = 0; t < n_tokens; t++) {
        size_t block = (size_t)bt[bt_off[t] + pos[t] / block_size];
        size_t slot = block * (size_t)block_size + (size_t)(pos[t] % block_size);
        memcpy(pool + slot * (size_t)row_width, src + (size_t)t * (size_t)row_width, (size_t)row_width * sizeof(float));
    }
    return SD_OK;
}

sd_status sd_cpu_kv_write_f16(sd_backend *be, uint16_t *pool, int32_t block_size, int32_t row_width, const float *src,
                              int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off) {
    (void)be;
    for (int32_t t = 0; t < n_tokens; t++) {
        size_t block = (size_t)bt[bt_off[t] + pos[t] / block_size];
        uint16_t *dst = pool + (block * (size_t)block_size + (size_t)(pos[t] % block_size)) * (size_t)row_width;
        const float *row = src + (size_t)t * (size_t)row_width;
        for (int32_t i = 0; i < row_width; i++) dst[i] = sd_f32_to_f16(row[i]);
    }
    return SD_OK;
}

/* n halves to floats (exact either way). */
static inline void widen(const uint16_t *h, size_t n, float *out) {
    size_t i = 0;
#if SD_CPU_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) out[i] = sd_f16_to_f32(h[i]);
}

typedef struct attn_args {
    sd_backend *be;
    const float *q;
    const void *k_pool, *v_pool; /* float or uint16_t (f16) */
    bool f16;
    float *out;
    const int32_t *pos, *bt, *bt_off;
    size_t n_tokens, n_heads, n_kv_heads, head_dim, block_size;
    float scale;
} attn_args;

/* Kv head kvh's vector at position p of a sequence (table bt) as floats:
 * in the pool (f32), or widened into buf (f16). */
static inline const float *kv_at(const attn_args *a, const void *pool, const int32_t *bt, size_t p, size_t kvh,
                                 float *buf) {
    size_t slot = (size_t)bt[p / a->block_size] * a->block_size + p % a->block_size;
    size_t at = (slot * a->n_kv_heads + kvh) * a->head_dim;
    if (!a->f16) return (const float *)pool + at;
    widen((const uint16_t *)pool + at, a->head_dim, buf);
    return buf;
}

static void attn_item(void *p, int64_t item, int32_t ith) {
    const attn_args *a = p;
    float *scratch = a->be->scratch + (size_t)ith * a->be->scratch_per_thread;
    float *acc = scratch;                      /* [head_dim] */
    float *row = scratch + a->head_dim;        /* [head_dim]: a widened f16 row */
    float *scores = scratch + 2 * a->head_dim; /* [pos + 1] */
    size_t group = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    size_t t = (size_t)item / a->n_heads, h = (size_t)item % a->n_heads, kvh = h / group;
    size_t n_pos = (size_t)a->pos[t] + 1;
    const int32_t *bt = a->bt + a->bt_off[t];
    const float *q = a->q + (t * a->n_heads + h) * hd;

    float max = -INFINITY;
    for (size_t j = 0; j < n_pos; j++) {
        const float *k = kv_at(a, a->k_pool, bt, j, kvh, row);
        float s = sd_cpu_dot(q, k, hd) * a->scale;
        scores[j] = s;
        if (s > max) max = s;
    }
    float sum = 0.0f;
    for (size_t j = 0; j < n_pos; j++) {
        float e = expf(scores[j] - max);
        scores[j] = e;
        sum += e;
    }

    for (size_t d = 0; d < hd; d++) acc[d] = 0.0f;
    for (size_t j = 0; j < n_pos; j++) {
        const float *v = kv_at(a, a->v_pool, bt, j, kvh, row);
        float w = scores[j];
        size_t d = 0;
#if SD_CPU_AVX2
        __m256 wv = _mm256_set1_ps(w);
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
#endif
        for (; d < hd; d++) acc[d] = fmaf(w, v[d], acc[d]);
    }
    float *o = a->out + (t * a->n_heads + h) * hd;
    for (size_t d = 0; d < hd; d++) o[d] = acc[d] / sum;
}

static sd_status attention(sd_backend *be, const float *q, const void *k_pool, const void *v_pool, bool f16,
                           int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                           const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out) {
    if (n_tokens <= 0) return SD_OK;
    size_t max_pos = 0, work = 0;
    for (int32_t t = 0; t < n_tokens; t++) {
        if ((size_t)pos[t] > max_pos) max_pos = (size_t)pos[t];
        work += (size_t)pos[t] + 1;
    }
    SD_TRY(sd_cpu_scratch_reserve(be, 2 * (size_t)head_dim + max_pos + 1));
    attn_args a = {.be = be,
                   .q = q,
                   .k_pool = k_pool,
                   .v_pool = v_pool,
                   .f16 = f16,
                   .out = out,
                   .pos = pos,
                   .bt = bt,
                   .bt_off = bt_off,
                   .n_tokens = (size_t)n_tokens,
                   .n_heads = (size_t)n_heads,
                   .n_kv_heads = (size_t)n_kv_heads,
                   .head_dim = (size_t)head_dim,
                   .block_size = (size_t)block_size,
                   .scale = scale};
    sd_cpu_parallel(be, attn_item, &a, (int64_t)n_tokens * n_heads, work * (size_t)n_heads * (size_t)head_dim * 2);
    return SD_OK;
}

sd_status sd_cpu_attention(sd_backend *be, const float *q, const float *k_pool, const float *v_pool, int32_t n_tokens,
                           int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                           const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out) {
    return attention(be, q, k_pool, v_pool, false, n_tokens, n_heads, n_kv_heads, head_dim, block_size, pos, bt, bt_off,
                     scale, out);
}

sd_status sd_cpu_attention_f16(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                               int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                               int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                               float scale, float *out) {
    return attention(be, q, k_pool, v_pool, true, n_tokens, n_heads, n_kv_heads, head_dim, block_size, pos, bt, bt_off,
                     scale, out);
}
