/* sample.c — counter-based RNG (Philox4x32-10), processed distributions,
 * and seeded token sampling.
 *
 * RNG. Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11) is a keyed bijection of a 128-bit counter: a draw is a
 * pure function of (seed, position, purpose), so the same seeded request
 * yields the same tokens whatever the batch, the thread or the process
 * (failover). Key = the 64-bit seed as two 32-bit words (low word first);
 * counter = (position low word, position high word, purpose, 0). Checked
 * against the Random123 known-answer vectors in tests/test_sample.c.
 * Rejected: a stateful generator (xoshiro, PCG) — its output would depend on
 * how many draws came before, which differs between plain and speculative
 * decoding.
 *
 * Processing, in this fixed order (documented contract, since speculative
 * verification must apply exactly the same steps to draft and target):
 *   1. temperature: z = logit / T, in double;
 *   2. softmax in double with the maximum subtracted, summed in index order;
 *   3. top-k: keep the k most probable tokens (ties: lower id first);
 *   4. top-p: on the distribution renormalized over what top-k kept, keep
 *      the smallest prefix of tokens by (probability desc, id asc) whose mass
 *      reaches top_p (the prefix summed in rank order, against top_p times
 *      the kept mass: top-k's summed in rank order, the whole vocabulary's
 *      in id order);
 *   5. min-p: on the distribution renormalized over what top-p kept, drop
 *      tokens with p < min_p * p_max;
 *   6. renormalize over the kept set (sum in index order), written as f32.
 * Temperature 0 is greedy: a one-hot on sd_argmax (lowest id on ties).
 * Logits may be -inf (masked); NaN or +inf is refused as INVALID_ARG. The
 * sort is a qsort with a total order (probability, then id), so the kept set
 * never depends on the sort's stability. With top-k only the k first are
 * sorted, after a selection (select_first): the same entries in the same
 * order, O(n) instead of O(n log n) (Gemma 3's 262,144 ids); top-p and
 * min-p alone rank a growing prefix until it decides the cut
 * (filter_ranked). */
#include "specd/sample.h"

#include <math.h>
#include <stdlib.h>

/* ---- Philox4x32-10 ---- */

#define PHILOX_M0     0xD2511F53u
#define PHILOX_M1     0xCD9E8D57u
#define PHILOX_W0     0x9E3779B9u /* golden ratio */
#define PHILOX_W1     0xBB67AE85u /* sqrt(3) - 1 */
#define PHILOX_ROUNDS 10

void sd_philox4x32(uint64_t seed, uint32_t ctr[4], uint32_t out[4]) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * x0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * x2;
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
        uint32_t y1 = (uint32_t)p1;
        uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
        uint32_t y3 = (uint32_t)p0;
        x0 = y0;
        x1 = y1;
        x2 = y2;
        x3 = y3;
    }
    out[0] = x0;
    out[1] = x1;
    out[2] = x2;
    out[3] = x3;
}

double sd_rng_uniform(uint64_t seed, uint64_t position, sd_rng_purpose purpose) {
    uint32_t ctr[4] = {(uint32_t)position, (uint32_t)(position >> 32), (uint32_t)purpose, 0};
    uint32_t out[4];
    sd_philox4x32(seed, ctr, out);
    uint64_t bits = (((uint64_t)out[0] << 32) | out[1]) >> 11; /* 53 bits */
    return (double)bits * 0x1.0p-53;
}

/* ---- the exponential race ---- */

/* The uniform of vocabulary entry v in (0, 1): 32 bits of the Philox block
 * (position, SD_RNG_RACE, v / 4), word v % 4, centred in its cell so that
 * -log never sees 0. */
static double race_uniform(const uint32_t words[4], int32_t v) { return ((double)words[v & 3] + 0.5) * 0x1.0p-32; }

int32_t sd_sample_race(const float *probs, int32_t n, uint64_t seed, uint64_t position) {
    /* The winner minimizes E_v / p_v with E_v = -log U_v. As -log U >= 1 - U,
     * an entry with (1 - U_v) >= best * p_v cannot win: the log is taken
     * only for the few that might (a bound, never an approximation). */
    int32_t best_v = -1;
    double best = INFINITY;
    uint32_t ctr[4] = {(uint32_t)position, (uint32_t)(position >> 32), (uint32_t)SD_RNG_RACE, 0};
    uint32_t words[4];
    int32_t block = -1;
    for (int32_t v = 0; v < n; v++) {
        if (!(probs[v] > 0.0f)) continue;
        if ((v >> 2) != block) {
            block = v >> 2;
            ctr[3] = (uint32_t)block;
            sd_philox4x32(seed, ctr, words);
        }
        double u = race_uniform(words, v), p = (double)probs[v];
        if (best_v >= 0 && 1.0 - u >= best * p) continue;
        double key = -log(u) / p;
        if (key < best) { /* ties keep the lower id */
            best = key;
            best_v = v;
        }
    }
    return best_v;
}

