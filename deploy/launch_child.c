/* launch_child.c — a child process's binary and command line for
 * specd-launch (launch_child.h). */
#include "launch_child.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool is_executable(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

bool launch_find_binary(const launch_opts *o, const char *name, const char *subdir, char *out, size_t n) {
    char cand[PATH_MAX];
    if (o->bin_dir) {
        snprintf(cand, sizeof cand, "%s/%s", o->bin_dir, name);
        if (is_executable(cand)) return snprintf(out, n, "%s", cand), true;
        snprintf(cand, sizeof cand, "%s/%s/%s", o->bin_dir, subdir, name);
        if (is_executable(cand)) return snprintf(out, n, "%s", cand), true;
        return false;
    }
    char self[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    if (l > 0) {
        self[l] = 0;
        char *dir = dirname(self); /* .../build/deploy */
        snprintf(cand, sizeof cand, "%s/../%s/%s", dir, subdir, name);
        if (is_executable(cand)) return snprintf(out, n, "%s", cand), true;
        snprintf(cand, sizeof cand, "%s/%s", dir, name);
        if (is_executable(cand)) return snprintf(out, n, "%s", cand), true;
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(cand, sizeof cand, "%.*s/%s", (int)len, path, name);
        if (len && is_executable(cand)) return snprintf(out, n, "%s", cand), true;
        path = colon ? colon + 1 : NULL;
    }
    return false;
}

/* ---- building each child's command line ----
 * The flags are the processes' own (see each one's --help). */

static void push(launch_child *c, int *argc, const char *a) {
    if (*argc < LAUNCH_MAX_ARGV - 1) c->argv[(*argc)++] = (char *)a;
}

static const char *int_arg(launch_child *c, int slot, long v) {
    snprintf(c->argbuf[slot], sizeof c->argbuf[slot], "%ld", v);
    return c->argbuf[slot];
}

/* --curve: each child's own secret key, the key of the server it connects
 * to, and the allow-lists of the sockets it binds (launch_keys.c). */
static void push_keys(const launch_argv_ctx *x, launch_child *c, int *n) {
    static const launch_key key_of[CHILD_ROLE_COUNT] = {LAUNCH_KEY_COORDINATOR, LAUNCH_KEY_VERIFIER, LAUNCH_KEY_DRAFTER,
                                                        LAUNCH_KEY_GATEWAY};
    launch_key who = c->role == CHILD_VERIFIER && c->rank > 0 ? LAUNCH_KEY_RANK : key_of[c->role];
    const char *args[LAUNCH_KEY_MAX_ARGS];
    int k = launch_keys_args(x->keys, who, x->o->tp, args);
    for (int i = 0; i < k; i++) push(c, n, args[i]);
}

void launch_build_argv(const launch_argv_ctx *x, launch_child *c) {
    const launch_opts *o = x->o;
    int n = 0;
    push(c, &n, c->path);
    switch (c->role) {
    case CHILD_COORDINATOR:
        push(c, &n, "--model");
        push(c, &n, o->target);
        push(c, &n, "--client-addr");
        push(c, &n, o->client_addr);
        push(c, &n, "--worker-addr");
        push(c, &n, o->worker_addr);
        if (o->local_ngram) push(c, &n, "--local-ngram");
        break;
    case CHILD_VERIFIER:
        push(c, &n, "--model");
        push(c, &n, o->target);
        push(c, &n, "--coordinator");
        push(c, &n, x->worker_connect);
        if (o->tp > 1) {
            push(c, &n, "--tp");
            push(c, &n, int_arg(c, 0, o->tp));
            push(c, &n, "--rank");
            push(c, &n, int_arg(c, 1, c->rank));
            push(c, &n, "--group");
            push(c, &n, x->group_addr);
        }
        push(c, &n, "--group-id");
        push(c, &n, int_arg(c, 4, c->group + 1));
        if (o->eagle && c->rank == 0) { /* a group's head lives in its leader */
            push(c, &n, "--eagle");
            push(c, &n, o->eagle);
            if (o->eagle_weights) push(c, &n, "--eagle-weights"), push(c, &n, o->eagle_weights);
        }
        if (o->device_base >= 0) {
            push(c, &n, "--device");
            snprintf(c->argbuf[3], sizeof c->argbuf[3], "cuda:%d", o->device_base + c->group * o->tp + c->rank);
            push(c, &n, c->argbuf[3]);
        }
        if (o->threads_verifier > 0) {
            push(c, &n, "--threads");
            push(c, &n, int_arg(c, 2, o->threads_verifier));
        }
        break;
    case CHILD_GATEWAY:
        push(c, &n, "--listen");
        push(c, &n, o->http);
        push(c, &n, "--coordinator");
        push(c, &n, x->client_connect);
        push(c, &n, "--model-name");
        push(c, &n, o->model_name);
        break;
    case CHILD_ROLE_COUNT: break;
    case CHILD_DRAFTER: {
        const drafter_spec *d = &o->drafters[c->drafter];
        if (d->kind == DRAFT_MODEL) {
            push(c, &n, "--model");
            push(c, &n, d->model);
        } else { /* over the target: n-gram (its vocabulary only), its first L layers, or a head (its embedding) */
            if (d->kind == DRAFT_NGRAM) push(c, &n, "--ngram");
            if (d->kind == DRAFT_LAYERS || d->kind == DRAFT_EAGLE) {
                push(c, &n, d->kind == DRAFT_EAGLE ? "--eagle" : "--draft-layers");
                push(c, &n, d->kind == DRAFT_EAGLE ? d->model : int_arg(c, 0, d->layers));
            }
            if (d->kind == DRAFT_EAGLE && o->eagle_weights)
                push(c, &n, "--eagle-weights"), push(c, &n, o->eagle_weights);
            push(c, &n, "--model");
            push(c, &n, o->target);
        }
        push(c, &n, "--coordinator");
        push(c, &n, x->worker_connect);
        if (o->threads_drafter > 0) {
            push(c, &n, "--threads");
            push(c, &n, int_arg(c, 2, o->threads_drafter));
        }
        break;
    }
    }
    if (o->curve_dir) push_keys(x, c, &n);
    if (o->verbose) push(c, &n, "-v");
    for (int i = 0; i < o->n_extra[c->role]; i++) push(c, &n, o->extra[c->role][i]);
    c->argv[n] = NULL;
}
