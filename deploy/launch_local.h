/* launch_local.h — a local launch closed to other users (launch_local.c):
 * without keys and without addresses given, specd-launch puts its ZeroMQ
 * sockets (ipc://) in a directory only its user may enter, and says where
 * in a file of that user's that specd-client and specd-gateway read when
 * no --coordinator is given (specd/client.h, sd_client_discover). */
#ifndef SPECD_LAUNCH_LOCAL_H
#define SPECD_LAUNCH_LOCAL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct launch_local {
    bool on;
    char dir[512];                             /* BASE/specd-UID/launch-PID (mode 0700) */
    char user_dir[256];                        /* BASE/specd-UID (mode 0700) */
    char client[600], worker[600], group[600]; /* ipc://DIR/client ... */
} launch_local;

/* Makes the private directory under base ($XDG_RUNTIME_DIR, else /tmp) and
 * fills the three addresses. False (logged) when the user's directory is
 * not the user's own with mode 0700 or cannot be made. */
bool launch_local_make(const char *base, launch_local *l);
/* Records client_addr as where this user's service is (BASE/specd-UID/current). */
bool launch_local_publish(const launch_local *l, const char *client_addr);
/* Removes the sockets, the directory and the record (when it is still ours). */
void launch_local_remove(const launch_local *l);

#endif
