/* gguf_impl.h — internals shared by the GGUF reader and writer.
 *
 * The writer's sd_gguf_writer_copy_kv needs the raw encoded bytes of a
 * metadata value so that it can copy any value (nested arrays included)
 * without re-encoding it; the reader exposes them here rather than in the
 * public header, because no other module should depend on the encoding. */
#ifndef SPECD_GGUF_IMPL_H
#define SPECD_GGUF_IMPL_H

#include "specd/gguf.h"

/* Maximum nesting of arrays inside arrays (an array of arrays is depth 2). */
#define SD_GGUF_MAX_ARRAY_DEPTH 8

/* Raw encoded value of metadata entry i: the bytes after the entry's type id
 * (borrowed, points into the mapping). Returns false when i is out of range. */
bool sd_gguf_kv_raw(const sd_gguf *g, int64_t i, const uint8_t **bytes, size_t *n_bytes);

/* Size in bytes of one element of a fixed-size metadata type; 0 for string,
 * array and unknown ids. */
size_t sd_gguf_type_size(sd_gguf_type t);

/* The file mapping behind g with a new reference (sd_file_map_release it);
 * NULL when g reads a caller's buffer (sd_gguf_open_buffer). */
struct sd_file_map;
struct sd_file_map *sd_gguf_file_map(const sd_gguf *g);

#endif
