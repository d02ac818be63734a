/* spec.h — exact speculative verification: proposal sparsification, greedy
 * and stochastic verification of K drafted tokens.
 *
 * Notation. For one sequence and one step the drafter proposes y_1..y_K,
 * the target gives p_1..p_{K+1}. p and q are *processed* distributions
 * (sd_sample_probs with the same sd_sampling on both sides). q travels
 * sparse (the drafter's top-N tokens, always containing its draft), p is
 * dense. Verification accepts a prefix of the draft and then emits exactly
 * one more token, so a step always commits n_accepted + 1 tokens.
 *
 * Sampled verification is *coupled* (spec.c says why): the token committed
 * at position t is always the draw plain decoding makes there,
 * sd_sample_race(p_t, seed, t), and a draft token is accepted when it
 * equals that draw. Seeded output is thus a
 * function of (seed, prompt) alone — the same with any drafter, any K, any
 * step boundaries, before and after every failover — and equals seeded
 * plain decoding. The drafter races its own distribution with the same
 * uniforms (sd_spec_draft_coupled), which is what makes drafts land.
 * Every function here is pure, thread-safe and allocation-free. */
#ifndef SPECD_SPEC_H
#define SPECD_SPEC_H

#include "specd/common.h"
#include "specd/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default number of tokens a drafter keeps of its processed distribution. */
#define SD_SPEC_DEFAULT_TOP_N 16
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
    bool bonus; /* all K accepted: the last token is the draw from p_{K+1} */
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
 * entries in order, normalized by their sum). Returns the token id, or -1
 * when q is empty or has no positive mass. */
int32_t sd_spec_q_sample(const sd_spec_q *q, double u);

/* The drafter's step at one position: sparsifies probs[n_vocab] (its
 * processed distribution) into ids/q_probs[top_n] as sd_spec_sparsify, and
 * draws *token = sd_sample_race(probs, n_vocab, seed, position), with the
 * uniforms the verifier's draw uses there. A token outside the top_n replaces the least kept entry (with its
 * own mass, renormalized), so q always contains the draft. */
sd_status sd_spec_draft_coupled(const float *probs, int32_t n_vocab, int32_t top_n, uint64_t seed, uint64_t position,
                                int32_t *ids, float *q_probs, int32_t *n_out, int32_t *token);

/* The whole drafter step at one position from its logits[n_vocab]:
 * sd_sample_probs with s into probs[n_vocab] (caller scratch), then
 * sd_spec_draft_coupled at (s->seed, position). A greedy s gives the same
 * result (the one-hot q {argmax: 1}) from one pass over the logits, probs
 * untouched. s is taken as given (valid by sd_sampling_check, run once by
 * the drafter's caller: sd_drafter_propose). Under the rejection rule
 * (s->rule) the draft is drawn from the sparse q itself (sd_spec_q_sample,
 * SD_RNG_DRAFT), which that rule needs to be exact. */
sd_status sd_spec_draft_step(const float *logits, int32_t n_vocab, const sd_sampling *s, int32_t top_n,
                             uint64_t position, float *probs, int32_t *ids, float *q_probs, int32_t *n_out,
                             int32_t *token);

/* sd_spec_draft_step's draw for a sampled s from the processed
 * distribution probs[n_vocab] (sd_sample_probs' output) instead of logits:
 * for a drafter that computes it over fewer ids and scatters it (an EAGLE
 * head over its draft vocabulary: drafter_eagle.c). */
sd_status sd_spec_draft_probs(const float *probs, int32_t n_vocab, const sd_sampling *s, int32_t top_n,
                              uint64_t position, int32_t *ids, float *q_probs, int32_t *n_out, int32_t *token);

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

/* Stochastic (coupled) verification of one step. p: [k+1][n_vocab]
 * processed target distributions (row i for the token at position pos0 + i;
 * row k is the bonus position); draft[k] and q[k] the proposal (q is
 * checked, not used for the decision). For i = 0..k, x_i =
 * sd_sample_race(p_i, seed, pos0 + i); drafts
 * are accepted while draft[i] == x_i, and x at the first mismatch (or x_k)
 * is emitted. k may be 0 (plain sampling from p_0). Writes out_tokens[k+1]
 * (first *n_accepted + 1 to commit) and, when info is not NULL, *info.
 * SD_ERR_RANGE for a token id outside the vocabulary, SD_ERR_INVALID_ARG
 * for a malformed p or q (logged). */
sd_status sd_spec_verify(const float *p, int32_t n_vocab, const int32_t *draft, const sd_spec_q *q, int32_t k,
                         uint64_t seed, uint64_t pos0, int32_t *out_tokens, int32_t *n_accepted, sd_spec_info *info);

/* Rejection-sampling verification of one step (Leviathan et al. 2023,
 * Chen et al. 2023; spec_reject.c), the other rule: draft[i] is accepted
 * with probability min(1, p_i(y) / q_i(y)), u = sd_rng_uniform(seed,
 * pos0 + i, SD_RNG_ACCEPT); at the first rejection the token comes from the
 * residual norm(max(0, p_i - q_i)) (inverse CDF, SD_RNG_RESIDUAL; from p_i
 * when the residual has no mass); when all K are accepted the bonus is
 * sd_sample_race(p_k). Exact in distribution (each committed token follows
 * p given the tokens before it) when draft[i] was drawn from q_i itself,
 * independently of those uniforms; unlike the coupled rule the committed
 * tokens depend on the drafts. Arguments, checks and outputs as
 * sd_spec_verify; residual: caller scratch of n_vocab floats. */
sd_status sd_spec_verify_rejection(const float *p, int32_t n_vocab, const int32_t *draft, const sd_spec_q *q, int32_t k,
                                   uint64_t seed, uint64_t pos0, float *residual, int32_t *out_tokens,
                                   int32_t *n_accepted, sd_spec_info *info);

/* Acceptance rate of one position under rejection sampling: alpha =
 * sum_v min(p(v), q(v)) with both normalized: an upper bound of the coupled
 * rule's rate, which is at least alpha / (2 - alpha) (spec.c); kept for the
 * drafter benchmarks. */
double sd_spec_alpha(const float *p, int32_t n_vocab, const sd_spec_q *q);

/* Expected tokens committed per target step with per-token acceptance
 * alpha and draft length k: (1 - alpha^(k+1)) / (1 - alpha); k + 1 at 1. */
double sd_spec_expected_tokens(double alpha, int32_t k);

#ifdef __cplusplus
}
#endif
#endif
