/* specd-client-jobs.c — specd-client --jobs: many requests from JSON
 * lines, at most --concurrency in flight, one JSON result per line in
 * input order. Per-job results are built as JSON on the library's I/O
 * thread (inside the final callback) so the main thread only orders and
 * writes them. */
#include "specd-client.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- many jobs ---- */

typedef struct job {
    cJSON *id; /* the line's "id", echoed (owned by the parsed line) */
    char *out; /* finished JSON line (malloc'd) */
    uint64_t request_id;
    bool done, failed;
} job;

typedef struct jobs_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t n_done, in_flight;
} jobs_run;

typedef struct job_ctx {
    jobs_run *run;
    job *j;
} job_ctx;

static char *job_line(cJSON *obj, const cJSON *id) {
    if (id) cJSON_AddItemToObject(obj, "id", cJSON_Duplicate(id, true));
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return s;
}

static void job_cb(const sd_client_chunk *ch, void *user) {
    if (!ch->final) return;
    job_ctx *x = user;
    char *line = job_line(cli_result_json(ch->final), x->j->id);
    pthread_mutex_lock(&x->run->mu);
    x->j->out = line;
    x->j->failed = ch->final->status != SD_OK;
    x->j->done = true;
    x->run->n_done++;
    x->run->in_flight--;
    pthread_cond_broadcast(&x->run->cv);
    pthread_mutex_unlock(&x->run->mu);
}

static const char *json_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Fills req from one job line on top of the command-line defaults. stop
 * pointers borrow from line. false + why on a bad field. */
/* A job's "messages" ([{"role","content"}, ...], at most SD_MAX_CHAT_MESSAGES)
 * into turns, borrowing from line; false + why when malformed. */
static bool job_messages(const cJSON *msgs, sd_client_request *req, sd_client_chat_msg *turns, char *why,
                         size_t why_len) {
    size_t n = 0;
    const cJSON *e;
    if (!cJSON_IsArray(msgs)) {
        snprintf(why, why_len, "\"messages\" must be an array of {\"role\",\"content\"}");
        return false;
    }
    cJSON_ArrayForEach(e, msgs) {
        const char *role = json_str(e, "role"), *content = json_str(e, "content");
        if (!role || !content || n >= SD_MAX_CHAT_MESSAGES) {
            snprintf(why, why_len, "\"messages\": at most %d objects with string \"role\" and \"content\"",
                     SD_MAX_CHAT_MESSAGES);
            return false;
        }
        turns[n++] = (sd_client_chat_msg){role, content, NULL, NULL};
    }
    req->messages = turns;
    req->n_messages = n;
    req->chat = false; /* the conversation alone says what the prompt is */
    return true;
}

/* A job's structured output: at most one of "json_schema" (a schema
 * object, or its text), "regex", "grammar" (GBNF text), "response_json":
 * true; a line without any keeps the command line's. *owned: a schema
 * object's text (caller frees after the submit). */
static bool job_constraint(const cJSON *line, sd_client_request *req, char **owned, char *why, size_t why_len) {
    static const char *const keys[] = {"json_schema", "regex", "grammar", "response_json"};
    static const Specd__ConstraintKind kinds[] = {SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA,
                                                  SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX,
                                                  SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR,
                                                  SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT};
    int found = -1;
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(line, keys[k]);
        if (!v) continue;
        if (found >= 0) {
            snprintf(why, why_len, "\"%s\" and \"%s\" exclude each other", keys[found], keys[k]);
            return false;
        }
        found = k;
        req->constraint_kind = kinds[k];
        req->constraint_text = NULL;
        if (k == 3) {
            if (!cJSON_IsTrue(v)) req->constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE;
        } else if (cJSON_IsString(v)) {
            req->constraint_text = v->valuestring;
        } else if (k == 0 && cJSON_IsObject(v)) {
            if (!(*owned = cJSON_PrintUnformatted(v))) {
                snprintf(why, why_len, "out of memory");
                return false;
            }
            req->constraint_text = *owned;
        } else {
            snprintf(why, why_len, "\"%s\" must be a string%s", keys[k], k == 0 ? " or a schema object" : "");
            return false;
        }
    }
    return true;
}

