/* attention_z.h — attention.c's 512-bit kernels (attention_z.c), for the
 * SD_CPU_ATTN_AVX512 path: compiled where the build targets AVX2 on x86-64
 * with GCC or Clang, used where the CPU has AVX-512 F/VL/DQ. */
#ifndef SPECD_CPU_ATTENTION_Z_H
#define SPECD_CPU_ATTENTION_Z_H

#include <stdbool.h>
#include <stddef.h>

#include "cpu/cpu_impl.h"

#if SD_CPU_AVX2 && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SD_CPU_ATTN_Z 1
#else
#define SD_CPU_ATTN_Z 0
#endif

/* Whether this CPU runs the kernels below (false where they are not compiled). */
bool sd_cpu_attn_z_supported(void);

#if SD_CPU_ATTN_Z
/* An item's scores (attention.c's score loop): for every block b in [b0,
 * b1) of 8 K rows kp[8b ..] and every row i that reads it (8b < n_pos[i],
 * 8b + 8 > lo[i]), e[i][8b + p] = dot(q[i], kp[8b + p]) * scale, each
 * sd_cpu_dot's operations; rows sorted by position. */
void sd_cpu_attn_scores_z(const float *const *q, float *const *e, const size_t *n_pos, const size_t *lo, size_t n_rows,
                          const float *const *kp, size_t b0, size_t b1, size_t hd, float scale);
/* s[0..n) -> e_j = exp(s_j - max), s[n..round8(n)) = 0; returns the lane
 * sum (attention.c's softmax_weights). */
float sd_cpu_attn_softmax_z(float *s, size_t n);
/* The outputs of an item's n_rows rows (n_rows >= 1, sorted by position):
 * o[r][d] = (sum_j e[r][j] * vp[j][d], fused adds in position order) / sum[r]
 * (attention.c's V pass). */
void sd_cpu_attn_v_rows_z(const float *const *vp, float *const *e, const size_t *n_pos, const float *sum,
                          float *const *o, size_t n_rows, size_t hd);
#endif

#endif
