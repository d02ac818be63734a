/* model_tree.c — a token tree verified in one forward (model.h,
 * sd_model_forward_tree / sd_model_tree_keep).
 *
 * Layout. The tree's nodes are rows of one ordinary forward over one
 * sequence: node i is stored at position base + i (base = the sequence's
 * length), so the cache grows as for a chain of n_nodes and every row of
 * the batch machinery (validation, growth, block tables, capture, logits)
 * is model_forward.c's. What differs is where a node is: its logical
 * position base + depth(i) (RoPE's), and what it sees: the sequence's rows
 * below base in place, then its ancestors' and its own rows in depth order
 * (the backend's attention_tree). Attention reads those keys in position
 * order with attention's own arithmetic, and every other op is per row, so
 * each node's logits, K and V equal bit for bit what the path from the
 * root to it gives run as a chain (test_spec_tree).
 *
 * After verification the caller keeps the accepted path with
 * sd_model_tree_keep: the kept nodes' K/V rows are copied down to
 * consecutive positions base, base + 1, ... (each node's row was computed at
 * its logical position, so the copy is the row a chain would have written)
 * and the sequence is truncated after them. Measured alternative: rolling
 * back to base and re-running the accepted tokens costs a second forward;
 * the copy costs 2 x layers row copies per kept node. The rows copied lie
 * at or past base, in blocks this forward grew or the sequence's last,
 * partial block, which the prefix cache never shares (kv.h: a truncation
 * stops before a shared block), so a shared block is never written.
 *
 * Refused (a clear error): a backend without attention_tree (CUDA today: no
 * device kernel yet), a tensor-parallel group (the plan carries no tree),
 * and layers beyond Llama's (model_arch.c: windows, NeoX RoPE, q/k norms). */
#include "model_impl.h"

#include <stdlib.h>
#include <string.h>

/* Checks what the tree needs of the model: SD_OK or why not (logged). */
static sd_status tree_supported(const sd_model *m) {
    if (!m->be.ops->attention_tree || !m->be.ops->host_memory) {
        SD_ERROR("model: backend %s does not verify token trees (tree drafting runs on the CPU backend; use chains "
                 "on this one)",
                 m->be.ops->name);
        return SD_ERR_UNSUPPORTED;
    }
    if (m->coll || m->shard.tp_size > 1) {
        SD_ERROR("model: token trees are not supported in a tensor-parallel group");
        return SD_ERR_UNSUPPORTED;
    }
    for (int32_t l = 0; l < m->n_layers_used; l++)
        if (sd_model_layer_is_arch(m, l)) {
            SD_ERROR("model: token trees support Llama layers only (layer %d has another architecture's parts: "
                     "biases, NeoX RoPE, q/k norms or a sliding window)",
                     (int)l);
            return SD_ERR_UNSUPPORTED;
        }
    return SD_OK;
}

