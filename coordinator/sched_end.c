/* sched_end.c — how requests and steps end (the scheduler: sched_dispatch.c).
 *
 * A request ends with Finished (its stats and text tail) or an Error to its
 * client and a Release to the workers that hold it; its session is freed
 * once no step refers to it (sd_sched_reap). A worker step that fails (a
 * bad result, a timeout) resets its sequences' beliefs for that worker so
 * they are resent in full; a lost worker's requests move to the others. */
#include "coord.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fill_stats(const sd_coord *c, const sd_session *s, Specd__RequestStats *st, uint64_t now_us) {
    specd__request_stats__init(st);
    st->prompt_tokens = (uint32_t)s->n_prompt;
    st->generated_tokens = (uint32_t)sd_session_generated(s);
    st->drafted = s->drafted;
    st->accepted = s->accepted;
    st->target_steps = s->target_steps;
    uint64_t sched = s->t_sched_us ? s->t_sched_us : now_us;
    st->queued_ms = (double)(sched - s->t_submit_us) / 1000.0;
    st->drafting_ms = (double)s->drafting_us / 1000.0;
    st->verifying_ms = (double)s->verifying_us / 1000.0;
    st->first_token_ms = s->t_first_token_us ? (double)(s->t_first_token_us - s->t_submit_us) / 1000.0 : 0.0;
    st->total_ms = (double)(now_us - s->t_submit_us) / 1000.0;
    st->drafter_kind = s->want_kind;
    if (!st->drafter_kind && s->drafter >= 0 && c->workers[s->drafter].used)
        st->drafter_kind = c->workers[s->drafter].drafter_kind;
    st->drafter_switches = s->kind_switches;
}

static void release(sd_coord *c, sd_session *s, uint64_t now_us) {
    if (s->v_holds && sd_coord_group_ok(c, s)) sd_outbox_release(c, s->group, s->id, now_us);
    if (s->d_holds && sd_coord_drafter_ok(c, s)) sd_outbox_release(c, s->drafter, s->id, now_us);
    s->v_holds = s->d_holds = false;
}

static void end_session(sd_coord *c, sd_session *s, uint64_t now_us) {
    if (s->state == SD_SESSION_ACTIVE)
        c->n_active--;
    else if (s->state == SD_SESSION_QUEUED)
        c->n_queued--;
    s->state = SD_SESSION_FINISHED;
    c->finished_requests++;
    release(c, s, now_us);
    sd_coord_client_request_done(c, s->client_ident, s->client_ident_len);
    sd_sched_reap(c, s);
}

void sd_sched_finish(sd_coord *c, sd_session *s, Specd__StopReason reason, const char *tail, size_t tail_len,
                     uint64_t now_us) {
    if (s->state == SD_SESSION_FINISHED) return;
    Specd__RequestStats st;
    fill_stats(c, s, &st, now_us);
    Specd__Finished fin = SPECD__FINISHED__INIT;
    fin.request_id = s->id;
    fin.reason = reason;
    fin.stats = &st;
    fin.text_tail.data = (uint8_t *)(uintptr_t)tail;
    fin.text_tail.len = tail ? tail_len : 0;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED;
    env.finished = &fin;
    SD_INFO("request %llu finished (%s): %d prompt + %d generated tokens, %u/%u drafts accepted, %u steps",
            (unsigned long long)s->id,
            protobuf_c_enum_descriptor_get_value(&specd__stop_reason__descriptor, (int)reason)->name, s->n_prompt,
            sd_session_generated(s), s->accepted, s->drafted, s->target_steps);
    sd_outbox_client(c, s->client_ident, s->client_ident_len, &env, now_us);
    end_session(c, s, now_us);
}

void sd_sched_abort(sd_coord *c, sd_session *s, Specd__Code code, const char *msg, bool notify, uint64_t now_us) {
    if (s->state == SD_SESSION_FINISHED) return;
    SD_WARN("request %llu aborted (%s): %s", (unsigned long long)s->id, sd_net_code_name(code), msg);
    if (notify)
        sd_outbox_client_error(c, s->client_ident, s->client_ident_len, code, s->id, s->client_tag, msg, now_us);
    end_session(c, s, now_us);
}

/* ---------------------------------------------------------------- results */

void sd_sched_fail_step(sd_coord *c, int32_t wi, const char *why) {
    sd_coord_worker *w = &c->workers[wi];
    bool verifier = w->role == SPECD__ROLE__ROLE_VERIFIER;
    SD_WARN("%s %s failed step %llu: %s", verifier ? "verifier" : "drafter", w->name, (unsigned long long)w->step_id,
            why);
    if (!w->busy) return;
    w->busy = false;
    for (int32_t i = 0; i < w->n_step; i++) {
        sd_session *s = sd_sched_find(c, w->step_rids[i]);
        if (!s) continue;
        if (verifier) {
            s->in_verify = false;
            s->v_cached = 0;
            if (++s->verify_failures > 3 && s->state != SD_SESSION_FINISHED) {
                sd_sched_abort(c, s, SPECD__CODE__CODE_INTERNAL, "the verifier failed this request's step 4 times",
                               true, 0);
                continue;
            }
        } else {
            s->in_draft = false;
            s->d_cached = 0;
            if (s->shadow_token == SD_SHADOW_PENDING) s->shadow_token = SD_SHADOW_NONE; /* lost with the step */
            /* no drafts at this length: verify with K = 0 rather than retry at once */
            s->draft_base = s->n_tokens;
            s->k = 0;
        }
        sd_sched_reap(c, s);
    }
    w->n_step = 0;
    if (verifier) w->verify_reply_us = w->hold_since_us = 0;
}

/* The worker's requests keep their committed tokens and lose it: the next
 * pump places them on the other groups / drafters (placement.c), where they
 * are refilled from keep_len 0. */
void sd_sched_on_worker_lost(sd_coord *c, int32_t wi) {
    sd_coord_worker *w = &c->workers[wi];
    w->busy = false;
    w->n_step = 0;
    w->verify_reply_us = w->hold_since_us = 0;
    int32_t moved = 0;
    for (int32_t i = c->n_sessions - 1; i >= 0; i--) {
        sd_session *s = c->sessions[i];
        if (s->group == wi) {
            s->in_verify = false;
            s->v_cached = 0;
            s->v_holds = false;
            s->group = -1;
            moved += s->state == SD_SESSION_ACTIVE;
        }
        if (s->drafter == wi) {
            s->in_draft = false;
            s->d_cached = 0;
            s->d_holds = false;
            s->drafter = -1;
            if (s->shadow_token == SD_SHADOW_PENDING) s->shadow_token = SD_SHADOW_NONE;
            moved += s->state == SD_SESSION_ACTIVE;
        }
        sd_sched_reap(c, s);
    }
    c->drafting_dirty = true;
    if (moved > 0)
        SD_INFO("%s %s: %d requests move to the others",
                w->role == SPECD__ROLE__ROLE_VERIFIER ? "verifier group" : "drafter", w->name, moved);
}