static bool job_request(const cJSON *line, const options *o, sd_client_request *req, const char **stops,
                        sd_client_chat_msg *turns, char **owned, char *why, size_t why_len) {
    *req = o->req;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(line, "messages");
    if (v && !job_messages(v, req, turns, why, why_len)) return false;
    req->prompt = json_str(line, "prompt");
    if (!req->prompt && !req->n_messages) {
        snprintf(why, why_len, "missing string field \"prompt\" (or \"messages\")");
        return false;
    }
#define NUM_FIELD(key, dst, cast)                                         \
    if ((v = cJSON_GetObjectItemCaseSensitive(line, key))) {              \
        if (!cJSON_IsNumber(v)) {                                         \
            snprintf(why, why_len, "field \"%s\" must be a number", key); \
            return false;                                                 \
        }                                                                 \
        dst = (cast)v->valuedouble;                                       \
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(line, "n")) && cJSON_IsNumber(v) && v->valuedouble < 1) {
        snprintf(why, why_len, "field \"n\" must be at least 1 (leave it out for the coordinator's default)");
        return false;
    }
    NUM_FIELD("n", req->max_tokens, uint32_t);
    NUM_FIELD("temp", req->sampling.temperature, float);
    NUM_FIELD("top_p", req->sampling.top_p, float);
    NUM_FIELD("top_k", req->sampling.top_k, int32_t);
    NUM_FIELD("min_p", req->sampling.min_p, float);
    NUM_FIELD("seed", req->sampling.seed, uint64_t);
    NUM_FIELD("max_k", req->max_k, int32_t);
#undef NUM_FIELD
    if ((v = cJSON_GetObjectItemCaseSensitive(line, "chat"))) req->chat = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(line, "ignore_eos"))) req->ignore_eos = cJSON_IsTrue(v);
    if (json_str(line, "system")) req->system = json_str(line, "system");
    if ((v = cJSON_GetObjectItemCaseSensitive(line, "stop"))) {
        size_t n = 0;
        if (cJSON_IsString(v)) {
            stops[n++] = v->valuestring;
        } else if (cJSON_IsArray(v)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, v) {
                if (!cJSON_IsString(e) || n >= SD_MAX_STOP_STRINGS) {
                    snprintf(why, why_len, "\"stop\": at most %d strings", SD_MAX_STOP_STRINGS);
                    return false;
                }
                stops[n++] = e->valuestring;
            }
        } else {
            snprintf(why, why_len, "\"stop\" must be a string or an array of strings");
            return false;
        }
        req->stop = stops;
        req->n_stop = n;
    }
    return job_constraint(line, req, owned, why, why_len);
}

