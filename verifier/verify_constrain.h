/* verify_constrain.h — the verifier's structured output (issue 35): per
 * KV slot, the constraint of the sequence it holds, advanced over the
 * sequence's generated tokens, and the compiled grammars shared by every
 * slot (a cache keyed by the constraint's kind and text).
 *
 * A constrained VerifySeq carries its Constraint with every step; the
 * verifier asks sd_vcon_sync for the slot's sd_constraint, brought to the
 * tokens the slot holds now, and gives it to sd_spec_verify_batch, which
 * masks every row it samples (spec_batch.h). The tokens the constraint has
 * advanced over are kept beside it and compared with the slot's history
 * each step, so truncation (rejected drafts, CACHE_MISS resends, failover)
 * rolls it back to the common prefix and whatever came since is replayed:
 * no assumption about how keep_len moved. The state itself is the
 * engine's per-slot constraints (specd/constrain_slots.h). */
#ifndef SPECD_VERIFY_CONSTRAIN_H
#define SPECD_VERIFY_CONSTRAIN_H

#include "specd/constrain_cache.h"
#include "specd/net.h"

typedef struct sd_vcon sd_vcon;

/* Over tok's vocabulary (the byte trie is built here; tok is borrowed and
 * must outlive c: the head's forced drafts are encoded with it), max_seqs
 * slots. Caller frees with sd_vcon_free. */
sd_status sd_vcon_create(const sd_tok *tok, int32_t max_seqs, sd_vcon **out);
void sd_vcon_free(sd_vcon **c);

/* Forgets slot's constraint (the slot was freed). NULL-safe. */
void sd_vcon_release(sd_vcon *c, int32_t slot);

/* The constraint of the sequence in slot, advanced over its generated
 * tokens hist[prompt_len .. n_ctx): *out, borrowed until the next call on
 * this slot; NULL when pc has no constraint. A constraint that does not
 * compile, or a generated token it does not allow, is SD_ERR_FORMAT /
 * SD_ERR_UNSUPPORTED / SD_ERR_RANGE / SD_ERR_INVALID_ARG with err saying
 * why (the caller answers BAD_REQUEST). c NULL (no tokenizer): every
 * constraint is SD_ERR_UNSUPPORTED. */
sd_status sd_vcon_sync(sd_vcon *c, int32_t slot, const Specd__Constraint *pc, const int32_t *hist,
                       int32_t prompt_len, int32_t n_ctx, sd_constraint **out, char *err, size_t err_cap);

/* The EAGLE head's drafts after a step (verify_head.c), cut before the
 * first one con refuses: con is at the state after hist[0..from) (the
 * step's context); the step committed hist[from..hist_len) and next, and
 * the head drafted drafts[n] after them. Returns how many to keep; con is
 * left as it was. */
size_t sd_vcon_cut_drafts(sd_constraint *con, const int32_t *hist, int32_t from, int32_t hist_len, int32_t next,
                          const int32_t *drafts, size_t n);

/* The EAGLE head's drafts under con after a step (verify_head.c): con is
 * at the state after hist[0..from) (the step's context); it is advanced
 * over what the step committed, hist[from..hist_len) and next, then over
 * the tokens it forces next (sd_constraint_forced_tokens, at most k),
 * written to forced: the head drafts on from there, masked. Returns how
 * many forced, or -1 when no draft can follow (the committed tokens leave
 * the language, or the output ended). Either way the caller rolls con back
 * to the length it had before the call. */
int32_t sd_vcon_head_begin(const sd_vcon *c, sd_constraint *con, const int32_t *hist, int32_t from, int32_t hist_len,
                           int32_t next, int32_t k, int32_t *forced);

/* Grammar cache figures (tests, logs). */
sd_grammar_cache_stats sd_vcon_cache_stats(const sd_vcon *c);

#endif
