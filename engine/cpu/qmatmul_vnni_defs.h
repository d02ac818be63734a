/* qmatmul_vnni_defs.h — qmatmul_simd.inc's parameters for its AVX-512 VNNI
 * copies (qmatmul_vnni.c: the blocks of 32, qmatmul_vnni_k.c: the
 * K-quants), included under their target pragma; each file then names its
 * copy (QFN) and its kinds (QBLOCK32, QKQUANT). No include guard: the .inc
 * undefines these after each use. */
#define QIDOT(u, v)        _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (v))
#define QIDOT_ACC(a, u, v) _mm256_dpbusd_epi32((a), (u), (v))
#define QWDOT_ACC(a, u, v) _mm256_dpwssd_epi32((a), (u), (v))
#define QOFFSET8           1
#define QZMM               1
#define QSHAPES(X)         SD_QTILE_SHAPES_WIDE(X)
