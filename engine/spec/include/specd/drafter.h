/* drafter.h — drafters behind one small interface: propose up to K tokens
 * with the sparse distributions they were drawn from, for one sequence.
 *
 * Three kinds:
 *   - n-gram (prompt lookup): no model. Finds the earlier occurrences of
 *     the context's suffix with the longest match (ngram_min..ngram_max
 *     tokens), proposes the continuation most of them agree on, and drafts
 *     as many tokens as are likely to be accepted (ngram_min_p); q is
 *     one-hot. For greedy requests it calibrates its acceptance estimates
 *     on the sequence's own history (drafter.c).
 *   - model: a small GGUF model whose vocabulary equals the target's
 *     (checked with sd_tok_vocab_hash; a mismatch is a clear error). It keeps
 *     a KV cache per sequence and draws each token from its processed
 *     distribution (sd_spec_draft_coupled: the exponential race with the
 *     verifier's uniforms for (seed, position); under the rejection rule a
 *     draw from the sparse q itself, sd_spec_draft_step), sending it
 *     sparsified to the top_n tokens.
 *   - self-draft: the model drafter over the target's first L layers + final
 *     norm + LM head (a view of the loaded target sharing its weights, or
 *     sd_model_params.n_layers_used = L when loaded from the file).
 *
 * The caller passes the sequence's whole committed context on every
 * propose; a model drafter keeps a copy of the tokens it has in its cache,
 * reuses their longest common prefix with the context and rolls the rest
 * back, so rejected drafts never need an explicit rollback (one is offered
 * for callers that know better). A drafter is not thread-safe: one call at a
 * time per drafter. */
#ifndef SPECD_DRAFTER_H
#define SPECD_DRAFTER_H

#include "specd/common.h"
typedef struct sd_constraint sd_constraint; /* specd/constrain.h (specd_constrain); only its handle here */
#include "specd/model.h"
#include "specd/sample.h"
#include "specd/spec.h"
#include "specd/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_drafter sd_drafter;

typedef enum sd_drafter_kind {
    SD_DRAFTER_NGRAM = 1,
    SD_DRAFTER_MODEL = 2,
    SD_DRAFTER_SELF = 3,
    SD_DRAFTER_EAGLE = 4, /* an EAGLE-3 head over the target's hidden states (eagle.h) */
} sd_drafter_kind;

/* The default draft vocabulary cut (sd_drafter_params.draft_vocab): none.
 * A cut assumes the tokenizer's ids are ranked by frequency; 32768 was the
 * best of 8192, 16384, 24576, 32768 and the whole vocabulary measured with
 * SmolLM2's 49,152-token BPE (about 4% faster, bench/results/spec-cpu.md),
 * but it would keep a quarter of Llama 3's 128k ids, unmeasured: so it is
 * asked for (--draft-vocab 32768), not assumed. */
#define SD_DRAFTER_DEFAULT_VOCAB 0

