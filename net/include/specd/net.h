/* net.h — ZeroMQ + protobuf-c plumbing shared by every specd process.
 *
 * What lives here: protocol constants (version, heartbeat timing, size
 * limits), socket setup that every process uses (every socket gets a
 * maximum message size and a finite linger; ROUTER sockets are
 * ROUTER_MANDATORY so an unroutable reply is an error, not a silent drop;
 * optional CurveZMQ), envelope send/receive (routing frames + exactly one
 * body frame), decode-and-validate of every envelope (token ids in
 * [0, vocab), every length bounded, sampling parameters in range) with an
 * error message naming the field, the limit and the value, and the
 * role/rank log prefix.
 *
 * Generated protobuf-c code (specd.pb-c.h) lives only in the build tree;
 * include it through this header. Nothing here keeps global state: the
 * ZeroMQ context is the caller's. */
#ifndef SPECD_NET_H
#define SPECD_NET_H

#include "specd/common.h"
#include "specd/sampling.h"
#include "specd.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- protocol constants ---- */
#define SD_PROTOCOL_VERSION      1u
#define SD_HEARTBEAT_INTERVAL_MS 250 /* send a heartbeat this often when idle */
#define SD_HEARTBEAT_LIVENESS    8   /* silent intervals before a peer is dead (2 s) */
#define SD_NET_LINGER_MS         200 /* ZMQ_LINGER on every socket */

/* Size limits, enforced at the socket (ZMQ_MAXMSGSIZE) and by validation. */
#define SD_MAX_CLIENT_MSG_BYTES (4 << 20)  /* client link: prompts are text */
#define SD_MAX_WORKER_MSG_BYTES (64 << 20) /* worker link: full prefixes on CACHE_MISS */
#define SD_MAX_PROMPT_BYTES     (1 << 20)  /* prompt text; a conversation's content in all */
#define SD_MAX_CHAT_MESSAGES    1024       /* turns of SubmitRequest.messages */
#define SD_MAX_CALL_ID_BYTES    256        /* ChatMessage.tool_call_id */
#define SD_MAX_BATCH            256        /* sequences in one draft/verify batch */
#define SD_MAX_STEP_COSTS       256        /* Hello.step_costs entries */
#define SD_MAX_TOP_N            1024       /* entries of one sparse q */
#define SD_MAX_STOP_STRINGS     16
#define SD_MAX_STOP_BYTES       256         /* per stop string */
#define SD_MAX_CONSTRAINT_BYTES (64 << 10)  /* Constraint.text: a JSON Schema, regex or grammar */
#define SD_MAX_TOKEN_BYTES      1024        /* TokenLogprob.token / top_tokens: one token's bytes */
#define SD_MAX_PROMPT_LP_ROWS   64          /* prompt tokens scored per prefill chunk (VerifySeq.prompt_logprobs) */
#define SD_MAX_IDENTITY_BYTES   255         /* ZeroMQ routing id */
#define SD_MAX_GROUP_SIZE       1024        /* ranks in a verifier group */
#define SD_MAX_GROUP_ID         65535       /* Hello.group_id */
#define SD_MAX_GROUP_ROWS       (1 << 22)   /* batch rows in one GroupPlan */
#define SD_MAX_GROUP_MSG_BYTES  (256 << 20) /* the group link: a plan of SD_MAX_GROUP_ROWS rows fits */
#define SD_MIN_MSG_CAP_BYTES    (1 << 20)   /* floor of a fitted socket cap (Hello, errors, stats) */
/* A head drafter's features (Hello.feature_layers, VerifyResult.features,
 * DraftSeq.features): layers read, floats per position (3 x a hidden size of
 * up to 21,845), and floats in one VerifyResponse or DraftRequest (4 MiB:
 * the coordinator's worker socket accepts that much more from any peer, so
 * it sizes the memory a hostile message can cost, it_bounds; 600 positions
 * of SmolLM2, 85 of an 8B model, a step) */
