/* specd-client — command-line front end of libspecd-client.
 *
 * Modes (combinable with --wait-ready, which runs first):
 *   -p PROMPT      one request; text streams to stdout, stats to stderr
 *                  (--json: one object at the end instead)
 *   --jobs FILE    many requests (JSON lines), at most --concurrency in
 *                  flight; one JSON result per line, in input order
 *   --stats        the coordinator's ServiceStats (--json for machines)
 * Exit status: 0 success, 1 an error (printed with its code and message),
 * 2 bad usage. The library does the networking; this file only maps flags
 * and JSON to requests and results. Per-job results are built as JSON on the
 * library's I/O thread (inside the final callback) so the main thread only
 * orders and writes them. */
#include "specd-client.h"
#include "specd/curve.h"
#include "specd/cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t cli_interrupted; /* set by SIGINT/SIGTERM; main polls it */

static void on_signal(int sig) {
    (void)sig;
    cli_interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-client [--coordinator ADDR] -p PROMPT [options]\n"
            "       specd-client [--coordinator ADDR] --jobs FILE.jsonl [--out FILE] [--concurrency N] [options]\n"
            "       specd-client [--coordinator ADDR] --stats [--json]\n"
            "       specd-client [--coordinator ADDR] --wait-ready SEC\n"
            "  --coordinator ADDR  coordinator client address (default: the one this user's specd-launch\n"
            "                      recorded in $XDG_RUNTIME_DIR or /tmp/specd-UID/current, else %s)\n"
            "  -p, --prompt TEXT   prompt text\n"
            "  -n N                new tokens at most, N >= 1 (default: the coordinator's; 0 is refused,\n"
            "                      as OpenAI refuses max_tokens 0: leave -n out for the default)\n"
            "  --temp T            temperature (default 0 = greedy)\n"
            "  --top-p P, --top-k K, --min-p P, --seed S   sampling\n"
            "  --chat              format the prompt as a user turn with the model's chat template\n"
            "  --system S          system prompt (with --chat)\n"
            "  --special           read special-token text in a plain prompt as control tokens (default: it\n"
            "                      stays text; refused with --chat)\n"
            "  --stop S            stop string (repeatable, up to %d)\n"
            "  --max-k K           largest draft length (-1: no speculation)\n"
            "  --drafter KIND      only drafters of this kind draft for the request: ngram, model, self or\n"
            "                      eagle (a verifier's EAGLE head)\n"
            "                      (default: the coordinator chooses per request by measured goodput)\n"
            "  --ignore-eos        generate past end-of-generation tokens\n"
            "  --json-schema FILE  the output is an instance of this JSON Schema (structured output)\n"
            "  --regex RE          the whole output matches this regular expression\n"
            "  --grammar FILE      the output is a sentence of this GBNF grammar (start rule root)\n"
            "  --response-json     the output is a JSON object (OpenAI's json_object)\n"
            "  --json              print one JSON object at the end\n"
            "  --timeout SEC       give up when the coordinator does not answer (default 10)\n"
            "  --deadline SEC      each request ends within SEC of its submit, cancelled past it (default\n"
            "                      3600)\n"
            "  --curve-secret FILE CurveZMQ: this client's secret key (specd-keygen; mode 0600; or\n"
            "                      $SPECD_CURVE_SECRET); its public key must be on the coordinator's\n"
            "                      --client-keys list\n"
            "  --curve-server FILE the coordinator's public key (or $SPECD_CURVE_SERVER)\n"
            "  --jobs FILE         JSON lines: {\"prompt\",\"n\",\"temp\",\"top_p\",\"top_k\",\"min_p\",\"seed\",\n"
            "                      \"chat\",\"system\",\"stop\",\"max_k\",\"ignore_eos\",\"id\"}, or \"messages\":\n"
            "                      [{\"role\",\"content\"}, ...] (a conversation, instead of \"prompt\");\n"
            "                      structured output: \"json_schema\" (object or text), \"regex\", \"grammar\"\n"
            "                      or \"response_json\": true\n"
            "  --out FILE          write job results here instead of stdout\n"
            "  --concurrency N     jobs in flight at most (default 64)\n"
            "  --stats             print service statistics\n"
            "  --wait-ready SEC    wait until a verifier is registered\n"
            "  -v                  debug logs\n"
            "  -h, --help          this help\n",
            SD_CLIENT_DEFAULT_ADDR, SD_MAX_STOP_STRINGS);
}

