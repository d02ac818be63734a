/* qmatmul_impl.h — what qmatmul.c (the C twins, activations, dispatch) and
 * its SIMD tile files (qmatmul_avx2.c, qmatmul_vnni.c, qmatmul_vnni_k.c) share: block
 * constants, the tile shapes the dispatch picks and the tables of tiles.
 *
 * The tiles live in their own translation units, one per instruction set,
 * because they are many instantiations of a few always-inline kernels
 * (formats x shapes): split, the build compiles them in parallel, and each
 * unit stays small enough for the sanitizer build (ASan instruments every
 * copy). Only the shapes the dispatch can pick are instantiated (see
 * SD_QTILE_SHAPES); a table entry of any other shape is NULL. */
#ifndef SPECD_CPU_QMATMUL_IMPL_H
#define SPECD_CPU_QMATMUL_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu/quant_kernels.h"
#include "specd/gguf.h" /* sd_f16_to_f32: exact, the software twin of F16C's vcvtph2ps */

#define QK   32  /* elements per activation block (and Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 block) */
/* Bytes per super-block of a K-quant activation row (sd_cpu_q8k_row_bytes):
 * 256 int8, the f32 scale, 64 int16 lane sums. */
#define Q8K_SB_BYTES (SD_QK_K + 4 + 128)

/* MAX_R x MAX_T tiles; pool chunks of ROW_CHUNK output rows (a multiple of
 * 3 and 4), or a multiple of it for calls that stream their weights
 * (qmatmul.c: chunk_rows, up to STREAM_CHUNK_BYTES of weights a chunk). */
enum { MAX_R = 4, MAX_T = 8, TOK_BLOCK = 64, ROW_CHUNK = 48, STREAM_CHUNK_BYTES = 384 << 10 };
/* The integer formats: blocks of 32 first, then the K-quants (kind >=
 * KIND_Q4_K), whose tiles are their own. */
enum {
    KIND_Q8_0 = 0,
    KIND_Q4_0 = 1,
    KIND_Q4_1 = 2,
    KIND_Q5_0 = 3,
    KIND_Q5_1 = 4,
    KIND_Q4_K = 5,
    KIND_Q5_K = 6,
    KIND_Q6_K = 7,
    N_KINDS = 8
};

/* Bytes of one block of 32 of kind (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1). */
static inline size_t qblock_bytes(int kind) {
    return kind == KIND_Q8_0 ? 34 : kind == KIND_Q4_0 ? 18 : kind == KIND_Q4_1 ? 20 : kind == KIND_Q5_0 ? 22 : 24;
}

/* True for the blocks of 32 with a minimum m (x = v d + m): Q4_1, Q5_1. */
static inline bool kind_has_min(int kind) { return kind == KIND_Q4_1 || kind == KIND_Q5_1; }

/* The AVX-512 VNNI copy of the tiles needs GCC's target pragma. */
#if SD_CPU_AVX2 && defined(__GNUC__) && !defined(__clang__)
#define HAVE_VNNI_PATH 1
#else
#define HAVE_VNNI_PATH 0
#endif

/* The AMX-INT8 path (qmatmul_amx.c) for K-quant calls of at least
 * SD_AMX_MIN_TOKENS tokens; the VNNI path does the rest of its calls.
 * GCC 11 has the tile intrinsics. */
#if HAVE_VNNI_PATH && defined(__linux__) && __GNUC__ >= 11
#define HAVE_AMX_PATH 1
#else
#define HAVE_AMX_PATH 0
#endif
#define SD_AMX_MIN_TOKENS 28 /* the measured crossover (qmatmul_amx.c) */

/* True when this CPU has AMX-INT8 and the kernel let this process use the
 * tile state (asked for once). */
bool sd_cpu_amx_usable(void);
/* Bytes of a call's activations laid out as B tiles, and of one thread's
 * weight strip (qmatmul_amx.c). */
size_t sd_cpu_kamx_xprep_bytes(size_t n_in, size_t n_tokens);
size_t sd_cpu_kamx_scratch_bytes(size_t n_in);
/* Lays out n_tokens K-quant activation rows (xrow_bytes apart) as B tiles
 * into dst (sd_cpu_kamx_xprep_bytes, 64-byte aligned). */
