/* bench_prompts.h — the prompt files of bench/prompts/ (bench_prompts.c). */
#ifndef SPECD_BENCH_PROMPTS_H
#define SPECD_BENCH_PROMPTS_H

/* Reads one prompt per non-empty line of path into out[0..max), the two
 * characters "\n" in a line standing for a newline. Returns the number read
 * (>= 0), or -1 with a message on stderr when the file cannot be read. The
 * caller frees each out[i]. */
int sd_bench_read_prompts(const char *path, char **out, int max);

/* The two characters "\n" to a newline, in place. */
void sd_bench_unescape_newlines(char *s);

#endif
