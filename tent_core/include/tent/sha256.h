/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), header-only, no dependencies.
 *
 * What the executors need to run the peer authentication handshake (tent/auth.h) without
 * linking OpenSSL: a few hashes per connection, never on the data path. Checked against
 * Python's hashlib/hmac over random inputs of every length class (tests/test_auth_c.py).
 */
#ifndef TENT_SHA256_H
#define TENT_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TENT_SHA256_BYTES 32
#define TENT_SHA256_BLOCK 64

typedef struct {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t buf[TENT_SHA256_BLOCK];
    size_t n; /* bytes in buf */
} tent_sha256_ctx;

static const uint32_t tent_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

static inline uint32_t tent_sha256_ror(uint32_t x, unsigned r) { return (x >> r) | (x << (32u - r)); }

static inline void tent_sha256_compress(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) |
               (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = tent_sha256_ror(w[i - 15], 7) ^ tent_sha256_ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = tent_sha256_ror(w[i - 2], 17) ^ tent_sha256_ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = tent_sha256_ror(e, 6) ^ tent_sha256_ror(e, 11) ^ tent_sha256_ror(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + tent_sha256_k[i] + w[i];
        uint32_t S0 = tent_sha256_ror(a, 2) ^ tent_sha256_ror(a, 13) ^ tent_sha256_ror(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

static inline void tent_sha256_init(tent_sha256_ctx *c) {
    static const uint32_t iv[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(c->h, iv, sizeof iv);
    c->total = 0;
    c->n = 0;
}

static inline void tent_sha256_update(tent_sha256_ctx *c, const void *data, size_t len) {
    const uint8_t *p = (const uint8_t *)data;
    c->total += len;
    if (c->n) {
        size_t take = TENT_SHA256_BLOCK - c->n < len ? TENT_SHA256_BLOCK - c->n : len;
        memcpy(c->buf + c->n, p, take);
        c->n += take;
        p += take;
        len -= take;
        if (c->n < TENT_SHA256_BLOCK)
            return;
        tent_sha256_compress(c->h, c->buf);
        c->n = 0;
    }
    for (; len >= TENT_SHA256_BLOCK; p += TENT_SHA256_BLOCK, len -= TENT_SHA256_BLOCK)
        tent_sha256_compress(c->h, p);
    if (len) {
        memcpy(c->buf, p, len);
        c->n = len;
    }
}

static inline void tent_sha256_final(tent_sha256_ctx *c, uint8_t out[TENT_SHA256_BYTES]) {
    uint64_t bits = c->total * 8u;
    c->buf[c->n++] = 0x80;
    if (c->n > 56) {
        memset(c->buf + c->n, 0, TENT_SHA256_BLOCK - c->n);
        tent_sha256_compress(c->h, c->buf);
        c->n = 0;
    }
    memset(c->buf + c->n, 0, 56 - c->n);
    for (int i = 0; i < 8; i++)
        c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    tent_sha256_compress(c->h, c->buf);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    memset(c, 0, sizeof *c);
}

static inline void tent_sha256(const void *data, size_t len, uint8_t out[TENT_SHA256_BYTES]) {
    tent_sha256_ctx c;
    tent_sha256_init(&c);
    tent_sha256_update(&c, data, len);
    tent_sha256_final(&c, out);
}

/* HMAC-SHA256 over the concatenation of `nparts` byte strings (no temporary buffer needed). */
typedef struct {
    const void *p;
    size_t n;
} tent_bytes;

static inline void tent_hmac_sha256_parts(const uint8_t *key, size_t key_len, const tent_bytes *parts, int nparts,
                                          uint8_t out[TENT_SHA256_BYTES]) {
    uint8_t k[TENT_SHA256_BLOCK] = {0}, pad[TENT_SHA256_BLOCK], inner[TENT_SHA256_BYTES];
    if (key_len > TENT_SHA256_BLOCK)
        tent_sha256(key, key_len, k);
    else
        memcpy(k, key, key_len);
    tent_sha256_ctx c;
    for (int i = 0; i < TENT_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    tent_sha256_init(&c);
    tent_sha256_update(&c, pad, sizeof pad);
    for (int i = 0; i < nparts; i++)
        tent_sha256_update(&c, parts[i].p, parts[i].n);
    tent_sha256_final(&c, inner);
    for (int i = 0; i < TENT_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    tent_sha256_init(&c);
    tent_sha256_update(&c, pad, sizeof pad);
    tent_sha256_update(&c, inner, sizeof inner);
    tent_sha256_final(&c, out);
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
}

static inline void tent_hmac_sha256(const uint8_t *key, size_t key_len, const void *msg, size_t len,
                                    uint8_t out[TENT_SHA256_BYTES]) {
    tent_bytes part = {msg, len};
    tent_hmac_sha256_parts(key, key_len, &part, 1, out);
}

/* Constant-time equality of two byte strings of length n: 1 if equal. */
static inline int tent_ct_equal(const uint8_t *a, const uint8_t *b, size_t n) {
    volatile uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= (uint8_t)(a[i] ^ b[i]);
    return acc == 0;
}

#endif /* TENT_SHA256_H */