void sd_cpu_kamx_prep_x(const uint8_t *xq, size_t xrow_bytes, size_t n_in, size_t n_tokens, uint8_t *dst);
/* y[t * n_out + r] for rows [r_begin, r_end) and every token, on the laid
 * out activations xp; scratch: sd_cpu_kamx_scratch_bytes, 64-byte aligned. */
void sd_cpu_kamx_rows(int kind, const uint8_t *w, size_t row_bytes, size_t r_begin, size_t r_end, const uint8_t *xp,
                      size_t n_in, size_t n_tokens, float *y, size_t n_out, uint8_t *scratch);

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* An F16 / BF16 row's elements past its last whole 8 (from n8 to n),
 * added to s one at a time in order: the one tail of the C twin and of
 * every SIMD tile, so all paths end a row the same way. */
static inline float f16_row_tail(const uint8_t *wr, const float *x, size_t n8, size_t n, bool f16, float s) {
    for (size_t i = n8; i < n; i++) {
        uint16_t h = sd_load_u16(wr + 2 * i);
        s = fmaf(f16 ? sd_f16_to_f32(h) : bf16_to_float(h), x[i], s);
    }
    return s;
}

#if SD_CPU_AVX2
/* (qmatmul_simd.inc's tiles and qmatmul_amx.c) The 32 weights of sub-block s of the K-quant super-block blk as unsigned
 * bytes, the first operand of maddubs: Q4_K nibbles, Q5_K 5-bit values, Q6_K
 * the stored 6-bit q (its -32 is taken off with the lane sums). */
