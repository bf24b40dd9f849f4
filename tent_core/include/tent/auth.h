/* The peer authentication handshake of tent_core.auth, for executors' own connections.
 *
 * Same bytes as the Python side (SECURITY.md, "Wire format"): the client sends HELLO, the server
 * answers CHALLENGE (its nonce and its proof), the client checks the proof in constant time and
 * answers RESPONSE (its proof), the server checks it and answers OK or DENY + reason. The key is
 * the per-purpose key the Python side derived from the cluster token (auth.key("tcp")): the
 * token itself never reaches C. `ctx` binds the handshake to what the client expects the server
 * to be (may be empty; both sides must use the same bytes).
 *
 * Both functions run on a connected socket, blocking or not, and give up at `timeout_ms`:
 * a silent or slow peer cannot hold a thread longer than that.
 */
#ifndef TENT_AUTH_H
#define TENT_AUTH_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "sha256.h"

#define TENT_AUTH_VERSION 1u
#define TENT_AUTH_NONCE 32
#define TENT_AUTH_MAC 32
#define TENT_AUTH_HELLO_LEN (8 + 4 + 4 + TENT_AUTH_NONCE)         /* 48 */
#define TENT_AUTH_CHALLENGE_LEN (8 + TENT_AUTH_NONCE + TENT_AUTH_MAC) /* 72 */
#define TENT_AUTH_RESPONSE_LEN (8 + TENT_AUTH_MAC)                 /* 40 */
#define TENT_AUTH_RESULT_LEN 8
#define TENT_AUTH_MAX_REASON 120

enum {
    TENT_AUTH_OK = 0,
    TENT_AUTH_EIO = -1,       /* the connection failed or closed */
    TENT_AUTH_ETIMEDOUT = -2, /* the peer did not finish in time */
    TENT_AUTH_EREFUSED = -3,  /* the peer does not know the key (or refused ours) */
    TENT_AUTH_EPROTO = -4,    /* the peer does not speak this handshake */
};

static const char tent_auth_hello_magic[8] = {'T', 'E', 'N', 'T', 'A', 'U', 'T', 'H'};
static const char tent_auth_challenge_magic[8] = {'T', 'E', 'N', 'T', 'C', 'H', 'A', 'L'};
static const char tent_auth_response_magic[8] = {'T', 'E', 'N', 'T', 'R', 'E', 'S', 'P'};
static const char tent_auth_ok_magic[8] = {'T', 'E', 'N', 'T', 'O', 'K', 0, 0};
static const char tent_auth_deny_magic[8] = {'T', 'E', 'N', 'T', 'D', 'E', 'N', 'Y'};

static inline int64_t tent_auth__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int tent_auth__wait(int fd, short ev, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - tent_auth__now_ms();
        if (left <= 0)
            return TENT_AUTH_ETIMEDOUT;
        struct pollfd p = {fd, ev, 0};
        int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return TENT_AUTH_EIO;
    }
}

static inline int tent_auth__send(int fd, const void *buf, size_t n, int64_t deadline) {
    const uint8_t *p = (const uint8_t *)buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = tent_auth__wait(fd, POLLOUT, deadline);
            if (rc)
                return rc;
        } else {
            return TENT_AUTH_EIO;
        }
    }
    return 0;
}

/* Up to `want` bytes (fewer only at EOF); the count, or a negative TENT_AUTH_E*. */
static inline int tent_auth__recv(int fd, uint8_t *buf, size_t want, int64_t deadline) {
    size_t got = 0;
    while (got < want) {
        ssize_t k = recv(fd, buf + got, want - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
        } else if (k == 0) {
            break;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            int rc = tent_auth__wait(fd, POLLIN, deadline);
            if (rc)
                return rc;
        } else {
            return TENT_AUTH_EIO;
        }
    }
    return (int)got;
}

static inline int tent_auth__nonce(uint8_t out[TENT_AUTH_NONCE]) {
    size_t got = 0;
    while (got < TENT_AUTH_NONCE) {
        ssize_t k = getrandom(out + got, TENT_AUTH_NONCE - got, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return TENT_AUTH_EIO;
        }
        got += (size_t)k;
    }
    return 0;
}

/* label = "tent-auth-v1 server\0" / "client\0" / "session\0"; mac = HMAC(key, label | cn | sn | ctx) */
static inline void tent_auth__mac(const uint8_t *key, size_t key_len, const char *label, const uint8_t *cn,
                                  const uint8_t *sn, const uint8_t *ctx, size_t ctx_len, uint8_t out[TENT_AUTH_MAC]) {
    tent_bytes parts[4] = {{label, strlen(label) + 1}, {cn, TENT_AUTH_NONCE}, {sn, TENT_AUTH_NONCE}, {ctx, ctx_len}};
    tent_hmac_sha256_parts(key, key_len, parts, 4, out);
}

