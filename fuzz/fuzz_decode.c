/* fuzz_decode.c — libFuzzer target for the decoders of every link at the
 * sizes a hostile peer can send (MiB), with a structure-aware mutator.
 *
 * The input's first byte picks the decoder (client, to-client, worker,
 * to-worker, rank, leader); the rest is the wire bytes, decoded with the
 * coordinator's and the workers' limits. Checked: a refused message has a
 * code and a reason; an accepted one has neither and holds no string with a
 * NUL byte in the wire bytes (sd_net_nul_field); a decoder never takes more
 * than its unpack budget, which libFuzzer's -rss_limit_mb and -malloc_limit_mb
 * enforce from outside (fuzz/run-fuzz decode sets them, with -max_len 8 MiB).
 *
 * Byte-level mutation rarely builds what costs protobuf-c the most: a
 * repeated field whose entries are many small sub-messages. So half the
 * time LLVMFuzzerCustomMutator instead picks one field inside the
 * envelope's body and repeats it up to the size limit, fixing the body's
 * length prefix; the other half is libFuzzer's own mutation. Linked with
 * replay.c it is a plain program that runs each file named on its command
 * line (the CTest replay of fuzz/corpus/decode, built by every compiler). */
#include "specd/net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VIOLATION(...)                                \
    do {                                              \
        fprintf(stderr, "fuzz_decode: " __VA_ARGS__); \
        fprintf(stderr, "\n");                        \
        abort();                                      \
    } while (0)

enum { DEC_CLIENT, DEC_TO_CLIENT, DEC_WORKER, DEC_TO_WORKER, DEC_RANK, DEC_LEADER, DEC_COUNT };

static const ProtobufCMessageDescriptor *descriptor_of(int which) {
    switch (which) {
    case DEC_CLIENT: return &specd__client_to_coordinator__descriptor;
    case DEC_TO_CLIENT: return &specd__coordinator_to_client__descriptor;
    case DEC_WORKER: return &specd__worker_to_coordinator__descriptor;
    case DEC_TO_WORKER: return &specd__coordinator_to_worker__descriptor;
    case DEC_RANK: return &specd__rank_to_leader__descriptor;
    default: return &specd__leader_to_rank__descriptor;
    }
}

static ProtobufCMessage *decode(int which, const uint8_t *d, size_t n, Specd__Code *code, char *err, size_t len) {
    const sd_net_limits lim = {.n_vocab = 49152, .max_context = 8192, .max_batch = 64, .max_k = 8};
    switch (which) {
    case DEC_CLIENT: return (ProtobufCMessage *)sd_net_decode_client(d, n, &lim, code, err, len);
    case DEC_TO_CLIENT: return (ProtobufCMessage *)sd_net_decode_to_client(d, n, code, err, len);
    case DEC_WORKER: return (ProtobufCMessage *)sd_net_decode_worker(d, n, &lim, code, err, len);
    case DEC_TO_WORKER: return (ProtobufCMessage *)sd_net_decode_to_worker(d, n, &lim, code, err, len);
    case DEC_RANK: return (ProtobufCMessage *)sd_net_decode_rank(d, n, code, err, len);
    default: return (ProtobufCMessage *)sd_net_decode_leader(d, n, &lim, code, err, len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] % DEC_COUNT;
    const uint8_t *wire = data + 1;
    size_t n = size - 1;
    Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
    char err[512];
    ProtobufCMessage *m = decode(which, wire, n, &code, err, sizeof err);
    if (!m) {
        if (code == SPECD__CODE__CODE_OK || code == SPECD__CODE__CODE_UNSPECIFIED || !err[0])
            VIOLATION("a refused %zu-byte message has no code or reason (code %d)", n, (int)code);
        return 0;
    }
    if (code != SPECD__CODE__CODE_OK || err[0]) VIOLATION("an accepted message carries code %d: %s", (int)code, err);
    const char *nul = sd_net_nul_field(descriptor_of(which), wire, n);
    if (nul) VIOLATION("accepted a message whose %s holds a NUL byte", nul);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

/* ---- structure-aware mutation ---- */

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size) __attribute__((weak));

static uint32_t next_rand(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Reads a varint at p (< end); returns its length, 0 when malformed. */
static size_t get_varint(const uint8_t *p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (size_t i = 0; i < 10 && p + i < end; i++) {
        *v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) return i + 1;
    }
    return 0;
}

/* Bytes of the field starting at p (key, length and payload), 0 when malformed. */
static size_t field_len(const uint8_t *p, const uint8_t *end) {
    uint64_t key, v;
    size_t k = get_varint(p, end, &key);
    if (!k) return 0;
    const uint8_t *q = p + k;
    switch (key & 7) {
    case 0: {
        size_t l = get_varint(q, end, &v);
        return l ? k + l : 0;
    }
    case 1: return end - q >= 8 ? k + 8 : 0;
    case 5: return end - q >= 4 ? k + 4 : 0;
    case 2: {
        size_t l = get_varint(q, end, &v);
        if (!l || v > (uint64_t)(end - q - l)) return 0;
        return k + l + (size_t)v;
    }
    default: return 0;
    }
}

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[n++] = v ? (b | 0x80) : b;
    } while (v);
    return n;
}

