/* quant_impl.h — what quant.c shares with quant_k.c (the K-quant types). */
#ifndef SPECD_FORMATS_QUANT_IMPL_H
#define SPECD_FORMATS_QUANT_IMPL_H

#include "specd/gguf.h"

/* f16 <-> f32: exact widening; narrowing rounds to nearest even. */
float sd_quant_f16_to_f32(uint16_t h);
uint16_t sd_quant_f32_to_f16(float f);

/* Dequantizes / quantizes n_blocks super-blocks of the K type t (the
 * sd_dequantize / sd_quantize contracts; arguments already checked). */
void sd_quant_k_dequantize(sd_dtype t, const uint8_t *src, uint64_t n_blocks, float *out);
void sd_quant_k_quantize(sd_dtype t, const float *in, uint64_t n_blocks, uint8_t *dst);

#endif
