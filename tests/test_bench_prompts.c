/* test_bench_prompts.c — the one prompt-file reader (tools/bench_prompts.c)
 * that specd-bench, specd-generate --prompt-file and the greedy tests share:
 * comments, empty lines, CRLF and "\n" escapes, the first max prompts, a
 * missing file; and the repository's prompt files read as their line counts
 * say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench_prompts.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static void test_reader(void **state) {
    (void)state;
    char path[] = "/tmp/specd-prompts-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "# a header, skipped\n"
                     "first prompt\n"
                     "\n"
                     "two\\nlines\r\n"
                     "#also skipped\n"
                     "a \\ backslash stays, \\t too\n"
                     "last, no newline");
    char **lines = NULL;
    size_t n = 0;
    assert_int_equal(sd_bench_read_prompt_file(path, &lines, &n), 0);
    assert_int_equal(n, 4);
    assert_string_equal(lines[0], "first prompt");
    assert_string_equal(lines[1], "two\nlines");
    assert_string_equal(lines[2], "a \\ backslash stays, \\t too");
    assert_string_equal(lines[3], "last, no newline");
    sd_bench_prompts_free(lines, n);
    char *first[2] = {NULL, NULL};
    assert_int_equal(sd_bench_read_prompts(path, first, 2), 2);
    assert_string_equal(first[0], "first prompt");
    assert_string_equal(first[1], "two\nlines");
    free(first[0]);
    free(first[1]);
    char *more[8];
    assert_int_equal(sd_bench_read_prompts(path, more, 8), 4);
    for (int i = 0; i < 4; i++) free(more[i]);
    assert_int_equal(sd_bench_read_prompts(path, more, 0), 0);
    unlink(path);
    assert_int_equal(sd_bench_read_prompt_file(path, &lines, &n), -1);
    assert_null(lines);
    assert_int_equal(n, 0);
    assert_int_equal(sd_bench_read_prompts(path, more, 8), -1);
}

/* The committed files: every non-empty line but train.txt's header. */
static void test_repository_files(void **state) {
    (void)state;
    static const struct {
        const char *file;
        size_t n;
    } files[] = {{"bench/prompts/chat.txt", 8}, {"bench/prompts/code_edit.txt", 8}, {"tools/eagle/prompts/train.txt", 520}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", SPECD_SOURCE_DIR, files[i].file);
        char **lines = NULL;
        size_t n = 0;
        assert_int_equal(sd_bench_read_prompt_file(path, &lines, &n), 0);
        assert_int_equal(n, files[i].n);
        for (size_t j = 0; j < n; j++) assert_true(lines[j][0] != '#' && lines[j][0] != '\0');
        sd_bench_prompts_free(lines, n);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader),
        cmocka_unit_test(test_repository_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
