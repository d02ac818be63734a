/* identity.h — what identifies a model across processes: the ModelIdentity
 * a worker sends in Hello, and the coordinator compares with its target's.
 * Plain data: a worker fills it from its model file (sd_weights_identity in
 * formats/weights.h); net/ only carries it. */
#ifndef SPECD_IDENTITY_H
#define SPECD_IDENTITY_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_model_identity {
    char architecture[32];   /* "llama" */
    char name[128];          /* file or directory name, for logs */
    uint32_t vocab_size;     /* tokens */
    uint64_t vocab_hash;     /* sd_tok_vocab_hash */
    uint32_t context_length; /* tokens */
    uint32_t n_layers;       /* layers run */
} sd_model_identity;

#ifdef __cplusplus
}
#endif
#endif