/* Repeats one field of the envelope's first length-delimited field (the
 * oneof body) copies times in place; 0 when the input has no such shape. */
static size_t repeat_field(uint8_t *data, size_t size, size_t max_size, uint32_t *rng) {
    const uint8_t *end = data + size;
    uint8_t *env = data + 1; /* after the decoder byte */
    uint64_t key, body_len;
    size_t k = get_varint(env, end, &key);
    if (!k || (key & 7) != 2) return 0;
    size_t l = get_varint(env + k, end, &body_len);
    if (!l || body_len > (uint64_t)(end - env - k - l)) return 0;
    uint8_t *body = env + k + l;
    /* pick the f-th field of the body */
    size_t n_fields = 0, off = 0;
    while (off < body_len) {
        size_t fl = field_len(body + off, body + body_len);
        if (!fl) break;
        off += fl;
        n_fields++;
    }
    if (n_fields == 0) return 0;
    size_t pick = next_rand(rng) % n_fields, at = 0;
    for (size_t i = 0; i < pick; i++) at += field_len(body + at, body + body_len);
    size_t flen = field_len(body + at, body + body_len);
    size_t room = max_size > size + 16 ? max_size - size - 16 : 0;
    if (flen == 0 || room < flen) return 0;
    size_t max_copies = room / flen;
    /* log-uniform: mostly a few copies (fast runs), now and then up to the size limit */
    size_t limit = (size_t)1 << (next_rand(rng) % 24);
    size_t copies = 1 + next_rand(rng) % (max_copies < limit ? max_copies : limit);
    size_t new_body = (size_t)body_len + copies * flen;
    uint8_t lenbuf[10];
    size_t new_l = put_varint(lenbuf, new_body);
    size_t head = 1 + k; /* decoder byte + envelope key */
    size_t tail = size - (head + l + (size_t)body_len);
    size_t out_size = head + new_l + new_body + tail;
    if (out_size > max_size) return 0;
    uint8_t *out = malloc(out_size);
    if (!out) return 0;
    size_t o = 0;
    memcpy(out, data, head);
    o += head;
    memcpy(out + o, lenbuf, new_l);
    o += new_l;
    memcpy(out + o, body, at + flen);
    o += at + flen;
    for (size_t c = 0; c < copies; c++, o += flen) memcpy(out + o, body + at, flen);
    memcpy(out + o, body + at + flen, (size_t)body_len - at - flen + tail);
    memcpy(data, out, out_size);
    free(out);
    return out_size;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint32_t rng = seed ? seed : 1;
    if (size > 1 && (next_rand(&rng) & 1)) {
        size_t n = repeat_field(data, size, max_size, &rng);
        if (n) return n;
    }
    return LLVMFuzzerMutate ? LLVMFuzzerMutate(data, size, max_size) : size;
}
