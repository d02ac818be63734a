/* gateway_impl.h — what the modules of specd-gateway share.
 *
 *   main.c     flags, signals, start and orderly stop
 *   http.c     libmicrohttpd: routing, auth, body limits, SSE streaming
 *   openai.c   OpenAI request JSON -> gw_gen (validated) and the response JSON
 *   jobs.c     one HTTP generation = one gw_job of n choices, each one
 *              coordinator request; callbacks, cancel, the janitor that
 *              collects finished records from libspecd-client
 *   metrics.c  Prometheus text (gateway counters + the coordinator's stats)
 *
 * The gateway is a plain client of the coordinator: it uses only the public
 * API of libspecd-client (specd/client.h) and never parses model files. */
#ifndef SPECD_GATEWAY_IMPL_H
#define SPECD_GATEWAY_IMPL_H

#include "specd/client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_DEFAULT_LISTEN          "127.0.0.1:8000"
#define GW_DEFAULT_MODEL_NAME      "specd"
#define GW_DEFAULT_MAX_BODY        (4u << 20)  /* bytes of one request body (413 above) */
#define GW_DEFAULT_MAX_CONNECTIONS 256         /* open HTTP connections (one thread each) */
#define GW_DEFAULT_MAX_INFLIGHT    256         /* coordinator requests in flight from this gateway (429 above) */
#define GW_DEFAULT_TIMEOUT_S       30          /* an HTTP connection idle this long is closed */
#define GW_DEFAULT_DRAIN_S         20          /* after SIGTERM, in-flight requests get this long */
#define GW_MAX_CHOICES             16          /* n, times the prompts of a batched completion */
#define GW_MAX_OUTPUT_BYTES        (8u << 20)  /* generated text kept per choice */
#define GW_HEADER_MEMORY           (64u << 10) /* libmicrohttpd's per-connection memory: caps the headers */
#define GW_KEEPALIVE_MS            15000       /* SSE comment sent when a stream is silent this long */
#define GW_STATS_TIMEOUT_MS        2000        /* /health and /metrics wait this long for the coordinator */
#define GW_RETRY_AFTER_S           1           /* Retry-After on 429 */

typedef struct gw_metrics gw_metrics;
typedef struct gw_janitor gw_janitor;

/* Process-wide configuration and shared objects (one per process, passed
 * around as a context; no globals). */
typedef struct gw_server {
    char listen[256];
    const char *coordinator;
    const char *api_key;      /* NULL: no authentication */
    const char *model_name;   /* what /v1/models lists and responses carry */
    bool insecure;            /* --insecure: a non-loopback listen address without an API key is allowed */
    char *tls_cert, *tls_key; /* PEM contents (owned; NULL: plain HTTP), from --tls-cert / --tls-key */
    size_t max_body;
    unsigned max_connections, max_inflight, timeout_s;
    sd_client *client;
    gw_janitor *janitor;
    gw_metrics *metrics;
    atomic_uint inflight;     /* coordinator requests submitted and not finished */
    atomic_bool draining;     /* set on SIGINT/SIGTERM: new generation requests get 503, the running ones finish */
    atomic_bool stopping;     /* set once drained (or at a second signal): waiting handlers give up */
    unsigned drain_timeout_s; /* the drain's bound (--drain-timeout) */
    int stop_fd;              /* eventfd, readable once stopping is set (gw_http_start / gw_http_stop) */
} gw_server;

/* True when the --listen address ADDR:PORT or [ADDR]:PORT is on the
 * loopback (127.0.0.0/8 or ::1): only this host can reach it (main.c). */
bool gw_listen_is_loopback(const char *listen);

/* ---- openai.c: requests ---- */

typedef enum gw_endpoint { GW_EP_CHAT, GW_EP_COMPLETIONS } gw_endpoint;

/* tools.c: a chat request's tools (see there). */
#define GW_MAX_TOOLS 128
typedef enum gw_tool_mode {
    GW_TOOLS_OFF = 0,   /* no tools, or tool_choice "none" */
    GW_TOOLS_AUTO,      /* the model may call one: its calls parsed from its answer (tool_formats.c) */
    GW_TOOLS_REQUIRED,  /* the answer is one call of some tool (constrained) */
    GW_TOOLS_NAMED,     /* the answer is one call of the named tool (constrained) */
} gw_tool_mode;
typedef struct gw_tools {
    gw_tool_mode mode;
    size_t n;
    char *names[GW_MAX_TOOLS]; /* owned */
} gw_tools;
void gw_tools_free(gw_tools **t);
gw_tools *gw_tools_dup(const gw_tools *t); /* NULL for NULL or out of memory */

