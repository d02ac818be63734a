/* verify_feat.h — the target's features for an EAGLE-3 head drafting in
 * another process (specd-drafter --eagle; verify_feat.c). Internal to the
 * verifier library: verify_serve.c calls it; one per verifier. Not
 * thread-safe. */
#ifndef SPECD_VERIFY_FEAT_H
#define SPECD_VERIFY_FEAT_H

#include "specd/model.h"
#include "specd/net.h"

typedef struct sd_vfeat sd_vfeat;

/* For target (borrowed; must outlive it) and batches of max_batch
 * sequences. head_ids[n_head] (may be 0): the layers the verifier's own head
 * captures (verify_head.c owns the capture then: a request for other layers
 * gets no features). Caller frees with sd_vfeat_free, which clears a
 * capture it set. */
sd_status sd_vfeat_create(sd_model *target, int32_t max_batch, const int32_t *head_ids, int32_t n_head, sd_vfeat **out);
void sd_vfeat_free(sd_vfeat **f);

/* A step begins: captures req->feature_layers when a sequence wants
 * features (a warning, once per layer set, when it cannot). */
void sd_vfeat_begin(sd_vfeat *f, const Specd__VerifyRequest *req);

/* Whether s's rows must all be computed (it wants features and this step
 * captures them: no prefix-cache adoption for it). f may be NULL. */
bool sd_vfeat_wanted(const sd_vfeat *f, const Specd__VerifySeq *s);

/* After a forward: its rows [row0, row0 + n) are s's committed positions
 * pos0 .. pos0 + n - 1; when s wants features they go into res
 * (feature_pos0, feature_width, features: borrowed from f until the next
 * step; i < max_batch), unless the step's SD_MAX_STEP_FEATURES would be
 * passed or the capture lacks the rows (then none: logged). f may be NULL. */
void sd_vfeat_put(sd_vfeat *f, size_t i, const Specd__VerifySeq *s, int32_t pos0, int32_t n, int32_t row0,
                  Specd__VerifyResult *res);

/* Rows and bytes of features sent since start. */
void sd_vfeat_totals(const sd_vfeat *f, uint64_t *rows, uint64_t *bytes);

#endif
