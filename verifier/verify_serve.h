/* verify_serve.h — the verifier's request handling, without sockets: a
 * request_id -> KV slot map over the target's paged KV cache, and the
 * translation of a VerifyRequest batch into one ragged target pass +
 * per-sequence verification (see verify_serve.c). specd-verifier's main
 * wires these functions into the worker loop (specd/worker.h); the unit
 * tests call them directly. */
#ifndef SPECD_VERIFY_SERVE_H
#define SPECD_VERIFY_SERVE_H

#include "specd/model.h"
#include "specd/net.h"
#include "specd/spec_batch.h"
#include "specd/tokenizer.h"

typedef struct sd_verifier sd_verifier;

typedef struct sd_verifier_params {
    int32_t max_seqs;   /* KV slots = sequences cached at once (default 64) */
    int32_t kv_blocks;  /* blocks in the KV pool (required, > 0) */
    int32_t block_size; /* tokens per block (default 16) */
    int32_t max_batch;  /* sequences per VerifyRequest (default 64, <= SD_MAX_BATCH) */
    int32_t max_k;      /* draft tokens per sequence (default 16, <= SD_MAX_K) */
    int32_t max_ctx;    /* tokens per sequence; 0 = the model's context length */
    /* Prefix cache (kv.h): the share of the pool, in percent, that cached
     * blocks no sequence holds may keep (default 50; 0: off). A prefill
     * chunk of a sequence adopts the cached blocks matching its tokens. */
    int32_t prefix_cache_pct;
    /* Touch the whole KV pool before serving (sd_kv_prefault): no request
     * pays for the memory's first use; the pool is resident from the start. */
    bool kv_prefault;
    /* Structured output (VerifySeq.constraint): the target's tokenizer,
     * borrowed: it must outlive the verifier (its vocabulary's byte trie is
     * built at create; the head's forced drafts are encoded with it). NULL:
     * a constrained sequence is answered BAD_REQUEST. */
    const sd_tok *tok;
    /* An EAGLE-3 head (a Hugging Face directory, eagle.h) that drafts in
     * this process after each step (VerifySeq.next_k; verify_head.h), or
     * NULL. The target then captures the head's layers on every forward;
     * with the prefix cache each computed row's fused feature is kept in
     * the KV cache's side rows, where an adopter of its block finds it. */
    const char *eagle_dir;
    int32_t eagle_weights; /* the head's matrices (eagle.h's sd_eagle_weights; 0: the default, Q8_0) */
} sd_verifier_params;

/* max_seqs 64, kv_blocks 0 (must be set), block_size 16, max_batch 64,
 * max_k 16, max_ctx 0, tok NULL. */
sd_verifier_params sd_verifier_default_params(void);

/* KV blocks for max_seqs sequences of ctx/4 tokens each, capped so the pool
 * takes at most a quarter of the memory available now (at least one
 * context's worth of blocks). */
int32_t sd_verifier_default_kv_blocks(const sd_model_config *cfg, int32_t max_seqs, int32_t block_size,
                                      int32_t max_ctx);

/* A verifier over target (borrowed; must outlive it). Caller frees with
 * sd_verifier_free. */
sd_status sd_verifier_create(sd_model *target, const sd_verifier_params *p, sd_verifier **out);
void sd_verifier_free(sd_verifier **v);

/* Limits incoming envelopes are validated against (vocab, context, batch,
 * draft). */
sd_net_limits sd_verifier_limits(const sd_verifier *v);

/* Serves one batch: per sequence truncate to keep_len (CODE_CACHE_MISS when
 * the slot holds fewer tokens or the id is unknown and keep_len > 0), append,
 * verify the drafts (greedy at temperature 0, exact rejection sampling
 * otherwise), commit accepted + one token, roll the KV back to the committed
 * prefix without its last token. prefill_only appends and commits nothing.
 * No slot or KV blocks left: CODE_KV_FULL for that sequence. Fills *resp
 * (initialized) with memory owned by v, valid until the next call. Errors
 * only for a batch over max_batch or a failed forward pass. */
sd_status sd_verifier_handle(sd_verifier *v, const sd_net_verify_step *step, Specd__VerifyResponse *resp);

/* Runs verification steps of synthetic sequences before serving
 * (sd_warmup_run; SD_WARMUP_FULL: every size up to SD_WARMUP_EXACT_TOKENS
 * three times, a ladder above, up to max_tokens; SD_WARMUP_TIMES: one timed
 * step of 1, 2, 4, .. tokens), so the first requests do not pay for a
 * step size's first sighting: a CUDA verifier runs a new size op by op,
 * records it as a graph the second time (sizes up to
 * SD_WARMUP_EXACT_TOKENS) and loads a kernel module the first time a kernel
 * runs. Every step verifies one sequence per max_k + 1 tokens, with as
 * many drafts as fit (one-hot q, as an n-gram drafter sends), so the logits
 * are wanted for every row. rep's steady times are what the coordinator's
 * cost model starts from (Hello.step_costs). Nothing stays behind: every
 * slot and KV block is free again, and the step count (stats) is
 * unchanged. Stops early at a size the KV pool, the slots or max_batch
 * cannot hold (logged). Refused (SD_ERR_INVALID_ARG) once any slot is in
 * use: it is for a verifier that has not served yet. rep may be NULL. */
sd_status sd_verifier_warmup(sd_verifier *v, sd_warmup_mode mode, int32_t max_tokens, sd_warmup_report *rep);

/* Frees the slots (and KV blocks) of the given ids; unknown ids are ignored. */
void sd_verifier_release(sd_verifier *v, const uint64_t *request_ids, size_t n);
/* Frees every slot. */
void sd_verifier_reset(sd_verifier *v);
/* KV blocks total / free, sequences cached, batches served. */
void sd_verifier_stats(const sd_verifier *v, Specd__WorkerStats *stats);

#endif