/* One prompt of a request (a completion may batch several). */
typedef struct gw_prompt {
    char *text;   /* owned; NULL when ids are given */
    int32_t *ids; /* owned */
    size_t n_ids;
    /* chat: the conversation (content owned, roles static), formatted by
     * the model's chat template on the coordinator */
    sd_client_chat_msg *turns;
    size_t n_turns;
} gw_prompt;

/* A validated generation request. */
typedef struct gw_gen {
    gw_endpoint endpoint;
    gw_prompt prompts[GW_MAX_CHOICES];
    size_t n_prompts;
    unsigned n;                      /* samples per prompt */
    uint32_t max_tokens;             /* 0: the coordinator's default */
    sd_sampling sampling;            /* seed: of choice 0; choice i gets gw_choice_seed() */
    bool seeded;                     /* the request gave a seed */
    char *stop[SD_MAX_STOP_STRINGS]; /* owned */
    size_t n_stop;
    bool stream, include_usage, ignore_eos;
    bool echo;          /* completions: the text starts with the prompt (and logprobs with its tokens') */
    bool prompt_only;   /* completions: max_tokens 0 with echo: the prompt only, nothing generated */
    bool parse_special; /* completions (extension): a text prompt's special-token text is read as control tokens */
    /* the target's logprobs per token (chat: logprobs + top_logprobs;
     * completions: logprobs = N alternatives) */
    bool logprobs;
    uint32_t top_logprobs; /* 0..SD_MAX_TOP_LOGPROBS */
    /* structured output (response_format.c): NONE, or the kind and its
     * owned text (a JSON Schema's compact JSON, a GBNF grammar) */
    Specd__ConstraintKind constraint_kind;
    char *constraint_text;
    gw_tools *tools;  /* owned; NULL: no tools (or tool_choice "none") */
    char *tools_json; /* owned: the request's tools (compact JSON) for the chat template; NULL: none */
} gw_gen;

/* An OpenAI error: HTTP status and the error object's fields. */
typedef struct gw_error {
    int http_status;
    const char *type; /* "invalid_request_error", ... (static) */
    const char *code; /* static or NULL */
    char param[64];   /* empty: null */
    char message[512];
} gw_error;

/* Parses and validates body (len bytes, not NUL-terminated) for endpoint
 * into *out (caller frees with gw_gen_clear). On failure returns false and
 * fills *err (400 with the offending param). Thread-safe. */
bool gw_gen_parse(gw_endpoint endpoint, const char *body, size_t len, gw_gen *out, gw_error *err);
void gw_gen_clear(gw_gen *g);

/* response_format.c: response_format (text, json_object, json_schema) and
 * llama.cpp's grammar / json_schema fields of a request object into g's
 * constraint; false with a 400 naming the field. */
struct cJSON;
bool gw_parse_constraint(const struct cJSON *root, gw_gen *g, gw_error *err);
/* guided.c: vLLM's guided_json / guided_regex / guided_grammar /
 * guided_choice into g's constraint; other: a constraint field named
 * other_name was given too (a 400 naming both). False with a 400. */
bool gw_parse_guided(const struct cJSON *root, bool other, const char *other_name, gw_gen *g, gw_error *err);
/* tools.c: tools / tool_choice of a chat request (after its messages):
 * the tools for the chat template (g->tools_json), a forced call as g's
 * constraint; false with a 400 naming the field. */
bool gw_parse_tools(const struct cJSON *root, gw_gen *g, gw_error *err);
/* An assistant history turn m's tool_calls as the wire's JSON list of
 * {"name", "arguments"} (the arguments string's own text when it is JSON) in
 * *calls_json (owned; NULL when it has none). False with a 400 on param. */
bool gw_tool_turn(const struct cJSON *m, char **calls_json, const char *param, gw_error *err);
/* A tool history turn m's tool_call_id (messages[i]) into *id (malloc'd;
 * NULL when absent): a string of 1 to SD_MAX_CALL_ID_BYTES bytes. */
