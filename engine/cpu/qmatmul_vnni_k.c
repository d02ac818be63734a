/* qmatmul_vnni_k.c — the AVX-512 VNNI tiles of the K-quants (Q4_K, Q5_K,
 * Q6_K): qmatmul_simd.inc as qmatmul_vnni.c includes it, with the K-quant
 * tiles instead of the blocks of 32. Its own file so the two compile in
 * parallel (qmatmul_simd.inc: QBLOCK32, QKQUANT). */
#include "cpu/qmatmul_impl.h"

#if HAVE_VNNI_PATH
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#include "cpu/qmatmul_vnni_defs.h"
#define QFN(name) name##_vnni_k
#define QBLOCK32  0 /* qmatmul_vnni.c */
#define QKQUANT   1
#include "cpu/qmatmul_simd.inc"
#pragma GCC pop_options
#else
typedef int qmatmul_vnni_k_not_built; /* ISO C wants a declaration in every file */
#endif
