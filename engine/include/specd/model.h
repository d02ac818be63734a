/* model.h — a Llama-architecture model and its ragged batched forward pass.
 *
 * The model is written once against the backend interface (backend_impl.h);
 * this header is what callers see. A forward call runs a ragged batch: any
 * number of sequences, each with any number of new tokens, every token
 * carrying its position and sequence slot; attention is causal inside each
 * sequence over that sequence's KV cache. Logits come back only for the rows
 * asked for. On the CPU backend the logits of a token do not depend on what
 * else is in the batch or how its sequence's tokens were chunked (fixed
 * reduction order per output element): speculative greedy output equals
 * plain greedy output bit for bit. */
#ifndef SPECD_MODEL_H
#define SPECD_MODEL_H

#include "specd/common.h"
#include "specd/gguf.h"
#include "specd/model_config.h"
#include "specd/kv.h"
#include "specd/coll.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_model sd_model;

/* Where a tensor-parallel group computes the LM head (docs/DESIGN.md,
 * "Tensor parallelism", says why split is the default). */
typedef enum sd_tp_lm_head {
    SD_TP_LM_HEAD_SPLIT = 0,  /* rank r holds vocabulary rows [r*V/tp, (r+1)*V/tp) and computes those
                                 logits; the leader gathers them (needs tp | n_vocab, else LEADER) */
    SD_TP_LM_HEAD_LEADER = 1, /* the leader holds the whole head and computes every logit; the other
                                 ranks hold none (a replica there would never be read) */
} sd_tp_lm_head;

/* How the CPU backend holds the matrices a file stores quantized or in
 * 16 bits (model_load.c): as stored, mapped in place where they can be (the
 * default); read as f32 (4 bytes a weight: what a tensor-parallel group
 * needs to equal TP = 1 on the integer formats); or as stored but copied. */
typedef enum sd_cpu_weights {
    SD_CPU_WEIGHTS_STORED = 0,
    SD_CPU_WEIGHTS_F32 = 1,
    SD_CPU_WEIGHTS_COPY = 2,
} sd_cpu_weights;

/* Backend switches. The defaults are what a run wants; the other values
 * exist to compare paths and to test them, and reach a process only from
 * its command line (specd/backend_opts.h parses them; library code reads no
 * environment). */
typedef struct sd_backend_opts {
    sd_cpu_weights cpu_weights; /* --cpu-weights stored|f32|copy */
    /* --cpu-qpath c|avx2|avx512-vnni|avx512-amx: the CPU kernel path for
     * stored matrices (a path this CPU or build lacks: a warning, then the
     * fastest it has); NULL = the fastest. Borrowed, a static string. */
    const char *cpu_qpath;
    bool host_verify;          /* --host-verify: verify on the host even on a GPU */
    bool cuda_graphs;          /* --cuda-graphs 0|1 (default 1): record and replay CUDA graphs */
    bool cuda_mma;             /* --cuda-mma 0|1 (default 1): the tensor-core streaming matmul */
    bool cuda_fuse;            /* --cuda-fuse 0|1 (default 1): fused launches (0: op by op) */
    bool cuda_pdl;             /* --cuda-pdl 0|1 (default 0): programmatic dependent launch */
    int32_t cuda_pdl_prefetch; /* --cuda-pdl-prefetch N (0..64, default 4): weight chunks per warp
                                  the matmul prefetches into L2 under PDL */
} sd_backend_opts;

/* The defaults above. */
sd_backend_opts sd_backend_default_opts(void);