bool gw_tool_result_id(const struct cJSON *m, int i, char **id, gw_error *err);

/* The seed of choice i: the request's seed for i = 0, a SplitMix64 mix of
 * (seed, i) after, so n samples are reproducible from one seed. */
uint64_t gw_choice_seed(uint64_t seed, unsigned i);

/* True when s[0..len) is well-formed UTF-8 (no overlongs, no surrogates). */
bool gw_utf8_valid(const char *s, size_t len);

/* Constant-time comparison of a presented key with the configured one
 * (time depends only on the configured key's length). */
bool gw_key_equal(const char *presented, const char *key);

/* "{"error":{...}}" for err. Caller frees with free(). */
char *gw_error_json(const gw_error *err);

/* Fills err; returns false (for `return gw_fail(...)`). */
bool gw_fail(gw_error *err, int http_status, const char *type, const char *code, const char *param, const char *fmt,
             ...) __attribute__((format(printf, 6, 7)));

/* ---- jobs.c ---- */

/* A token with its logprob; its bytes are lp_bytes[off, off + len) of the
 * choice that holds it. */
typedef struct gw_tok_lp {
    int32_t id;
    float logprob;
    uint32_t off, len;
} gw_tok_lp;

/* One generated token's logprob and its alternatives. */
typedef struct gw_lp {
    gw_tok_lp token;
    uint32_t n_top;
    gw_tok_lp top[SD_MAX_TOP_LOGPROBS];
} gw_lp;

/* tool_stream.c: a chat answer with tools streamed (per choice): where
 * its content ends and, once a call marker came (tool_formats.c), a JSON
 * lexer's position in the call object being read. Offsets into the text. */
typedef struct gw_tool_stream {
    size_t content_end; /* text[0, content_end) is content: streamable as such */
    bool calls;         /* a call marker came (or the answer opened with '{'): no more content */
    bool stopped;       /* a call named no known tool: nothing more is streamed */
    size_t scanned;     /* bytes lexed (once calls) */
    int depth;          /* of objects and arrays in the call object (0: between calls) */
    bool in_str, esc, after_colon, closed;
    int key;                    /* the depth-1 key being read: 1 name, 2 arguments / parameters, 0 other */
    size_t str_from, str_end;   /* the last depth-1 string */
    bool name_done;             /* the function's name is whole: */
    size_t name_from, name_len; /* ... here */
    size_t args_from, args_end; /* the arguments object (0: not begun / not closed) */
    size_t sent;                /* end of the argument bytes sent of this call (0: none) */
    bool head_sent;             /* this call's first delta (id, type, name) went out */
    int n_heads;                /* calls whose first delta went out */
} gw_tool_stream;

/* One tool-call delta: call index's head (name bytes text[name_from, +name_len))
 * and / or argument bytes text[args_from, +args_len). */
typedef struct gw_tool_delta {
    int index;
    bool head;
    size_t name_from, name_len, args_from, args_len;
} gw_tool_delta;
/* Advances t over text[0, len) (the whole answer so far, growing between
 * calls): t->content_end moves on, and the next call delta due is put in
 * *d (true; call again until false). */
bool gw_tool_stream_next(gw_tool_stream *t, const gw_tools *tools, const char *text, size_t len, gw_tool_delta *d);

/* tool_formats.c: the call markers (<tool_call>, [TOOL_CALLS], <|python_tag|>). */
#define GW_TOOL_N_MARKERS 3
extern const char *const GW_TOOL_MARKERS[GW_TOOL_N_MARKERS];
/* The first marker in text[from, len) (its index in *which) or len (*which -1). */
size_t gw_tool_marker_find(const char *text, size_t len, size_t from, int *which);
/* Bytes at the end of text[0, len) that may begin a marker (held back). */
size_t gw_tool_marker_tail(const char *text, size_t len);
/* The calls in a whole answer text[0, len) (NUL-terminated) as a cJSON list
 * of {"name", "arguments": object} (caller deletes), or NULL when it is no
 * valid call of tools; *content_len: the bytes of content before the calls. */
struct cJSON *gw_tool_parse(const gw_tools *t, const char *text, size_t len, size_t *content_len);

