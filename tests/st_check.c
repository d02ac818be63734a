/* st_check — opens .safetensors files with specd's reader, for the
 * differential test against the reference implementation
 * (tests/ref/test_hf_oracle.py).
 *
 *   st_check FILE...
 * prints one line per file: "ok N" (N tensors) or "error RULE" (the rule
 * named at the start of the reader's message). Exit 0 unless a file could
 * not be examined at all. */
#include <stdio.h>
#include <string.h>

#include "specd/safetensors.h"

int main(int argc, char **argv) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
    for (int i = 1; i < argc; i++) {
        char err[512] = "";
        sd_safetensors *st = NULL;
        sd_status s = sd_safetensors_open(argv[i], &st, err, sizeof err);
        if (s == SD_OK) {
            printf("ok %lld\n", (long long)sd_safetensors_n_tensors(st));
            sd_safetensors_close(&st);
        } else {
            const char *colon = strchr(err, ':');
            printf("error %.*s\n", colon ? (int)(colon - err) : (int)strlen(err), err);
        }
    }
    return 0;
}