/* ---- processing ---- */

int32_t sd_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
    return best;
}

typedef struct ranked {
    double p;
    int32_t id;
} ranked;

/* Probability descending, then id ascending: a total order. */
static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Moves the k first entries of r[0..n) in cmp_ranked's order to r[0..k),
 * in no particular order (quickselect, three-way partitions around a
 * pseudo-random pivot: expected O(n)). The order is total, so they are
 * exactly the entries a full sort puts first: sorting just them gives a
 * full sort's prefix, element for element. */
static void select_first(ranked *r, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n;
    uint64_t x = 0x9E3779B97F4A7C15ull; /* xorshift: the same pivots every call */
    while (lo < k && k < hi) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ranked pv = r[lo + (int32_t)(x % (uint64_t)(hi - lo))], t;
        int32_t lt = lo, i = lo, gt = hi; /* [lo, lt) before pv, [lt, i) pv, [gt, hi) after */
        while (i < gt) {
            int c = cmp_ranked(&r[i], &pv);
            if (c < 0)
                t = r[i], r[i++] = r[lt], r[lt++] = t;
            else if (c > 0)
                t = r[i], r[i] = r[--gt], r[gt] = t;
            else
                i++;
        }
        if (k < lt)
            hi = lt;
        else if (k <= i)
            return;
        else
            lo = i;
    }
}

/* Steps 4-5 on r[0..m), a full ranking's first m entries, of n_kept
 * candidates whose mass is `mass`: the kept count, or -1 when these m
 * cannot decide it (the top-p prefix or the min-p run reaches past them). */
static int32_t cut_prefix(const ranked *r, int32_t m, int32_t n_kept, double mass, const sd_sampling *s) {
    if (s->top_p < 1.0f) {
        double need = (double)s->top_p * mass, cum = 0.0;
        int32_t keep = -1;
        for (int32_t i = 0; i < m; i++) {
            cum += r[i].p;
            if (cum >= need) {
                keep = i + 1;
                break;
            }
        }
        if (keep < 0 && m < n_kept) return -1;
        n_kept = keep < 0 ? n_kept : keep;
    }
    if (s->min_p > 0.0f) {
        /* Renormalizing scales every p alike, so the test on raw p is the same. */
        double floor_p = (double)s->min_p * r[0].p;
        int32_t keep = 1;
        while (keep < n_kept && keep < m && r[keep].p >= floor_p) keep++;
        if (keep == m && m < n_kept) return -1;
        n_kept = keep;
    }
    return n_kept;
}

/* Steps 3-5 on r[0..n) (id order): the kept count, r[0..count) the kept
 * entries in rank order. Top-k ranks just its k (select_first). Without
 * it, top-p and min-p keep a prefix of the full ranking that is usually
 * short, so the first m are ranked (select_first and a sort: exactly a
 * full sort's prefix) and m grows 8x until they decide the cut: a sort of
 * a few hundred entries instead of the whole vocabulary (2.4 ms a row on
 * 49,152 ids), with the very sums the full sort's prefix gives. */
static int32_t filter_ranked(ranked *r, int32_t n, const sd_sampling *s) {
    double mass = 0.0;
    if (s->top_k > 0 && s->top_k < n) { /* only the top k are looked at: rank just them */
        select_first(r, n, s->top_k);
        qsort(r, (size_t)s->top_k, sizeof *r, cmp_ranked);
        for (int32_t i = 0; i < s->top_k; i++) mass += r[i].p;
        return cut_prefix(r, s->top_k, s->top_k, mass, s);
    }
    for (int32_t i = 0; i < n; i++) mass += r[i].p; /* id order: no ranking needed for it */
    for (int32_t m = n < 256 ? n : 256;; m = m > n / 8 ? n : m * 8) {
        if (m < n) select_first(r, n, m);
        qsort(r, (size_t)m, sizeof *r, cmp_ranked);
        int32_t kept = cut_prefix(r, m, n, mass, s);
        if (kept >= 0) return kept;
    }
}

