/* weights_hf.c — Hugging Face checkpoint directories (placeholder until the
 * safetensors source lands: a directory is refused with a clear error). */
#include "weights_impl.h"

sd_status sd_weights_hf_open(const char *dir, sd_weights **out) {
    (void)out;
    SD_ERROR("weights: %s is a directory; Hugging Face checkpoints are not supported in this build", dir);
    return SD_ERR_UNSUPPORTED;
}
