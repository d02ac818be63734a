/* specd-keygen — writes CurveZMQ key pairs for specd's links.
 *
 *   specd-keygen [--dir DIR] NAME...
 *
 * For each NAME writes DIR/NAME.key (the secret key, mode 0600, never
 * overwritten) and DIR/NAME.pub (the public key), and prints each public key
 * with its name, in the allow-list format, so
 *   specd-keygen --dir keys drafter0 verifier >> keys/workers.allow
 * builds an allow-list. Key generation is zmq_curve_keypair (libsodium or
 * tweetnacl inside libzmq); nothing here is cryptography of our own. */
#include "specd/curve.h"
#include "specd/net.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f, "usage: specd-keygen [--dir DIR] NAME...\n"
               "Writes a CurveZMQ key pair per NAME: DIR/NAME.key (secret, mode 0600; an existing file is never\n"
               "overwritten) and DIR/NAME.pub (public), and prints 'PUBLIC NAME' lines (the allow-list format of\n"
               "specd-coordinator --client-keys/--worker-keys and specd-verifier --rank-keys).\n"
               "  --dir DIR   where the files go (default: the current directory; created with mode 0700)\n"
               "  -h, --help  this help\n");
}

static bool name_ok(const char *n) {
    if (!n[0] || strlen(n) > 64) return false;
    for (const char *c = n; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == '.'))
            return false;
    return n[0] != '.';
}

int main(int argc, char **argv) {
    const char *dir = ".";
    static const struct option longs[] = {{"dir", required_argument, 0, 'd'}, {"help", no_argument, 0, 'h'}, {0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (o == 'd') {
            dir = optarg;
        } else if (o == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    sd_net_log_init("keygen", 0, false);
    for (int i = optind; i < argc; i++)
        if (!name_ok(argv[i])) {
            fprintf(stderr, "specd-keygen: bad name '%s' (letters, digits, '-', '_', '.'; at most 64)\n", argv[i]);
            return 2;
        }
    if (mkdir(dir, 0700) != 0) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "specd-keygen: cannot create the directory %s\n", dir);
            return 1;
        }
    }
    for (int i = optind; i < argc; i++) {
        char pub[SD_CURVE_Z85_LEN + 1];
        if (sd_curve_keygen(dir, argv[i], pub) != SD_OK) return 1;
        printf("%s %s\n", pub, argv[i]);
    }
    return 0;
}
