/* unpack.c — protobuf-c unpacking with a memory budget, and socket caps
 * fitted to what each link can carry.
 *
 * protobuf-c unpacks in two passes: it scans every field of the wire bytes
 * into 32-byte records, then allocates every repeated array, sub-message and
 * string before a single validation check can run. Two wire bytes (a tag and
 * a zero length) become a pointer, a whole sub-message struct and a scan
 * record: about 50-100 heap bytes per wire byte, and as much time. So every
 * unpack here goes through a ProtobufCAllocator that charges each allocation
 * (with malloc's own overhead) against a budget proportional to the wire size
 * and refuses the first one over it; protobuf-c then frees what it built and
 * returns NULL, which the decoders report as MALFORMED. The work done before
 * the refusal is bounded by the budget too.
 *
 * A walk over the wire bytes first computes a lower bound of those
 * allocations and refuses a message whose bound is already over budget, so
 * the commonest hostile shape (millions of empty entries) costs one pass
 * over its bytes and no allocation at all.
 *
 * The allocator hands out plain malloc'd blocks and frees with free(), so a
 * message unpacked here is freed with free_unpacked(m, NULL) like any other:
 * no caller had to change. Its price is that frees are not credited back
 * (free() does not tell the size), so the budget bounds the total allocated
 * during one unpack, which is above its peak. Rejected: a header in front of
 * each block to credit frees (free_unpacked(m, NULL) could no longer free),
 * and a pre-pass over the wire counting repeated elements (a second parser
 * of the wire format to keep in step with protobuf-c's). */
#include "specd/net.h"

#include <stdlib.h>
#include <string.h>

typedef struct unpack_budget {
    size_t left;
    bool exceeded;
} unpack_budget;

/* What malloc really takes for a request of size bytes on glibc: a 16-byte
 * rounded chunk with an 8-byte header, 32 bytes at least. */
