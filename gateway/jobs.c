/* jobs.c — HTTP generation requests as coordinator requests.
 *
 * One HTTP request becomes a gw_job with one choice per (prompt, sample);
 * each choice is one libspecd-client request. Tokens arrive on the
 * client's I/O thread (on_chunk) and are appended to the choice under the
 * job's mutex; the HTTP thread that owns the connection waits on the job's
 * condition variable and turns them into JSON or SSE. The job is
 * reference-counted because either side may end first: a client that
 * disconnects drops the HTTP side's reference (after cancelling), and the
 * final callback of each choice drops that choice's.
 *
 * libspecd-client keeps a record of every accepted request until
 * sd_client_wait collects it, and callbacks may not call sd_client_wait:
 * the final callback hands the id to the janitor thread, which collects
 * and frees it. (Rejected: collecting from the HTTP thread, which may be
 * gone by then.) Not before sd_client_submit has returned, though: a
 * request can finish while its submitter still waits on the record, and
 * collecting it then frees the record under the submitter; whichever of
 * the final callback and the submitter comes second hands it over. */
#include "gateway_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

double gw_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t random_u64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return v;
}

/* ---- the janitor ---- */

typedef struct jan_item {
    uint64_t request_id;
    struct jan_item *next;
} jan_item;

struct gw_janitor {
    sd_client *client;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    jan_item *head, *tail;
};

static void *janitor_main(void *arg) {
    gw_janitor *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->head && !j->stopping) pthread_cond_wait(&j->cv, &j->mu);
        if (j->stopping) break;
        jan_item *it = j->head;
        j->head = it->next;
        if (!j->head) j->tail = NULL;
        pthread_mutex_unlock(&j->mu);
        /* The record is DONE right after the final callback returns. */
        sd_client_result res;
        memset(&res, 0, sizeof res);
        sd_status st = sd_client_wait(j->client, it->request_id, 10000, &res);
        if (st == SD_OK)
            sd_client_result_clear(&res);
        else if (st != SD_ERR_NOT_FOUND)
            SD_WARN("janitor: request %llu not collectable: %s", (unsigned long long)it->request_id, sd_status_str(st));
        free(it);
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

gw_janitor *gw_janitor_start(sd_client *c) {
    gw_janitor *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->client = c;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    if (pthread_create(&j->thread, NULL, janitor_main, j) != 0) {
        pthread_cond_destroy(&j->cv);
        pthread_mutex_destroy(&j->mu);
        free(j);
        return NULL;
    }
    return j;
}

/* Queues request_id for collection; a stopped janitor drops it (the
 * client frees its records when it closes). Called from callbacks. */
static void janitor_push(gw_janitor *j, uint64_t request_id) {
    jan_item *it = calloc(1, sizeof *it);
    if (!it) {
        SD_ERROR("janitor: out of memory: request %llu's record stays until the client closes",
                 (unsigned long long)request_id);
        return;
    }
    it->request_id = request_id;
    pthread_mutex_lock(&j->mu);
    if (j->stopping) {
        free(it);
    } else {
        if (j->tail)
            j->tail->next = it;
        else
            j->head = it;
        j->tail = it;
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
}

void gw_janitor_stop(gw_janitor *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    bool running = !j->stopping;
    j->stopping = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (running) pthread_join(j->thread, NULL);
}

void gw_janitor_free(gw_janitor **jp) {
    if (!jp || !*jp) return;
    gw_janitor *j = *jp;
    gw_janitor_stop(j);
    while (j->head) {
        jan_item *it = j->head;
        j->head = it->next;
        free(it);
    }
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
    *jp = NULL;
}

/* ---- jobs ---- */

static bool append_text(gw_choice *c, const char *s, size_t n);

gw_job *gw_job_create(gw_server *srv, const gw_gen *g) {
    gw_job *job = calloc(1, sizeof *job);
    if (!job) return NULL;
    job->srv = srv;
    job->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (job->wake_fd < 0) {
        SD_ERROR("eventfd: %s", strerror(errno));
        free(job);
        return NULL;
    }
    pthread_mutex_init(&job->mu, NULL);
    job->refs = 1;
    job->endpoint = g->endpoint;
    snprintf(job->id, sizeof job->id, "%s-%016llx%08llx", g->endpoint == GW_EP_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)random_u64(), (unsigned long long)(random_u64() & 0xffffffffu));
    job->created = (long long)time(NULL);
    job->t_start_ms = gw_now_ms();
    job->n = g->n;
    job->logprobs = g->logprobs;
    job->echo = g->echo;
    job->tools = gw_tools_dup(g->tools);
    job->n_choices = g->n_prompts * g->n;
    for (size_t i = 0; i < job->n_choices; i++) {
        gw_choice *c = &job->choices[i];
        c->job = job;
        c->index = (unsigned)i;
        /* echo: the choice's text starts with its prompt, streamed first
         * (a prompt of ids: its text comes from the coordinator, on_chunk). */
        const char *prompt = g->prompts[i / g->n].text;
        if (g->echo && prompt && !append_text(c, prompt, strlen(prompt))) {
            gw_job_release(job);
            return NULL;
        }
    }
    return job;
}