#define SD_MAX_FEATURE_LAYERS   8
#define SD_MAX_FEATURE_WIDTH    (1 << 16)
#define SD_MAX_STEP_FEATURES    (1 << 20)
#define SD_MAX_FEATURE_LAYER_ID 65535

/* Unpack budget: protobuf-c allocates every sub-message, string and repeated
 * array (and 32 bytes of scan state per field) before validation can run, so
 * 2 wire bytes of an empty sub-message cost about 100 bytes of heap. Every
 * unpack may allocate at most SD_NET_UNPACK_BASE_BYTES + SD_NET_UNPACK_RATIO x
 * its wire size (each allocation charged with malloc's overhead). The
 * densest legitimate message, a DraftResponse of 256 x 32 one-entry sparse
 * q's (the n-gram drafter), needs 14.5x (test_unpack prints the ratios);
 * packed token arrays need under 2x. */
#define SD_NET_UNPACK_BASE_BYTES (256 << 10)
#define SD_NET_UNPACK_RATIO      16

/* A verification step's measured time (Hello.step_costs). */
typedef struct sd_step_cost {
    uint32_t tokens;     /* tokens the step carried */
    uint32_t forward_us; /* forward pass and verification, as VerifyResponse.forward_us */
} sd_step_cost;

/* What a process knows about the model it validates against. */
typedef struct sd_net_limits {
    int32_t n_vocab;     /* token ids must be in [0, n_vocab) */
    int32_t max_context; /* tokens in one sequence */
    int32_t max_batch;   /* sequences per batch (<= SD_MAX_BATCH) */
    int32_t max_k;       /* draft tokens per sequence (<= SD_MAX_K) */
    /* drafters: floats per position of DraftSeq.features (its Hello's
     * feature_width); 0 = a drafter that takes none (features refused) */
    int32_t feature_width;
} sd_net_limits;

/* ---- sockets ---- */

typedef struct sd_net_socket_params {
    int type;              /* ZMQ_ROUTER, ZMQ_DEALER, ... */
    int64_t max_msg_bytes; /* ZMQ_MAXMSGSIZE (required, > 0) */
    int linger_ms;         /* ZMQ_LINGER (default SD_NET_LINGER_MS) */
    int sndhwm, rcvhwm;    /* high-water marks in messages (0 = libzmq default) */
    const char *identity;  /* ZMQ_ROUTING_ID for DEALER sockets, or NULL */
    /* CurveZMQ (all NULL = plaintext). Keys are Z85 text (40 chars). */
    const char *curve_server_secret;         /* set on the binding (server) side */
    const char *curve_server_public;         /* set on the connecting (client) side */
    const char *curve_public, *curve_secret; /* the connecting side's own keys (required with server_public) */
    const char *zap_domain;                  /* server side: SD_ZAP_DOMAIN_* (required with server_secret) */
    /* When not NULL, a handshake monitor (sd_net_monitor_open) is attached
     * before the socket connects and returned here: a handshake that fails
     * on a mechanism mismatch is never retried by libzmq, so a monitor
     * attached after connecting could miss the one event there will be. */
    void **monitor;
} sd_net_socket_params;

/* Defaults: linger SD_NET_LINGER_MS, everything else 0/NULL. */
sd_net_socket_params sd_net_socket_default_params(void);

/* Creates a socket in zctx with p applied and binds it to bind_addr (when not
 * NULL) or connects it to connect_addr. ROUTER sockets get
 * ZMQ_ROUTER_MANDATORY. Caller closes *out with sd_net_close (and a monitor
 * asked for with p->monitor with sd_net_monitor_close, first). Errors name
 * the address and zmq_strerror. */
sd_status sd_net_socket_open(void *zctx, const sd_net_socket_params *p, const char *bind_addr, const char *connect_addr,
                             void **out);
/* zmq_close(*sock), *sock = NULL. NULL-safe. */
void sd_net_close(void **sock);