static inline void tent_auth__why(char *why, size_t why_len, const char *msg, const uint8_t *reason, size_t reason_len) {
    if (!why || !why_len)
        return;
    if (reason && reason_len) {
        char r[TENT_AUTH_MAX_REASON + 1];
        size_t n = reason_len > TENT_AUTH_MAX_REASON ? TENT_AUTH_MAX_REASON : reason_len;
        for (size_t i = 0; i < n; i++)
            r[i] = (reason[i] >= 0x20 && reason[i] < 0x7f) ? (char)reason[i] : '?';
        r[n] = 0;
        snprintf(why, why_len, "%s: %s", msg, r);
    } else {
        snprintf(why, why_len, "%s", msg);
    }
}

/* Authenticate to the server at the other end of `fd`. 0, or a TENT_AUTH_E* with `why` set. */
static inline int tent_auth_client(int fd, const uint8_t *key, size_t key_len, const uint8_t *ctx, size_t ctx_len,
                                   int timeout_ms, char *why, size_t why_len) {
    int64_t deadline = tent_auth__now_ms() + timeout_ms;
    uint8_t hello[TENT_AUTH_HELLO_LEN], chal[TENT_AUTH_CHALLENGE_LEN + TENT_AUTH_MAX_REASON];
    uint8_t resp[TENT_AUTH_RESPONSE_LEN], res[TENT_AUTH_RESULT_LEN + TENT_AUTH_MAX_REASON], mac[TENT_AUTH_MAC];
    memcpy(hello, tent_auth_hello_magic, 8);
    uint32_t v = TENT_AUTH_VERSION;
    uint8_t vb[8] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v, 0, 0, 0, 0};
    memcpy(hello + 8, vb, 8);
    const uint8_t *cn = hello + 16;
    if (tent_auth__nonce(hello + 16)) {
        tent_auth__why(why, why_len, "no randomness for the auth nonce", NULL, 0);
        return TENT_AUTH_EIO;
    }
    int rc = tent_auth__send(fd, hello, sizeof hello, deadline);
    if (rc == 0)
        rc = tent_auth__recv(fd, chal, TENT_AUTH_CHALLENGE_LEN, deadline);
    if (rc < 0) {
        tent_auth__why(why, why_len, rc == TENT_AUTH_ETIMEDOUT ? "authentication timed out" : "connection failed during authentication", NULL, 0);
        return rc;
    }
    if (rc >= 8 && memcmp(chal, tent_auth_deny_magic, 8) == 0) {
        tent_auth__why(why, why_len, "peer refused authentication", chal + 8, (size_t)rc - 8);
        return TENT_AUTH_EREFUSED;
    }
    if (rc != TENT_AUTH_CHALLENGE_LEN || memcmp(chal, tent_auth_challenge_magic, 8) != 0) {
        tent_auth__why(why, why_len, "peer does not speak the TENT auth handshake (bad challenge)", NULL, 0);
        return TENT_AUTH_EPROTO;
    }
    const uint8_t *sn = chal + 8, *smac = chal + 8 + TENT_AUTH_NONCE;
    tent_auth__mac(key, key_len, "tent-auth-v1 server", cn, sn, ctx, ctx_len, mac);
    if (!tent_ct_equal(mac, smac, TENT_AUTH_MAC)) {
        tent_auth__why(why, why_len, "peer failed to prove the cluster secret (different auth token, or not the expected peer)", NULL, 0);
        return TENT_AUTH_EREFUSED;
    }
    memcpy(resp, tent_auth_response_magic, 8);
    tent_auth__mac(key, key_len, "tent-auth-v1 client", cn, sn, ctx, ctx_len, resp + 8);
    rc = tent_auth__send(fd, resp, sizeof resp, deadline);
    if (rc == 0)
        rc = tent_auth__recv(fd, res, TENT_AUTH_RESULT_LEN, deadline);
    if (rc < 0) {
        tent_auth__why(why, why_len, rc == TENT_AUTH_ETIMEDOUT ? "authentication timed out" : "connection failed during authentication", NULL, 0);
        return rc;
    }
    if (rc == TENT_AUTH_RESULT_LEN && memcmp(res, tent_auth_ok_magic, 8) == 0)
        return TENT_AUTH_OK;
    if (rc >= 8 && memcmp(res, tent_auth_deny_magic, 8) == 0) {
        int more = tent_auth__recv(fd, res + 8, TENT_AUTH_MAX_REASON, tent_auth__now_ms() + 50);
        tent_auth__why(why, why_len, "peer refused authentication", res + 8, more > 0 ? (size_t)more : 0);
        return TENT_AUTH_EREFUSED;
    }
    tent_auth__why(why, why_len, "peer sent a bad handshake result", NULL, 0);
    return TENT_AUTH_EPROTO;
}