void gw_job_release(gw_job *job) {
    if (!job) return;
    pthread_mutex_lock(&job->mu);
    int left = --job->refs;
    pthread_mutex_unlock(&job->mu);
    if (left > 0) return;
    for (size_t i = 0; i < job->n_choices; i++) {
        free(job->choices[i].text);
        free(job->choices[i].lps);
        free(job->choices[i].lp_bytes);
    }
    close(job->wake_fd);
    pthread_mutex_destroy(&job->mu);
    gw_tools_free(&job->tools);
    free(job);
}

bool gw_job_done_locked(const gw_job *job) {
    for (size_t i = 0; i < job->n_choices; i++)
        if (!job->choices[i].done) return false;
    return true;
}

/* Appends text to c; false when it would pass GW_MAX_OUTPUT_BYTES or memory
 * runs out. Call with the job's mutex held. */
static bool append_text(gw_choice *c, const char *s, size_t n) {
    if (c->text_len + n + 1 > GW_MAX_OUTPUT_BYTES) return false;
    if (c->text_len + n + 1 > c->text_cap) {
        size_t cap = c->text_cap ? c->text_cap : 256;
        while (cap < c->text_len + n + 1) cap *= 2;
        char *p = realloc(c->text, cap);
        if (!p) return false;
        c->text = p;
        c->text_cap = cap;
    }
    memcpy(c->text + c->text_len, s, n);
    c->text_len += n;
    c->text[c->text_len] = '\0';
    return true;
}

/* Keeps bytes[n] in c's logprob byte store as *t's; false past the cap or
 * out of memory. Call with the job's mutex held. */
static bool keep_lp_token(gw_choice *c, const sd_client_token_lp *src, gw_tok_lp *t) {
    size_t n = src->bytes ? src->n_bytes : 0;
    if (c->lp_bytes_len + n > GW_MAX_OUTPUT_BYTES) return false;
    if (c->lp_bytes_len + n > c->lp_bytes_cap) {
        size_t cap = c->lp_bytes_cap ? c->lp_bytes_cap : 1024;
        while (cap < c->lp_bytes_len + n) cap *= 2;
        char *p = realloc(c->lp_bytes, cap);
        if (!p) return false;
        c->lp_bytes = p;
        c->lp_bytes_cap = cap;
    }
    if (n) memcpy(c->lp_bytes + c->lp_bytes_len, src->bytes, n);
    *t = (gw_tok_lp){src->id, src->logprob, (uint32_t)c->lp_bytes_len, (uint32_t)n};
    c->lp_bytes_len += n;
    return true;
}

/* Appends a chunk's logprobs to c; false past the caps or out of memory.
 * Call with the job's mutex held. */
static bool append_logprobs(gw_choice *c, const sd_client_logprob *lps, size_t n) {
    if (c->n_lps + n > GW_MAX_OUTPUT_BYTES / 64) return false; /* tokens: bounded like the text */
    if (c->n_lps + n > c->lps_cap) {
        size_t cap = c->lps_cap ? c->lps_cap : 64;
        while (cap < c->n_lps + n) cap *= 2;
        gw_lp *p = realloc(c->lps, cap * sizeof *p);
        if (!p) return false;
        c->lps = p;
        c->lps_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        gw_lp *e = &c->lps[c->n_lps];
        memset(e, 0, sizeof *e);
        if (!keep_lp_token(c, &lps[i].token, &e->token)) return false;
        for (size_t j = 0; j < lps[i].n_top && j < SD_MAX_TOP_LOGPROBS; j++) {
            if (!keep_lp_token(c, &lps[i].top[j], &e->top[j])) return false;
            e->n_top++;
        }
        c->n_lps++;
    }
    return true;
}

