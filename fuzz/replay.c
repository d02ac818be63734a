/* replay.c — main() of the fuzz targets' replay programs (fuzz_*_replay).
 *
 * Runs LLVMFuzzerTestOneInput once on each file named on the command line,
 * each read into a buffer of exactly its size so that ASan sees an
 * over-read. This is how CTest runs the seed corpora (fuzz/corpus/NAME) with
 * any compiler; libFuzzer builds (clang) bring their own main instead. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    int n_run = 0;
    for (int a = 1; a < argc; a++) {
        FILE *f = fopen(argv[a], "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", argv[a]);
            return 1;
        }
        long len = -1;
        if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
        if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
            fprintf(stderr, "cannot size %s\n", argv[a]);
            fclose(f);
            return 1;
        }
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
            fprintf(stderr, "cannot read %s\n", argv[a]);
            fclose(f);
            free(buf);
            return 1;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(buf, (size_t)len);
        free(buf);
        n_run++;
    }
    printf("replayed %d inputs\n", n_run);
    return 0;
}