/* ---- results as JSON ---- */

static const char *kind_name(Specd__DrafterKind k) {
    switch (k) {
    case SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL: return "model";
    case SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM: return "ngram";
    case SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF: return "self";
    case SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE: return "eagle";
    default: return "";
    }
}

/* A string member that is valid JSON whatever the bytes (sd_json_quote):
 * model text can be invalid UTF-8, which cJSON would write as is. */
static void add_text(cJSON *obj, const char *name, const char *s, size_t len) {
    char *quoted = sd_json_quote(s, len);
    if (quoted) cJSON_AddRawToObject(obj, name, quoted);
    free(quoted);
}

cJSON *cli_result_json(const sd_client_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "request_id", (double)r->request_id);
    cJSON_AddNumberToObject(o, "prompt_tokens", r->prompt_tokens);
    cJSON *ids = cJSON_AddArrayToObject(o, "ids");
    for (size_t i = 0; i < r->n_ids; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->ids[i]));
    add_text(o, "text", r->text ? r->text : "", r->text ? r->text_len : 0);
    if (r->status == SD_OK) {
        cJSON_AddStringToObject(o, "stop_reason", sd_client_stop_reason_name(r->stop_reason));
    } else {
        cJSON_AddStringToObject(o, "stop_reason", "ERROR");
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code",
                                r->code == SPECD__CODE__CODE_UNSPECIFIED ? "CLIENT" : sd_net_code_name(r->code));
        add_text(e, "message", r->error, strlen(r->error));
    }
    const sd_client_request_stats *s = &r->stats;
    cJSON *st = cJSON_AddObjectToObject(o, "stats");
    cJSON_AddNumberToObject(st, "generated_tokens", s->generated_tokens);
    cJSON_AddNumberToObject(st, "drafted", s->drafted);
    cJSON_AddNumberToObject(st, "accepted", s->accepted);
    cJSON_AddNumberToObject(st, "acceptance", s->drafted ? (double)s->accepted / s->drafted : 0.0);
    cJSON_AddNumberToObject(st, "target_steps", s->target_steps);
    cJSON_AddNumberToObject(st, "tokens_per_step",
                            s->target_steps ? (double)s->generated_tokens / s->target_steps : 0.0);
    cJSON_AddNumberToObject(st, "queued_ms", s->queued_ms);
    cJSON_AddNumberToObject(st, "drafting_ms", s->drafting_ms);
    cJSON_AddNumberToObject(st, "verifying_ms", s->verifying_ms);
    cJSON_AddNumberToObject(st, "first_token_ms", s->first_token_ms);
    cJSON_AddNumberToObject(st, "total_ms", s->total_ms);
    if (s->drafter_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED)
        cJSON_AddStringToObject(st, "drafter_kind", kind_name(s->drafter_kind));
    cJSON_AddNumberToObject(st, "drafter_switches", s->drafter_switches);
    return o;
}

static void print_error(const sd_client_result *r) {
    if (r->code != SPECD__CODE__CODE_UNSPECIFIED && r->code != SPECD__CODE__CODE_OK)
        fprintf(stderr, "specd-client: error %s: %s\n", sd_net_code_name(r->code), r->error);
    else
        fprintf(stderr, "specd-client: %s\n", r->error[0] ? r->error : sd_status_str(r->status));
}

/* ---- one prompt ---- */

typedef struct single_state {
    bool stream;            /* print text as it comes */
    sd_client_result final; /* copy of the final record's scalars (refused submits) */
    bool got_final;
} single_state;

static void single_cb(const sd_client_chunk *ch, void *user) {
    single_state *s = user;
    if (s->stream && ch->text_len) {
        fwrite(ch->text, 1, ch->text_len, stdout);
        fflush(stdout);
    }
    if (ch->final) {
        s->final = *ch->final;
        s->final.ids = NULL; /* borrowed arrays are not kept */
        s->final.text = NULL;
        s->got_final = true;
    }
}