typedef struct sd_model_params {
    int32_t n_threads;     /* 0 = every online core */
    int32_t n_layers_used; /* 0 = all; L < n_layers runs only the first L
                               layers + final norm + LM head (self-draft) */
    int32_t device;        /* -1 = CPU (default); N >= 0 = CUDA device N */
    /* Tensor parallelism: this process holds shard tp_rank of tp_size
     * (attention heads, the MLP's inner dimension and the LM head's
     * vocabulary split; see docs/DESIGN.md) and runs every forward in
     * lockstep with the other ranks over coll. tp_size must divide the
     * head count, the MLP width, and either divide the KV head count or be
     * a multiple of it (then KV heads are replicated); anything else is
     * refused at load with SD_ERR_INVALID_ARG and a line saying why. */
    int32_t tp_rank;          /* default 0 */
    int32_t tp_size;          /* default 1 */
    sd_tp_lm_head tp_lm_head; /* default SD_TP_LM_HEAD_SPLIT */
    /* The group (borrowed). May be NULL at load and given later with
     * sd_model_set_coll (ranks load their slices before the group exists).
     * With tp_size 1 a one-rank group may be given: the collectives then
     * run, which exercises that path on a single device. */
    sd_coll *coll;
    /* The KV cache's element type for sd_model_kv_create: SD_DTYPE_F32 (the
     * default) or SD_DTYPE_F16 (half the memory; on a backend without an
     * f16 cache, CUDA today, sd_model_kv_create refuses it). */
    sd_dtype kv_type;
    /* The most tokens one sequence will hold (0, the default: the model's
     * context length, n_ctx_train, which is what the verifier and the
     * coordinator serve). It picks a LongRoPE model's factors at load
     * (sd_model_rope_factors: the long ones when it exceeds the original
     * context); nothing else reads it. Every rank of a group must load with
     * the same value (the default everywhere the verifier loads). */
    int32_t max_ctx;
    sd_backend_opts backend; /* default sd_backend_default_opts() */
} sd_model_params;

/* Parses a KV cache type name: "f32" or "f16"; false otherwise. */
bool sd_kv_type_parse(const char *name, sd_dtype *type);

sd_model_params sd_model_default_params(void);

/* Loads weights from an open GGUF (dequantized to f32 in this version; g may
 * be closed afterwards). Caller frees with sd_model_free. */
sd_status sd_model_load(const sd_gguf *g, const sd_model_params *p, sd_model **out);

/* Loads weights from any weights source (weights.h: a GGUF file or a Hugging
 * Face checkpoint directory); w may be closed afterwards. Every tensor's
 * shape is checked against the config. Caller frees with sd_model_free. */
typedef struct sd_weights sd_weights;
sd_status sd_model_load_weights(const sd_weights *w, const sd_model_params *p, sd_model **out);

/* The kernel path a CPU backend created with sd_backend_opts.cpu_qpath =
 * qpath computes stored weights on: "avx512-amx", "avx512-vnni", "avx2" or
 * "c" (qpath when this CPU has it, else the fastest it has); for benchmark
 * tables. */
const char *sd_cpu_kernel_path(const char *qpath);

/* Parses a device name: "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N. */
sd_status sd_device_parse(const char *name, int32_t *device);

void sd_model_free(sd_model **m);

/* A model that borrows m's weights and runs only its first n_layers (<= m's
 * layers in use) + final norm + LM head: the zero-copy self-draft. It has
 * its own activations and worker threads (so it and m may run concurrently
 * from two threads); m must outlive it. sd_model_free on the view frees
 * only what the view allocated. Caller frees with sd_model_free. */
sd_status sd_model_view_layers(const sd_model *m, int32_t n_layers, sd_model **out);

/* Borrowed config, valid while m lives. */
const sd_model_config *sd_model_config_of(const sd_model *m);

/* Creates a KV cache shaped for m holding max_seqs sequences and n_blocks
 * blocks of block_size tokens (0 = 16). Caller frees with sd_kv_free. A
 * model with a sliding window gets a window group (kv.h): its windowed
 * layers hold about a window per sequence, not a context (model_window.c
 * sizes it; sd_kv_params_of(kv)->window_blocks says how many). */
sd_status sd_model_kv_create(const sd_model *m, int32_t max_seqs, int32_t n_blocks, int32_t block_size, sd_kv **out);