sd_status sd_model_forward_tree(sd_model *m, sd_kv *kv, const sd_tree_batch *t, float *out) {
    if (!m || !kv || !t || t->n_nodes < 1 || !t->tokens || !t->parent) {
        SD_ERROR("model: a tree forward needs a model, a cache and at least one node with tokens and parents");
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(tree_supported(m));
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (t->seq < 0 || t->seq >= kp->max_seqs) {
        SD_ERROR("model: tree sequence slot %d outside [0, %d)", (int)t->seq, (int)kp->max_seqs);
        return SD_ERR_RANGE;
    }
    const int32_t n = t->n_nodes, base = sd_kv_seq_len(kv, t->seq);
    if (n > INT32_MAX / (n + 1) || (int64_t)base + n >= INT32_MAX) {
        SD_ERROR("model: a tree of %d nodes after %d positions is too large", (int)n, (int)base);
        return SD_ERR_RANGE;
    }
    for (int32_t i = 0; i < n; i++)
        if (t->parent[i] < -1 || t->parent[i] >= i) {
            SD_ERROR("model: tree node %d has parent %d (a parent comes before its child, -1 for the context)", (int)i,
                     (int)t->parent[i]);
            return SD_ERR_INVALID_ARG;
        }
    /* per node: storage and logical position, its path's offset; the path
     * (its depth + 1 storage positions) is filled leaf-to-root */
    int32_t *store = malloc((size_t)n * sizeof *store), *logical = malloc((size_t)n * sizeof *logical);
    int32_t *seq = malloc((size_t)n * sizeof *seq), *path_off = malloc((size_t)n * sizeof *path_off);
    int32_t *path = NULL;
    sd_status s = store && logical && seq && path_off ? SD_OK : SD_ERR_NOMEM;
    size_t n_path = 0;
    for (int32_t i = 0; s == SD_OK && i < n; i++) {
        int32_t depth = t->parent[i] < 0 ? 0 : logical[t->parent[i]] - base + 1;
        store[i] = base + i;
        logical[i] = base + depth;
        seq[i] = t->seq;
        path_off[i] = (int32_t)n_path;
        n_path += (size_t)depth + 1;
    }
    if (s == SD_OK && !(path = malloc(n_path * sizeof *path))) s = SD_ERR_NOMEM;
    for (int32_t i = 0; s == SD_OK && i < n; i++)
        for (int32_t v = i, d = logical[i] - base; v >= 0; v = t->parent[v], d--) path[path_off[i] + d] = base + v;
    if (s == SD_OK) {
        const sd_attn_tree at = {.base = base, .path_off = path_off, .path = path};
        bool *all = NULL;
        if (!t->logits && !(all = malloc((size_t)n * sizeof *all))) s = SD_ERR_NOMEM;
        for (int32_t i = 0; all && i < n; i++) all[i] = true;
        const sd_batch b = {n, t->tokens, store, seq, t->logits ? t->logits : all};
        if (s == SD_OK) {
            m->tree_pos = logical;
            m->tree = &at;
            s = sd_model_forward(m, kv, &b, out);
            m->tree = NULL;
            m->tree_pos = NULL;
        }
        free(all);
    } else {
        SD_ERROR("model: out of memory planning a tree of %d nodes", (int)n);
    }
    free(store);
    free(logical);
    free(seq);
    free(path_off);
    free(path);
    return s;
}

sd_status sd_model_tree_keep(sd_model *m, sd_kv *kv, int32_t seq, int32_t base, int32_t n_keep, const int32_t *nodes) {
    if (!m || !kv || base < 0 || n_keep < 0 || (n_keep > 0 && !nodes)) return SD_ERR_INVALID_ARG;
    SD_TRY(tree_supported(m));
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (seq < 0 || seq >= kp->max_seqs) return SD_ERR_RANGE;
    const int32_t len = sd_kv_seq_len(kv, seq);
    for (int32_t j = 0; j < n_keep; j++)
        if (nodes[j] < j || (j > 0 && nodes[j] <= nodes[j - 1]) || (int64_t)base + nodes[j] >= len) {
            SD_ERROR("model: kept tree node %d is node %d (nodes increase, node j >= j, inside the %d stored)", (int)j,
                     (int)nodes[j], (int)(len - base));
            return SD_ERR_RANGE;
        }
    const size_t row = (size_t)kp->n_kv_heads * (size_t)kp->head_dim * (kp->type == SD_DTYPE_F16 ? 2 : sizeof(float));
    /* destinations j <= nodes[j] and nodes increase: row j is never read after it is written */
    for (int32_t j = 0; j < n_keep; j++) {
        if (nodes[j] == j) continue;
        for (int32_t l = 0; l < m->n_layers_used; l++) {
            memcpy(sd_kv_k(kv, l, seq, base + j), sd_kv_k(kv, l, seq, base + nodes[j]), row);
            memcpy(sd_kv_v(kv, l, seq, base + j), sd_kv_v(kv, l, seq, base + nodes[j]), row);
        }
    }
    return sd_kv_truncate(kv, seq, base + n_keep);
}
