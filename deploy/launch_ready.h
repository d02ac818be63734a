/* launch_ready.h — specd-launch's readiness questions: which workers the
 * coordinator has registered (a StatsQuery over the client link), and
 * whether the gateway accepts connections. */
#ifndef SPECD_LAUNCH_READY_H
#define SPECD_LAUNCH_READY_H

#include <stdbool.h>

typedef struct launch_ready {
    void *zctx, *sock; /* a DEALER on the coordinator's client link */
    double last_query_ms;
    int groups_alive, drafters_alive; /* registered verifier leaders / drafters */
} launch_ready;

/* Sends a StatsQuery (a failed send is logged at DEBUG: the coordinator may not be up yet). */
void launch_ready_query(launch_ready *r);
/* Reads every waiting reply and updates who is alive. */
void launch_ready_read(launch_ready *r);
/* True when a socket on this host listens on TCP port (/proc/net/tcp and
 * tcp6; never connects, so it cannot self-connect to the port it asks about). */
bool launch_port_listening(int port);
/* True when something listens on the gateway's ADDR:PORT port. */
bool launch_gateway_listening(const char *http);
/* True when a ZeroMQ bind address is bound: tcp://HOST:PORT listening,
 * ipc://PATH a socket file (other transports: true). */
bool launch_zmq_bound(const char *addr);
/* True when port lies in the kernel's ephemeral range (ip_local_port_range),
 * where outgoing connections take their source ports. */
bool launch_port_ephemeral(int port);
/* Monotonic milliseconds (specd-launch.c). */
double launch_now_ms(void);

#endif
