/* Drives tent/sha256.h and tent/auth.h for tests/test_auth_c.py.
 *   auth_check sha256 <hex>                -> hex digest
 *   auth_check hmac <keyhex> <msghex>      -> hex mac
 *   auth_check client|server <fd> <keyhex> <ctxhex> <timeout_ms>
 *                                          -> "ok" or "<rc> <why>" (exit 0 either way)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent/auth.h"

static size_t unhex(const char *s, uint8_t *out, size_t cap) {
    size_t n = strlen(s) / 2;
    if (n > cap) {
        fprintf(stderr, "input too long\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            fprintf(stderr, "bad hex\n");
            exit(2);
        }
        out[i] = (uint8_t)v;
    }
    return n;
}

static void hexout(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        printf("%02x", p[i]);
    printf("\n");
}

int main(int argc, char **argv) {
    static uint8_t a[1 << 20], b[1 << 20];
    uint8_t out[32];
    if (argc == 3 && !strcmp(argv[1], "sha256")) {
        size_t n = unhex(argv[2], a, sizeof a);
        tent_sha256(a, n, out);
        hexout(out, 32);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "hmac")) {
        size_t kn = unhex(argv[2], a, sizeof a), mn = unhex(argv[3], b, sizeof b);
        tent_hmac_sha256(a, kn, b, mn, out);
        hexout(out, 32);
        return 0;
    }
    if (argc == 6 && (!strcmp(argv[1], "client") || !strcmp(argv[1], "server"))) {
        int fd = atoi(argv[2]);
        size_t kn = unhex(argv[3], a, sizeof a), cn = unhex(argv[4], b, sizeof b);
        char why[256] = "";
        int rc = !strcmp(argv[1], "client") ? tent_auth_client(fd, a, kn, b, cn, atoi(argv[5]), why, sizeof why)
                                            : tent_auth_server(fd, a, kn, b, cn, atoi(argv[5]), why, sizeof why);
        if (rc == 0)
            printf("ok\n");
        else
            printf("%d %s\n", rc, why);
        return 0;
    }
    fprintf(stderr, "usage: see the source\n");
    return 2;
}
