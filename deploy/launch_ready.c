/* launch_ready.c — specd-launch's readiness questions (launch_ready.h):
 * readiness is asked of the coordinator itself, not guessed from log lines. */
#include "launch_ready.h"

#include "specd/common.h"
#include "specd/net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void launch_ready_query(launch_ready *r) {
    Specd__StatsQuery q = SPECD__STATS_QUERY__INIT;
    q.include_workers = true;
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_STATS;
    env.stats = &q;
    if (sd_net_send(r->sock, NULL, 0, &env.base) != SD_OK) SD_DEBUG("stats query not sent (coordinator not up yet)");
    r->last_query_ms = launch_now_ms();
}

/* Reads every waiting reply and updates who is alive. */
void launch_ready_read(launch_ready *r) {
    for (;;) {
        sd_net_msg m = {0};
        if (sd_net_recv(r->sock, false, true, &m) != SD_OK) {
            sd_net_msg_clear(&m);
            return;
        }
        Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
        char err[256];
        Specd__CoordinatorToClient *env = sd_net_decode_to_client(m.body, m.body_len, &code, err, sizeof err);
        sd_net_msg_clear(&m);
        if (!env) {
            SD_WARN("undecodable reply from the coordinator (%s): %s", sd_net_code_name(code), err);
            continue;
        }
        switch (env->body_case) {
        case SPECD__COORDINATOR_TO_CLIENT__BODY_STATS: {
            int v = 0, d = 0;
            for (size_t i = 0; i < env->stats->n_workers; i++) {
                const Specd__WorkerInfo *w = env->stats->workers[i];
                if (!w->alive) continue;
                if (w->role == SPECD__ROLE__ROLE_VERIFIER && w->rank == 0) v++;
                if (w->role == SPECD__ROLE__ROLE_DRAFTER) d++;
            }
            r->groups_alive = v;
            r->drafters_alive = d;
            break;
        }
        case SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR:
            SD_WARN("coordinator answered the stats query with %s: %s", sd_net_code_name(env->error->code),
                    env->error->message);
            break;
        default: SD_DEBUG("ignoring coordinator message %d", (int)env->body_case); break;
        }
        specd__coordinator_to_client__free_unpacked(env, NULL);
    }
}

/* True when a TCP socket on this host listens on port (IPv4 or IPv6), read
 * from /proc/net/tcp{,6}: asking never connects. (A connect loop to a
 * port that nobody has bound yet is how a TCP self-connect happens when
 * the port lies in the ephemeral range: the probe itself could take the
 * port it waits for.) */
bool launch_port_listening(int port) {
    static const char *const tables[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        if (!f) continue;
        char line[512];
        bool found = false;
        if (!fgets(line, sizeof line, f)) line[0] = '\0'; /* the header */
        while (!found && fgets(line, sizeof line, f)) {
            /* "  sl  local_address rem_address   st ...": local ADDR:PORT (hex), state 0A = LISTEN */
            char local[128], remote[128];
            unsigned st;
            if (sscanf(line, "%*d: %127s %127s %x", local, remote, &st) != 3) continue;
            const char *colon = strrchr(local, ':');
            found = colon && st == 0x0A && strtol(colon + 1, NULL, 16) == port;
        }
        fclose(f);
        if (found) return true;
    }
    return false;
}

bool launch_gateway_listening(const char *http) {
    const char *colon = strrchr(http, ':');
    return colon && launch_port_listening(atoi(colon + 1));
}

bool launch_zmq_bound(const char *addr) {
    struct stat st;
    if (strncmp(addr, "ipc://", 6) == 0) return stat(addr + 6, &st) == 0 && S_ISSOCK(st.st_mode);
    if (strncmp(addr, "tcp://", 6) != 0) return true; /* inproc:// and others: nothing to wait for */
    const char *colon = strrchr(addr + 6, ':');
    return colon && launch_port_listening(atoi(colon + 1));
}

bool launch_port_ephemeral(int port) {
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int lo = 0, hi = -1;
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) hi = -1;
        fclose(f);
    }
    return port >= lo && port <= hi;
}
