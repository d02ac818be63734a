/* draft_head.c — an EAGLE-3 head as a draft server's drafter
 * (specd-drafter --eagle DIR; draft_head.h).
 *
 * The head (engine/spec/drafter_eagle.c) drafts from the target's features
 * of every position before the context's last token. They come from the
 * verifier through the coordinator (coordinator/feat_relay.c), with the
 * draft step of the sequence: DraftSeq.features, the captured layers'
 * outputs of positions feature_pos0.., f32, width floats each (checked at
 * the edge: net/validate_feat.c). The head fuses them at once (its fc) and
 * keeps them per slot, each tagged with its position's token, so a slot
 * whose tokens changed (another request, a rollback) never drafts from
 * stale ones. A run that starts past the positions the head holds (a gap:
 * this drafter restarted, lost the slot, or joined the request midway) is
 * not fed; the head then lacks a position and drafts nothing for the
 * sequence, which the coordinator sees as a drafter that proposes nothing.
 * At DEBUG each fed run is logged with a checksum of its bytes, so a test
 * can check them against the target's own rows of those positions.
 *
 * Unlike the model drafter this one takes the whole context per call
 * (sd_drafter_propose), not a batch: the head's rows per sequence are few
 * (the features fused since the last call, then K one-row steps), and the
 * draft server holds every sequence's committed tokens anyway. Under a
 * constraint (DraftSeq.constraint) the draft server proposes the forced
 * tokens first and the head drafts after them, masked at every drafted
 * position, as in the other two placements (draft_constrain.h). */
#include "draft_head.h"

#include <string.h>

/* FNV-1a 64 over n floats' bytes: the DEBUG line's checksum of a fed run
 * (tests/integration/test_greedy.py compares it with specd-generate
 * --dump-features's rows of the same positions). */
static uint64_t fnv_floats(const float *f, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint8_t b[sizeof(float)];
        memcpy(b, &f[i], sizeof b);
        for (size_t j = 0; j < sizeof b; j++) h = (h ^ b[j]) * 0x100000001b3ull;
    }
    return h;
}

/* The Euclidean norm of f[n], in double: beside the FNV-1a in the DEBUG
 * line, for tests that compare features within a tolerance (a TP group's
 * differ from TP 1's in the last bits). */
void sd_draft_head_seq(void *head, sd_drafter *d, int32_t slot, const Specd__DraftSeq *sq, const int32_t *held,
                       int32_t len, int32_t n_forced, int32_t k, const sd_sampling *s, sd_constraint *con,
                       int32_t *tokens, sd_spec_q *q, int32_t *n, sd_head_catchup *cu) {
    sd_draft_head *st = head;
    const int32_t width = st->width;
    *n = 0;
    double t0 = sd_now();
    sd_status e = sd_drafter_rollback(d, slot, (int32_t)sq->keep_len);
    if (e == SD_OK && sq->n_features > 0 && width > 0) {
        const int32_t pos0 = (int32_t)sq->feature_pos0, rows = (int32_t)(sq->n_features / (size_t)width);
        st->rows += (uint64_t)rows;
        st->bytes += (uint64_t)sq->n_features * sizeof(float);
        if (pos0 > sd_drafter_eagle_n_features(d, slot)) {
            st->gaps++;
            SD_DEBUG("drafter: request %llu: features from position %d, the head has %d: no drafts for it",
                     (unsigned long long)sq->request_id, (int)pos0, (int)sd_drafter_eagle_n_features(d, slot));
        } else {
            e = sd_drafter_eagle_features(d, slot, pos0, rows, held + pos0, sq->features);
            if (e == SD_OK && sd_log_enabled(SD_LOG_DEBUG))
                SD_DEBUG("head features: request %llu positions %d..%d fnv1a %016llx l2 %.9g",
                         (unsigned long long)sq->request_id, (int)pos0, (int)(pos0 + rows - 1),
                         (unsigned long long)fnv_floats(sq->features, sq->n_features),
                         sd_l2_norm(sq->features, sq->n_features));
        }
    }
    double t1 = sd_now();
    st->feed_s += t1 - t0;
    int32_t fed = width > 0 ? (int32_t)(sq->n_features / (size_t)width) : 0;
    /* features of positions it drafted nothing for: their time; the rows
     * are counted once, by the head's own catch-up over them below (as
     * verifier/verify_head.c reports them) */
    if (fed > k + 1) cu->s += (t1 - t0) * (double)(fed - k - 1) / fed;
    if (e == SD_OK && k > 0) {
        sd_drafter_set_constraint(d, con);
        e = sd_drafter_propose(d, slot, held, len + n_forced, k, s, tokens, q, n);
        sd_drafter_set_constraint(d, NULL);
        int64_t rows = 0;
        cu->s += sd_drafter_eagle_take_catchup_s(d, &rows);
        cu->rows += rows;
    }
    st->draft_s += sd_now() - t1;
    if (e != SD_OK) {
        SD_WARN("drafter: request %llu: the head failed (%s): no drafts", (unsigned long long)sq->request_id,
                sd_status_str(e));
        sd_drafter_rollback(d, slot, 0); /* its features are suspect: refilled from a new request only */
        *n = 0;
    }
    if (*n > 0) st->drafts++;
}

void sd_draft_head_log(const sd_draft_head *st) {
    if (st->rows == 0) return;
    SD_INFO("drafter: head features of %llu positions received, %llu bytes (%.0f a position), %llu gaps; fused in "
            "%.1f ms (%.1f us a position), drafting %.1f ms for %llu sequence steps",
            (unsigned long long)st->rows, (unsigned long long)st->bytes, (double)st->bytes / (double)st->rows,
            (unsigned long long)st->gaps, st->feed_s * 1e3, st->feed_s * 1e6 / (double)st->rows, st->draft_s * 1e3,
            (unsigned long long)st->drafts);
}
