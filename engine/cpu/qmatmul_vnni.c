/* qmatmul_vnni.c — the AVX-512 VNNI tiles of qmatmul.c: qmatmul_simd.inc
 * with dpbusd for the integer dots, compiled for that instruction set
 * (GCC's target pragma) and picked at run time when the CPU has it. The
 * F16 / BF16 tiles are qmatmul_avx2.c's on both paths.
 *
 * A file of its own, as qmatmul_avx2.c is: qmatmul_impl.h says why. */
#include "cpu/qmatmul_impl.h"

#if HAVE_VNNI_PATH
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define QFN(name)   name##_vnni
#define QIDOT(u, v)         _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (v))
#define QIDOT_ACC(a, u, v)  _mm256_dpbusd_epi32((a), (u), (v))
#define QOFFSET8            1
#define QSHAPES(X)          SD_QTILE_SHAPES_WIDE(X)
#include "cpu/qmatmul_simd.inc"
#undef QFN
#undef QIDOT
#undef QIDOT_ACC
#undef QOFFSET8
#undef QSHAPES
#pragma GCC pop_options
#else
typedef int qmatmul_vnni_not_built; /* ISO C wants a declaration in every file */
#endif
