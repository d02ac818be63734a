/* spec.h — exact speculative verification: proposal sparsification, greedy
 * and stochastic (rejection-sampling) verification of K drafted tokens.
 *
 * Notation. For one sequence and one step the drafter proposes y_1..y_K,
 * y_i drawn from its proposal q_i; the target gives p_1..p_{K+1}. p and q are
 * *processed* distributions (sd_sample_probs with the same sd_sampling on
 * both sides). q travels sparse (the drafter keeps its top-N tokens and
 * samples from exactly that renormalized q), p is dense. Verification
 * accepts a prefix of the draft and then emits exactly one more token, so a
 * step always commits n_accepted + 1 tokens and the committed text follows
 * p exactly (Leviathan et al. 2023; Chen et al. 2023).
 *
 * Random numbers: sd_rng_uniform(seed, position, purpose) where position is
 * the position the token would occupy in the sequence (pos0 + i for y_{i+1},
 * as in plain decoding), purposes SD_RNG_ACCEPT for the acceptance test,
 * SD_RNG_RESIDUAL for the replacement after a rejection and SD_RNG_SAMPLE
 * for the bonus token (the same draw plain decoding makes at that position).
 * The drafter uses SD_RNG_DRAFT. Every function here is pure, thread-safe and
 * allocation-free: the caller passes scratch. */
#ifndef SPECD_SPEC_H
#define SPECD_SPEC_H

#include "specd/common.h"
#include "specd/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default number of tokens a drafter keeps of its processed distribution. */
#define SD_SPEC_DEFAULT_TOP_N 16
/* Below this residual mass the replacement after a rejection is drawn from p
 * (spec.c explains why that is exact to within this much). */
#define SD_SPEC_RESIDUAL_EPS  1e-9

/* A sparse proposal distribution q over the vocabulary: entry j gives token
 * ids[j] the mass probs[j] / sum(probs). Ids should be distinct (a repeated
 * id is read as the sum of its entries, consistently in sampling and
 * verification). An n-gram draft is one-hot: n = 1, probs[0] = 1. */
typedef struct sd_spec_q {
    int32_t n;          /* entries, >= 1 */
    const int32_t *ids; /* [n] token ids in [0, n_vocab) */
    const float *probs; /* [n] masses >= 0, finite, positive sum */
} sd_spec_q;

/* What happened in one stochastic step, beyond the tokens (for tests, stats
 * and logs). */
typedef struct sd_spec_info {
    int32_t n_q_zero;       /* draft tokens that had q(y) = 0 (drafter bug; rejected) */
    bool residual_fallback; /* residual mass ~0: the replacement was drawn from p */
    bool bonus;             /* all K accepted: the last token is the bonus from p_{K+1} */
} sd_spec_info;

/* One sequence of a verification over a forward's logits rows, made where
 * the logits are (sd_model_forward_verify: on the GPU for a CUDA model). The
 * decisions are those of sd_spec_verify_greedy (temperature 0) or of
 * sd_sample_probs + sd_spec_verify on the same rows and keys. */
typedef struct sd_spec_rows {
    int32_t row0;         /* first of its wanted rows (p_1) in the forward */
    int32_t k;            /* drafts; its rows are row0 .. row0 + k */
    const int32_t *draft; /* [k] */
    const sd_spec_q *q;   /* [k]; may be NULL when greedy */
    const sd_sampling *sampling;
    uint64_t pos0; /* position of draft[0] (the random key) */
    /* out */
    sd_status status; /* SD_OK, or why this sequence was refused (logged) */
    int32_t n_accepted;
    int32_t tokens[SD_MAX_K + 1]; /* the first n_accepted + 1 are to commit */
    sd_spec_info info;
} sd_spec_rows;

/* Keeps the top_n most probable tokens of probs[n_vocab] (probability
 * descending, lower id first on ties; zero entries are never kept) and
 * renormalizes them (sum in double). Writes ids[top_n] and q_probs[top_n] in
 * that order and the count to *n_out (>= 1). probs must have a positive
 * finite sum. O(n_vocab log top_n), no allocation. */
sd_status sd_spec_sparsify(const float *probs, int32_t n_vocab, int32_t top_n, int32_t *ids, float *q_probs,
                           int32_t *n_out);

/* Draws a token from q with a uniform u in [0, 1) (inverse CDF over the
 * entries in order, normalized by their sum): the drafter's sampling step.
 * Returns the token id, or -1 when q is empty or has no positive mass. */
int32_t sd_spec_q_sample(const sd_spec_q *q, double u);

/* q(token) after normalization: the sum of token's entries over sum(probs);
 * 0 when token is not in q. */
double sd_spec_q_prob(const sd_spec_q *q, int32_t token);

/* Checks q against the vocabulary (ids in range, masses finite and >= 0,
 * positive sum) and writes the sum of its positive masses, in entry order,
 * to *total; index names q in the log. SD_ERR_RANGE / SD_ERR_INVALID_ARG. */
sd_status sd_spec_q_check(const sd_spec_q *q, int32_t n_vocab, int32_t index, double *total);

/* Greedy verification: target_argmax[k+1] holds argmax p_i (sd_argmax of
 * the target logits at each draft position and the bonus position),
 * draft[k] the proposal. Accepts while draft[i] == target_argmax[i], then
 * emits target_argmax at the first mismatch (or at k when all match). Writes
 * out_tokens[k+1] (the first *n_accepted + 1 are the tokens to commit). */
sd_status sd_spec_verify_greedy(const int32_t *target_argmax, const int32_t *draft, int32_t k, int32_t *out_tokens,
                                int32_t *n_accepted);

/* Stochastic verification of one step. p: [k+1][n_vocab] processed target
 * distributions (row i for the token at position pos0 + i; row k is the
 * bonus position); draft[k], q[k] the proposal and the sparse distributions
 * it was drawn from. Token y_i is accepted with probability
 * min(1, p_i(y_i)/q_i(y_i)); at the first rejection the replacement is drawn
 * from norm(max(0, p_i - q_i)) and the rest is discarded; if all k are
 * accepted a bonus token is drawn from p_k. p rows and q are normalized by
 * their own sums (the same normalization sd_sample_from applies). k may be
 * 0 (plain sampling from p_0). scratch: [n_vocab] doubles, caller-owned.
 * Writes out_tokens[k+1] (first *n_accepted + 1 to commit) and, when info is
 * not NULL, *info. SD_ERR_RANGE for a token id outside the vocabulary,
 * SD_ERR_INVALID_ARG for a malformed p or q (logged). */
sd_status sd_spec_verify(const float *p, int32_t n_vocab, const int32_t *draft, const sd_spec_q *q, int32_t k,
                         uint64_t seed, uint64_t pos0, double *scratch, int32_t *out_tokens, int32_t *n_accepted,
                         sd_spec_info *info);

/* Acceptance rate of one position: alpha = sum_v min(p(v), q(v)) with both
 * normalized (the probability that a token drawn from q is accepted). */
double sd_spec_alpha(const float *p, int32_t n_vocab, const sd_spec_q *q);

/* Expected tokens committed per target step with per-token acceptance
 * alpha and draft length k: (1 - alpha^(k+1)) / (1 - alpha); k + 1 at 1. */
double sd_spec_expected_tokens(double alpha, int32_t k);

#ifdef __cplusplus
}
#endif
#endif