/* The window pool sd_model_kv_create would give m's cache (0: no window
 * group), for a TP leader to tell its ranks. */
int32_t sd_model_kv_window_blocks(const sd_model *m, int32_t max_seqs, int32_t n_blocks, int32_t block_size);

/* A TP rank's cache (rank > 0: it runs the leader's plans and keeps no
 * bookkeeping): the leader's pool shape, n_blocks main blocks and, with
 * window_blocks > 0 (the leader's sd_model_kv_window_blocks; m must have a
 * sliding window), a window group of that many; 0: none, as the leader's.
 * Caller frees with sd_kv_free. */
sd_status sd_model_kv_create_rank(const sd_model *m, int32_t n_blocks, int32_t block_size, int32_t window_blocks,
                                  sd_kv **out);

/* A ragged batch. For each sequence the tokens present must continue it:
 * the first new token of seq s has pos == sd_kv_seq_len(kv, s) at call time
 * and the following ones pos+1, pos+2, ... in the order they appear (tokens
 * of different sequences may interleave). */
typedef struct sd_batch {
    int32_t n_tokens;
    const int32_t *tokens; /* [n_tokens] token ids in [0, n_vocab) */
    const int32_t *pos;    /* [n_tokens] positions */
    const int32_t *seq;    /* [n_tokens] sequence slots in [0, max_seqs) */
    const bool *logits;    /* [n_tokens] rows whose logits are wanted; NULL = none */
} sd_batch;

/* Runs the batch: appends every token's K/V to kv (growing its sequences;
 * SD_ERR_OUT_OF_BLOCKS leaves kv unchanged) and writes the logits of the
 * wanted rows, in batch order, to out[n_wanted * n_vocab]. Validates ids,
 * positions and slots first (SD_ERR_RANGE / SD_ERR_INVALID_ARG with a log
 * line). Not thread-safe per model: one forward at a time; it uses the
 * model's own worker threads. */
sd_status sd_model_forward(sd_model *m, sd_kv *kv, const sd_batch *b, float *out);

/* sd_model_forward with logits for the first n_head token ids only, out
 * [n_wanted * n_head]: the LM head's other rows are not computed (a draft
 * model's vocabulary cut, drafter.h). Each logit equals sd_model_forward's
 * bit for bit on the CPU backend. n_head outside [1, n_vocab] is
 * SD_ERR_RANGE; n_head < n_vocab in a tensor-parallel group is
 * SD_ERR_UNSUPPORTED. */
sd_status sd_model_forward_head(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out);

/* True when the model's backend verifies drafts next to the logits (a GPU):
 * sd_model_forward_verify then never copies the target distributions out.
 * sd_backend_opts.host_verify at load turns it off. */
bool sd_model_verifies_on_device(const sd_model *m);

/* Runs b like sd_model_forward, keeps the wanted rows' logits where they
 * were computed, and verifies seqs[n_seqs] from them (each sequence's
 * row0 indexes the wanted rows in batch order) with the backend's verifier.
 * Per-sequence problems go to seqs[i].status; the return value is the
 * forward's or the device's failure. Only for models where
 * sd_model_verifies_on_device is true (SD_ERR_UNSUPPORTED otherwise). */
struct sd_spec_rows;
sd_status sd_model_forward_verify(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_seqs, struct sd_spec_rows *seqs);

/* ---- token trees (model_tree.c): many drafts verified in one forward ---- */

/* One sequence's token tree. Node i is a token whose parent is an earlier
 * node, or -1: it continues the cached context. A node's position is the
 * sequence's length at the call plus its depth (roots at depth 0). */
typedef struct sd_tree_batch {
    int32_t seq;           /* sequence slot */
    int32_t n_nodes;       /* >= 1 */
    const int32_t *tokens; /* [n_nodes] token ids */
    const int32_t *parent; /* [n_nodes] parent[i] in [-1, i) */
    const bool *logits;    /* [n_nodes] rows whose logits are wanted; NULL = every row */
} sd_tree_batch;

