/* feat_relay.c — the target's features for EAGLE-3 heads drafting in their
 * own process (specd-drafter --eagle DIR: the deployment of a head on a
 * separate, cheaper accelerator).
 *
 * The head reads three target layers' hidden states at every committed
 * position, which only the verifier computes. The path, per sequence:
 *   1. the drafter's Hello names the layers and the floats a position
 *      (feature_layers, feature_width = 3 x the target's hidden size);
 *      every live head drafter must name the same (a second one that
 *      differs is refused), so one capture serves them all;
 *   2. a verify step of a sequence whose drafter is such a head asks for
 *      its features (VerifySeq.want_features, VerifyRequest.feature_layers);
 *      the verifier captures the layers and returns the rows that became
 *      committed: positions feature_pos0 .. cached_len - 1 (VerifyResult);
 *   3. they wait on the session (feat, a contiguous run of positions) and
 *      ride with its next draft step to a head drafter (DraftSeq.features),
 *      then are dropped at the next verify result: a draft step that goes
 *      out meanwhile (a second one before the verdict) carries them again,
 *      which the drafter takes as a no-op rewrite of the same positions.
 * The drafter holds its features per sequence and drafts only when it has
 * every position before the context's last token, each tagged with its
 * token (drafter_eagle.c): a gap (a drafter that restarted, was evicted,
 * or joined a request midway; a verifier that could not capture) means no
 * drafts for that request from then on, never drafts from another
 * position's features.
 *
 * Bounded: a step carries at most SD_MAX_STEP_FEATURES floats. Verify
 * steps stay within it (sd_feat_step_rows: the scheduler cuts a head-drafted
 * sequence's appends and drafts to the rows left, sched_dispatch.c), and a
 * draft step carries the leading rows of a session's run that fit, the
 * following steps the rest (feat_sent: how many went).
 * Output never depends on any of it: verification is exact.
 *
 * Chosen: no coordinator-side history of features (a drafter that lost
 * them could be refilled from it), since it would hold 3 x n_embd floats
 * for every position of every live request (6.9 KB a position for
 * SmolLM2-135M, 48 KiB for an 8B Llama); what is kept here is only what
 * has not reached a drafter yet, bounded by the request's context. */
#include "coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A live head drafter other than except (its slot), or -1. */
static int32_t live_feat_drafter(const sd_coord *c, int32_t except) {
    for (int32_t d = 0; d < SD_COORD_MAX_WORKERS; d++)
        if (d != except && c->workers[d].alive && sd_feat_drafter(&c->workers[d])) return d;
    return -1;
}

Specd__Code sd_feat_hello_refusal(const sd_coord *c, const Specd__Hello *h, const char *name, char *msg,
                                  size_t msg_len) {
    if (h->feature_width == 0) return SPECD__CODE__CODE_OK;
    int32_t d = live_feat_drafter(c, -1);
    if (d < 0) return SPECD__CODE__CODE_OK;
    const sd_coord_worker *o = &c->workers[d];
    bool same = (uint32_t)o->feat_width == h->feature_width && (size_t)o->n_feat_layers == h->n_feature_layers;
    for (int32_t j = 0; same && j < o->n_feat_layers; j++) same = (uint32_t)o->feat_layers[j] == h->feature_layers[j];
    if (same) return SPECD__CODE__CODE_OK;
    char mine[96] = "", theirs[96] = "";
    for (size_t j = 0; j < h->n_feature_layers; j++)
        snprintf(mine + strlen(mine), sizeof mine - strlen(mine), "%s%u", j ? "," : "", h->feature_layers[j]);
    for (int32_t j = 0; j < o->n_feat_layers; j++)
        snprintf(theirs + strlen(theirs), sizeof theirs - strlen(theirs), "%s%d", j ? "," : "", (int)o->feat_layers[j]);
    snprintf(msg, msg_len,
             "hello.feature_layers: this head reads layers %s (%u floats a position), the live head drafter %s "
             "reads %s (%d floats): one capture serves them all",
             mine, h->feature_width, o->name, theirs, (int)o->feat_width);
    SD_WARN("refused %s: %s", name, msg);
    return SPECD__CODE__CODE_REFUSED;
}

void sd_feat_hello_take(sd_coord_worker *w, const Specd__Hello *h) {
    w->n_feat_layers = 0;
    w->feat_width = 0;
    if (h->feature_width == 0 || h->n_feature_layers > SD_MAX_FEATURE_LAYERS) return; /* validated at the edge */
    for (size_t j = 0; j < h->n_feature_layers; j++) w->feat_layers[j] = (int32_t)h->feature_layers[j];
    w->n_feat_layers = (int32_t)h->n_feature_layers;
    w->feat_width = (int32_t)h->feature_width;
}

bool sd_feat_wanted(const sd_coord *c, const sd_session *s) {
    return s->drafter >= 0 && c->workers[s->drafter].alive && sd_feat_drafter(&c->workers[s->drafter]);
}