static int run_single(sd_client *c, const options *o) {
    single_state st = {.stream = !o->json};
    uint64_t id = 0;
    sd_status s = sd_client_submit(c, &o->req, single_cb, &st, &id);
    if (s != SD_OK) {
        if (st.got_final)
            print_error(&st.final);
        else
            fprintf(stderr, "specd-client: submit failed: %s\n", sd_status_str(s));
        return 1;
    }
    sd_client_result r;
    bool cancelled = false;
    for (;;) {
        s = sd_client_wait(c, id, 200, &r);
        if (s == SD_OK) break;
        if (errno != ETIMEDOUT) {
            fprintf(stderr, "specd-client: wait failed: %s\n", sd_status_str(s));
            return 1;
        }
        if (cli_interrupted && !cancelled) {
            sd_client_cancel(c, id);
            cancelled = true;
        }
    }
    int rc = r.status == SD_OK ? 0 : 1;
    if (o->json) {
        cJSON *j = cli_result_json(&r);
        char *txt = cJSON_PrintUnformatted(j);
        printf("%s\n", txt);
        free(txt);
        cJSON_Delete(j);
    } else {
        printf("\n");
    }
    fflush(stdout); /* the text before the stats line on stderr, also when both go to one file */
    if (r.status != SD_OK) {
        print_error(&r);
    } else if (!o->json) {
        const sd_client_request_stats *t = &r.stats;
        fprintf(stderr,
                "[request %llu: %u prompt + %zu generated tokens, stop %s; drafted %u, accepted %u (%.1f%%), "
                "%u target steps (%.2f tokens/step); first token %.1f ms, total %.1f ms]\n",
                (unsigned long long)r.request_id, r.prompt_tokens, r.n_ids, sd_client_stop_reason_name(r.stop_reason),
                t->drafted, t->accepted, t->drafted ? 100.0 * t->accepted / t->drafted : 0.0, t->target_steps,
                t->target_steps ? (double)t->generated_tokens / t->target_steps : 0.0, t->first_token_ms, t->total_ms);
    }
    sd_client_result_clear(&r);
    return rc;
}

/* ---- stats ---- */

static const char *role_name(Specd__Role r) {
    switch (r) {
    case SPECD__ROLE__ROLE_DRAFTER: return "drafter";
    case SPECD__ROLE__ROLE_VERIFIER: return "verifier";
    case SPECD__ROLE__ROLE_CLIENT: return "client";
    case SPECD__ROLE__ROLE_COORDINATOR: return "coordinator";
    default: return "unspecified";
    }
}

/* Speculative decoding: verify steps, drafts, acceptance per draft
 * position, mean accepted length and goodput (as /metrics has them). */
static void print_spec_stats(const sd_client_service_stats *s) {
    double steps = (double)s->seq_verify_steps, drafts = (double)s->drafts;
    printf("speculation: %llu sequence verify steps in %llu verify batches, %llu with drafts; %llu/%llu draft "
           "tokens accepted; mean accepted length %.2f per drafted step; goodput %.2f tokens per step\n",
           (unsigned long long)s->seq_verify_steps, (unsigned long long)s->verify_batches,
           (unsigned long long)s->drafts, (unsigned long long)s->accepted_tokens, (unsigned long long)s->draft_tokens,
           drafts > 0 ? (double)s->accepted_tokens / drafts : 0.0,
           steps > 0 ? (double)s->committed_tokens / steps : 0.0);
    if (s->n_positions == 0) return;
    printf("acceptance by draft position:");
    for (size_t i = 0; i < s->n_positions; i++)
        printf(" %zu:%llu/%llu", i, (unsigned long long)s->accepted_tokens_per_pos[i],
               (unsigned long long)s->draft_tokens_per_pos[i]);
    printf("\n");
}