/* Watches sock's handshakes: *mon is a PAIR socket (poll it for ZMQ_POLLIN)
 * that receives sock's handshake events, so a peer refused by the server's
 * ZAP handler (or speaking another mechanism) learns it at once instead of
 * retrying silently. Close with sd_net_monitor_close before sock. */
sd_status sd_net_monitor_open(void *zctx, void *sock, void **mon);

typedef enum sd_net_handshake {
    SD_NET_HANDSHAKE_NONE = 0, /* no handshake event waiting */
    SD_NET_HANDSHAKE_OK,       /* a handshake succeeded */
    SD_NET_HANDSHAKE_REFUSED,  /* refused for good: the ZAP handler said no, or another mechanism */
    SD_NET_HANDSHAKE_FAILED,   /* failed without detail: a wrong server key, or a server going down */
} sd_net_handshake;

/* Reads every event waiting on mon and returns the last one's kind, with a
 * line saying what failed (and where) in why. Callers treat REFUSED as
 * final and FAILED as final only when it repeats (SD_NET_HANDSHAKE_TRIES). */
sd_net_handshake sd_net_monitor_read(void *mon, char *why, size_t why_len);
#define SD_NET_HANDSHAKE_TRIES 3

/* Stops monitoring sock and closes *mon. NULL-safe. */
void sd_net_monitor_close(void *sock, void **mon);

/* ---- envelopes on the wire ---- */

#define SD_NET_USER_ID_MAX 32

/* A received message: the routing id (ROUTER side; empty on DEALER) and the
 * one body frame. */
typedef struct sd_net_msg {
    uint8_t identity[SD_MAX_IDENTITY_BYTES];
    size_t identity_len;
    /* the peer's ZAP User-Id (CurveZMQ: the role its key is restricted to,
     * "" = any or no ZAP) */
    char user_id[SD_NET_USER_ID_MAX];
    uint8_t *body; /* owned by the msg (frame's data, or malloc'd), freed by sd_net_msg_clear */
    size_t body_len;
    void *frame; /* the received zmq_msg_t that body points into (no copy), or NULL */
} sd_net_msg;

/* Receives one message (non-blocking when dontwait). A ROUTER socket expects
 * [identity, body]; any other socket [body]. Extra or missing frames are
 * consumed and reported as SD_ERR_FORMAT (the identity is still filled so
 * the caller can answer). SD_ERR_NET with errno EAGAIN when nothing waits. */
sd_status sd_net_recv(void *sock, bool router, bool dontwait, sd_net_msg *m);
void sd_net_msg_clear(sd_net_msg *m);

/* Packs env (any generated envelope) and sends it, preceded by the routing
 * id when identity != NULL. Thread-compatible (one thread per socket). */
sd_status sd_net_send(void *sock, const uint8_t *identity, size_t identity_len, const ProtobufCMessage *env);

/* ---- bounded unpack ---- */

/* Bytes an unpack of len wire bytes may allocate (see SD_NET_UNPACK_RATIO). */
size_t sd_net_unpack_budget(size_t len);
/* Unpacks len bytes as message type d with allocations capped at budget
 * bytes (pass sd_net_unpack_budget(len)). One walk over the wire bytes
 * first refuses a message whose allocations are already over budget (and,
 * when nul_field != NULL, one whose string fields hold a NUL byte: the
 * field's name goes to *nul_field). NULL when refused or when the bytes do
 * not decode; *over_budget (may be NULL) is true when the budget ran out.
 * The result is freed with protobuf_c_message_free_unpacked(m, NULL) or the
 * type's free_unpacked(m, NULL). Thread-safe. */
ProtobufCMessage *sd_net_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, size_t budget,
                                bool *over_budget, const char **nul_field);

/* Name of the first string field of a message of type d in the wire bytes
 * that holds a NUL byte ("prompt"), or NULL. protobuf-c would cut such a
 * string at the NUL; the decoders refuse it instead (CODE_BAD_REQUEST).
 * Returns a static string; thread-safe; O(len). */
const char *sd_net_nul_field(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len);

