/* client_discover.c — where this user's local service is (specd/client.h,
 * sd_client_discover): the address specd-launch recorded in
 * BASE/specd-UID/current (deploy/launch_local.c). Trusted only when that
 * directory is this user's own with mode 0700 and the file this user's:
 * another user could otherwise point our clients at a coordinator of theirs
 * and read the prompts. */
#include "specd/client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool ours(const char *path, bool dir) {
    struct stat st;
    if (lstat(path, &st) != 0 || st.st_uid != getuid()) return false;
    return dir ? S_ISDIR(st.st_mode) && (st.st_mode & 077) == 0 : S_ISREG(st.st_mode) && (st.st_mode & 022) == 0;
}

bool sd_client_discover(const char *runtime_base, char *out, size_t out_len) {
    if (!out || out_len == 0) return false;
    out[0] = '\0';
    if (!runtime_base || !runtime_base[0]) runtime_base = "/tmp";
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/specd-%u", runtime_base, (unsigned)getuid());
    snprintf(path, sizeof path, "%s/current", dir);
    if (!ours(dir, true) || !ours(path, false)) return false;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[600];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok) return false;
    line[strcspn(line, "\r\n")] = '\0';
    if (strncmp(line, "ipc://", 6) != 0 && strncmp(line, "tcp://", 6) != 0) return false;
    if (strlen(line) >= out_len) return false;
    snprintf(out, out_len, "%s", line);
    return true;
}