static size_t charge_of(size_t size) {
    size_t c = (size + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

static void *budget_alloc(void *data, size_t size) {
    unpack_budget *b = data;
    size_t charge = charge_of(size);
    if (size > b->left || charge > b->left) {
        b->exceeded = true;
        return NULL;
    }
    void *p = malloc(size ? size : 1);
    if (p) b->left -= charge;
    return p;
}

static void budget_free(void *data, void *p) {
    (void)data;
    free(p);
}

size_t sd_net_unpack_budget(size_t len) {
    size_t scaled;
    if (len > (SIZE_MAX - SD_NET_UNPACK_BASE_BYTES) / SD_NET_UNPACK_RATIO) return SIZE_MAX;
    scaled = len * SD_NET_UNPACK_RATIO;
    return scaled + SD_NET_UNPACK_BASE_BYTES;
}

/* ---- one walk over the wire bytes ----
 * Before protobuf-c sees a message, its bytes are walked once (fields looked
 * up in the descriptor, nested messages followed) for two things:
 *  - a lower bound of what unpacking will allocate: each sub-message's
 *    struct, each string, a pointer per repeated entry, a 32-byte scan
 *    record per field past a message's first 16. A message whose bound is
 *    over its budget, or that holds more than WALK_MAX_FIELDS fields, is
 *    refused before anything is allocated, so a hostile message of small
 *    entries costs part of one pass over its bytes; the allocator still
 *    enforces the budget for what the bound leaves out.
 *  - NUL bytes in strings: protobuf-c hands strings over NUL-terminated and
 *    drops their length, so a prompt "a\0b" would arrive as "a", cut.
 * Malformed bytes end the walk quietly: the unpack reports them. */

#define WALK_DEPTH        16 /* deeper than any specd message nests */
/* Fields in one message, nested ones included. The largest legitimate
 * messages (a DraftResponse or VerifyRequest of 256 sequences x 32 drafts,
 * each draft's q a sub-message of two packed fields) hold about 27,000;
 * every array of numbers is packed, one field. Past this a message is
 * refused before unpacking: entries of a few bytes each cost protobuf-c
 * 15x their size or more, and the count, not the size, is what they have. */
#define WALK_MAX_FIELDS   (1 << 16)
#define SCAN_RECORD_BYTES 32 /* protobuf-c's ScannedMember */
#define SCAN_ON_STACK     16 /* records protobuf-c keeps on its stack */

typedef struct wire_walk {
    bool want_nul;    /* stop at the first string holding a NUL */
    const char *nul;  /* that string's field name */
    size_t cost;      /* lower bound of the unpack's allocations (saturating) */
    size_t n_fields;  /* fields walked, all levels */
    size_t stop_cost; /* stop once cost passes this */
} wire_walk;

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

static void add_cost(wire_walk *w, size_t c) { w->cost = w->cost > SIZE_MAX - c ? SIZE_MAX : w->cost + c; }

static bool walk_done(const wire_walk *w) { return w->nul || w->cost > w->stop_cost || w->n_fields > WALK_MAX_FIELDS; }

static void walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth, wire_walk *w) {
    size_t n_fields = 0;
    add_cost(w, charge_of(d->sizeof_message));
    while (p < end && !walk_done(w)) {
        uint64_t key, v;
        if (!read_varint(&p, end, &key)) break;
        if (++n_fields > SCAN_ON_STACK) add_cost(w, SCAN_RECORD_BYTES);
        w->n_fields++;
        if ((key & 7) == 0) {
            if (!read_varint(&p, end, &v)) break;
            continue;
        }
        if ((key & 7) == 1 || (key & 7) == 5) {
            size_t n = (key & 7) == 1 ? 8 : 4;
            if ((size_t)(end - p) < n) break;
            p += n;
            continue;
        }
        if ((key & 7) != 2 || !read_varint(&p, end, &v) || v > (uint64_t)(end - p)) break;
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
        if (f) {
            bool text = f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES;
            if (f->label == PROTOBUF_C_LABEL_REPEATED && (text || f->type == PROTOBUF_C_TYPE_MESSAGE))
                add_cost(w, sizeof(void *));
            if (text) add_cost(w, charge_of((size_t)v + 1));
            if (w->want_nul && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)v)) w->nul = f->name;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE && v == 0) /* the commonest hostile entry: no call */
                add_cost(w, charge_of(((const ProtobufCMessageDescriptor *)f->descriptor)->sizeof_message));
            else if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < WALK_DEPTH)
                walk(f->descriptor, p, p + v, depth + 1, w);
        } else {
            add_cost(w, charge_of((size_t)v)); /* kept as an unknown field's copy */
        }
        p += v;
    }
}

const char *sd_net_nul_field(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len) {
    if (!d || !data) return NULL;
    wire_walk w = {.want_nul = true, .stop_cost = SIZE_MAX};
    walk(d, data, data + len, 0, &w);
    return w.nul;
}

ProtobufCMessage *sd_net_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, size_t budget,
                                bool *over_budget, const char **nul_field) {
    if (over_budget) *over_budget = false;
    if (nul_field) *nul_field = NULL;
    if (!d || (!data && len)) return NULL;
    wire_walk w = {.want_nul = nul_field != NULL, .stop_cost = budget};
    walk(d, data, data + len, 0, &w);
    if (w.nul) {
        *nul_field = w.nul;
        return NULL;
    }
    if (w.cost > budget || w.n_fields > WALK_MAX_FIELDS) {
        if (over_budget) *over_budget = true;
        return NULL;
    }
    unpack_budget b = {budget, false};
    ProtobufCAllocator a = {.alloc = budget_alloc, .free = budget_free, .allocator_data = &b};
    ProtobufCMessage *m = protobuf_c_message_unpack(d, &a, len, data);
    if (!m && over_budget) *over_budget = b.exceeded;
    return m;
}

/* Bytes a length-delimited field of n payload bytes takes on the wire, at most. */
static int64_t field_bytes(int64_t n) { return 1 + 5 + n; }

