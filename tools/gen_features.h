/* gen_features.h — specd-generate's feature dumps (--dump-features) and
 * its prompt input helpers: the training data of an EAGLE-3 head
 * (tools/train-eagle reads what this writes).
 *
 * One file per generated sequence, DIR/NNNNNN.safetensors (NNNNNN the
 * sequence's index from 000000), holding for its T tokens (prompt then
 * generated):
 *   tokens  I32 [T]
 *   aux     F32 [T][3 H]  the residual stream after each of the captured
 *                         layers (model.h capture ids: the output of layer
 *                         id), in layer-id order as given
 *   final   F32 [T][H]    the final norm of the last layer's output (the LM
 *                         head's input)
 *   __metadata__ {"layer_ids": "a,b,c", "hidden_size": "H",
 *                 "vocab_size": "V", "model": the model's file name,
 *                 "n_prompt": the prompt's tokens (the first ones)}
 * Row t holds the target's state after reading tokens[0..t]: it predicts
 * tokens[t + 1]. */
#ifndef SPECD_GEN_FEATURES_H
#define SPECD_GEN_FEATURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "specd/chat.h"
#include "specd/model.h"
#include "specd/sample.h"
#include "specd/tokenizer.h"

typedef struct sd_gen_dump_params {
    const char *dir;         /* existing directory the files go to */
    const char *model_path;  /* its file name goes to the metadata */
    const char *prompt;      /* the one prompt without prompt_file */
    const char *prompt_file; /* one prompt a line, or NULL */
    const char *layers;      /* "a,b,c" capture ids, or NULL: EAGLE-3's default */
    int32_t n_predict;       /* tokens generated per prompt at most */
    sd_sampling sampling;
    bool ignore_eos;
    const sd_chat_template *chat; /* NULL: prompts are plain text */
    const char *system;           /* with chat: the system turn, or NULL */
} sd_gen_dump_params;

/* specd-generate --dump-features: generates after each prompt (prompt_file's
 * lines, or prompt) with plain decoding, features captured on every forward
 * (the last token is fed once more for its row), and writes its file.
 * Progress goes to stderr. Returns the exit code (0, 1 failure, 2 usage). */
int sd_gen_dump_main(const sd_gen_dump_params *p, sd_model *m, const sd_tok *tok);

/* "a,b,c" into ids[max] and *n; false on a malformed list. */
bool sd_gen_parse_layers(const char *s, int32_t *ids, int32_t max, int32_t *n);

/* All of stdin as the prompt: *owned (malloc'd, NUL-terminated; the caller
 * frees it) and *prompt pointing at it. 0, or specd-generate's exit status:
 * 1 out of memory, 2 the input holds a NUL byte (said on stderr; refused
 * rather than cut there; nothing is left to free). */
int sd_gen_prompt_stdin(const char **prompt, char **owned);

#endif
