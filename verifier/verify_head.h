/* verify_head.h — an EAGLE-3 head inside the verifier (verify_head.c):
 * fed the target's hidden states of every row the verifier computes, it
 * drafts each sequence's next tokens right after its verify step
 * (VerifySeq.next_k -> VerifyResult.next_draft). Internal to the verifier
 * library: verify_serve.c calls it; one head per verifier, its slots the
 * verifier's KV slots. Not thread-safe. */
#ifndef SPECD_VERIFY_HEAD_H
#define SPECD_VERIFY_HEAD_H

#include "specd/constrain.h"
#include "specd/kv.h"
#include "specd/model.h"
#include "specd/net.h"
#include "specd/sample.h"

typedef struct sd_vhead sd_vhead;

/* Loads the head in dir for target (borrowed; must outlive it) with
 * max_seqs slots of max_ctx positions, and sets the target's capture to the
 * head's layers. kv is the verifier's cache (borrowed; must outlive it):
 * with its prefix cache on, the head keeps every computed row's fused
 * feature in its side rows (sd_kv_side_enable), where sequences that adopt
 * the row's block find it. In a TP group target is the leader's shard
 * (its capture holds the whole residual stream: verify_head.c). Refusals
 * as sd_eagle_head_load; SD_ERR_INVALID_ARG for a rank > 0's shard.
 * weights: the head's matrices (sd_drafter_params.eagle_weights). Caller
 * frees with sd_vhead_free, which clears the capture. */
sd_status sd_vhead_open(const char *dir, sd_model *target, sd_kv *kv, int32_t max_seqs, int32_t max_ctx,
                        int32_t max_batch, int32_t max_k, int32_t weights, sd_vhead **out);
void sd_vhead_free(sd_vhead **h);

/* Slot's cache holds its first len positions only (a truncation); release:
 * the slot starts a new sequence. */
void sd_vhead_rollback(sd_vhead *h, int32_t slot, int32_t len);
void sd_vhead_release(sd_vhead *h, int32_t slot);

/* The last target forward's rows [row0, row0 + n) are slot's committed
 * positions pos0 .. pos0 + n - 1; hist holds the slot's tokens from
 * position 0 (at least pos0 + n): their features go to the head, with,
 * under the prefix cache, those of positions the head lacks before pos0
 * (adopted blocks') from the cache's side rows. A failure is logged and
 * leaves the slot without drafts until it is refilled (drafts are
 * optional); the time is added to the step's head time. */
void sd_vhead_feed(sd_vhead *h, int32_t slot, const int32_t *hist, int32_t pos0, int32_t n, int32_t row0);

/* A constrained sequence's state for its drafts (verify_constrain.c's
 * sd_vcon_head_begin fills it): con at the state after the committed
 * tokens and the forced drafts, forced[n_forced] the tokens the constraint
 * forces next (borrowed for the call). */
typedef struct sd_vhead_con {
    sd_constraint *con;
    const int32_t *forced;
    int32_t n_forced;
} sd_vhead_con;

/* Drafts up to k tokens for slot continuing its committed tokens,
 * cached[n_cached] then next (the token its step just sampled), with
 * sampling s into res->next_draft / next_q / next_us (the last feed's time
 * included) and next_catchup_us / _rows (of that, the rows past the 1 + k a
 * drafting step takes in), borrowed from h (batch entry i, i < max_batch) until the next
 * step. Under a constraint (hc non-NULL): the forced drafts first, q = 1,
 * then the head's, masked at each drafted position (con is left where it
 * was). None on a failure (logged). */
void sd_vhead_draft(sd_vhead *h, size_t i, int32_t slot, const int32_t *cached, int32_t n_cached, int32_t next,
                    int32_t k, const sd_sampling *s, const sd_vhead_con *hc, Specd__VerifyResult *res);

/* The target layers the head reads into ids[SD_MODEL_CAPTURE_MAX]: their
 * count (0 for a NULL h). */
int32_t sd_vhead_layers(const sd_vhead *h, int32_t *ids);

/* Seconds the head spent since the last call (feeds and drafts), and zero. */
double sd_vhead_take_seconds(sd_vhead *h);

#endif
