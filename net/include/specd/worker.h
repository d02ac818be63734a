/* worker.h — the connection loop every worker process runs (drafters and the
 * verifier leader): register, serve requests, heartbeat, reconnect.
 *
 * A worker is a DEALER connected to the coordinator's worker address. It
 * sends Hello (protocol version, role, rank, model identity, limits, stats),
 * waits for Welcome, then serves: every envelope is validated with
 * sd_net_read_to_worker against the worker's limits (undecodable or out of
 * range: an Error with the decoder's code goes back and the loop carries
 * on); DraftRequest / VerifyRequest go to the role's handler, whose reply is
 * sent; Release goes to the release callback. Once per heartbeat interval,
 * busy or idle, the worker sends a Heartbeat with its stats (so the
 * coordinator's view of KV blocks stays current under load). When the
 * coordinator is silent for `liveness` intervals (or does not answer Hello
 * in that time) the worker clears every cache (reset callback), closes and
 * reopens its socket and registers again. An Error in answer to Hello is a
 * refusal: it is logged and the loop returns SD_WORKER_REFUSED (main exits
 * with status 3) — except CODE_REFUSED ("a verifier leader is already
 * registered"), which is retried SD_WORKER_REFUSED_RETRIES times one
 * liveness period apart, because a verifier restarted right after a clean
 * stop is refused until the coordinator notices that its predecessor died.
 * A handshake the coordinator refuses (its ZAP handler does not know this
 * worker's key, or only one side runs CurveZMQ; seen through a socket
 * monitor) is a refusal too: no Hello could ever get through. Readable input on stop_fd (a signalfd or the read end of a
 * self-pipe written by a signal handler) ends the loop cleanly; readable
 * input on fail_fd (a verifier group that lost a rank) ends it after an
 * Error CODE_UNAVAILABLE, so the coordinator drops the worker at once and
 * keeps its requests for the next one.
 *
 * The handler runs on a compute thread of the loop's own, so heartbeats
 * and the coordinator's liveness keep being handled during a long step (a
 * SmolLM2 prefill of many prompts takes seconds on a small CPU); requests
 * and releases that arrive meanwhile wait in order behind it. The release,
 * reset and stats callbacks run on the loop's thread and only while no step
 * is running, so no callback needs to be thread-safe. Nothing here keeps
 * global state. */
#ifndef SPECD_WORKER_H
#define SPECD_WORKER_H

#include "specd/curve.h"
#include "specd/identity.h"
#include "specd/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Serves one request (req->env->body_case is DRAFT or VERIFY: req->draft
 * or req->verify is the validated step), on the loop's compute thread:
 * fills *reply (an initialized WorkerToCoordinator) with the response,
 * pointing into memory the handler owns and keeps valid until its next
 * call. SD_OK even when some sequences failed (per-sequence codes); any
 * other status makes the loop answer Error CODE_INTERNAL and carry on. */
typedef sd_status (*sd_worker_handle_fn)(void *user, const sd_net_worker_msg *req, Specd__WorkerToCoordinator *reply);
/* Frees the caches of the given request ids (unknown ids are ignored). */
typedef void (*sd_worker_release_fn)(void *user, const uint64_t *request_ids, size_t n);
/* Forgets every cached sequence (the coordinator's beliefs were reset). */
typedef void (*sd_worker_reset_fn)(void *user);
/* Fills *stats (initialized) with current resource use. */
typedef void (*sd_worker_stats_fn)(void *user, Specd__WorkerStats *stats);
/* Why the worker can no longer serve (for the Error sent on fail_fd);
 * borrowed, valid until the loop returns. */
typedef const char *(*sd_worker_fail_reason_fn)(void *user);

/* The target's vocabulary size from a Welcome, when it is not limits.n_vocab
 * (a drafter whose embedding is padded to other rows than the target's:
 * same tokenizer). Called on the socket thread, possibly while a step runs
 * on the compute thread: hand the value over, apply it between steps. */