/* Runs the tree in one forward: every node attends to the sequence's cached
 * positions and its own ancestors only, and its logits (wanted rows, in node
 * order, out [n_wanted][n_vocab]) equal bit for bit what the path from a
 * root to it gives run as a chain (sd_model_forward). The cache grows by
 * n_nodes rows (node i's K/V at position base + i): the caller then keeps a
 * path with sd_model_tree_keep. Feature capture sees one row per node.
 * SD_ERR_UNSUPPORTED (logged) on a backend without tree attention (CUDA),
 * in a tensor-parallel group, or for layers beyond Llama's. */
sd_status sd_model_forward_tree(sd_model *m, sd_kv *kv, const sd_tree_batch *t, float *out);

/* After sd_model_forward_tree on seq at base (its length before the call):
 * keeps nodes[0..n_keep) (increasing, nodes[j] >= j: a path of the tree, or
 * any rows in chain order) as positions base .. base + n_keep - 1 by copying
 * their K/V rows down, and truncates seq there. The cache then equals, bit
 * for bit, what running those tokens as a chain would have left. */
sd_status sd_model_tree_keep(sd_model *m, sd_kv *kv, int32_t seq, int32_t base, int32_t n_keep, const int32_t *nodes);

/* ---- feature capture (EAGLE-3 draft heads and their training data) ----
 * Opt-in: with a capture set, every forward of m (on the leader) also copies
 * out, for every row of its batch, the residual stream after each listed
 * layer (layer id j = the output of layer j, 0-based: what layer j + 1
 * reads) and, with final, the LM head's input (the final norm of the last
 * layer's output). While no capture is set nothing is copied: the forward
 * only tests one pointer per layer. A device backend downloads the whole
 * residual stream once per captured layer. */
#define SD_MODEL_CAPTURE_MAX 8

/* Sets the capture (n_layers in [1, SD_MODEL_CAPTURE_MAX], ids in
 * [0, layers used)) or clears it (n_layers 0). SD_ERR_RANGE with a log
 * line for an id out of range. */
sd_status sd_model_capture_set(sd_model *m, int32_t n_layers, const int32_t *layer_ids, bool final);

/* The last forward's capture: aux [n_rows][n_layers * n_embd] (row order of
 * the batch; per row the layers in the order set), final [n_rows][n_embd]
 * (NULL unless asked). Borrowed: valid until the next forward or
 * sd_model_capture_set. NULL with *n_rows 0 when nothing was captured. */
const float *sd_model_capture_aux(const sd_model *m, int32_t *n_rows);
const float *sd_model_capture_final(const sd_model *m, int32_t *n_rows);

/* out[n][n_embd] = the embedding table's rows ids[n], as f32 on the host
 * (dequantized when stored quantized): what a draft head without its own
 * embedding reads. SD_ERR_RANGE for an id outside the vocabulary. */
sd_status sd_model_embed_host(const sd_model *m, const int32_t *ids, int32_t n, float *out);

/* Bytes of weights the forward pass reads per step (for bandwidth figures). */
uint64_t sd_model_weight_bytes(const sd_model *m);

/* Bytes of weights this process holds, in the backend's formats, the
 * embedding table included: on a tensor-parallel rank 1/tp of the layers
 * plus the replicated parts (norms, embedding table, its LM head rows). */
uint64_t sd_model_resident_bytes(const sd_model *m);

/* Of those, the bytes used in place from the model file's mapping (not
 * copied; shared with every process that maps the same file): matrices
 * kept as stored whose rows are whole in the file (model_load.c). */
uint64_t sd_model_mapped_bytes(const sd_model *m);

/* ---- tensor parallelism ---- */

/* This process's shard: which heads, MLP columns and vocabulary rows it
 * holds. */
