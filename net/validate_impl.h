/* validate_impl.h — what net/validate.c (the decoders, one per link) and
 * net/validate_fields.c (the checks of single fields and shared messages)
 * share: the validation context and the field checks. Internal to net/. */
#ifndef SPECD_NET_VALIDATE_IMPL_H
#define SPECD_NET_VALIDATE_IMPL_H

#include "specd/net.h"

#define NAME_MAX_BYTES 256 /* Hello.name, ModelIdentity strings */

/* Validation context: the limits in force and where to write the first error. */
typedef struct vctx {
    int32_t n_vocab;     /* 0 = token ranges unknown (only >= 0 checked) */
    int32_t max_context; /* INT32_MAX when unknown */
    int32_t max_batch;
    int32_t max_k;
    int32_t feature_width; /* sd_net_limits.feature_width */
    Specd__Code *code;
    char *err;
    size_t err_len;
} vctx;

/* Writes the first failure (code, message) into v and returns false. */
__attribute__((format(printf, 3, 4))) bool sd_nv_fail(vctx *v, Specd__Code code, const char *fmt, ...);
/* The context for lim (NULL: the protocol's own limits), clearing *code and err. */
vctx sd_nv_make_ctx(const sd_net_limits *lim, Specd__Code *code, char *err, size_t err_len);

/* The field checks (validate_fields.c): true when the field is valid, else
 * sd_nv_fail's false with the field's path in the message. */
/* Unpacks an envelope of type d within sd_net_unpack_budget(len); NULL with
 * the failure in v (MALFORMED, or BAD_REQUEST for a NUL in a string). */
ProtobufCMessage *sd_nv_unpack_env(vctx *v, const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len);
bool sd_nv_no_unknown_fields(vctx *v, const ProtobufCMessage *m);
bool sd_nv_check_text(vctx *v, const char *path, const char *s, size_t max_bytes);
bool sd_nv_check_tokens(vctx *v, const char *path, const int32_t *ids, size_t n);
bool sd_nv_check_logprobs(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n);
bool sd_nv_check_logprobs_from(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n, bool first_none);
bool sd_nv_check_logprob_request(vctx *v, const char *path, bool logprobs, uint32_t top_logprobs);
bool sd_nv_check_q(vctx *v, const char *path, const Specd__SparseDist *q, int32_t token);
/* sampling.c: a Sampling (NULL: the default, greedy) converted into *out and
 * checked, once. */
bool sd_nv_check_sampling(vctx *v, const char *path, const Specd__Sampling *s, sd_sampling *out);
bool sd_nv_check_distinct_ids(vctx *v, const char *path, const uint64_t *ids, size_t n);
bool sd_nv_check_batch_size(vctx *v, const char *path, size_t n);
bool sd_nv_check_code(vctx *v, const char *path, Specd__Code c);
bool sd_nv_check_error(vctx *v, const char *path, const Specd__Error *e);
bool sd_nv_check_hello(vctx *v, const char *path, const Specd__Hello *h, bool worker);
/* validate_constraint.c: a Constraint's shape (kind, text), and a
 * Submit's constraint against the fields it excludes. */
bool sd_nv_check_constraint(vctx *v, const char *path, const Specd__Constraint *c);
bool sd_nv_check_submit_constraint(vctx *v, const Specd__SubmitRequest *s);
/* A DraftSeq's constraint and prompt_len (at most its context; 0 without a
 * constraint). */
bool sd_nv_check_draft_constraint(vctx *v, size_t i, const Specd__DraftSeq *s);

/* validate_feat.c: a head drafter's features. Hello.feature_layers /
 * feature_width; VerifyRequest.feature_layers; result i's features
 * (*total: floats so far in the response); DraftSeq i's features against
 * v->feature_width (*total: floats so far in the request). */
bool sd_nv_check_hello_features(vctx *v, const char *path, const Specd__Hello *h);
bool sd_nv_check_feature_layers(vctx *v, const Specd__VerifyRequest *r);
bool sd_nv_check_result_features(vctx *v, size_t i, const Specd__VerifyResult *d, size_t *total);
bool sd_nv_check_draft_features(vctx *v, size_t i, const Specd__DraftSeq *s, size_t *total);

#endif
