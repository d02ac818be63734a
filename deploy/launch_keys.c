/* launch_keys.c — keys for specd-launch --curve DIR (launch_keys.h).
 *
 * One key pair per role rather than one for the whole service: the
 * coordinator's allow-lists then tell clients from workers (a client key
 * can never register a worker), and the client key handed to the user can
 * be revoked by regenerating it alone. Existing pairs are reused so a
 * restart does not invalidate keys already given out. */
#include "launch_keys.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const NAMES[LAUNCH_KEY_COUNT] = {"coordinator", "verifier", "rank",  "drafter",
                                                    "gateway",     "client",   "launch"};

/* Writes an allow-list of the given keys' public halves. */
static sd_status write_allow(const launch_keys *k, const char *path, const launch_key *which, int n) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        SD_ERROR("%s: %s", tmp, strerror(errno));
        return SD_ERR_IO;
    }
    fprintf(f, "# written by specd-launch --curve: one public key per line\n");
    sd_status st = SD_OK;
    for (int i = 0; i < n && st == SD_OK; i++) {
        char pub[SD_CURVE_Z85_LEN + 1];
        st = sd_curve_key_read(k->pub[which[i]], false, pub);
        /* a worker key takes one role only: a drafter's key cannot become the verifier */
        bool worker = which[i] == LAUNCH_KEY_VERIFIER || which[i] == LAUNCH_KEY_DRAFTER;
        if (st == SD_OK)
            fprintf(f, "%s%s%s %s\n", pub, worker ? " role=" : "", worker ? NAMES[which[i]] : "", NAMES[which[i]]);
    }
    if (fclose(f) != 0 && st == SD_OK) st = SD_ERR_IO;
    if (st == SD_OK && rename(tmp, path) != 0) {
        SD_ERROR("%s: %s", path, strerror(errno));
        st = SD_ERR_IO;
    }
    if (st != SD_OK) unlink(tmp);
    return st;
}

int launch_keys_args(const launch_keys *k, launch_key who, int tp, const char *argv[LAUNCH_KEY_MAX_ARGS]) {
    int n = 0;
    const char *server = k->pub[LAUNCH_KEY_COORDINATOR];
    if (who == LAUNCH_KEY_COORDINATOR) {
        argv[n++] = "--client-keys";
        argv[n++] = k->clients_allow;
        argv[n++] = "--worker-keys";
        argv[n++] = k->workers_allow;
        server = NULL;
    } else if (who == LAUNCH_KEY_RANK) {
        server = k->pub[LAUNCH_KEY_VERIFIER]; /* ranks connect to the leader */
    } else if (who == LAUNCH_KEY_VERIFIER && tp > 1) {
        argv[n++] = "--rank-keys";
        argv[n++] = k->ranks_allow;
    }
    argv[n++] = "--curve-secret";
    argv[n++] = k->secret[who];
    if (server) {
        argv[n++] = "--curve-server";
        argv[n++] = server;
    }
    return n;
}

sd_status launch_keys_make(const char *dir, launch_keys *k) {
    memset(k, 0, sizeof *k);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        SD_ERROR("--curve %s: %s", dir, strerror(errno));
        return SD_ERR_IO;
    }
    for (int i = 0; i < LAUNCH_KEY_COUNT; i++) {
        snprintf(k->secret[i], sizeof k->secret[i], "%s/%s.key", dir, NAMES[i]);
        snprintf(k->pub[i], sizeof k->pub[i], "%s/%s.pub", dir, NAMES[i]);
        bool have_secret = access(k->secret[i], F_OK) == 0, have_pub = access(k->pub[i], F_OK) == 0;
        if (have_secret && have_pub) continue;
        if (have_secret != have_pub) {
            SD_ERROR("--curve %s: %s has half a key pair (%s missing); remove the other half to regenerate it", dir,
                     NAMES[i], have_secret ? k->pub[i] : k->secret[i]);
            return SD_ERR_INVALID_ARG;
        }
        SD_TRY(sd_curve_keygen(dir, NAMES[i], NULL));
    }
    snprintf(k->clients_allow, sizeof k->clients_allow, "%s/clients.allow", dir);
    snprintf(k->workers_allow, sizeof k->workers_allow, "%s/workers.allow", dir);
    snprintf(k->ranks_allow, sizeof k->ranks_allow, "%s/ranks.allow", dir);
    static const launch_key clients[] = {LAUNCH_KEY_GATEWAY, LAUNCH_KEY_CLIENT, LAUNCH_KEY_LAUNCH};
    static const launch_key workers[] = {LAUNCH_KEY_VERIFIER, LAUNCH_KEY_DRAFTER};
    static const launch_key ranks[] = {LAUNCH_KEY_RANK};
    SD_TRY(write_allow(k, k->clients_allow, clients, 3));
    SD_TRY(write_allow(k, k->workers_allow, workers, 2));
    SD_TRY(write_allow(k, k->ranks_allow, ranks, 1));
    return sd_curve_id_load(k->secret[LAUNCH_KEY_LAUNCH], k->pub[LAUNCH_KEY_COORDINATOR], &k->launch_id);
}