int32_t sd_feat_step_rows(const sd_coord *c) {
    int32_t d = live_feat_drafter(c, -1);
    if (d < 0) return INT32_MAX;
    int32_t rows = SD_MAX_STEP_FEATURES / c->workers[d].feat_width; /* width validated in [1, SD_MAX_FEATURE_WIDTH] */
    return rows > 0 ? rows : 1;
}

size_t sd_feat_request_layers(const sd_coord *c, const Specd__VerifySeq *seqs, int32_t n, uint32_t *layers) {
    bool wanted = false;
    for (int32_t i = 0; i < n && !wanted; i++) wanted = seqs[i].want_features;
    int32_t d = wanted ? live_feat_drafter(c, -1) : -1;
    if (d < 0) return 0;
    const sd_coord_worker *w = &c->workers[d];
    for (int32_t j = 0; j < w->n_feat_layers; j++) layers[j] = (uint32_t)w->feat_layers[j];
    return (size_t)w->n_feat_layers;
}

void sd_feat_store(sd_coord *c, sd_session *s, const Specd__VerifyResult *vr, int32_t sent_keep) {
    if (vr->n_features == 0) return;
    const int32_t p0 = (int32_t)vr->feature_pos0, rows = (int32_t)(vr->cached_len - vr->feature_pos0);
    const int32_t width = (int32_t)vr->feature_width; /* validated: rows x width floats, width bounded */
    int32_t d = live_feat_drafter(c, -1);
    if (d < 0 || width != c->workers[d].feat_width || p0 < sent_keep) {
        SD_WARN("request %llu: features of positions %d..%d, %d floats each, dropped (the step kept %d positions; "
                "head drafters read %d floats)",
                (unsigned long long)s->id, (int)p0, (int)(p0 + rows - 1), (int)width, (int)sent_keep,
                d < 0 ? 0 : (int)c->workers[d].feat_width);
        return;
    }
    if (width != s->feat_width) {
        s->feat_rows = 0;          /* another drafter's */
    } else if (s->feat_sent > 0) { /* the drafter has these: keep what the step could not carry */
        const int32_t sent = s->feat_sent < s->feat_rows ? s->feat_sent : s->feat_rows;
        s->feat_rows -= sent;
        s->feat_pos0 += sent;
        if (s->feat_rows > 0)
            memmove(s->feat, s->feat + (size_t)sent * (size_t)width,
                    (size_t)s->feat_rows * (size_t)width * sizeof *s->feat);
    }
    s->feat_sent = 0;
    if (s->feat_rows == 0 || p0 < s->feat_pos0 || p0 > s->feat_pos0 + s->feat_rows)
        s->feat_pos0 = p0, s->feat_rows = 0; /* a gap is the drafter's to see */
    else
        s->feat_rows = p0 - s->feat_pos0; /* rows from p0 on were computed again */
    const size_t need = (size_t)(s->feat_rows + rows) * (size_t)width;
    if (need > s->feat_cap) {
        float *p = realloc(s->feat, need * sizeof *p);
        if (!p) {
            SD_ERROR("request %llu: out of memory for %zu floats of features; its head drafter gets none",
                     (unsigned long long)s->id, need);
            s->feat_rows = 0;
            return;
        }
        s->feat = p;
        s->feat_cap = need;
    }
    memcpy(s->feat + (size_t)s->feat_rows * (size_t)width, vr->features, (size_t)rows * (size_t)width * sizeof(float));
    s->feat_rows += rows;
    s->feat_width = width;
    c->feat_rows_in += (uint64_t)rows;
    c->feat_bytes_in += (uint64_t)rows * (uint64_t)width * sizeof(float);
}

void sd_feat_draft_seq(sd_coord *c, int32_t d, sd_session *s, Specd__DraftSeq *ds, size_t *step_floats) {
    const sd_coord_worker *w = &c->workers[d];
    if (!sd_feat_drafter(w) || s->feat_rows == 0 || s->feat_width != w->feat_width) return;
    /* positions before the context's last token only (the drafter's check) */
    const int64_t len = (int64_t)ds->keep_len + (int64_t)ds->n_append;
    if ((int64_t)s->feat_pos0 + s->feat_rows > len - 1) return;
    /* as many leading rows as the step's budget has room for; the next
     * steps carry the rest (a run longer than one step's budget: the
     * prefill of a big target, sd_feat_step_rows) */
    const size_t room = ((size_t)SD_MAX_STEP_FEATURES - *step_floats) / (size_t)s->feat_width;
    const int32_t rows = room < (size_t)s->feat_rows ? (int32_t)room : s->feat_rows;
    if (rows == 0) return;
    const size_t n = (size_t)rows * (size_t)s->feat_width;
    ds->feature_pos0 = (uint32_t)s->feat_pos0;
    ds->n_features = n;
    ds->features = s->feat;
    *step_floats += n;
    if (rows > s->feat_sent) s->feat_sent = rows;
    c->feat_rows_out += (uint64_t)rows;
    c->feat_bytes_out += (uint64_t)n * sizeof(float);
}