static int run_stats(sd_client *c, const options *o) {
    sd_client_service_stats s;
    sd_status st = sd_client_stats(c, (int)(o->timeout_s * 1000), &s);
    if (st != SD_OK) {
        fprintf(stderr, "specd-client: no statistics from %s within %.1f s: %s\n", o->link.coordinator, o->timeout_s,
                sd_status_str(st));
        return 1;
    }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "active_requests", s.active_requests);
        cJSON_AddNumberToObject(j, "queued_requests", s.queued_requests);
        cJSON_AddNumberToObject(j, "finished_requests", (double)s.finished_requests);
        cJSON_AddNumberToObject(j, "committed_tokens", (double)s.committed_tokens);
        cJSON_AddNumberToObject(j, "step_overhead_p50_us", s.step_overhead_p50_us);
        cJSON_AddNumberToObject(j, "step_overhead_p99_us", s.step_overhead_p99_us);
        cJSON_AddNumberToObject(j, "draft_wait_mean_us", s.draft_wait_mean_us);
        cJSON_AddNumberToObject(j, "draft_wait_p99_us", s.draft_wait_p99_us);
        cJSON_AddNumberToObject(j, "draft_wait_share", s.draft_wait_share);
        cJSON_AddNumberToObject(j, "verify_fixed_us", s.verify_fixed_us);
        cJSON_AddNumberToObject(j, "verify_token_us", s.verify_token_us);
        cJSON_AddNumberToObject(j, "draft_token_us", s.draft_token_us);
        cJSON_AddNumberToObject(j, "draft_step_us", s.draft_step_us);
        cJSON_AddNumberToObject(j, "catchup_row_us", s.catchup_row_us);
        cJSON_AddNumberToObject(j, "seq_verify_steps", (double)s.seq_verify_steps);
        cJSON_AddNumberToObject(j, "drafts", (double)s.drafts);
        cJSON_AddNumberToObject(j, "draft_tokens", (double)s.draft_tokens);
        cJSON_AddNumberToObject(j, "accepted_tokens", (double)s.accepted_tokens);
        cJSON_AddNumberToObject(j, "verify_batches", (double)s.verify_batches);
        cJSON *dp = cJSON_AddArrayToObject(j, "draft_tokens_per_pos");
        cJSON *ap = cJSON_AddArrayToObject(j, "accepted_tokens_per_pos");
        for (size_t i = 0; i < s.n_positions; i++) {
            cJSON_AddItemToArray(dp, cJSON_CreateNumber((double)s.draft_tokens_per_pos[i]));
            cJSON_AddItemToArray(ap, cJSON_CreateNumber((double)s.accepted_tokens_per_pos[i]));
        }
        cJSON *ws = cJSON_AddArrayToObject(j, "workers");
        for (size_t i = 0; i < s.n_workers; i++) {
            const sd_client_worker_info *w = &s.workers[i];
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "role", role_name(w->role));
            cJSON_AddNumberToObject(x, "rank", w->rank);
            cJSON_AddStringToObject(x, "name", w->name);
            cJSON_AddStringToObject(x, "drafter_kind", kind_name(w->drafter_kind));
            cJSON_AddBoolToObject(x, "alive", w->alive);
            cJSON_AddNumberToObject(x, "kv_blocks_total", w->kv_blocks_total);
            cJSON_AddNumberToObject(x, "kv_blocks_free", w->kv_blocks_free);
            cJSON_AddNumberToObject(x, "n_sequences", w->n_sequences);
            cJSON_AddNumberToObject(x, "steps", (double)w->steps);
            cJSON_AddNumberToObject(x, "prefix_query_tokens", (double)w->prefix_query_tokens);
            cJSON_AddNumberToObject(x, "prefix_hit_tokens", (double)w->prefix_hit_tokens);
            cJSON_AddNumberToObject(x, "prefix_blocks_cached", w->prefix_blocks_cached);
            cJSON_AddNumberToObject(x, "prefix_blocks_evicted", (double)w->prefix_blocks_evicted);
            cJSON_AddNumberToObject(x, "group_id", w->group_id);
            cJSON_AddNumberToObject(x, "group_size", w->group_size);
            cJSON_AddNumberToObject(x, "active_requests", w->active_requests);
            cJSON_AddNumberToObject(x, "served_requests", (double)w->served_requests);
            cJSON_AddNumberToObject(x, "drafted", (double)w->drafted);
            cJSON_AddNumberToObject(x, "accepted", (double)w->accepted);
            cJSON_AddNumberToObject(x, "committed", (double)w->committed);
            cJSON_AddNumberToObject(x, "step_us", w->step_us);
            cJSON_AddNumberToObject(x, "worker_id", (double)w->worker_id);
            cJSON_AddItemToArray(ws, x);
        }
        char *txt = cJSON_PrintUnformatted(j);
        printf("%s\n", txt);
        free(txt);
        cJSON_Delete(j);
        return 0;
    }
    printf("requests: %u active, %u queued, %llu finished; %llu tokens committed\n", s.active_requests,
           s.queued_requests, (unsigned long long)s.finished_requests, (unsigned long long)s.committed_tokens);
    printf("step overhead: p50 %.1f us, p99 %.1f us\n", s.step_overhead_p50_us, s.step_overhead_p99_us);
    printf("verify steps held for drafts: %.0f%%, wait mean %.1f us, p99 %.1f us\n", 100.0 * s.draft_wait_share,
           s.draft_wait_mean_us, s.draft_wait_p99_us);
    printf("cost model: verify step %.0f us + %.0f us per token; drafting %.0f us per token; draft round trip "
           "%.0f us",
           s.verify_fixed_us, s.verify_token_us, s.draft_token_us, s.draft_step_us);
    if (s.catchup_row_us > 0) printf("; a head's catch-up %.0f us a skipped position", s.catchup_row_us);
    printf("\n");
    print_spec_stats(&s);
    for (size_t i = 0; i < s.n_workers; i++) {
        const sd_client_worker_info *w = &s.workers[i];
        printf("  %s[%u] %s%s%s %s: KV blocks %u free of %u, %u sequences, %llu steps\n", role_name(w->role), w->rank,
               w->name, w->drafter_kind ? " " : "", kind_name(w->drafter_kind), w->alive ? "alive" : "DEAD",
               w->kv_blocks_free, w->kv_blocks_total, w->n_sequences, (unsigned long long)w->steps);
        if (w->prefix_query_tokens > 0 || w->prefix_blocks_cached > 0)
            printf("    prefix cache: %llu of %llu prompt tokens hit (%.1f%%), %u blocks cached, %llu evicted\n",
                   (unsigned long long)w->prefix_hit_tokens, (unsigned long long)w->prefix_query_tokens,
                   w->prefix_query_tokens ? 100.0 * (double)w->prefix_hit_tokens / (double)w->prefix_query_tokens : 0.0,
                   w->prefix_blocks_cached, (unsigned long long)w->prefix_blocks_evicted);
        if (w->role == SPECD__ROLE__ROLE_VERIFIER)
            printf("    group %u (TP %u): %u requests now, %llu served, %llu tokens committed, %llu/%llu drafts "
                   "accepted, step(64) %.0f us\n",
                   w->group_id, w->group_size, w->active_requests, (unsigned long long)w->served_requests,
                   (unsigned long long)w->committed, (unsigned long long)w->accepted, (unsigned long long)w->drafted,
                   w->step_us);
        else
            printf("    %u requests now, %llu served, %llu/%llu drafts accepted, round trip %.0f us\n",
                   w->active_requests, (unsigned long long)w->served_requests, (unsigned long long)w->accepted,
                   (unsigned long long)w->drafted, w->step_us);
    }
    return 0;
}