static void progress(size_t done, size_t total) {
    if (!isatty(STDERR_FILENO) || total == 0) return;
    int width = 40, fill = (int)(width * done / total);
    fprintf(stderr, "\r[");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %zu/%zu", done, total);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* Reads every non-empty line of in (results go out in input order): the
 * parsed lines (NULL where a line is not JSON; reported as that job's
 * error) and whether each holds a NUL (\u0000: refused, cJSON would cut the
 * text there). Returns the count; the caller frees both arrays and the
 * lines. Stops early when memory runs out. */
static size_t read_job_lines(FILE *in, cJSON ***lines_out, bool **nul_out) {
    size_t n = 0, cap = 0;
    cJSON **lines = NULL;
    bool *nul = NULL;
    char *buf = NULL;
    size_t buf_cap = 0;
    ssize_t len;
    while ((len = getline(&buf, &buf_cap, in)) >= 0) {
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = '\0';
        if (len == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            cJSON **p = realloc(lines, cap * sizeof *p);
            if (!p) break;
            lines = p;
            bool *q = realloc(nul, cap * sizeof *q);
            if (!q) break;
            nul = q;
        }
        nul[n] = sd_json_has_nul(buf, (size_t)len);
        lines[n++] = cJSON_Parse(buf);
    }
    free(buf);
    *lines_out = lines;
    *nul_out = nul;
    return n;
}

/* The jobs of one --jobs run: the parsed lines, their records and the
 * submission state shared with the callbacks (run). */
typedef struct jobs_state {
    sd_client *c;
    const options *o;
    cJSON **lines;
    bool *nul;
    size_t n;
    job *jobs;
    job_ctx *ctx;
    jobs_run run;
    size_t cap_in_flight;
    bool net_down; /* a submit failed for the network: the rest would each wait out --timeout too */
} jobs_state;

/* Records job j as failed without running, with an error {code, message};
 * in_flight: it held a slot under the cap, given back here. */
static void job_fail_unrun(jobs_run *run, job *j, const char *code, const char *message, bool in_flight) {
    cJSON *e = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(e, "error");
    cJSON_AddStringToObject(err, "code", code);
    cJSON_AddStringToObject(err, "message", message);
    char *line = job_line(e, j->id);
    pthread_mutex_lock(&run->mu);
    j->out = line, j->failed = j->done = true;
    if (in_flight) run->n_done++, run->in_flight--;
    pthread_mutex_unlock(&run->mu);
}

/* Submits job i (its slot under the cap already taken): a bad line is
 * recorded as a BAD_JOB error at once; a network failure ends submitting. */
static void submit_job(jobs_state *st, size_t i) {
    job *j = &st->jobs[i];
    st->ctx[i] = (job_ctx){&st->run, j};
    char why[256];
    sd_client_request req;
    const char *stops[SD_MAX_STOP_STRINGS];
    sd_client_chat_msg turns[SD_MAX_CHAT_MESSAGES]; /* borrowed from the line until submitted */
    char *schema_text = NULL;                         /* a "json_schema" object's text, until submitted */
    bool ok = st->lines[i] && cJSON_IsObject(st->lines[i]) && !st->nul[i];
    if (!ok && st->nul[i])
        snprintf(why, sizeof why, "line %zu holds a NUL character (\\u0000): refused rather than cut at it", i + 1);
    else if (!ok)
        snprintf(why, sizeof why, "line %zu is not a JSON object", i + 1);
    else {
        j->id = cJSON_GetObjectItemCaseSensitive(st->lines[i], "id");
        ok = job_request(st->lines[i], st->o, &req, stops, turns, &schema_text, why, sizeof why);
    }
    if (!ok) {
        job_fail_unrun(&st->run, j, "BAD_JOB", why, true);
    } else if (sd_client_submit(st->c, &req, job_cb, &st->ctx[i], &j->request_id) == SD_ERR_NET) {
        /* the final callback recorded this job's error */
        st->net_down = true;
        fprintf(stderr, "specd-client: no answer from %s: the jobs after line %zu are not submitted\n",
                st->o->link.coordinator, i + 1);
    }
    free(schema_text);
}

/* Submits jobs from *next while there is room under the cap. */
static void submit_jobs(jobs_state *st, size_t *next) {
    while (*next < st->n && !cli_interrupted && !st->net_down) {
        pthread_mutex_lock(&st->run.mu);
        bool room = st->run.in_flight < st->cap_in_flight;
        if (room) st->run.in_flight++;
        pthread_mutex_unlock(&st->run.mu);
        if (!room) break;
        submit_job(st, (*next)++);
    }
}

/* Writes the finished jobs from *next_out on, in order, and collects their
 * records; called and returns with run.mu held. */
static void write_finished_locked(jobs_state *st, FILE *out, size_t *next_out, size_t *failures) {
    while (*next_out < st->n && st->jobs[*next_out].done) {
        job *j = &st->jobs[*next_out];
        pthread_mutex_unlock(&st->run.mu);
        fprintf(out, "%s\n", j->out);
        fflush(out);
        *failures += j->failed;
        if (j->request_id) {
            sd_client_result r;
            if (sd_client_wait(st->c, j->request_id, 1000, &r) == SD_OK) sd_client_result_clear(&r);
        }
        free(j->out);
        j->out = NULL;
        (*next_out)++;
        progress(*next_out, st->n);
        pthread_mutex_lock(&st->run.mu);
    }
}

/* After an interrupt or a network failure: jobs *next.. are reported as
 * not run. */
static void fail_unsubmitted(jobs_state *st, size_t *next) {
    for (; *next < st->n; (*next)++) {
        job *j = &st->jobs[*next];
        j->id = st->lines[*next] ? cJSON_GetObjectItemCaseSensitive(st->lines[*next], "id") : NULL;
        job_fail_unrun(&st->run, j, cli_interrupted ? "INTERRUPTED" : "UNAVAILABLE",
                       cli_interrupted ? "not submitted: interrupted" : "not submitted: the coordinator did not answer",
                       false);
    }
}

/* Runs the jobs, at most the cap in flight, writing each result line in
 * input order as soon as it and those before it are done. Returns how many
 * failed. */
static size_t run_all_jobs(jobs_state *st, FILE *out) {
    size_t next = 0, next_out = 0, failures = 0;
    while (next < st->n || next_out < st->n) {
        submit_jobs(st, &next);
        pthread_mutex_lock(&st->run.mu);
        write_finished_locked(st, out, &next_out, &failures);
        if (next_out < st->n) {
            if ((cli_interrupted || st->net_down) && next < st->n) { /* stop submitting; report the rest as not run */
                pthread_mutex_unlock(&st->run.mu);
                fail_unsubmitted(st, &next);
                pthread_mutex_lock(&st->run.mu);
            }
            bool can_submit = next < st->n && st->run.in_flight < st->cap_in_flight;
            if (!can_submit && !st->jobs[next_out].done) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 200 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&st->run.cv, &st->run.mu, &ts);
            }
        }
        pthread_mutex_unlock(&st->run.mu);
    }
    return failures;
}