typedef struct sd_drafter_params {
    int32_t max_seqs;               /* sequence slots in [0, max_seqs) (default 1) */
    int32_t max_ctx;                /* most tokens a sequence holds, context + draft (default 4096) */
    int32_t top_n;                  /* tokens kept of a model drafter's distribution (default SD_SPEC_DEFAULT_TOP_N) */
    int32_t ngram_min;              /* shortest match (tokens) an n-gram draft may rest on (default 1) */
    int32_t ngram_max;              /* match lengths are measured up to this many tokens (default 16) */
    float ngram_min_p;              /* an n-gram draft stops before the estimated probability that all of it is
                           accepted falls below this, in (0, 1] (default 0.15) */
    int32_t ngram_cache_entries;    /* n-grams of earlier outputs the n-gram drafter keeps for all its
                                    sequences (default 65536, about 2.5 MB); < 0: no shared cache */
    int32_t n_threads;              /* model drafters' worker threads, 0 = all cores */
    int32_t device;                 /* model drafters loaded from a file: -1 = CPU (default), N = cuda:N */
    const sd_backend_opts *backend; /* model drafters loaded from a file: the backend switches (borrowed,
                                       read at open); NULL = sd_backend_default_opts() (default) */
    int32_t draft_vocab;            /* a model drafter's vocabulary cut: it computes logits for token ids
                                    [0, draft_vocab) only and never drafts the others (q is 0 there); 0,
                                    or n_vocab and above = the whole vocabulary; < 0 refused (default
                                    SD_DRAFTER_DEFAULT_VOCAB). Exact at any value: the target decides
                                    every committed token (spec.h) */
    int32_t prefix_cache_pct;    /* a model drafter's prefix cache (kv.h): the share of its KV pool, in
                                    percent, that cached blocks no sequence holds may keep; 0 = the
                                    default (50), < 0 = no prefix cache, > 100 refused */
    int32_t eagle_weights;       /* an EAGLE-3 head's matrices (eagle.h's sd_eagle_weights): 0 = the
                                    default (Q8_0) */
} sd_drafter_params;

sd_drafter_params sd_drafter_default_params(void);

/* An n-gram (prompt lookup) drafter. Caller frees with sd_drafter_free. */
sd_status sd_drafter_ngram_create(const sd_drafter_params *p, sd_drafter **out);

/* A model drafter over the GGUF at path. target_vocab_hash/target_n_vocab
 * are the target's (sd_tok_vocab_hash, n_vocab): a draft model whose
 * vocabulary differs is refused with SD_ERR_UNSUPPORTED and a log line
 * naming both sizes; one that differs only in trailing unused padding
 * tokens (its embedding padded to other rows) pairs, drafting among ids <
 * target_n_vocab. Caller frees with sd_drafter_free. */
sd_status sd_drafter_model_open(const char *path, uint64_t target_vocab_hash, int32_t target_n_vocab,
                                const sd_drafter_params *p, sd_drafter **out);

/* Pairs model or self drafter d, opened against its own vocabulary, with a
 * target whose tokenizer hashes alike but whose embedding has
 * target_n_vocab rows (the service's Welcome says it): a draft padded
 * further drafts among ids < target_n_vocab from then on (a cut only
 * narrows); one padded less accepts context ids up to target_n_vocab and
 * drafts nothing for a sequence holding one past its own rows. N-gram and
 * EAGLE drafters: nothing to do. Not concurrent with a propose call. */
sd_status sd_drafter_pair_vocab(sd_drafter *d, int32_t target_n_vocab);

/* The token ids d can feed: [0, rows) (a model's embedding rows; INT32_MAX
 * for drafters that only copy the context). */
int32_t sd_drafter_embed_rows(const sd_drafter *d);

/* The self-draft from a file: loads only the first n_layers of the target
 * GGUF at path (+ embeddings, final norm, LM head) — what a drafter process
 * that does not hold the target wants. In a process that already holds the
 * target use sd_drafter_self_view (no extra weight memory). Caller frees
 * with sd_drafter_free. */
sd_status sd_drafter_self_open(const char *path, int32_t n_layers, const sd_drafter_params *p, sd_drafter **out);

/* The zero-copy self-draft: a view of target's first n_layers
 * (sd_model_view_layers), owned by the drafter; target is borrowed and must
 * outlive the drafter. Caller frees with sd_drafter_free. */
sd_status sd_drafter_self_view(const sd_model *target, int32_t n_layers, const sd_drafter_params *p, sd_drafter **out);

/* A model drafter over an already loaded model (borrowed: it must outlive
 * the drafter; kind says MODEL or SELF for reports). The caller has checked
 * the vocabulary. Caller frees with sd_drafter_free. */
sd_status sd_drafter_model_wrap(sd_model *m, sd_drafter_kind kind, const sd_drafter_params *p, sd_drafter **out);

