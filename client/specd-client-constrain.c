/* specd-client-constrain.c — specd-client's structured output options:
 * --json-schema FILE, --regex RE, --grammar FILE, --response-json become
 * the request's constraint (SubmitRequest.constraint). The text is sent as
 * given; the coordinator compiles it and refuses what it cannot serve. */
#include "specd-client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FILE's bytes, NUL-terminated, malloc'd; NULL with a message when it
 * cannot be read, holds a NUL or is over SD_MAX_CONSTRAINT_BYTES. */
static char *read_text(const char *opt, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "specd-client: %s: cannot open %s\n", opt, path);
        return NULL;
    }
    char *buf = malloc(SD_MAX_CONSTRAINT_BYTES + 2);
    size_t n = buf ? fread(buf, 1, SD_MAX_CONSTRAINT_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) {
        fprintf(stderr, "specd-client: out of memory reading %s\n", path);
        return NULL;
    }
    buf[n] = '\0';
    const char *why = n > SD_MAX_CONSTRAINT_BYTES ? "over the limit of " : n == 0 ? "empty" : NULL;
    if (!why && memchr(buf, '\0', n)) why = "holds a NUL byte";
    if (why) {
        fprintf(stderr, "specd-client: %s: %s is %s", opt, path, why);
        if (n > SD_MAX_CONSTRAINT_BYTES) fprintf(stderr, "%d bytes", SD_MAX_CONSTRAINT_BYTES);
        fputc('\n', stderr);
        free(buf);
        return NULL;
    }
    return buf;
}

int cli_constraint_load(options *o) {
    int n = (o->schema_path != NULL) + (o->regex != NULL) + (o->grammar_path != NULL) + o->response_json;
    if (n == 0) return 0;
    if (n > 1) {
        fprintf(stderr, "specd-client: --json-schema, --regex, --grammar and --response-json exclude each other\n");
        return 2;
    }
    if (o->response_json) {
        o->req.constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT;
        return 0;
    }
    if (o->regex) {
        o->req.constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX;
        o->req.constraint_text = o->regex;
        return 0;
    }
    const char *opt = o->schema_path ? "--json-schema" : "--grammar";
    o->con_text = read_text(opt, o->schema_path ? o->schema_path : o->grammar_path);
    if (!o->con_text) return 2;
    o->req.constraint_kind = o->schema_path ? SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA
                                            : SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR;
    o->req.constraint_text = o->con_text;
    return 0;
}