/* libspecd-client's callback, on its I/O thread (or, for a submit refused
 * locally, on the submitting thread). Quick: append and signal. The
 * arrival time is taken before the job's mutex, so waiting for it counts
 * as forwarding time (the SSE side may hold the mutex while formatting). */
static void on_chunk(const sd_client_chunk *ch, void *user) {
    gw_choice *c = user;
    gw_job *job = c->job;
    gw_server *srv = job->srv;
    bool cancel = false;
    double now = gw_now_ms();
    pthread_mutex_lock(&job->mu);
    if (ch->request_id && !c->request_id) c->request_id = ch->request_id;
    size_t text_was = c->text_len, lps_was = c->n_lps;
    /* echo of a prompt of ids: its text, before any token */
    if (ch->prompt_text_len && job->echo && !c->done && c->n_tokens == 0 &&
        !append_text(c, ch->prompt_text, ch->prompt_text_len)) {
        SD_WARN("request %llu: echoed prompt over %u bytes: cancelling it", (unsigned long long)c->request_id,
                GW_MAX_OUTPUT_BYTES);
        cancel = true;
    }
    /* echo with logprobs: the prompt's, in order, before any token's; a
     * resubmission (coordinator failover) sends them again: kept once */
    if (ch->n_prompt_logprobs && job->echo && job->logprobs && !c->done && !cancel && c->n_tokens == 0 &&
        ch->prompt_from == c->n_prompt_lps && c->n_prompt_lps == c->n_lps) {
        if (!append_logprobs(c, ch->prompt_logprobs, ch->n_prompt_logprobs)) {
            SD_WARN("request %llu: prompt logprobs over the output limit kept: cancelling it",
                    (unsigned long long)c->request_id);
            cancel = true;
        }
        c->n_prompt_lps = c->n_lps;
    }
    if (ch->text_len && !c->done && !append_text(c, ch->text, ch->text_len)) {
        SD_WARN("request %llu: output over %u bytes kept: cancelling it", (unsigned long long)c->request_id,
                GW_MAX_OUTPUT_BYTES);
        cancel = !ch->final;
    }
    if (job->logprobs && ch->n_ids && !c->done && !cancel) {
        if (!ch->logprobs) {
            SD_WARN("request %llu: tokens came without the logprobs asked for: cancelling it",
                    (unsigned long long)c->request_id);
            cancel = !ch->final;
        } else if (!append_logprobs(c, ch->logprobs, ch->n_ids)) {
            SD_WARN("request %llu: logprobs over the output limit kept: cancelling it",
                    (unsigned long long)c->request_id);
            cancel = !ch->final;
        }
    }
    /* something for the next SSE delta: its forwarding time starts here */
    if ((c->text_len > text_was || c->n_lps > lps_was) && c->t_pending_ms == 0) c->t_pending_ms = now;
    if (ch->n_ids) {
        c->n_tokens += (uint32_t)ch->n_ids;
        gw_metrics_tokens(srv->metrics, (uint32_t)ch->n_ids, c->t_last_ms > 0 ? now - c->t_last_ms : -1);
        if (c->t_first_ms == 0) c->t_first_ms = now;
        c->t_last_ms = now;
    }
    const sd_client_result *f = ch->final;
    uint64_t collect = 0;
    if (f) {
        c->done = true;
        c->t_final_ms = now;
        c->status = f->status;
        c->code = f->code;
        snprintf(c->error, sizeof c->error, "%s", f->error);
        c->stop_reason = f->stop_reason;
        c->prompt_tokens = f->prompt_tokens;
        c->stats = f->stats;
        if (f->status == SD_OK) c->n_tokens = (uint32_t)f->n_ids;
        if (c->submit_returned)
            collect = f->request_id;
        else
            c->collect_id = f->request_id; /* gw_job_submit hands it over */
        gw_metrics_choice(srv->metrics, c, job->t_start_ms);
        atomic_fetch_sub(&srv->inflight, 1);
    }
    bool wake = job->waiting;
    job->waiting = false; /* one write per wait is enough: the count stays until read */
    uint64_t rid = c->request_id;
    pthread_mutex_unlock(&job->mu);
    if (wake) eventfd_write(job->wake_fd, 1);
    if (cancel && rid) sd_client_cancel(srv->client, rid);
    if (f) {
        if (collect) janitor_push(srv->janitor, collect);
        gw_job_release(job); /* this choice's reference; may free the job */
    }
}