/* ZMQ_MAXMSGSIZE for the coordinator's worker socket: the largest reply a
 * drafter or verifier can owe to batches of at most max_batch sequences and
 * max_k drafts (a DraftResponse with SD_MAX_TOP_N-entry q's), floored at
 * SD_MIN_MSG_CAP_BYTES and capped at SD_MAX_WORKER_MSG_BYTES. */
int64_t sd_net_worker_reply_cap(int32_t max_batch, int32_t max_k);
/* ZMQ_MAXMSGSIZE for a worker's socket to the coordinator: the largest
 * request its limits allow (max_batch sequences of a full context of
 * appended tokens and max_k drafts with SD_MAX_TOP_N-entry q's), floored
 * at SD_MIN_MSG_CAP_BYTES and capped at SD_MAX_WORKER_MSG_BYTES. */
int64_t sd_net_worker_request_cap(const sd_net_limits *lim);
/* What a head drafter's features add to one VerifyResponse or DraftRequest
 * at most (SD_MAX_STEP_FEATURES floats): a drafter with lim->feature_width
 * gets it in its request cap; the coordinator adds it to its reply cap. */
int64_t sd_net_feature_bytes_cap(void);
/* ZMQ_MAXMSGSIZE for the coordinator's client socket: one SubmitRequest with
 * SD_MAX_PROMPT_BYTES of prompt and of system text, or max_context prompt
 * ids, and its stop strings; at most SD_MAX_CLIENT_MSG_BYTES. */
int64_t sd_net_client_msg_cap(int32_t max_context);

/* ---- decode + validate ----
 * Each decoder unpacks bytes into an envelope and validates every field that
 * is present against lim. On failure it returns NULL and writes a readable
 * reason ("verify.seqs[3].draft[1]: token id 70000 out of range [0, 49152)")
 * into err and the matching code into *code (CODE_MALFORMED when the bytes do
 * not decode or need more than sd_net_unpack_budget(len) bytes to unpack,
 * CODE_BAD_REQUEST/CODE_TOO_LARGE for bad fields). The result is
 * freed with the matching specd__*__free_unpacked(env, NULL). lim may be NULL
 * where the receiver cannot know the vocabulary yet (a coordinator before any
 * verifier registered); token ranges are then not checked. A process acts
 * on the validated structs of sd_net_read_client / sd_net_read_to_worker
 * below (the same checks); these envelope-only forms serve the links whose
 * messages carry no sampling, and checks of an envelope (the client's
 * check of its own Submit, tests, fuzzers). */
Specd__ClientToCoordinator *sd_net_decode_client(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                 Specd__Code *code, char *err, size_t err_len);
Specd__CoordinatorToClient *sd_net_decode_to_client(const uint8_t *data, size_t len, Specd__Code *code, char *err,
                                                    size_t err_len);
Specd__WorkerToCoordinator *sd_net_decode_worker(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                 Specd__Code *code, char *err, size_t err_len);
Specd__CoordinatorToWorker *sd_net_decode_to_worker(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                    Specd__Code *code, char *err, size_t err_len);

/* ---- validated messages ----
 * What a process acts on: a message decoded and checked once, where it
 * entered the process, with the sampling parameters converted into the
 * engine's sd_sampling there (sampling.c) and nowhere again. The protobuf
 * fields that need no conversion (token arrays, text) are read in place
 * through req, borrowed from the envelope the struct came in. */

/* A submitted request (SubmitRequest). */
typedef struct sd_net_submit {
    const Specd__SubmitRequest *req; /* borrowed from the envelope */
    sd_sampling sampling;            /* req->sampling, converted and checked (absent: greedy) */
} sd_net_submit;

/* A draft step (DraftRequest). */
typedef struct sd_net_draft_step {
    const Specd__DraftRequest *req;     /* borrowed from the envelope */
    sd_sampling sampling[SD_MAX_BATCH]; /* [i]: req->seqs[i]->sampling, converted and checked */
} sd_net_draft_step;