int64_t sd_net_worker_reply_cap(int32_t max_batch, int32_t max_k) {
    if (max_batch < 1 || max_batch > SD_MAX_BATCH) max_batch = SD_MAX_BATCH;
    if (max_k < 1 || max_k > SD_MAX_K) max_k = max_k < 1 ? 1 : SD_MAX_K;
    /* One sparse q: ids (a packed varint of at most 5 bytes each) and probs (4 bytes each). */
    int64_t q = field_bytes(field_bytes(5 * (int64_t)SD_MAX_TOP_N) + field_bytes(4 * (int64_t)SD_MAX_TOP_N));
    /* One DraftResult: request id, code, cached_len, the tokens and one q per token. */
    int64_t result = field_bytes(3 * 11 + field_bytes(5 * (int64_t)max_k) + (int64_t)max_k * q);
    /* A VerifyResult, with logprobs of SD_MAX_TOP_LOGPROBS alternatives per
     * token, takes under 200 bytes per token of its max_k + 1: less than the
     * one q (> 9 KiB) a DraftResult carries per token, so drafts size the cap.
     * A prefill result with prompt logprobs carries SD_MAX_PROMPT_LP_ROWS
     * such entries, which can outgrow a DraftResult of a small max_k. */
    int64_t prompt_lp = field_bytes(3 * 11 + 200 * (int64_t)SD_MAX_PROMPT_LP_ROWS);
    if (prompt_lp > result) result = prompt_lp;
    int64_t cap = 4096 + field_bytes((int64_t)max_batch * result);
    if (cap < SD_MIN_MSG_CAP_BYTES) cap = SD_MIN_MSG_CAP_BYTES;
    if (cap > SD_MAX_WORKER_MSG_BYTES) cap = SD_MAX_WORKER_MSG_BYTES;
    return cap;
}

int64_t sd_net_feature_bytes_cap(void) {
    /* the floats (4 bytes each, packed), and per sequence its pos0 and width and the field's header */
    return 4 * (int64_t)SD_MAX_STEP_FEATURES + (int64_t)SD_MAX_BATCH * 3 * 11;
}

int64_t sd_net_worker_request_cap(const sd_net_limits *lim) {
    int64_t batch = lim && lim->max_batch > 0 && lim->max_batch <= SD_MAX_BATCH ? lim->max_batch : SD_MAX_BATCH;
    int64_t draft = lim && lim->max_k > 0 && lim->max_k <= SD_MAX_K ? lim->max_k : SD_MAX_K;
    int64_t ctx = lim && lim->max_context > 0 ? lim->max_context : INT32_MAX;
    int64_t q = field_bytes(field_bytes(5 * (int64_t)SD_MAX_TOP_N) + field_bytes(4 * (int64_t)SD_MAX_TOP_N));
    /* One VerifySeq (the larger of the two kinds): ids and lengths, sampling, the appended tokens, drafts and q's. */
    int64_t seq = field_bytes(256 + field_bytes(5 * ctx) + field_bytes(5 * draft) + draft * q);
    if (seq > SD_MAX_WORKER_MSG_BYTES) return SD_MAX_WORKER_MSG_BYTES;
    int64_t cap = 4096 + field_bytes(batch * seq);
    if (lim && lim->feature_width > 0) cap += sd_net_feature_bytes_cap(); /* a head drafter's features */
    if (cap < SD_MIN_MSG_CAP_BYTES) cap = SD_MIN_MSG_CAP_BYTES;
    if (cap > SD_MAX_WORKER_MSG_BYTES) cap = SD_MAX_WORKER_MSG_BYTES;
    return cap;
}

int64_t sd_net_client_msg_cap(int32_t max_context) {
    if (max_context < 1) max_context = 1 << 20;
    /* prompt and system, or a conversation (its content in all is bounded
     * as a prompt; each message adds a role and two headers) */
    int64_t text = 2 * field_bytes(SD_MAX_PROMPT_BYTES) + 16 * (int64_t)SD_MAX_CHAT_MESSAGES;
    /* prompt_ids and the continuation (failover) fill one context together */
    int64_t ids = field_bytes(5 * (int64_t)max_context);
    int64_t stop = SD_MAX_STOP_STRINGS * field_bytes(SD_MAX_STOP_BYTES);
    int64_t cap = 4096 + field_bytes(text + ids + stop);
    if (cap < SD_MIN_MSG_CAP_BYTES) cap = SD_MIN_MSG_CAP_BYTES;
    if (cap > SD_MAX_CLIENT_MSG_BYTES) cap = SD_MAX_CLIENT_MSG_BYTES;
    return cap;
}