typedef struct sd_model_shard {
    int32_t tp_rank, tp_size;
    int32_t n_heads, head0;       /* query heads [head0, head0 + n_heads) */
    int32_t n_kv_heads, kv_head0; /* KV heads held (replicated when fewer than ranks) */
    int32_t n_ff, ff0;            /* MLP columns [ff0, ff0 + n_ff) */
    int32_t n_vocab, vocab0;      /* LM head rows [vocab0, vocab0 + n_vocab); n_vocab 0 = none */
    sd_tp_lm_head lm_head;        /* the mode in effect (SPLIT falls back to LEADER when tp does not divide n_vocab) */
} sd_model_shard;

void sd_model_shard_of(const sd_model *m, sd_model_shard *out);

/* Time this model spent in its group's collectives since the last reset
 * (for benchmarks): calls and seconds, each including the wait for the
 * slowest rank (shm). NCCL runs on the model's stream and the calls only
 * enqueue: their seconds are the enqueue's, the wait is in the forward. */
typedef struct sd_model_tp_stats {
    uint64_t all_reduces, gathers;
    double all_reduce_s, gather_s;
} sd_model_tp_stats;

/* Copies the counters into *out (may be NULL) and, with reset, zeroes them. */
void sd_model_tp_stats_get(sd_model *m, sd_model_tp_stats *out, bool reset);

/* Sets the group (borrowed; must outlive its use) whose collectives every
 * forward runs: its rank and size must be the model's, and its kind fit the
 * backend (shm for the CPU, nccl for CUDA). A NCCL group is moved onto the
 * model's stream (sd_coll_use_stream) and stays there: one group serves one
 * model. NULL detaches it (the group itself is not touched). */
sd_status sd_model_set_coll(sd_model *m, sd_coll *coll);

/* What every rank of a tensor-parallel group needs to run one forward in
 * lockstep with the leader: the batch rows with their positions, the KV
 * block tables of the leader's allocation (ranks keep no cache bookkeeping
 * of their own, only the pools, so their block ids are the leader's by
 * construction), and the rows whose logits are wanted. Arrays borrowed. */
typedef struct sd_model_plan {
    int32_t n_tokens;
    const int32_t *tokens; /* [n_tokens] token ids */
    const int32_t *pos;    /* [n_tokens] positions */
    const int32_t *bt_off; /* [n_tokens] where each token's block table starts in bt */
    int32_t n_bt;
    const int32_t *bt; /* [n_bt] block ids: the batch's tables one after another */
    int32_t n_wanted;
    const int32_t *wanted; /* [n_wanted] rows (increasing) whose logits are wanted */
    /* [n_bt] or NULL: the windowed layers' blocks (a cache with a window
     * group, kv.h), at bt's offsets, -1 where freed. A rank's cache has the
     * leader's window pool (sd_model_kv_create_rank), so the ids hold there
     * too; a rank refuses a plan whose table it lacks or does not expect. */
    const int32_t *bt_win;
} sd_model_plan;

/* Called by the leader's forward once the batch is validated and the cache
 * grown, before any op runs; it must get the plan to the other ranks (they
 * run sd_model_forward_plan on it). An error fails the forward, which gives
 * the new positions back. */
typedef sd_status (*sd_model_plan_fn)(void *user, const sd_model_plan *plan);

/* Installs fn (NULL: none) on the leader's model. */
void sd_model_set_plan_sink(sd_model *m, sd_model_plan_fn fn, void *user);

/* A rank r > 0 of a group runs the leader's plan: the same ops on its own
 * shard, writing K/V into kv's pools at the plan's blocks (kv's own lengths
 * and tables are not used; it needs the leader's n_blocks and block_size).
 * Every index is checked against kv and the vocabulary first (SD_ERR_RANGE
 * with a log line: a rank never trusts a message). The logits are the
 * leader's; a rank computes its LM head rows and sends them in the gather. */
sd_status sd_model_forward_plan(sd_model *m, sd_kv *kv, const sd_model_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