/* An EAGLE-3 draft head (eagle.h) in dir for target (borrowed: it must
 * outlive the drafter; its embedding is used when the head has none). The
 * head drafts from the target's hidden states, which the caller passes
 * after each target forward with sd_drafter_eagle_features; the target
 * captures them when asked (sd_model_capture_set with the ids of
 * sd_drafter_eagle_layers). Refusals as sd_eagle_head_load. sd_draft_batch
 * answers SD_ERR_UNSUPPORTED: a drafter process (specd-drafter --eagle)
 * feeds it and proposes per sequence (drafter/draft_head.c). Caller frees
 * with sd_drafter_free. */
sd_status sd_drafter_eagle_open(const char *dir, const sd_model *target, const sd_drafter_params *p, sd_drafter **out);

/* The target layers an EAGLE drafter reads (capture ids, model.h) into
 * ids[3]; returns how many (3), or 0 for any other drafter. */
int32_t sd_drafter_eagle_layers(const sd_drafter *d, int32_t *ids);

/* Seconds an EAGLE drafter's proposals spent, since the last call, on head
 * rows past the 1 + k a drafting step of k brings at most, and how many
 * rows (*rows, may be NULL): rows of a context it fell behind on (a
 * prompt, the steps it did not draft for), which the caller reports apart
 * from what the drafted tokens cost (verifier/verify_head.c). 0 for
 * another kind. */
double sd_drafter_eagle_take_catchup_s(sd_drafter *d, int64_t *rows);

/* Hands an EAGLE drafter the target's captured features aux[n][3 * n_embd]
 * of committed positions pos0 .. pos0 + n - 1 of slot seq, whose tokens are
 * tokens[n] (pos0 at most the positions it already has: no gaps; later ones
 * are replaced). SD_ERR_INVALID_ARG for another drafter kind, SD_ERR_RANGE
 * for a gap. */
sd_status sd_drafter_eagle_features(sd_drafter *d, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                    const float *aux);

/* Features fused ahead of time (drafter_eagle.c; the verifier keeps them
 * beside its cached KV blocks, so a sequence that adopts blocks gets their
 * features without a target forward). For an EAGLE drafter: the width H of
 * a fused feature (0 for another kind); how many positions slot seq has
 * features of; fused[n][H] = the head's fc over aux[n][3 * n_embd] (a
 * function of each row alone: the same bits in any batch); and
 * sd_drafter_eagle_features with fused features: slot seq's positions pos0
 * .. pos0 + n - 1 get fused[n][H] (copied), their tokens tokens[n] (no
 * gaps: SD_ERR_RANGE; the head's own rows from pos0 on are recomputed at
 * the next propose). */
int32_t sd_drafter_eagle_width(const sd_drafter *d);
int32_t sd_drafter_eagle_n_features(const sd_drafter *d, int32_t seq);
sd_status sd_drafter_eagle_fuse(sd_drafter *d, const float *aux, int32_t n, float *fused);
sd_status sd_drafter_eagle_set_fused(sd_drafter *d, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                     const float *fused);

/* ---- token trees drafted by an EAGLE head (drafter_eagle_tree.c) ---- */

#define SD_TREE_MAX_NODES 64 /* nodes a tree keeps */
#define SD_TREE_MAX_TOPK  8  /* children per node, nodes expanded per depth */

/* The shape of a drafted tree (EAGLE-2's): topk children of each expanded
 * node; per depth the topk best nodes are expanded; depth levels; the
 * n_nodes best nodes overall are kept. Best: the highest product of the
 * head's probabilities along the path. */
typedef struct sd_tree_shape {
    int32_t topk;    /* 1 .. SD_TREE_MAX_TOPK */
    int32_t n_nodes; /* 1 .. SD_TREE_MAX_NODES */
    int32_t depth;   /* 1 .. SD_MAX_K */
} sd_tree_shape;

