/* qmatmul_amx.c — the K-quants (Q4_K, Q5_K, Q6_K) of prompt-sized calls on
 * AMX-INT8 tile products, bit for bit the arithmetic of quant_kernels.h.
 *
 * That arithmetic keeps, per (row, token, super-block), eight exact int32
 * lane sums: lane k takes elements 4k..4k+3 of each of the eight 32-element
 * sub-blocks s, I_k = sum_s sc_{s,k} P_{s,k} and M_k = sum_s c_{s,k}
 * S_{s,k}. A tile product sums over its whole K, so the lanes are kept
 * apart by order, not by zeros: a weight row is laid out lane-major (lane
 * k's 32 elements, 4 from each sub-block, one after the other), and one
 * TDPBUSD with K = 32 gives one lane for 16 rows x 16 tokens. The
 * sub-block scales go into the weights: w'_j = sc_{s(j),k} w_j (Q6_K:
 * sc (w_j - 32), which is I_k - 32 M_k at once). w' does not fit a byte
 * (Q4_K 0..945, Q5_K 0..1953, Q6_K -4064..4096), so it is split exactly,
 * w' = lo + 256 hi with lo in 0..255 (unsigned) and hi the rest (Q6_K:
 * signed, TDPBSSD), two products whose sums are combined in int32. Q4_K /
 * Q5_K's minimum is a third product with m_s in every byte of sub-block s.
 * The float steps after it are quant_kernels.h's, as vectors over the 16
 * tokens of one (row, lane): t_k = fmaf((float)M_k, -dmin, (float)I_k * d),
 * acc_k = fmaf(t_k, dx, acc_k) per super-block in order, then the lane tree
 * sd_cpu_hsum8. Integers are exact in any order, so the result is the C
 * twin's (test_qmatmul checks it against kdot_c on this path).
 *
 * An earlier AMX attempt (bench/results/quant-cpu.md, q4kp) computed one
 * lane per tile product with K = 4, a sixteenth of a product's work, and
 * was slower than the VNNI tile; with K = 32 and the scales folded into the
 * weights a product does eight times as much.
 *
 * Per call, the activations are laid out once as B tiles (16 tokens x one
 * lane of one super-block, 512 bytes; the same bytes as the q8 rows,
 * permuted, padded with zero tokens). Per 16-row strip, each thread lays out
 * its weights (lo and hi of each lane interleaved by row, the minimum's
 * bytes, d and -dmin for every super-block) in its scratch, then runs every
 * token tile over them. The layout costs about one and a half token tiles'
 * work, so the path pays from about 28 tokens (SD_AMX_MIN_TOKENS in
 * qmatmul_impl.h; measured on the 1B Q4_K_M model, 2 threads: 16 tokens
 * 150-160 ms against the VNNI tiles' 130, 24: 200-212 against 186, 32:
 * 207-222 against 247-253, bench/results/quant-cpu.md "amx"). Linux hands out the
 * tile state only after arch_prctl(ARCH_REQ_XCOMP_PERM); without it, or
 * without AMX-INT8, the path is not available and the VNNI tiles run. */
#include "cpu/qmatmul_impl.h"

#include <pthread.h>