typedef void (*sd_worker_welcome_fn)(void *user, int32_t target_n_vocab);

/* Blocks SIGINT and SIGTERM in the calling thread (call it in main before
 * any thread starts, so every thread inherits the mask) and returns a
 * signalfd that becomes readable when one arrives: the loop's stop_fd.
 * Caller closes *fd. */
sd_status sd_worker_signal_fd(int *fd);

typedef struct sd_worker_params {
    const char *coordinator;   /* worker address to connect to (required) */
    const sd_curve_id *curve;  /* CurveZMQ keys (borrowed; NULL or off: plaintext); a handshake the
                                * coordinator refuses ends the loop with SD_WORKER_REFUSED */
    Specd__Role role;          /* ROLE_DRAFTER or ROLE_VERIFIER */
    uint32_t rank, group_size; /* verifier group position; 0 / 1 for drafters */
    uint32_t group_id;         /* verifier leaders: Hello.group_id (0: the coordinator numbers the group) */
    Specd__DrafterKind drafter_kind;
    const char *name;        /* for the coordinator's logs; NULL = host:pid */
    sd_model_identity model; /* sent in Hello */
    sd_net_limits limits;    /* what incoming requests are validated against (n_vocab: the Welcome's
                              * vocab_size once one says it) */
    /* verifiers: steady step times measured before registering, sent in
     * Hello for the coordinator's cost model; borrowed for the loop's
     * lifetime (it says Hello again on reconnect) */
    const sd_step_cost *step_costs;
    size_t n_step_costs; /* <= SD_MAX_STEP_COSTS */
    /* an EAGLE head drafter: the target layers it reads and floats a
     * position (Hello.feature_layers / feature_width; limits.feature_width
     * the same); borrowed; 0 = none */
    const uint32_t *feature_layers;
    size_t n_feature_layers;   /* <= SD_MAX_FEATURE_LAYERS */
    int heartbeat_interval_ms; /* default SD_HEARTBEAT_INTERVAL_MS */
    int liveness;              /* default SD_HEARTBEAT_LIVENESS */
    int stop_fd;               /* readable = stop; -1 = never */
    /* readable = this worker can no longer serve (its verifier group went
     * down): the loop tells the coordinator (Error CODE_UNAVAILABLE with
     * fail_reason's text, so the coordinator drops it at once instead of
     * after the liveness period) and returns with SD_WORKER_FAILED; -1 =
     * never */
    int fail_fd;
    sd_worker_fail_reason_fn fail_reason; /* optional */
    sd_worker_handle_fn handle;           /* required */
    sd_worker_release_fn release;         /* required */
    sd_worker_reset_fn reset;             /* required */
    sd_worker_stats_fn stats;             /* required */
    sd_worker_welcome_fn welcome;         /* optional */
    void *user;                           /* passed to every callback */
} sd_worker_params;

/* Defaults: heartbeat constants of net.h, group_size 1, stop_fd and fail_fd -1,
 * architecture "llama", everything else 0/NULL. */
sd_worker_params sd_worker_default_params(void);

/* CODE_REFUSED answers to Hello retried before giving up. */
#define SD_WORKER_REFUSED_RETRIES 3

typedef enum sd_worker_exit {
    SD_WORKER_STOPPED = 0, /* stop_fd became readable: clean exit */
    SD_WORKER_REFUSED = 3, /* the coordinator answered Hello with an Error */
    SD_WORKER_FAILED = 4,  /* fail_fd became readable: reported to the coordinator */
} sd_worker_exit;

/* Runs the loop in zctx (caller's ZeroMQ context) until stopped or refused;
 * *why says which. Returns an error only when a socket cannot be set up or a
 * parameter is missing. Not thread-safe (one loop per context user). */
sd_status sd_worker_run(void *zctx, const sd_worker_params *p, sd_worker_exit *why);

#ifdef __cplusplus
}
#endif
#endif
