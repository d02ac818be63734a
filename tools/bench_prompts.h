/* bench_prompts.h — prompt files: bench/prompts/, tests/data/spec_prompts.txt,
 * tools/eagle/prompts/train.txt (bench_prompts.c). */
#ifndef SPECD_BENCH_PROMPTS_H
#define SPECD_BENCH_PROMPTS_H

#include <stddef.h>

/* Reads one prompt per line of path into a malloc'd array *out[*n] of
 * malloc'd strings: empty lines and lines starting with "#" skipped, a
 * trailing "\r" dropped, the two characters "\n" read as a newline. Returns
 * 0, or -1 with a message on stderr (nothing allocated) when the file cannot
 * be read or memory runs out. Free with sd_bench_prompts_free. */
int sd_bench_read_prompt_file(const char *path, char ***out, size_t *n);
void sd_bench_prompts_free(char **lines, size_t n);

/* The first max prompts of path (as sd_bench_read_prompt_file reads them)
 * into out[0..max). Returns how many (>= 0), or -1 as above. The caller
 * frees each out[i]. */
int sd_bench_read_prompts(const char *path, char **out, int max);

/* The two characters "\n" to a newline, in place. */
void sd_bench_unescape_newlines(char *s);

#endif