/* A verify step (VerifyRequest). */
typedef struct sd_net_verify_step {
    const Specd__VerifyRequest *req;    /* borrowed from the envelope */
    sd_sampling sampling[SD_MAX_BATCH]; /* [i]: req->seqs[i]->sampling, converted and checked */
} sd_net_verify_step;

/* A ClientToCoordinator: the envelope (owned) and, when its body is a
 * submit, the submit. */
typedef struct sd_net_client_msg {
    Specd__ClientToCoordinator *env;
    sd_net_submit submit; /* body SUBMIT only */
} sd_net_client_msg;

/* A CoordinatorToWorker: the envelope (owned) and, when its body is a
 * draft or a verify step, the step. */
typedef struct sd_net_worker_msg {
    Specd__CoordinatorToWorker *env;
    union {
        sd_net_draft_step draft;   /* body DRAFT only */
        sd_net_verify_step verify; /* body VERIFY only */
    };
} sd_net_worker_msg;

/* The decoders below validate as sd_net_decode_client / _to_worker and
 * return the validated struct; NULL with code and err as they do. Caller
 * frees with the matching _free (NULL-safe; sets *m to NULL). Thread-safe. */
sd_net_client_msg *sd_net_read_client(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                      char *err, size_t err_len);
void sd_net_client_msg_free(sd_net_client_msg **m);
sd_net_worker_msg *sd_net_read_to_worker(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                         char *err, size_t err_len);
void sd_net_worker_msg_free(sd_net_worker_msg **m);

/* A step this process built itself and hands to a handler without the wire
 * (the coordinator's in-process n-gram drafter, tests): req borrowed, each
 * sequence's sampling converted as the decoders do, without their check
 * (the builder's own values). At most SD_MAX_BATCH sequences are converted. */
void sd_net_draft_step_of(const Specd__DraftRequest *req, sd_net_draft_step *out);
void sd_net_verify_step_of(const Specd__VerifyRequest *req, sd_net_verify_step *out);

/* The verifier group's link (verifier/group.c): structure and sizes only
 * (equal array lengths, bounds, text); a rank checks a plan's block ids and
 * positions against its own pool (sd_model_forward_plan). lim gives the
 * vocabulary for the plan's token ids (NULL: only >= 0 checked). */
Specd__RankToLeader *sd_net_decode_rank(const uint8_t *data, size_t len, Specd__Code *code, char *err, size_t err_len);
Specd__LeaderToRank *sd_net_decode_leader(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                          char *err, size_t err_len);

/* Sampling message -> params, validated by sd_sampling_check (a top_p of 0,
 * proto3's unset value, means off). NULL msg gives the default (greedy).
 * false + err on a bad value. The decoders above call it on every Sampling
 * they pass (SubmitRequest, DraftSeq, VerifySeq) and hand the result back
 * in the validated struct: the one conversion and check of a message's
 * sampling parameters. */
bool sd_net_sampling_from_pb(const Specd__Sampling *msg, sd_sampling *out, char *err, size_t err_len);
/* Engine params -> message fields (into caller-owned *msg, already init'ed). */
void sd_net_sampling_to_pb(const sd_sampling *s, Specd__Sampling *msg);

/* Fills an Error reply (message copied into buf, which must outlive e). */
void sd_net_error_init(Specd__Error *e, Specd__Code code, uint64_t request_id, uint64_t client_tag,
                       const char *message);

/* Name of a code ("CACHE_MISS"), for logs. */
const char *sd_net_code_name(Specd__Code code);

/* ---- process logging ----
 * Sets the log prefix to "role[rank]" (e.g. "verifier[2]", "drafter[0]") and
 * the level (SD_LOG_DEBUG when verbose). Call once at start-up. */
void sd_net_log_init(const char *role, int rank, bool verbose);

/* CLOCK_REALTIME in microseconds (heartbeat timestamps). */
uint64_t sd_net_now_us(void);

#ifdef __cplusplus
}
#endif
#endif