/* Until a verifier is registered. With `discover` (no --coordinator, and
 * no record of specd-launch's address when the client started), it also
 * looks for that record every pass and moves to it once it appears:
 * specd-launch writes it when the service is ready, so a --wait-ready
 * started beside it (README's first commands) would otherwise wait on the
 * fallback address to its deadline. */
static int wait_ready(sd_client **c, sd_client_params *p, options *o, bool discover) {
    static char found[600];
    double deadline = sd_now() + o->wait_ready_s;
    while (!cli_interrupted) {
        if (discover && sd_client_discover(getenv("XDG_RUNTIME_DIR"), found, sizeof found)) {
            sd_client *moved = NULL;
            p->coordinator = found;
            if (sd_client_connect(p, &moved) == SD_OK) {
                sd_client_close(c);
                *c = moved;
                o->link.coordinator = found;
                discover = false;
            }
        }
        sd_client_service_stats s;
        if (sd_client_stats(*c, 500, &s) == SD_OK)
            for (size_t i = 0; i < s.n_workers; i++)
                if (s.workers[i].role == SPECD__ROLE__ROLE_VERIFIER && s.workers[i].alive) return 0;
        if (sd_now() >= deadline) break;
        usleep(100 * 1000);
    }
    fprintf(stderr, "specd-client: no verifier registered at %s within %.1f s\n", o->link.coordinator, o->wait_ready_s);
    return 1;
}

/* ---- flags ---- */