static inline int tent_auth__deny(int fd, const char *reason, int64_t deadline) {
    uint8_t msg[8 + TENT_AUTH_MAX_REASON];
    size_t n = strlen(reason);
    if (n > TENT_AUTH_MAX_REASON)
        n = TENT_AUTH_MAX_REASON;
    memcpy(msg, tent_auth_deny_magic, 8);
    memcpy(msg + 8, reason, n);
    return tent_auth__send(fd, msg, 8 + n, deadline);
}

/* Authenticate the client at the other end of `fd` (sends DENY + reason on failure). */
static inline int tent_auth_server(int fd, const uint8_t *key, size_t key_len, const uint8_t *ctx, size_t ctx_len,
                                   int timeout_ms, char *why, size_t why_len) {
    int64_t deadline = tent_auth__now_ms() + timeout_ms;
    uint8_t hello[TENT_AUTH_HELLO_LEN], chal[TENT_AUTH_CHALLENGE_LEN], resp[TENT_AUTH_RESPONSE_LEN], mac[TENT_AUTH_MAC];
    int rc = tent_auth__recv(fd, hello, sizeof hello, deadline);
    if (rc < 0 || rc != (int)sizeof hello) {
        tent_auth__why(why, why_len, rc == TENT_AUTH_ETIMEDOUT ? "client did not authenticate in time" : "client closed before authenticating", NULL, 0);
        return rc < 0 ? rc : TENT_AUTH_EIO;
    }
    uint32_t version = ((uint32_t)hello[8] << 24) | ((uint32_t)hello[9] << 16) | ((uint32_t)hello[10] << 8) | hello[11];
    if (memcmp(hello, tent_auth_hello_magic, 8) != 0) {
        tent_auth__deny(fd, "expected an auth HELLO (is the peer configured with an auth token?)", deadline);
        tent_auth__why(why, why_len, "client does not speak the TENT auth handshake", NULL, 0);
        return TENT_AUTH_EPROTO;
    }
    if (version != TENT_AUTH_VERSION) {
        tent_auth__deny(fd, "auth handshake version not supported", deadline);
        tent_auth__why(why, why_len, "client speaks another auth handshake version", NULL, 0);
        return TENT_AUTH_EPROTO;
    }
    const uint8_t *cn = hello + 16;
    memcpy(chal, tent_auth_challenge_magic, 8);
    if (tent_auth__nonce(chal + 8)) {
        tent_auth__why(why, why_len, "no randomness for the auth nonce", NULL, 0);
        return TENT_AUTH_EIO;
    }
    const uint8_t *sn = chal + 8;
    tent_auth__mac(key, key_len, "tent-auth-v1 server", cn, sn, ctx, ctx_len, chal + 8 + TENT_AUTH_NONCE);
    rc = tent_auth__send(fd, chal, sizeof chal, deadline);
    if (rc == 0)
        rc = tent_auth__recv(fd, resp, sizeof resp, deadline);
    if (rc < 0 || rc != (int)sizeof resp) {
        tent_auth__why(why, why_len, rc == TENT_AUTH_ETIMEDOUT ? "client did not authenticate in time" : "client closed during authentication", NULL, 0);
        return rc < 0 ? rc : TENT_AUTH_EIO;
    }
    tent_auth__mac(key, key_len, "tent-auth-v1 client", cn, sn, ctx, ctx_len, mac);
    if (memcmp(resp, tent_auth_response_magic, 8) != 0 || !tent_ct_equal(mac, resp + 8, TENT_AUTH_MAC)) {
        tent_auth__deny(fd, "client failed to prove the cluster secret (wrong auth token)", deadline);
        tent_auth__why(why, why_len, "client failed to prove the cluster secret (wrong auth token)", NULL, 0);
        return TENT_AUTH_EREFUSED;
    }
    rc = tent_auth__send(fd, tent_auth_ok_magic, TENT_AUTH_RESULT_LEN, deadline);
    if (rc) {
        tent_auth__why(why, why_len, "connection failed during authentication", NULL, 0);
        return rc;
    }
    return TENT_AUTH_OK;
}

#endif /* TENT_AUTH_H */
