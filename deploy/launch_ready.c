/* launch_ready.c — specd-launch's readiness questions (launch_ready.h):
 * readiness is asked of the coordinator itself, not guessed from log lines. */
#include "launch_ready.h"

#include "specd/common.h"
#include "specd/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

/* True when something accepts TCP connections at the gateway's ADDR:PORT
 * (a wildcard host is tried on the loopback). */
bool launch_gateway_listening(const char *http) {
    char host[128];
    const char *colon = strrchr(http, ':');
    if (!colon) return false;
    size_t hl = (size_t)(colon - http);
    if (http[0] == '[' && hl >= 2) http++, hl -= 2; /* [IPv6] */
    if (hl >= sizeof host) return false;
    memcpy(host, http, hl);
    host[hl] = '\0';
    int port = atoi(colon + 1);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    socklen_t len;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        if (a4->sin_addr.s_addr == htonl(INADDR_ANY)) a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        len = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        if (IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr)) a6->sin6_addr = in6addr_loopback;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        len = sizeof *a6;
    } else {
        return false;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    bool ok = connect(fd, (struct sockaddr *)&ss, len) == 0;
    close(fd);
    return ok;
}