#if HAVE_AMX_PATH
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return; /* AMX-TILE, AMX-INT8 */
    unsigned a1, b1, c1, d1;
    if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || !((c1 >> 27) & 1)) return; /* OSXSAVE: xgetbv usable */
    uint32_t xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if (((xlo >> 17) & 3) != 3) return; /* XTILECFG and XTILEDATA enabled by the OS */
    if (!((c >> 1) & 1)) return;        /* AVX512_VBMI (the weight layout's byte permutes) */
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool sd_cpu_amx_usable(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi,amx-tile,amx-int8")
#include <immintrin.h>

enum {
    TT = 16,                          /* tokens per tile */
    TR = 16,                          /* weight rows per strip */
    B_BYTES = 8 * 64,                 /* one B tile: 8 rows (sub-blocks) x 16 tokens x 4 bytes */
    A_BYTES = TR * 32,  /* one A tile: 16 rows x one lane's 32 bytes */
    L_BYTES = TR * 64,  /* one lane's lo and hi tiles, interleaved by row: 16 x (32 lo, 32 hi) */
    MIN_OFF = 8 * L_BYTES,
    D_OFF = MIN_OFF + A_BYTES,
    SB_BYTES = D_OFF + 2 * 64, /* per super-block: lanes 0-7, the minimum's tile, d[16], -dmin[16] */
};

size_t sd_cpu_kamx_xprep_bytes(size_t n_in, size_t n_tokens) {
    const size_t ntt = (n_tokens + TT - 1) / TT, nsb = n_in / SD_QK_K;
    return ntt * nsb * (8 * (size_t)B_BYTES + TT * sizeof(float));
}

size_t sd_cpu_kamx_scratch_bytes(size_t n_in) { return n_in / SD_QK_K * (size_t)SB_BYTES; }

void sd_cpu_kamx_prep_x(const uint8_t *xq, size_t xrow_bytes, size_t n_in, size_t n_tokens, uint8_t *dst) {
    const size_t ntt = (n_tokens + TT - 1) / TT, nsb = n_in / SD_QK_K;
    float *dxv = (float *)(dst + ntt * nsb * 8 * (size_t)B_BYTES);
    for (size_t tt = 0; tt < ntt; tt++)
        for (size_t sb = 0; sb < nsb; sb++) {
            uint8_t *b = dst + (tt * nsb + sb) * 8 * (size_t)B_BYTES;
            float *dx = dxv + (tt * nsb + sb) * TT;
            for (size_t t = 0; t < TT; t++) {
                const size_t tok = tt * TT + t;
                if (tok >= n_tokens) {
                    for (int k = 0; k < 8; k++)
                        for (int s = 0; s < 8; s++) memset(b + k * B_BYTES + s * 64 + t * 4, 0, 4);
                    dx[t] = 0.0f;
                    continue;
                }
                const uint8_t *q = xq + tok * xrow_bytes + sb * SD_QK_K;
                for (int k = 0; k < 8; k++)
                    for (int s = 0; s < 8; s++) memcpy(b + k * B_BYTES + s * 64 + t * 4, q + 32 * s + 4 * k, 4);
                dx[t] = q8k_d(xq + tok * xrow_bytes, nsb, sb);
            }
        }
}

/* In place: v[s] dword k -> v[k] dword s (8 x 8 dwords). */
static inline __attribute__((always_inline)) void transpose8(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* u[0..3] hold rows 0-3 of columns (0,4), (1,5), (2,6), (3,7) per 128-bit half; u[4..7] rows 4-7 */
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
        v[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
    }
}

/* Each of the 8 bytes of v (bytes 0-7, or with odd 1, 3, .. 15 / even 0, 2,
 * .. 14 of 16) four times: byte 4s + i of the result is byte s (2s + odd,
 * 2s) of v, the lane-major layout's per-dword scale. */
static inline __attribute__((always_inline)) __m256i rep4(__m128i v, int stride, int odd) {
    const __m256i b = _mm256_broadcastsi128_si256(v);
    char idx[32];
    for (int j = 0; j < 32; j++) idx[j] = (char)(stride * ((j % 16) / 4 + 4 * (j / 16)) + odd);
    return _mm256_shuffle_epi8(b, _mm256_loadu_si256((const __m256i *)idx));
}

/* Lays out one weight row's super-block for the tiles: row r of lo[k],
 * hi[k] (k = 0..7) and of the minimum's tile, d and -dmin. NULL blk: a
 * padding row (zeros). The scales: sd_kscale_bytes (qmatmul_impl.h). */
static inline __attribute__((always_inline)) void prep_row(const uint8_t *blk, int r, uint8_t *sbuf,
                                                           const int kind) {
    float *dv = (float *)(sbuf + D_OFF), *ndv = dv + 16;
    if (!blk) {
        for (int k = 0; k < 8; k++) memset(sbuf + k * L_BYTES + r * 64, 0, 64);
        memset(sbuf + MIN_OFF + r * 32, 0, 32);
        dv[r] = 0.0f;
        ndv[r] = 0.0f;
        return;
    }
    __m512i sc0, sc1;
    if (kind == KIND_Q6_K) {
        dv[r] = _cvtsh_ss(sd_load_u16(blk + 208));
        ndv[r] = 0.0f;
        /* lane k, dword s uses sc[2s + k / 4] */
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        sc0 = _mm512_cvtepi8_epi16(rep4(sc, 2, 0));
        sc1 = _mm512_cvtepi8_epi16(rep4(sc, 2, 1));
    } else {
        dv[r] = _cvtsh_ss(sd_load_u16(blk));
        ndv[r] = -_cvtsh_ss(sd_load_u16(blk + 2));
        const __m128i scm = sd_kscale_bytes(blk);
        sc0 = sc1 = _mm512_cvtepu8_epi16(rep4(scm, 1, 0));
        _mm256_storeu_si256((__m256i *)(sbuf + MIN_OFF + r * 32), rep4(_mm_srli_si128(scm, 8), 1, 0));
    }
    __m256i v[8];
    for (int s = 0; s < 8; s++) v[s] = sd_kweights32(blk, s, kind);
    transpose8(v);
    char si[64];
    for (int j = 0; j < 64; j++) si[j] = (char)(j < 32 ? 2 * j : 2 * (j - 32) + 1);
    const __m512i split = _mm512_loadu_si512(si);
    for (int k = 0; k < 8; k++) {
        __m512i x = _mm512_cvtepu8_epi16(v[k]);
        if (kind == KIND_Q6_K) x = _mm512_sub_epi16(x, _mm512_set1_epi16(32));
        const __m512i wp = _mm512_mullo_epi16(x, k < 4 ? sc0 : sc1);
        /* the low bytes (lo) to bytes 0-31, the high ones (hi) to 32-63 */
        _mm512_storeu_si512(sbuf + k * L_BYTES + r * 64, _mm512_permutexvar_epi8(split, wp));
    }
}

typedef struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* tmm0: B (8 x 64); tmm1..3: A lo, hi, min (16 x 32); tmm4..6: C lo, hi, min (16 x 64) */
static void tile_config(void) {
    tilecfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = 8;
    c.colsb[0] = 64;
    for (int i = 1; i <= 3; i++) {
        c.rows[i] = TR;
        c.colsb[i] = 32;
    }
    for (int i = 4; i <= 6; i++) {
        c.rows[i] = TR;
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
}

/* One strip (its weights laid out in sbuf) against token tile tt: out[r][t]
 * for its 16 rows and 16 tokens. Steps (lane k, super-block sb) run in
 * that order, software-pipelined: step i's tile products are issued before
 * the float steps of step i - 1 (read from cbuf, where step i - 1's tiles
 * were stored), and stored after them, so the AMX unit and the vector units
 * work at the same time (storing right after the products waited for them:
 * perf had a fifth of the kernel on the first tile store). Each lane's
 * accumulators stay in 16 registers over its super-blocks. */
static inline __attribute__((always_inline)) void strip_tile(const uint8_t *sbuf, const uint8_t *xp, size_t nsb,
                                                             size_t ntt, size_t tt, float out[TR][TT],
                                                             const int kind) {
    const int q6 = kind == KIND_Q6_K;
    int32_t cbuf[3][TR][TT] __attribute__((aligned(64)));
    float lane[8][TR][TT] __attribute__((aligned(64)));
    const float *dxv = (const float *)(xp + ntt * nsb * 8 * (size_t)B_BYTES) + tt * nsb * TT;
    const uint8_t *xt = xp + tt * nsb * 8 * (size_t)B_BYTES;
    const size_t steps = 8 * nsb;
    __m512 acc[TR];
#pragma GCC unroll 16
    for (int r = 0; r < TR; r++) acc[r] = _mm512_setzero_ps();
    for (size_t i = 0; i <= steps; i++) {
        if (i < steps) {
            const size_t k = i / nsb, sb = i % nsb;
            const uint8_t *s = sbuf + sb * SB_BYTES;
            _tile_loadd(0, xt + (sb * 8 + k) * B_BYTES, 64);
            _tile_loadd(1, s + k * L_BYTES, 64);
            _tile_loadd(2, s + k * L_BYTES + 32, 64);
            _tile_zero(4);
            _tile_zero(5);
            _tile_dpbusd(4, 1, 0);
            if (q6)
                _tile_dpbssd(5, 2, 0);
            else
                _tile_dpbusd(5, 2, 0);
            if (!q6) {
                _tile_loadd(3, s + MIN_OFF, 32);
                _tile_zero(6);
                _tile_dpbusd(6, 3, 0);
            }
            if (i + 1 < steps) { /* the next step's B and A tiles */
                const size_t k1 = (i + 1) / nsb, sb1 = (i + 1) % nsb;
                const uint8_t *b1 = xt + (sb1 * 8 + k1) * B_BYTES, *s1 = sbuf + sb1 * SB_BYTES;
                for (int l = 0; l < B_BYTES; l += 64) _mm_prefetch((const char *)(b1 + l), _MM_HINT_T0);
                for (int l = 0; l < L_BYTES; l += 64)
                    _mm_prefetch((const char *)(s1 + k1 * L_BYTES + l), _MM_HINT_T0);
            }
        }
        if (i > 0) { /* the float steps of step i - 1 */
            const size_t k = (i - 1) / nsb, sb = (i - 1) % nsb;
            const float *dv = (const float *)(sbuf + sb * SB_BYTES + D_OFF), *ndv = dv + 16;
            const __m512 dx = _mm512_loadu_ps(dxv + sb * TT);
#pragma GCC unroll 16
            for (int r = 0; r < TR; r++) {
                const __m512i iv = _mm512_add_epi32(_mm512_load_si512(cbuf[0][r]),
                                                    _mm512_slli_epi32(_mm512_load_si512(cbuf[1][r]), 8));
                const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(iv), _mm512_set1_ps(dv[r]));
                const __m512 v =
                    q6 ? p : _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[2][r])), _mm512_set1_ps(ndv[r]), p);
                acc[r] = _mm512_fmadd_ps(v, dx, acc[r]);
            }
            if (sb == nsb - 1) {
#pragma GCC unroll 16
                for (int r = 0; r < TR; r++) {
                    _mm512_store_ps(lane[k][r], acc[r]);
                    acc[r] = _mm512_setzero_ps();
                }
            }
        }
        if (i < steps) {
            _tile_stored(4, cbuf[0], 64);
            _tile_stored(5, cbuf[1], 64);
            if (!q6) _tile_stored(6, cbuf[2], 64);
        }
    }
    /* the lane tree of sd_cpu_hsum8, 16 tokens at a time */
    for (int r = 0; r < TR; r++) {
        const __m512 a0 = _mm512_add_ps(_mm512_load_ps(lane[0][r]), _mm512_load_ps(lane[4][r]));
        const __m512 a1 = _mm512_add_ps(_mm512_load_ps(lane[1][r]), _mm512_load_ps(lane[5][r]));
        const __m512 a2 = _mm512_add_ps(_mm512_load_ps(lane[2][r]), _mm512_load_ps(lane[6][r]));
        const __m512 a3 = _mm512_add_ps(_mm512_load_ps(lane[3][r]), _mm512_load_ps(lane[7][r]));
        _mm512_store_ps(out[r], _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
    }
}