bool gw_job_submit(gw_job *job, const gw_gen *g, gw_error *err) {
    gw_server *srv = job->srv;
    uint64_t base_seed = g->seeded ? g->sampling.seed : random_u64();
    for (size_t ci = 0; ci < job->n_choices; ci++) {
        const gw_prompt *p = &g->prompts[ci / g->n];
        gw_choice *c = &job->choices[ci];
        sd_client_request rq = sd_client_default_request();
        if (p->ids) {
            rq.prompt_ids = p->ids;
            rq.n_prompt_ids = p->n_ids;
        } else {
            rq.prompt = p->text;
        }
        rq.messages = p->turns;
        rq.n_messages = p->n_turns;
        rq.tools = g->tools_json;
        rq.max_tokens = g->max_tokens;
        rq.sampling = g->sampling;
        rq.sampling.seed = gw_choice_seed(base_seed, (unsigned)(ci % g->n));
        rq.stop = (const char *const *)g->stop;
        rq.n_stop = g->n_stop;
        rq.ignore_eos = g->ignore_eos;
        rq.logprobs = g->logprobs;
        rq.top_logprobs = g->top_logprobs;
        rq.prompt_logprobs = g->echo && g->logprobs;
        rq.echo = g->echo && p->ids; /* a text prompt is echoed as sent */
        rq.prompt_only = g->prompt_only;
        rq.parse_special = g->parse_special && !p->ids; /* text prompts only (ids are ids) */
        rq.constraint_kind = g->constraint_kind;
        rq.constraint_text = g->constraint_text;
        if (g->prompt_only) rq.max_tokens = 0;

        if (atomic_load(&srv->draining)) {
            gw_job_cancel(job);
            return gw_fail(err, 503, "server_error", "draining", NULL,
                           "the gateway is shutting down: retry (another gateway, or this one once restarted)");
        }
        if (atomic_fetch_add(&srv->inflight, 1) >= srv->max_inflight) {
            atomic_fetch_sub(&srv->inflight, 1);
            gw_job_cancel(job);
            return gw_fail(err, 429, "rate_limit_error", "too_many_requests", NULL,
                           "the gateway has %u requests in flight, its limit: retry later", srv->max_inflight);
        }
        pthread_mutex_lock(&job->mu);
        job->refs++;
        c->submitted = true;
        pthread_mutex_unlock(&job->mu);
        uint64_t rid = 0;
        sd_status st = sd_client_submit(srv->client, &rq, on_chunk, c, &rid);
        pthread_mutex_lock(&job->mu);
        if (st == SD_OK && !c->request_id) c->request_id = rid;
        c->submit_returned = true;
        uint64_t collect = c->collect_id;
        c->collect_id = 0;
        bool orphan = st != SD_OK && !c->done; /* failed without its final callback (out of memory) */
        if (orphan) {
            c->done = true;
            c->status = st;
            snprintf(c->error, sizeof c->error, "submit failed: %s", sd_status_str(st));
        }
        pthread_mutex_unlock(&job->mu);
        if (collect) janitor_push(srv->janitor, collect);
        if (orphan) {
            atomic_fetch_sub(&srv->inflight, 1);
            gw_job_release(job);
        }
        if (st != SD_OK) {
            pthread_mutex_lock(&job->mu);
            gw_choice_error(c, err);
            pthread_mutex_unlock(&job->mu);
            gw_job_cancel(job);
            return false;
        }
    }
    return true;
}

void gw_job_cancel(gw_job *job) {
    uint64_t ids[GW_MAX_CHOICES];
    size_t n = 0;
    pthread_mutex_lock(&job->mu);
    for (size_t i = 0; i < job->n_choices; i++) {
        const gw_choice *c = &job->choices[i];
        if (c->submitted && !c->done && c->request_id) ids[n++] = c->request_id;
    }
    pthread_mutex_unlock(&job->mu);
    for (size_t i = 0; i < n; i++) {
        sd_status st = sd_client_cancel(job->srv->client, ids[i]);
        SD_DEBUG("cancel request %llu: %s", (unsigned long long)ids[i], sd_status_str(st));
    }
}