typedef struct gw_choice {
    struct gw_job *job; /* the job this choice belongs to (callbacks get the choice) */
    unsigned index;
    uint64_t request_id;  /* 0 until accepted */
    bool submitted;       /* holds a job reference until its final callback */
    bool submit_returned; /* sd_client_submit returned for it (see collect_id) */
    uint64_t collect_id;  /* finished, its record not yet handed to the janitor (0: none) */
    char *text;           /* everything generated so far (owned, NUL-terminated) */
    size_t text_len, text_cap;
    size_t streamed; /* bytes of text already sent as SSE */
    uint32_t n_tokens;
    bool done; /* the final callback ran */
    sd_status status;
    Specd__Code code;
    char error[512];
    Specd__StopReason stop_reason;
    uint32_t prompt_tokens;
    sd_client_request_stats stats;
    double t_first_ms, t_last_ms; /* monotonic, 0 = none yet */
    /* monotonic arrival of the oldest chunk whose text or logprobs are not
     * streamed yet (0: none), and of the final callback (0: not yet): the
     * start of the forwarding time (gw_metrics_forward) */
    double t_pending_ms, t_final_ms;
    gw_lp *lps;          /* [n_lps] each token's logprob, when the request asked (owned); with echo the
                   prompt's tokens first (the first with a NaN logprob: it has none) */
    size_t n_prompt_lps; /* of those, the prompt's (echo) */
    size_t n_lps, lps_cap;
    size_t lps_streamed; /* entries already sent as SSE */
    char *lp_bytes;      /* the tokens' bytes gw_tok_lp point into (owned) */
    size_t lp_bytes_len, lp_bytes_cap;
    bool role_sent, finish_sent; /* streaming bookkeeping */
    gw_tool_stream ts;           /* an answer with tools streamed (tool_stream.c) */
} gw_choice;

/* One HTTP generation request. Reference-counted: the HTTP side holds one
 * reference, every submitted choice one until its final callback. */
typedef struct gw_job {
    gw_server *srv;
    pthread_mutex_t mu;
    /* eventfd the HTTP side polls, beside its socket, while it waits for
     * on_chunk: written when a chunk arrives and `waiting` was set */
    int wake_fd;
    bool waiting;
    int refs;
    bool abandoned; /* the HTTP side is gone: nobody reads */
    gw_endpoint endpoint;
    char id[48];       /* "chatcmpl-..." / "cmpl-..." */
    long long created; /* unix seconds */
    double t_start_ms;
    unsigned n;    /* samples per prompt: choice i belongs to prompt i / n */
    bool logprobs; /* the choices collect logprobs (gw_gen.logprobs) */
    bool echo;     /* gw_gen.echo: the prompt's text (ids: from the coordinator) and logprobs come first */
    gw_tools *tools; /* owned copy of gw_gen.tools: answers are parsed for tool calls (and streamed by tool_stream.c) */
    size_t n_choices;
    gw_choice choices[GW_MAX_CHOICES];
} gw_job;

/* tools.c: choice ci's answer as OpenAI tool_calls (a cJSON array the
 * caller deletes), or NULL when the job has no tools or the answer holds
 * no valid call. Call with the job's mutex held (or once it is done). */
struct cJSON *gw_tool_calls(const gw_job *job, size_t ci);
/* The id of choice ci's k-th tool call (tools.c), into out[cap]. */
void gw_tool_call_id(const gw_job *job, size_t ci, int k, char *out, size_t cap);
/* tool_stream.c: whether the job's answers are streamed through
 * gw_tool_stream_chunk (chat with tools). */
bool gw_tool_stream_on(const gw_job *job);
/* The next streaming chunk of choice ci: its content up to a call marker,
 * or a call's head (id, type, name) or argument bytes since the last; *out
 * NULL when there is nothing new (call until it is). Caller frees *out.
 * False when out of memory. Call with the job's mutex held. */
bool gw_tool_stream_chunk(gw_job *job, const char *model, size_t ci, bool include_usage, char **out);
/* The finish delta of choice ci of a job with tools: the calls not
 * streamed yet, or the content held back; *finish_reason "tool_calls" when
 * the answer was calls. */
void gw_tool_finish_delta(const gw_job *job, size_t ci, struct cJSON *delta, const char **finish_reason);

/* Creates a job for g (n_prompts * n choices); the caller holds the one
 * reference (gw_job_release). NULL when out of memory. */
gw_job *gw_job_create(gw_server *srv, const gw_gen *g);
void gw_job_release(gw_job *job);