int cli_run_jobs(sd_client *c, const options *o) {
    FILE *in = strcmp(o->jobs, "-") == 0 ? stdin : fopen(o->jobs, "r");
    if (!in) {
        fprintf(stderr, "specd-client: cannot open %s: %s\n", o->jobs, strerror(errno));
        return 1;
    }
    FILE *out = stdout;
    if (o->out && !(out = fopen(o->out, "w"))) {
        fprintf(stderr, "specd-client: cannot write %s: %s\n", o->out, strerror(errno));
        if (in != stdin) fclose(in);
        return 1;
    }
    jobs_state st = {.c = c, .o = o, .cap_in_flight = o->concurrency > 0 ? (size_t)o->concurrency : 64};
    st.n = read_job_lines(in, &st.lines, &st.nul);
    if (in != stdin) fclose(in);
    st.jobs = calloc(st.n ? st.n : 1, sizeof *st.jobs);
    st.ctx = calloc(st.n ? st.n : 1, sizeof *st.ctx);
    pthread_mutex_init(&st.run.mu, NULL);
    pthread_cond_init(&st.run.cv, NULL);
    size_t failures = 0;
    if (st.jobs && st.ctx) {
        failures = run_all_jobs(&st, out);
    } else {
        fprintf(stderr, "specd-client: out of memory for %zu jobs\n", st.n);
        failures = st.n ? st.n : 1;
    }
    for (size_t i = 0; i < st.n; i++) cJSON_Delete(st.lines[i]);
    free(st.nul);
    free(st.lines);
    free(st.jobs);
    free(st.ctx);
    pthread_cond_destroy(&st.run.cv);
    pthread_mutex_destroy(&st.run.mu);
    if (out != stdout) fclose(out);
    if (failures) fprintf(stderr, "specd-client: %zu of %zu jobs failed\n", failures, st.n);
    return failures ? 1 : 0;
}
