/* constrain_slots.h — a serving process's structured output (issue 35):
 * per slot (a KV slot of the verifier, a drafter's request slot), the
 * constraint of the sequence it holds, advanced over the sequence's
 * generated tokens, and the compiled grammars shared by every slot (a
 * cache keyed by the constraint's kind and text). The verifier
 * (verifier/verify_constrain.c) and the drafters (drafter/draft_serve.c)
 * keep theirs here.
 *
 * A constrained step carries its constraint every time; the server asks
 * sd_con_slots_sync for the slot's sd_constraint, brought to the tokens the
 * slot holds now. The tokens the constraint advanced over are kept beside
 * it and compared with the slot's history each step, so truncation
 * (rejected drafts, CACHE_MISS resends, failover) rolls it back to the
 * common prefix and whatever came since is replayed: no assumption about
 * how the history moved. */
#ifndef SPECD_CONSTRAIN_SLOTS_H
#define SPECD_CONSTRAIN_SLOTS_H

#include "specd/constrain_cache.h"
#include "specd/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_con_slots sd_con_slots;

/* Grammars kept compiled while no slot uses them. */
#define SD_CON_SLOTS_CACHE_GRAMMARS 32

/* Over tok's vocabulary (borrowed for the call; the byte trie is built
 * here), max_seqs slots. Caller frees with sd_con_slots_free. */
sd_status sd_con_slots_create(const sd_tok *tok, int32_t max_seqs, sd_con_slots **out);
void sd_con_slots_free(sd_con_slots **c);

/* Forgets slot's constraint (the slot was freed). NULL-safe. */
void sd_con_slots_release(sd_con_slots *c, int32_t slot);

/* The constraint (kind, text) of the sequence in slot, advanced over its
 * generated tokens hist[prompt_len .. n_ctx): *out, borrowed until the
 * next call on this slot; NULL (and the slot released) for
 * SD_CONSTRAINT_NONE. A constraint that does not compile, or a generated
 * token it does not allow, is SD_ERR_FORMAT / SD_ERR_UNSUPPORTED /
 * SD_ERR_RANGE / SD_ERR_INVALID_ARG with err saying why. */
sd_status sd_con_slots_sync(sd_con_slots *c, int32_t slot, sd_constraint_kind kind, const char *text,
                            const int32_t *hist, int32_t prompt_len, int32_t n_ctx, sd_constraint **out, char *err,
                            size_t err_cap);

/* Grammar cache figures (tests, logs). */
sd_grammar_cache_stats sd_con_slots_cache_stats(const sd_con_slots *c);

/* Forced drafts: up to k tokens c allows in turn, into ids, built from the
 * bytes c forces next (sd_constraint_forced_bytes) and from the output
 * itself: at each position, where bytes are forced or the only choice is
 * optional whitespace before them, the token the model wrote after the
 * longest matching byte context earlier in the output (if c allows it);
 * forced bytes no earlier token covers are drafted as tok encodes them,
 * the last token of that encoding left out (it ends where the forced bytes
 * do, and the model usually writes a longer token there: `":` where `"` is
 * forced). Inside a word the model has split its own way (the bytes so
 * far end in a letter), an encoder token of more than one byte that the
 * output does not hold ends the drafts (the model mostly spells on in
 * other pieces, and a rejected draft costs every row after it). c is left
 * as it was. Returns how many (0 on any failure: forced drafts are an
 * optimisation). */
int32_t sd_constraint_forced_tokens(sd_constraint *c, const sd_tok *tok, int32_t k, int32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