/* A drafted tree, nodes in order of depth (a parent before its children). */
typedef struct sd_draft_tree {
    int32_t n_nodes;
    int32_t tokens[SD_TREE_MAX_NODES]; /* target ids */
    int32_t parent[SD_TREE_MAX_NODES]; /* an earlier node, or -1: a child of the context's last token */
    int32_t depth[SD_TREE_MAX_NODES];  /* 1 for the children of the context's last token */
} sd_draft_tree;

/* Checks a shape: SD_ERR_RANGE with a log line naming the bad field. */
sd_status sd_tree_shape_check(const sd_tree_shape *shape);

/* Drafts a token tree continuing ctx[n_ctx] for slot (an EAGLE drafter, as
 * its propose: the head's rows for the context first, then one head forward
 * per depth over the nodes expanded there, each row attending to its own
 * ancestors only; s: a sampled request's first child at each node is
 * the chain's coupled draft). out->n_nodes 0: nothing drafted (no features yet). The
 * tree's rows in the head's cache are dropped at the next propose.
 * SD_ERR_INVALID_ARG for another drafter kind. */
sd_status sd_drafter_eagle_propose_tree(sd_drafter *d, int32_t slot, const int32_t *ctx, int32_t n_ctx,
                                        const sd_tree_shape *shape, const sd_sampling *s, sd_draft_tree *out);

void sd_drafter_free(sd_drafter **d);

sd_drafter_kind sd_drafter_kind_of(const sd_drafter *d);
/* "ngram", "model", "self" or "eagle" (static string). */
const char *sd_drafter_name(const sd_drafter *d);
/* The most entries a q of this drafter has: 1 for the n-gram drafter (q is
 * one-hot), the top_n of its parameters for a model drafter. Whoever copies
 * a q must keep this many, or the draft is no longer exact. */
int32_t sd_drafter_max_q(const sd_drafter *d);

/* Proposes up to k (<= SD_MAX_K) tokens continuing context[n_context]
 * (the sequence's committed tokens) for slot seq, sampled with s (the same
 * processing the target uses; the token at position n_context + i uses the
 * coupled race of (s->seed, n_context + i): spec.h). Writes tokens[k], q[k] and
 * *n_drafted (0..k; the n-gram drafter may find nothing). q[i].ids/probs are
 * borrowed from the drafter, valid until the next call for seq. A public
 * entry point: s is checked here (sd_sampling_validate). */
sd_status sd_drafter_propose(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                             const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted);
/* sd_drafter_propose for sampling its caller has already checked once (a
 * wire decoder in net/, or sd_spec_decoder_step's entry): the other
 * arguments are checked, s is taken as given. */
sd_status sd_drafter_propose_given(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                                   const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted);

/* Structured output for the next sd_drafter_propose calls: a model or
 * EAGLE drafter masks its distribution at each drafted position under c
 * (borrowed; the caller keeps it at the end of the context it passes, and
 * it is left there), so it drafts only tokens c allows (q the masked,
 * renormalised distribution; greedy: the argmax among them) and stops
 * where c allows none of its vocabulary. An EAGLE head masks its draft
 * vocabulary in target ids (through d2t), and accepts a context that ends
 * with up to SD_MAX_K forced drafts the target has not run (the caller's,
 * proposed with q = 1): it feeds them as chain rows, as its own drafts,
 * and drafts on. NULL removes it. The n-gram drafter ignores it (its
 * caller cuts the draft at the first refused token). */
void sd_drafter_set_constraint(sd_drafter *d, sd_constraint *c);

/* Forgets everything seq holds past its first len tokens (a no-op for the
 * n-gram drafter). */
sd_status sd_drafter_rollback(sd_drafter *d, int32_t seq, int32_t len);

/* Frees seq's cache; the slot may then start a new sequence. */
void sd_drafter_release(sd_drafter *d, int32_t seq);

#ifdef __cplusplus
}
#endif
#endif