/* Submits every choice of the job. On failure cancels what was submitted,
 * fills *err (400 / 429 / 503 by the coordinator's answer) and returns
 * false. Blocks until the coordinator accepted or refused each. */
bool gw_job_submit(gw_job *job, const gw_gen *g, gw_error *err);

/* Cancels every choice still running (the client went away). */
void gw_job_cancel(gw_job *job);

/* True when every choice is done. Call with job->mu held. */
bool gw_job_done_locked(const gw_job *job);

/* Milliseconds on CLOCK_MONOTONIC. */
double gw_now_ms(void);

/* The janitor collects the record libspecd-client keeps for every accepted
 * request (sd_client_wait), on its own thread, since callbacks may not. */
gw_janitor *gw_janitor_start(sd_client *c);
/* Stops its thread; what is pushed after that is dropped (sd_client_close
 * frees those records). The final callbacks that sd_client_close runs
 * still push, so the janitor is freed only after it. */
void gw_janitor_stop(gw_janitor *j);
void gw_janitor_free(gw_janitor **j);

/* ---- openai.c: responses ---- */

/* The whole non-streaming response body for a finished job. Caller frees. */
char *gw_response_json(const gw_job *job, const char *model);
/* One streaming chunk for choice ci: the assistant role (role, chat only),
 * a text delta (delta, delta_len bytes) with the logprobs of the choice's
 * tokens [lp_from, lp_to) (none when equal), or the finish_reason (finish).
 * include_usage adds "usage": null, as OpenAI does before the usage chunk.
 * Caller frees. */
char *gw_chunk_json(const gw_job *job, const char *model, size_t ci, bool role, const char *delta, size_t delta_len,
                    size_t lp_from, size_t lp_to, bool finish, bool include_usage);
/* The final usage-only chunk (stream_options.include_usage). Caller frees. */
char *gw_usage_chunk_json(const gw_job *job, const char *model);
/* "stop" / "length" for a finished choice. */
const char *gw_finish_reason(const gw_choice *c);
/* The error of a failed choice as an OpenAI error (HTTP status by code). */
void gw_choice_error(const gw_choice *c, gw_error *err);

/* ---- metrics.c ---- */

typedef enum gw_route {
    GW_ROUTE_CHAT,
    GW_ROUTE_COMPLETIONS,
    GW_ROUTE_MODELS,
    GW_ROUTE_HEALTH,
    GW_ROUTE_METRICS,
    GW_ROUTE_OTHER,
    GW_ROUTE_COUNT
} gw_route;

gw_metrics *gw_metrics_create(void);
void gw_metrics_destroy(gw_metrics **m);
/* One HTTP response sent on route with status. Thread-safe. */
void gw_metrics_http(gw_metrics *m, gw_route route, int status);
/* A choice finished (any outcome): its counts and latencies. Thread-safe. */
void gw_metrics_choice(gw_metrics *m, const gw_choice *c, double t_start_ms);
/* A chunk of n tokens arrived gap_ms after the previous one. Thread-safe. */
void gw_metrics_tokens(gw_metrics *m, uint32_t n, double gap_ms);
/* How a response left the gateway, for gw_metrics_forward. */
typedef enum gw_forward_kind {
    GW_FORWARD_STREAM, /* an SSE event: oldest chunk in it arrived -> its bytes handed to libmicrohttpd */
    GW_FORWARD_WHOLE,  /* a non-streamed response: last final callback -> the response queued */
    GW_FORWARD_COUNT
} gw_forward_kind;
/* One forwarding of kind took seconds inside the gateway
 * (specd_gateway_forward_seconds). Thread-safe; allocates nothing. */
void gw_metrics_forward(gw_metrics *m, gw_forward_kind kind, double seconds);
/* The /metrics body: gateway counters and, when st is non-NULL, the
 * coordinator's. Caller frees. */
char *gw_metrics_render(gw_metrics *m, const gw_server *srv, const sd_client_service_stats *st);

/* ---- http.c ---- */

/* Starts the HTTP daemon on srv->listen; returns an opaque handle (NULL on
 * failure, logged). */
void *gw_http_start(gw_server *srv);
/* Sets srv->stopping, wakes every waiting handler, stops the daemon. */
void gw_http_stop(gw_server *srv, void **daemon);

#endif
