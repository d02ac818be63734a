/* model_rope.c — the RoPE frequencies a model's layers rotate by: the base
 * and scaling of the file (none, linear, llama3, or per-frequency divisors:
 * rope_freqs.weight, or LongRoPE's long or short factors, chosen once at
 * load by sd_model_rope_factors from the context the model serves), and the
 * windowed layers' own (Gemma 3's base 10000, unscaled), computed in double
 * on the host and uploaded once at load: every backend and every rank of a
 * group rotates by the same table. LongRoPE's attention factor is not here:
 * it is in the scores' scale (model_config.h). Split out of model_load.c. */
#include "model_impl.h"

#include <math.h>

/* rope inverse frequencies [head_dim/2] with linear / llama3 scaling and
 * optional per-frequency divisors (rope_freqs.weight), computed in double. */
static void compute_inv_freq(const sd_model_config *c, const float *freq_factors, float *inv_freq) {
    int32_t half = c->head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double f = pow((double)c->rope_base, -2.0 * i / (double)c->head_dim);
        if (c->rope_scaling_type == SD_ROPE_LINEAR) {
            f /= (double)c->rope_scale_factor;
        } else if (c->rope_scaling_type == SD_ROPE_LLAMA3 && !freq_factors) {
            /* Llama 3.1: long wavelengths slowed by factor, short kept,
             * a smooth blend between */
            const double pi = 3.14159265358979323846;
            double wavelen = 2.0 * pi / f;
            double lo_wavelen = (double)c->rope_orig_ctx / (double)c->rope_low_freq_factor;
            double hi_wavelen = (double)c->rope_orig_ctx / (double)c->rope_high_freq_factor;
            if (wavelen > lo_wavelen) {
                f /= (double)c->rope_scale_factor;
            } else if (wavelen >= hi_wavelen) {
                double smooth = ((double)c->rope_orig_ctx / wavelen - (double)c->rope_low_freq_factor) /
                                ((double)c->rope_high_freq_factor - (double)c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / (double)c->rope_scale_factor + smooth * f;
            }
        }
        if (freq_factors) f /= (double)freq_factors[i];
        inv_freq[i] = (float)f;
    }
}

/* The frequencies of the layers of each kind: inv_freq (rope_base, scaling,
 * divisors) and, with a sliding window whose layers have a base of their
 * own, inv_freq_swa (rope_base_swa, no scaling, as llama.cpp). */
static sd_status upload_freqs(sd_model *m, const float *factors) {
    const sd_model_config *c = &m->cfg;
    float freq_host[SD_MODEL_MAX_HEAD_DIM / 2];
    size_t bytes = (size_t)(c->head_dim / 2) * sizeof(float);
    compute_inv_freq(c, factors, freq_host);
    m->inv_freq = m->be.ops->buf_alloc(m->be.ctx, bytes);
    if (!m->inv_freq) return SD_ERR_NOMEM;
    SD_TRY(m->be.ops->buf_upload(m->be.ctx, m->inv_freq, freq_host, bytes));
    if (c->sliding_window <= 0 || (c->rope_base_swa == c->rope_base && c->rope_scaling_type == 0 && !factors))
        return SD_OK;
    sd_model_config local = *c;
    local.rope_base = c->rope_base_swa;
    local.rope_scaling_type = SD_ROPE_NONE;
    compute_inv_freq(&local, NULL, freq_host);
    m->inv_freq_swa = m->be.ops->buf_alloc(m->be.ctx, bytes);
    if (!m->inv_freq_swa) return SD_ERR_NOMEM;
    return m->be.ops->buf_upload(m->be.ctx, m->inv_freq_swa, freq_host, bytes);
}

sd_status sd_model_load_freqs(sd_model *m, const sd_weights *w) {
    const sd_model_config *c = &m->cfg;
    const int32_t half = c->head_dim / 2;
    const float *lr = sd_model_rope_factors(c, m->params.max_ctx);
    if (lr) {
        int32_t ctx = m->params.max_ctx > 0 ? m->params.max_ctx : c->n_ctx_train;
        SD_INFO("model: LongRoPE with the %s factors (context %d %s the original %d), attention factor %g",
                lr == c->rope_factors_long ? "long" : "short", (int)ctx,
                lr == c->rope_factors_long ? ">" : "<=", (int)c->rope_orig_ctx, (double)c->rope_attn_factor);
        return upload_freqs(m, lr);
    }
    float factors[SD_MODEL_MAX_HEAD_DIM / 2];
    sd_weights_tensor rf;
    if (!sd_weights_find(w, "rope_freqs.weight", &rf)) return upload_freqs(m, NULL);
    if (rf.n_dims != 1 || rf.ne[0] != half) {
        SD_ERROR("model: rope_freqs.weight has %lld elements, expected %d", (long long)rf.ne[0], (int)half);
        return SD_ERR_FORMAT;
    }
    SD_TRY(sd_weights_read(w, "rope_freqs.weight", 0, 1, 0, half, factors)); /* NaN and infinity refused there */
    for (int32_t i = 0; i < half; i++)
        if (!(factors[i] > 0.0f)) {
            SD_ERROR("model: rope_freqs.weight[%d] = %g: RoPE divisors must be positive", (int)i, (double)factors[i]);
            return SD_ERR_FORMAT;
        }
    return upload_freqs(m, factors);
}