static inline __attribute__((always_inline)) __m256i sd_kweights32(const uint8_t *blk, int s, const int kind) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (kind == KIND_Q6_K) {
        const int h = s / 4, k = s % 4;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (k & 1)));
        __m256i top = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        __m256i nib = _mm256_and_si256(k < 2 ? lo : _mm256_srli_epi16(lo, 4), low4);
        /* bits 2k, 2k+1 of each byte to bits 4-5: no bit crosses a byte */
        __m256i two = k < 2 ? _mm256_slli_epi16(top, 4 - 2 * k) : _mm256_srli_epi16(top, 2 * k - 4);
        return _mm256_or_si256(nib, _mm256_and_si256(two, _mm256_set1_epi8(0x30)));
    }
    __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + (kind == KIND_Q5_K ? 48 : 16) + 32 * (s / 2)));
    __m256i n = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(qs, 4) : qs, low4);
    if (kind == KIND_Q5_K) {
        const __m256i bit = _mm256_set1_epi8((char)(1 << s));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        n = _mm256_or_si256(n, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return n;
}

/* The 6-bit scales and minimums of a Q4_K / Q5_K super-block as bytes:
 * sc_0..7, then m_0..7 (kscales_c's fields in qmatmul.c). Bytes s < 4: the
 * low 6 bits; s >= 4: a nibble of the third word plus the top 2 bits of
 * the first (sc) or second (m) moved to bits 4-5 of the same byte. */
static inline __m128i sd_kscale_bytes(const uint8_t *blk) {
    uint32_t w0, w1, w2;
    memcpy(&w0, blk + 4, 4);
    memcpy(&w1, blk + 8, 4);
    memcpy(&w2, blk + 12, 4);
    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    return _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
}
#endif

/* K-quant activation rows (quant_kernels.h: sd_cpu_q8k_row_bytes), nsb
 * super-blocks: q [nsb][256] int8 from byte 0, d [nsb] f32 from nsb * 256,
 * the lane sums [nsb][64] int16 from nsb * 260: for super-block sb, u = 0..3,
 * k = 0..7, h = 0..1, word 16u + 2k + h = S_{2u+h, k}, the sum of q over
 * elements 4k..4k+3 of the 32-element sub-block 2u + h. A row is nsb * 388
 * bytes, so the f32 scales are 4-byte aligned in a 4-aligned row. */
static inline float q8k_d(const uint8_t *xr, size_t nsb, size_t sb) {
    float d;
    memcpy(&d, xr + nsb * SD_QK_K + sb * 4, 4);
    return d;
}
static inline const uint8_t *q8k_lsums(const uint8_t *xr, size_t nsb, size_t sb) {
    return xr + nsb * (SD_QK_K + 4) + sb * 128;
}

/* Bytes of one K-quant super-block. */
static inline size_t kblock_bytes(int kind) { return kind == KIND_Q4_K ? 144 : kind == KIND_Q5_K ? 176 : 210; }

/* How far ahead of a K-quant super-block its tile of R rows prefetches:
 * the same place in the rows the chunk's next tiles read, one tile of R rows
 * down (Q6_K: two). A distance inside the row (1 KiB, as the other
 * formats had) misses most of a short row: a 2048-wide Q4_K row is 1152 bytes,
 * so 1 KiB ahead lands in the rows this tile is already reading and each
 * new tile started on cold lines (one-token calls stalled on their weight
 * loads). Measured on 75 MB matrices, 1 token, 2 threads (ns per row and
 * block, in-row / one tile / two tiles): Q4_K 1.38 / 0.58 / 1.04 (2048
 * wide), 0.89 / 0.53 / 0.88 (8192 wide); Q6_K 1.35 / 1.76 / 0.98 and
 * 1.43 / 1.63 / 0.90 (bench/results/quant-cpu.md). */
static inline size_t kprefetch_ahead(size_t row_bytes, int R, int kind) {
    return (size_t)(kind == KIND_Q6_K ? 2 * R : R) * row_bytes;
}

/* The tile of a call with n_tokens token rows: up to *rows weight rows x
 * *toks token rows, smaller at the edges of a chunk or token block. Up to 8
 * tokens share one pass over the weight rows; longer calls use tiles over
 * blocks of TOK_BLOCK tokens, rereading a chunk's rows from cache. wide:
 * the tiles of the AVX-512 VNNI path, 512-bit registers that each hold two
 * weight rows for one token, 16 accumulators (4 rows x 8 tokens) of its
 * 32 registers; otherwise (AVX2's 16 registers) up to 8 accumulators. */
static inline void qtile_shape(size_t n_tokens, bool wide, size_t *rows, size_t *toks) {
    if (wide) {
        *toks = n_tokens <= 8 ? n_tokens : 8;
        *rows = 4;
    } else if (n_tokens <= 8) {
        *toks = n_tokens;
        *rows = n_tokens <= 1 ? 4 : n_tokens <= 2 ? 2 : 1;
    } else {
        *toks = 4;
        *rows = 2;
    }
}

/* Every (R, T) that qtile_shape and the edges can give: R <= rows and
 * T <= toks of some call. X(R, T) for each: SD_QTILE_SHAPES for the narrow
 * rule, SD_QTILE_SHAPES_WIDE for the wide one. */
#define SD_QTILE_SHAPES(X) \
    X(1, 1) X(2, 1) X(3, 1) X(4, 1) X(1, 2) X(2, 2) X(1, 3) X(2, 3) X(1, 4) X(2, 4) X(1, 5) X(1, 6) X(1, 7) X(1, 8)
#define SD_QTILE_SHAPES_WIDE(X)                                                                                     \
    X(1, 1)                                                                                                         \
    X(2, 1)                                                                                                         \
    X(3, 1) X(4, 1) X(1, 2) X(2, 2) X(3, 2) X(4, 2) X(1, 3) X(2, 3) X(3, 3) X(4, 3) X(1, 4) X(2, 4) X(3, 4) X(4, 4) \
        X(1, 5) X(2, 5) X(3, 5) X(4, 5) X(1, 6) X(2, 6) X(3, 6) X(4, 6) X(1, 7) X(2, 7) X(3, 7) X(4, 7) X(1, 8)     \
            X(2, 8) X(3, 8) X(4, 8)

/* One R x T tile of an integer format (qmatmul_simd.inc: QFN(qtile)).
 * pf_ahead: the blocks of 32 prefetch (into L2) the weights pf_ahead bytes
 * past those they read, the same place in the chunk's next tile of rows; 0
 * when this is the chunk's last tile (the thread's next chunk is not known,
 * and the rows past this one are another chunk's). The K-quants keep their
 * own distance (kprefetch_ahead) and ignore it. */
typedef void (*qtile_fn)(const uint8_t *w, size_t row_bytes, const uint8_t *xq, size_t xrow_bytes, size_t nb, float *y,
                         size_t n_out, size_t pf_ahead);
/* One R x T tile of F16 / BF16; pf_ahead as for qtile_fn. */
typedef void (*ftile_fn)(const uint8_t *w, size_t row_bytes, const float *x, float *y, size_t n_in, size_t n_out,
                         size_t pf_ahead);

#if SD_CPU_AVX2
/* [kind][R - 1][T - 1]: one R x T tile of an integer format; NULL for a
 * shape not in SD_QTILE_SHAPES. qmatmul_avx2.c. */
extern const qtile_fn sd_cpu_qtiles_avx2[N_KINDS][MAX_R][MAX_T];
/* [f16][R - 1][T - 1]: F16 (1) / BF16 (0) tiles, both SIMD paths. qmatmul_avx2.c. */
extern const ftile_fn sd_cpu_ftiles[2][MAX_R][MAX_T];
#endif
#if HAVE_VNNI_PATH
/* As sd_cpu_qtiles_avx2, with VNNI integer dots, in the wide shapes
 * (SD_QTILE_SHAPES_WIDE), for the blocks of 32 but Q4_0 and Q5_0 (all
 * NULL: sd_cpu_zptiles_vnni). qmatmul_vnni.c. */
extern const qtile_fn sd_cpu_qtiles_vnni[N_KINDS][MAX_R][MAX_T];
/* The K-quants' VNNI tiles (qmatmul_vnni_k.c; the entries of the blocks of 32
 * are NULL there, and the K-quants' in sd_cpu_qtiles_vnni). */
extern const qtile_fn sd_cpu_qtiles_vnni_k[N_KINDS][MAX_R][MAX_T];
/* True for the kinds whose VNNI tiles run on prepared activation rows
 * (zprep below): Q4_0, Q5_0. */
static inline bool kind_zprep(int kind) { return kind == KIND_Q4_0 || kind == KIND_Q5_0; }
/* [Q4_0, Q5_0][R - 1][T - 1]: their tiles on prepared activation rows in
 * the wide shapes; the xq and xrow_bytes they take are the prepared rows
 * and zprep_row_bytes. qmatmul_vnni.c. */
extern const qtile_fn sd_cpu_zptiles_vnni[2][MAX_R][MAX_T];
/* The VNNI tiles of kind, [R - 1][T - 1] (Q4_0, Q5_0: on prepared rows). */
static inline const qtile_fn (*sd_cpu_vnni_qtiles(int kind))[MAX_T] {
    return kind_zprep(kind)    ? sd_cpu_zptiles_vnni[kind == KIND_Q5_0]
           : kind >= KIND_Q4_K ? sd_cpu_qtiles_vnni_k[kind]
                               : sd_cpu_qtiles_vnni[kind];
}
/* As sd_cpu_ftiles, in 512-bit registers, in the wide shapes. qmatmul_vnni.c. */
extern const ftile_fn sd_cpu_ftiles_vnni[2][MAX_R][MAX_T];
/* Prepares one quantized activation row xr (sd_cpu_q8_row_bytes, nb
 * blocks) for sd_cpu_zptiles_vnni into dst (zprep_row_bytes(nb) bytes,
 * 64-byte aligned). qmatmul_vnni.c. */
void sd_cpu_zprep_row_vnni(const uint8_t *xr, size_t nb, uint8_t *dst);
#endif

/* Prepared activations (zprep), for the VNNI path's Q4_0 and Q5_0 tiles
 * (qmatmul_vnni.c says why): per token, a
 * row holding per block b, at b * ZPREP_BLOCK_BYTES, q + 128 as unsigned
 * bytes with each dword twice (dword 2k + i = dword k), then dx_b twice
 * ([2b + i], f32) for the blocks padded to a multiple of 8 (zeros past
 * nb): 72 bytes per block against a q8 row's 68. Such calls take
 * ZPREP_TOK_BLOCK tokens per pass over a chunk's rows (64 prepared rows of
 * an 8192-wide matrix are 1.2 MB, most of an L2 beside the weights):
 * measured 1-6% faster than 64 on 576-, 2048- and 8192-wide matrices, one
 * thread (bench/results/quant-cpu.md). */
enum { ZPREP_BLOCK_BYTES = 64, ZPREP_TOK_BLOCK = 16 };

static inline size_t zprep_padded_blocks(size_t nb) { return (nb + 7) & ~(size_t)7; }

static inline size_t zprep_row_bytes(size_t nb) {
    return (nb * ZPREP_BLOCK_BYTES + zprep_padded_blocks(nb) * 8 + 63) & ~(size_t)63;
}

#endif