/* The logits' checks; the sampling parameters are the caller's (checked
 * once, at the public entry or the wire's edge). */
static sd_status check_inputs(const float *logits, int32_t n, const sd_sampling *s, const void *out) {
    if (!logits || !out || !s || n <= 0) {
        SD_ERROR("sampling: need logits, parameters, an output and n > 0 (n = %d)", (int)n);
        return SD_ERR_INVALID_ARG;
    }
    bool any_finite = false;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            SD_ERROR("sampling: logit %d is %g", (int)i, (double)logits[i]);
            return SD_ERR_INVALID_ARG;
        }
        any_finite |= isfinite(logits[i]);
    }
    if (!any_finite) {
        SD_ERROR("sampling: all %d logits are -inf", (int)n);
        return SD_ERR_INVALID_ARG;
    }
    return SD_OK;
}

sd_status sd_sample_greedy(const float *logits, int32_t n, int32_t *token) {
    if (!logits || !token || n <= 0) {
        SD_ERROR("sampling: need logits, an output and n > 0 (n = %d)", (int)n);
        return SD_ERR_INVALID_ARG;
    }
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            SD_ERROR("sampling: logit %d is %g", (int)i, (double)logits[i]);
            return SD_ERR_INVALID_ARG;
        }
        if (logits[i] > logits[best]) best = i;
    }
    if (logits[best] == -INFINITY) {
        SD_ERROR("sampling: all %d logits are -inf", (int)n);
        return SD_ERR_INVALID_ARG;
    }
    *token = best;
    return SD_OK;
}

sd_status sd_sample_probs(const float *logits, int32_t n, const sd_sampling *s, float *probs) {
    SD_TRY(sd_sampling_validate(s));
    return sd_sample_probs_given(logits, n, s, probs);
}

sd_status sd_sample_probs_given(const float *logits, int32_t n, const sd_sampling *s, float *probs) {
    SD_TRY(check_inputs(logits, n, s, probs));
    if (sd_sampling_is_greedy(s)) {
        int32_t best = sd_argmax(logits, n);
        for (int32_t i = 0; i < n; i++) probs[i] = i == best ? 1.0f : 0.0f;
        return SD_OK;
    }

    ranked *r = malloc((size_t)n * sizeof *r); /* [n] (p, id), id order until sorted */
    if (!r) {
        SD_ERROR("sampling: cannot allocate scratch for %d tokens", (int)n);
        return SD_ERR_NOMEM;
    }
    /* 1-2. temperature and softmax in double. */
    double inv_t = 1.0 / (double)s->temperature, z_max = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        double z = (double)logits[i] * inv_t;
        if (z > z_max) z_max = z;
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) {
        r[i].id = i;
        r[i].p = exp((double)logits[i] * inv_t - z_max);
        total += r[i].p;
    }
    for (int32_t i = 0; i < n; i++) r[i].p /= total;

    /* 3-5. filters over the ranking; kept = r[0..n_kept). */
    int32_t n_kept = n;
    bool rank = (s->top_k > 0 && s->top_k < n) || s->top_p < 1.0f || s->min_p > 0.0f;
    if (rank) n_kept = filter_ranked(r, n, s);

    /* 6. renormalize, summing in id order so the result is order-independent. */
    for (int32_t i = 0; i < n; i++) probs[i] = 0.0f;
    if (rank) {
        /* Scatter kept probabilities as doubles through a second pass. */
        double *dense = calloc((size_t)n, sizeof *dense); /* [n] kept p by id */
        if (!dense) {
            free(r);
            SD_ERROR("sampling: cannot allocate scratch for %d tokens", (int)n);
            return SD_ERR_NOMEM;
        }
        for (int32_t i = 0; i < n_kept; i++) dense[r[i].id] = r[i].p;
        double kept = 0.0;
        for (int32_t i = 0; i < n; i++) kept += dense[i];
        for (int32_t i = 0; i < n; i++) probs[i] = (float)(dense[i] / kept);
        free(dense);
    } else {
        for (int32_t i = 0; i < n; i++) probs[i] = (float)r[i].p;
    }
    free(r);
    return SD_OK;
}

/* ---- penalties and log-probabilities ---- */

