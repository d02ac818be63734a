/* qmatmul_vnni_k.c — the AVX-512 VNNI tiles of the K-quants (Q4_K, Q5_K,
 * Q6_K): qmatmul_simd.inc as qmatmul_vnni.c includes it, with the K-quant
 * tiles instead of the blocks of 32. Its own file so the two compile in
 * parallel (qmatmul_simd.inc: QBLOCK32, QKQUANT). */
#include "cpu/qmatmul_impl.h"

#if HAVE_VNNI_PATH
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define QFN(name)          name##_vnni_k
#define QIDOT(u, v)        _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (v))
#define QIDOT_ACC(a, u, v) _mm256_dpbusd_epi32((a), (u), (v))
#define QWDOT_ACC(a, u, v) _mm256_dpwssd_epi32((a), (u), (v))
#define QOFFSET8           1
#define QZMM               1
#define QSHAPES(X)         SD_QTILE_SHAPES_WIDE(X)
#define QBLOCK32           0 /* qmatmul_vnni.c */
#define QKQUANT            1
#include "cpu/qmatmul_simd.inc"
#undef QBLOCK32
#undef QKQUANT
#undef QFN
#undef QIDOT
#undef QIDOT_ACC
#undef QWDOT_ACC
#undef QOFFSET8
#undef QZMM
#undef QSHAPES
#pragma GCC pop_options
#else
typedef int qmatmul_vnni_k_not_built; /* ISO C wants a declaration in every file */
#endif