static bool parse_num(const char *flag, const char *s, double lo, double hi, double *out) {
    if (sd_cli_parse_double(s, lo, hi, out)) return true;
    fprintf(stderr, "specd-client: %s: '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
    return false;
}

enum {
    OPT_TEMP = 256,
    OPT_TOP_P,
    OPT_TOP_K,
    OPT_MIN_P,
    OPT_SEED,
    OPT_CHAT,
    OPT_SYSTEM,
    OPT_STOP,
    OPT_MAX_K,
    OPT_DRAFTER,
    OPT_IGNORE_EOS,
    OPT_JSON,
    OPT_TIMEOUT,
    OPT_JOBS,
    OPT_OUT,
    OPT_CONC,
    OPT_STATS,
    OPT_WAIT_READY,
    OPT_DEADLINE,
    OPT_SPECIAL,
    OPT_JSON_SCHEMA,
    OPT_REGEX,
    OPT_GRAMMAR,
    OPT_RESPONSE_JSON
};

/* --drafter KIND, or false with the message on stderr. */
static bool parse_drafter(const char *arg, Specd__DrafterKind *out) {
    if (!strcmp(arg, "ngram"))
        *out = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    else if (!strcmp(arg, "model"))
        *out = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    else if (!strcmp(arg, "self"))
        *out = SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF;
    else if (!strcmp(arg, "eagle"))
        *out = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    else {
        fprintf(stderr, "specd-client: --drafter takes ngram, model, self or eagle, got '%s'\n", arg);
        return false;
    }
    return true;
}

/* 0 ok, 2 usage error, -1 help printed */
static int parse_args(int argc, char **argv, options *o) {
    static const struct option longs[] = {SD_CLIENT_LINK_LONG_OPTIONS,
                                          {"prompt", required_argument, NULL, 'p'},
                                          {"temp", required_argument, NULL, OPT_TEMP},
                                          {"top-p", required_argument, NULL, OPT_TOP_P},
                                          {"top-k", required_argument, NULL, OPT_TOP_K},
                                          {"min-p", required_argument, NULL, OPT_MIN_P},
                                          {"seed", required_argument, NULL, OPT_SEED},
                                          {"chat", no_argument, NULL, OPT_CHAT},
                                          {"system", required_argument, NULL, OPT_SYSTEM},
                                          {"stop", required_argument, NULL, OPT_STOP},
                                          {"max-k", required_argument, NULL, OPT_MAX_K},
                                          {"drafter", required_argument, NULL, OPT_DRAFTER},
                                          {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
                                          {"json", no_argument, NULL, OPT_JSON},
                                          {"timeout", required_argument, NULL, OPT_TIMEOUT},
                                          {"deadline", required_argument, NULL, OPT_DEADLINE},
                                          {"special", no_argument, NULL, OPT_SPECIAL},
                                          {"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},
                                          {"regex", required_argument, NULL, OPT_REGEX},
                                          {"grammar", required_argument, NULL, OPT_GRAMMAR},
                                          {"response-json", no_argument, NULL, OPT_RESPONSE_JSON},
                                          {"jobs", required_argument, NULL, OPT_JOBS},
                                          {"out", required_argument, NULL, OPT_OUT},
                                          {"concurrency", required_argument, NULL, OPT_CONC},
                                          {"stats", no_argument, NULL, OPT_STATS},
                                          {"wait-ready", required_argument, NULL, OPT_WAIT_READY},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    int ch;
    double v;
    while ((ch = getopt_long(argc, argv, "p:n:vh", longs, NULL)) != -1) {
        switch (ch) {
        case 'p': o->prompt = optarg; break;
        case 'n':
            if (!parse_num("-n", optarg, 1, 1e9, &v)) return 2;
            o->req.max_tokens = (uint32_t)v;
            break;
        case OPT_TEMP:
            if (!parse_num("--temp", optarg, 0, 1000, &v)) return 2;
            o->req.sampling.temperature = (float)v;
            break;
        case OPT_TOP_P:
            if (!parse_num("--top-p", optarg, 0, 1, &v)) return 2;
            o->req.sampling.top_p = v == 0 ? 1.0f : (float)v;
            break;
        case OPT_TOP_K:
            if (!parse_num("--top-k", optarg, 0, 1e9, &v)) return 2;
            o->req.sampling.top_k = (int32_t)v;
            break;
        case OPT_MIN_P:
            if (!parse_num("--min-p", optarg, 0, 0.999999, &v)) return 2;
            o->req.sampling.min_p = (float)v;
            break;
        case OPT_SEED: o->req.sampling.seed = strtoull(optarg, NULL, 0); break;
        case OPT_CHAT: o->req.chat = true; break;
        case OPT_SYSTEM: o->system = optarg; break;
        case OPT_STOP:
            if (o->n_stop >= SD_MAX_STOP_STRINGS) {
                fprintf(stderr, "specd-client: at most %d --stop strings\n", SD_MAX_STOP_STRINGS);
                return 2;
            }
            o->stop[o->n_stop++] = optarg;
            break;
        case OPT_MAX_K:
            if (!parse_num("--max-k", optarg, -1, SD_MAX_K, &v)) return 2;
            o->req.max_k = (int32_t)v;
            break;
        case OPT_DRAFTER:
            if (!parse_drafter(optarg, &o->req.drafter_kind)) return 2;
            break;
        case OPT_IGNORE_EOS: o->req.ignore_eos = true; break;
        case OPT_JSON: o->json = true; break;
        case OPT_SPECIAL: o->req.parse_special = true; break;
        case OPT_JSON_SCHEMA: o->schema_path = optarg; break;
        case OPT_REGEX: o->regex = optarg; break;
        case OPT_GRAMMAR: o->grammar_path = optarg; break;
        case OPT_RESPONSE_JSON: o->response_json = true; break;
        case OPT_DEADLINE:
            if (!parse_num("--deadline", optarg, 0.001, 2e6, &v)) return 2;
            o->req.timeout_ms = (int)(v * 1000);
            break;
        case OPT_TIMEOUT:
            if (!parse_num("--timeout", optarg, 0.001, 1e6, &o->timeout_s)) return 2;
            break;
        case OPT_JOBS: o->jobs = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_CONC:
            if (!parse_num("--concurrency", optarg, 1, 100000, &v)) return 2;
            o->concurrency = (int)v;
            break;
        case OPT_STATS: o->stats = true; break;
        case OPT_WAIT_READY:
            if (!parse_num("--wait-ready", optarg, 0, 1e6, &o->wait_ready_s)) return 2;
            break;
        case 'v': o->verbose = true; break;
        case 'h': usage(stdout); return -1;
        default:
            if (sd_client_link_opts_apply(&o->link, ch, optarg)) break;
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "specd-client: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    int modes = (o->prompt != NULL) + (o->jobs != NULL) + o->stats;
    if (modes > 1 || (modes == 0 && o->wait_ready_s <= 0)) {
        fprintf(stderr, "specd-client: give exactly one of -p, --jobs, --stats (or --wait-ready alone)\n");
        usage(stderr);
        return 2;
    }
    o->req.system = o->system;
    o->req.prompt = o->prompt;
    if (o->n_stop) o->req.stop = o->stop, o->req.n_stop = o->n_stop;
    return cli_constraint_load(o);
}

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.link.coordinator = SD_CLIENT_DEFAULT_ADDR;
    o.req = sd_client_default_request();
    o.timeout_s = 10;
    o.concurrency = 64;
    static char found[600];
    const char *const fallback = o.link.coordinator;
    if (sd_client_discover(getenv("XDG_RUNTIME_DIR"), found, sizeof found)) o.link.coordinator = found;
    int rc = parse_args(argc, argv, &o); /* --coordinator wins */
    if (rc != 0) {
        free(o.con_text);
        return rc < 0 ? 0 : rc;
    }
    sd_net_log_init("client", 0, o.verbose);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    sd_client_params p = sd_client_default_params();
    p.coordinator = o.link.coordinator;
    p.connect_timeout_ms = (int)(o.timeout_s * 1000);
    sd_curve_id curve;
    if (!sd_client_link_opts_keys(&o.link, "specd-client", getenv("SPECD_CURVE_SECRET"),
                                  getenv("SPECD_CURVE_SERVER"))) {
        free(o.con_text);
        return 2;
    }
    if (sd_curve_id_load(o.link.curve_secret, o.link.curve_server, &curve) != SD_OK) {
        free(o.con_text);
        return 2;
    }
    sd_client_params_set_curve(&p, &curve);
    sd_client *c = NULL;
    if (sd_client_connect(&p, &c) != SD_OK) {
        fprintf(stderr, "specd-client: cannot connect to %s\n", o.link.coordinator);
        free(o.con_text);
        return 1;
    }
    rc = 0;
    if (o.wait_ready_s > 0) rc = wait_ready(&c, &p, &o, o.link.coordinator == fallback);
    if (rc == 0 && o.stats)
        rc = run_stats(c, &o);
    else if (rc == 0 && o.prompt)
        rc = run_single(c, &o);
    else if (rc == 0 && o.jobs)
        rc = cli_run_jobs(c, &o);
    sd_client_close(&c);
    memset(&curve, 0, sizeof curve);
    free(o.con_text);
    return rc;
}