sd_status sd_sample_penalize(float *logits, int32_t n_vocab, const sd_sampling *s, const int32_t *generated,
                             int32_t n_generated, int32_t *counts) {
    if (!logits || !s || n_vocab <= 0 || n_generated < 0 || (n_generated > 0 && (!generated || !counts)))
        return SD_ERR_INVALID_ARG;
    if (!sd_sampling_has_penalties(s) || n_generated == 0) return SD_OK;
    for (int32_t j = 0; j < n_generated; j++)
        if (generated[j] < 0 || generated[j] >= n_vocab) {
            SD_ERROR("sampling: penalized token %d at %d outside [0, %d)", (int)generated[j], (int)j, (int)n_vocab);
            return SD_ERR_RANGE;
        }
    for (int32_t j = 0; j < n_generated; j++) counts[generated[j]]++;
    /* each distinct token once: the first visit applies and clears its count */
    for (int32_t j = 0; j < n_generated; j++) {
        int32_t t = generated[j];
        if (counts[t] == 0) continue;
        double pen = (double)s->frequency_penalty * counts[t] + (double)s->presence_penalty;
        logits[t] = (float)((double)logits[t] - pen);
        counts[t] = 0;
    }
    return SD_OK;
}

sd_status sd_sample_logprobs(const float *logits, int32_t n, int32_t token, int32_t top_n, sd_token_logprob *out) {
    if (!logits || !out || n <= 0 || token < 0 || token >= n || top_n < 0 || top_n > SD_MAX_TOP_LOGPROBS) {
        SD_ERROR("sampling: logprobs need logits, token %d in [0, %d) and top_n %d in [0, %d]", (int)token, (int)n,
                 (int)top_n, SD_MAX_TOP_LOGPROBS);
        return SD_ERR_INVALID_ARG;
    }
    double z_max = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            SD_ERROR("sampling: logit %d is %g", (int)i, (double)logits[i]);
            return SD_ERR_INVALID_ARG;
        }
        if (logits[i] > z_max) z_max = logits[i];
    }
    if (z_max == -INFINITY) {
        SD_ERROR("sampling: all %d logits are -inf", (int)n);
        return SD_ERR_INVALID_ARG;
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += exp((double)logits[i] - z_max);
    const double log_z = z_max + log(total);
    out->logprob = (float)((double)logits[token] - log_z);
    /* top_n by insertion into a sorted list: top_n <= 20, one pass */
    int32_t k = 0;
    for (int32_t i = 0; i < n && top_n > 0; i++) {
        float z = logits[i];
        if (k == top_n && !(z > logits[out->top_ids[k - 1]])) continue;
        int32_t at = k < top_n ? k++ : k - 1;
        while (at > 0 && z > logits[out->top_ids[at - 1]]) {
            out->top_ids[at] = out->top_ids[at - 1];
            at--;
        }
        out->top_ids[at] = i;
    }
    out->n_top = k;
    for (int32_t j = 0; j < k; j++) out->top_logprobs[j] = (float)((double)logits[out->top_ids[j]] - log_z);
    return SD_OK;
}

int32_t sd_sample_from(const float *probs, int32_t n, double u) {
    if (!probs || n <= 0) return -1;
    double total = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        if (probs[i] > 0.0f) {
            total += probs[i];
            last = i;
        }
    }
    if (last < 0) return -1;
    if (!(u >= 0.0)) u = 0.0;
    double target = u * total, cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        if (!(probs[i] > 0.0f)) continue;
        cum += probs[i];
        if (cum > target) return i;
    }
    return last; /* u*total rounded up to total */
}

sd_status sd_sample_token(const float *logits, int32_t n, const sd_sampling *s, uint64_t position, int32_t *token) {
    SD_TRY(sd_sampling_validate(s)); /* a public entry point: the one check */
    SD_TRY(check_inputs(logits, n, s, token));
    if (sd_sampling_is_greedy(s)) {
        *token = sd_argmax(logits, n);
        return SD_OK;
    }
    float *probs = malloc((size_t)n * sizeof *probs); /* [n] processed distribution */
    if (!probs) {
        SD_ERROR("sampling: cannot allocate %d probabilities", (int)n);
        return SD_ERR_NOMEM;
    }
    sd_status st = sd_sample_probs_given(logits, n, s, probs);
    if (st == SD_OK) {
        *token = sd_sample_race(probs, n, s->seed, position);
        if (*token < 0) st = SD_ERR_INTERNAL;
    }
    free(probs);
    return st;
}