static inline __attribute__((always_inline)) void kamx_rows(const uint8_t *w, size_t row_bytes, size_t r_begin,
                                                            size_t r_end, const uint8_t *xp, size_t n_in,
                                                            size_t n_tokens, float *y, size_t n_out, uint8_t *scratch,
                                                            const int kind) {
    const size_t nsb = n_in / SD_QK_K, ntt = (n_tokens + TT - 1) / TT, bb = kblock_bytes(kind);
    float out[TR][TT] __attribute__((aligned(64)));
    tile_config();
    for (size_t r0 = r_begin; r0 < r_end; r0 += TR) {
        const size_t nr = r_end - r0 < TR ? r_end - r0 : TR;
        for (size_t sb = 0; sb < nsb; sb++)
            for (size_t r = 0; r < TR; r++)
                prep_row(r < nr ? w + (r0 + r) * row_bytes + sb * bb : NULL, (int)r, scratch + sb * SB_BYTES, kind);
        for (size_t tt = 0; tt < ntt; tt++) {
            strip_tile(scratch, xp, nsb, ntt, tt, out, kind);
            const size_t nt = n_tokens - tt * TT < TT ? n_tokens - tt * TT : TT;
            for (size_t t = 0; t < nt; t++)
                for (size_t r = 0; r < nr; r++) y[(tt * TT + t) * n_out + r0 + r] = out[r][t];
        }
    }
    _tile_release();
}

void sd_cpu_kamx_rows(int kind, const uint8_t *w, size_t row_bytes, size_t r_begin, size_t r_end, const uint8_t *xp,
                      size_t n_in, size_t n_tokens, float *y, size_t n_out, uint8_t *scratch) {
    switch (kind) {
    case KIND_Q4_K:
        kamx_rows(w, row_bytes, r_begin, r_end, xp, n_in, n_tokens, y, n_out, scratch, KIND_Q4_K);
        break;
    case KIND_Q5_K:
        kamx_rows(w, row_bytes, r_begin, r_end, xp, n_in, n_tokens, y, n_out, scratch, KIND_Q5_K);
        break;
    default: kamx_rows(w, row_bytes, r_begin, r_end, xp, n_in, n_tokens, y, n_out, scratch, KIND_Q6_K); break;
    }
}
#pragma GCC pop_options

#else
bool sd_cpu_amx_usable(void) { return false; }
#endif
