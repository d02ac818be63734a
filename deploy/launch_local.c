/* launch_local.c — a local launch closed to other users (launch_local.h).
 *
 * Why ipc:// in a 0700 directory rather than CurveZMQ keys made per launch
 * (both were asked for, issue 37): connecting to a Unix socket needs search
 * permission on its directory, so the kernel refuses every other uid before
 * libzmq sees a byte (root excepted, who can read any key file anyway), and
 * nothing is encrypted per message: a step pays no crypto, the sockets are
 * no slower than loopback TCP, and there is no key file to leak or rotate.
 * Keys stay what crosses hosts (--curve). The directory is
 * BASE/specd-UID/launch-PID; BASE/specd-UID must be the user's own with mode
 * 0700 (else refused: someone else could have planted it), and
 * BASE/specd-UID/current names the client address for specd-client and
 * specd-gateway started without --coordinator (sd_client_discover checks the
 * same ownership before trusting it). */
#include "launch_local.h"

#include "specd/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* path exists as a directory owned by us with no group/other bits, or is
 * made so. */
static bool private_dir(const char *path) {
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        SD_ERROR("cannot make %s: %s", path, strerror(errno));
        return false;
    }
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
        SD_ERROR("%s is not a directory of this user with mode 0700: refusing to put the service's sockets there",
                 path);
        return false;
    }
    return true;
}

bool launch_local_make(const char *base, launch_local *l) {
    memset(l, 0, sizeof *l);
    if (!base || !base[0]) base = "/tmp";
    if (strlen(base) > 200) { /* a Unix socket path holds 107 bytes anyway */
        SD_ERROR("runtime directory %s: too long a path for the service's sockets", base);
        return false;
    }
    snprintf(l->user_dir, sizeof l->user_dir, "%s/specd-%u", base, (unsigned)getuid());
    snprintf(l->dir, sizeof l->dir, "%s/launch-%d", l->user_dir, (int)getpid());
    if (!private_dir(l->user_dir) || !private_dir(l->dir)) return false;
    snprintf(l->client, sizeof l->client, "ipc://%s/client", l->dir);
    snprintf(l->worker, sizeof l->worker, "ipc://%s/worker", l->dir);
    snprintf(l->group, sizeof l->group, "ipc://%s/group", l->dir);
    l->on = true;
    return true;
}

bool launch_local_publish(const launch_local *l, const char *client_addr) {
    char tmp[600], path[600];
    snprintf(path, sizeof path, "%s/current", l->user_dir);
    snprintf(tmp, sizeof tmp, "%s/.current-%d", l->user_dir, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        SD_WARN("cannot write %s: %s", tmp, strerror(errno));
        return false;
    }
    size_t n = strlen(client_addr);
    bool ok = write(fd, client_addr, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
    ok = close(fd) == 0 && ok && rename(tmp, path) == 0;
    if (!ok) {
        SD_WARN("cannot record the service's address in %s", path);
        unlink(tmp);
    }
    return ok;
}

void launch_local_remove(const launch_local *l) {
    if (!l->on) return;
    static const char *const names[] = {"client", "worker", "group"};
    char p[700];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", l->dir, names[i]);
        unlink(p);
    }
    rmdir(l->dir); /* fails, harmlessly, while a group socket -N of another group is left */
    /* the record, when it still names this launch */
    snprintf(p, sizeof p, "%s/current", l->user_dir);
    char buf[700] = {0};
    FILE *f = fopen(p, "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
        fclose(f);
        if (strncmp(buf, l->client, strlen(l->client)) == 0) unlink(p);
    }
}
