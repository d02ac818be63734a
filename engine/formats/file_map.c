/* file_map.c — a read-only file mapping shared by its users (weights.h).
 *
 * The GGUF reader maps its file; a model that computes on the weights as
 * stored points into that mapping instead of copying (model_load.c), and
 * must keep it after the reader is closed. So the mapping has a count of
 * references: the reader holds one, every model that points into it one
 * more, and the last release unmaps. Pages of a file mapped read-only are
 * the page cache's, shared by every process that maps the same file: a
 * verifier and a drafter on one model hold its weights once. */
#include "specd/weights.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

struct sd_file_map {
    const void *base;
    size_t size;
    atomic_int refs;
};

sd_file_map *sd_file_map_adopt(const void *base, size_t size) {
    sd_file_map *m = malloc(sizeof *m);
    if (!m) return NULL;
    m->base = base;
    m->size = size;
    atomic_init(&m->refs, 1);
    return m;
}

sd_file_map *sd_file_map_retain(sd_file_map *m) {
    if (m) atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    return m;
}

void sd_file_map_release(sd_file_map **m) {
    if (!m || !*m) return;
    if (atomic_fetch_sub_explicit(&(*m)->refs, 1, memory_order_acq_rel) == 1) {
        munmap((void *)(*m)->base, (*m)->size);
        free(*m);
    }
    *m = NULL;
}

size_t sd_file_map_size(const sd_file_map *m) { return m ? m->size : 0; }
