/*
 * A running xxh3_64 digest that an executor folds the bytes of a READ into while it copies them.
 *
 * Why: a caller that checks what it received (refhub verifies every byte of a replica) would
 * otherwise read each piece again after it landed, in Python, a second pass over memory (or at
 * best over L2). Folded inside the copy loop (tent_xxh3_copy_update), the hash reads no byte
 * again: with AVX2 each 64-byte stripe the copy loads is fed to XXH3's accumulators from the same
 * registers; without it each 64 KiB run is hashed right after it was written, from L1/L2.
 *
 * The contract (executor_abi.h, host->digest): the caller arms a digest on its own thread for
 * one submit (tent_core: ``engine.submit(requests, deadline, digest=d)``); an executor that
 * copies a READ slice on that thread inside submit_inline asks the host for the digest and, if
 * the slice's local_addr is exactly `next` (the stream continues where the digest stands), copies
 * it with tent_digest_copy() instead of memcpy. Anything else (a slice left to a worker, another
 * transport, a retry on another thread, a slice that does not continue the stream) is simply not
 * folded: `next` stays where it was, and the caller folds [next, end) itself from its buffer
 * (tent_core._native.Digest.update), which keeps the digest the one of the whole stream in order.
 *
 * The digest is exactly XXH3_64bits of the bytes folded, in order (streamed equals one-shot), i.e.
 * python xxhash.xxh3_64_intdigest of the same bytes (xxhash.h vendored beside this header).
 *
 * Folding where bytes land, on any thread (a network receive path, Transport.receive_digest): the
 * answer to a READ lands later, on a worker or the waiting thread, and the pieces of one stream
 * land on several connections at once, out of order. The executor keeps a reference to the digest
 * with the slice (tent_digest_hold when it takes the slice in submit, tent_digest_drop when the
 * slice is reported: the caller's object may be gone by then after a timeout) and calls
 * tent_digest_land(d, p, n) for every run of bytes right after it landed (from that core's
 * cache). A run that continues the stream is hashed at once; one that lands ahead of it is noted
 * (at most TENT_DIGEST_PENDING such runs; one that extends a noted run joins it) and hashed by
 * whichever thread closes the gap, so
 * out-of-order pieces are folded in order, never wrongly; a run it could not note stays unfolded
 * and the caller folds it (tent_digest_land of its whole landed range with wait=1). One thread
 * hashes at a time (the `folding` role); the mutex is held only to move `next` and the notes, never
 * while hashing. A digest bounded by [start, end) (end != 0) takes only bytes of that range: the
 * host hands each slice the armed digest whose range holds its destination (several streams, one
 * batch).
 */
#ifndef TENT_DIGEST_H
#define TENT_DIGEST_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
/* x86-64 with GCC or Clang: the SSE2 accumulate loop (the baseline every x86-64 CPU runs) plus an
 * AVX2 one compiled with a target attribute and picked at run time (the python xxhash wheel hashes at
 * AVX2 speed; an -O2 SSE2 build of XXH3 ran at a third of that over a hot 64 KiB run here). The
 * same digest either way: only the speed differs. The way xxHash's own xxh_x86dispatch.c does it. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(TENT_DIGEST_NO_DISPATCH)
#include <immintrin.h>
#define XXH_X86DISPATCH
#define XXH_DISPATCH_AVX2 1
#define XXH_DISPATCH_AVX512 1
#define XXH_TARGET_SSE2 __attribute__((__target__("sse2")))
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#define XXH_TARGET_AVX512 __attribute__((__target__("avx512f")))
#define TENT_DIGEST_AVX2 1
#endif
/* GCC generates XXH3's loops about 3x faster at -O3 than at the -O2 the extensions build with
 * (xxhash.h says as much): the hash, and only the hash, is compiled -O3. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#pragma GCC push_options
#pragma GCC optimize("O3")
#define TENT_DIGEST_POP_OPTIONS
#endif
#include "tent/xxhash.h"

#ifdef TENT_DIGEST_AVX2
__attribute__((noinline)) XXH_TARGET_AVX2 static void tent_xxh3_update_avx2(XXH3_state_t *st, const void *p, size_t n) {
  XXH3_update(st, (const xxh_u8 *)p, n, XXH3_accumulate_avx2, XXH3_scrambleAcc_avx2);
}
/* the python wheel's loop where the CPU has AVX-512 (its xxh3 hashed ~1.4x faster than the AVX2 one here) */
__attribute__((noinline)) XXH_TARGET_AVX512 static void tent_xxh3_update_avx512(XXH3_state_t *st, const void *p, size_t n) {
  XXH3_update(st, (const xxh_u8 *)p, n, XXH3_accumulate_avx512, XXH3_scrambleAcc_avx512);
}
__attribute__((noinline)) XXH_TARGET_SSE2 static void tent_xxh3_update_sse2(XXH3_state_t *st, const void *p, size_t n) {
  XXH3_update(st, (const xxh_u8 *)p, n, XXH3_accumulate_sse2, XXH3_scrambleAcc_sse2);
}
#endif
#ifdef TENT_DIGEST_AVX2
/* ---- one-pass copy + hash: each 64-byte stripe is loaded once into vector registers, stored to the
 * destination and fed from the same registers to XXH3's accumulate, so the hash's ALU work overlaps
 * the copy's memory traffic and no second read of the run happens. tent__copy_update mirrors
 * XXH3_update step for step (the internal buffer, the stripes of the block and the secret offset in
 * it, the scramble at each block end, the last stripe XXH3 keeps buffered); only the big consume of
 * the input itself is the fused loop, so the state after it is exactly the one XXH3_update leaves. */
#define TENT__FUSED_ACC_AVX2(acc, dst, src, secret, nb)                                                    \
  do {                                                                                                     \
    __m256i a0 = _mm256_load_si256((const __m256i *)(acc)), a1 = _mm256_load_si256((const __m256i *)(acc) + 1); \
    const xxh_u8 *s_ = (src), *k_ = (secret);                                                              \
    xxh_u8 *d_ = (dst);                                                                                    \
    for (size_t n_ = 0; n_ < (nb); n_++, s_ += 64, d_ += 64, k_ += XXH_SECRET_CONSUME_RATE) {              \
      __m256i v0 = _mm256_loadu_si256((const __m256i *)s_), v1 = _mm256_loadu_si256((const __m256i *)s_ + 1); \
      _mm256_storeu_si256((__m256i *)d_, v0);                                                              \
      _mm256_storeu_si256((__m256i *)d_ + 1, v1);                                                          \
      __m256i k0 = _mm256_xor_si256(v0, _mm256_loadu_si256((const __m256i *)k_));                          \
      __m256i k1 = _mm256_xor_si256(v1, _mm256_loadu_si256((const __m256i *)k_ + 1));                      \
      a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_mul_epu32(k0, _mm256_srli_epi64(k0, 32)),         \
                                                 _mm256_shuffle_epi32(v0, _MM_SHUFFLE(1, 0, 3, 2))));      \
      a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_mul_epu32(k1, _mm256_srli_epi64(k1, 32)),         \
                                                 _mm256_shuffle_epi32(v1, _MM_SHUFFLE(1, 0, 3, 2))));      \
    }                                                                                                      \
    _mm256_store_si256((__m256i *)(acc), a0);                                                              \
    _mm256_store_si256((__m256i *)(acc) + 1, a1);                                                          \
  } while (0)

#define TENT__FUSED_ACC_AVX512(acc, dst, src, secret, nb)                                                  \
  do {                                                                                                     \
    __m512i a0 = _mm512_load_si512((const void *)(acc));                                                   \
    const xxh_u8 *s_ = (src), *k_ = (secret);                                                              \
    xxh_u8 *d_ = (dst);                                                                                    \
    for (size_t n_ = 0; n_ < (nb); n_++, s_ += 64, d_ += 64, k_ += XXH_SECRET_CONSUME_RATE) {              \
      __m512i v0 = _mm512_loadu_si512((const void *)s_);                                                   \
      _mm512_storeu_si512((void *)d_, v0);                                                                 \
      __m512i k0 = _mm512_xor_si512(v0, _mm512_loadu_si512((const void *)k_));                             \
      a0 = _mm512_add_epi64(a0, _mm512_add_epi64(_mm512_mul_epu32(k0, _mm512_srli_epi64(k0, 32)),         \
                                                 _mm512_shuffle_epi32(v0, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2)))); \
    }                                                                                                      \
    _mm512_store_si512((void *)(acc), a0);                                                                 \
  } while (0)

/* XXH3_consumeStripes over src, storing each stripe to dst as it is hashed */
#define TENT__FUSED_CONSUME(FUSED, acc, soFar, perBlock, dst, src, nbStripes, secret, secretLimit, scramble)  \
  do {                                                                                                     \
    size_t nb_ = (nbStripes);                                                                              \
    const xxh_u8 *ks_ = (secret) + *(soFar) * XXH_SECRET_CONSUME_RATE;                                     \
    if (nb_ >= (perBlock) - *(soFar)) {                                                                    \
      size_t it_ = (perBlock) - *(soFar);                                                                  \
      do {                                                                                                 \
        FUSED(acc, dst, src, ks_, it_);                                                                    \
        scramble(acc, (secret) + (secretLimit));                                                           \
        src += it_ * XXH_STRIPE_LEN;                                                                       \
        dst += it_ * XXH_STRIPE_LEN;                                                                       \
        nb_ -= it_;                                                                                        \
        it_ = (perBlock);                                                                                  \
        ks_ = (secret);                                                                                    \
      } while (nb_ >= (perBlock));                                                                         \
      *(soFar) = 0;                                                                                        \
    }                                                                                                      \
    if (nb_ > 0) {                                                                                         \
      FUSED(acc, dst, src, ks_, nb_);                                                                      \
      src += nb_ * XXH_STRIPE_LEN;                                                                         \
      dst += nb_ * XXH_STRIPE_LEN;                                                                         \
      *(soFar) += nb_;                                                                                     \
    }                                                                                                      \
  } while (0)

/* memcpy(dst, src, len) + XXH3_64bits_update(st, dst, len) in one pass (XXH3_update's steps) */
#define TENT__COPY_UPDATE(NAME, TARGET, FUSED, ACCUMULATE, SCRAMBLE)                                       \
  __attribute__((noinline, unused)) TARGET static void NAME(XXH3_state_t *st, xxh_u8 *dst, const xxh_u8 *src,     \
                                                           size_t len) {                                       \
    const xxh_u8 *const end = src + len;                                                                   \
    const xxh_u8 *const secret = st->extSecret == NULL ? st->customSecret : st->extSecret;                 \
    XXH_ALIGN(64) xxh_u64 acc[8];                                                                          \
    st->totalLen += len;                                                                                   \
    if (len <= XXH3_INTERNALBUFFER_SIZE - st->bufferedSize) {                                              \
      memcpy(dst, src, len);                                                                               \
      memcpy(st->buffer + st->bufferedSize, dst, len);                                                     \
      st->bufferedSize += (XXH32_hash_t)len;                                                               \
      return;                                                                                              \
    }                                                                                                      \
    memcpy(acc, st->acc, sizeof acc);                                                                      \
    if (st->bufferedSize) {                                                                                \
      size_t load = XXH3_INTERNALBUFFER_SIZE - st->bufferedSize;                                           \
      memcpy(dst, src, load);                                                                              \
      memcpy(st->buffer + st->bufferedSize, dst, load);                                                    \
      src += load;                                                                                         \
      dst += load;                                                                                         \
      XXH3_consumeStripes(acc, &st->nbStripesSoFar, st->nbStripesPerBlock, st->buffer,                     \
                          XXH3_INTERNALBUFFER_SIZE / XXH_STRIPE_LEN, secret, st->secretLimit, ACCUMULATE, SCRAMBLE); \
      st->bufferedSize = 0;                                                                                \
    }                                                                                                      \
    if (end - src > XXH3_INTERNALBUFFER_SIZE) {                                                            \
      size_t nb = (size_t)(end - 1 - src) / XXH_STRIPE_LEN;                                                \
      TENT__FUSED_CONSUME(FUSED, acc, &st->nbStripesSoFar, st->nbStripesPerBlock, dst, src, nb, secret,    \
                          st->secretLimit, SCRAMBLE);                                                      \
      memcpy(st->buffer + sizeof(st->buffer) - XXH_STRIPE_LEN, dst - XXH_STRIPE_LEN, XXH_STRIPE_LEN);      \
    }                                                                                                      \
    memcpy(dst, src, (size_t)(end - src));                                                                 \
    memcpy(st->buffer, dst, (size_t)(end - src));                                                          \
    st->bufferedSize = (XXH32_hash_t)(end - src);                                                          \
    memcpy(st->acc, acc, sizeof acc);                                                                      \
  }

TENT__COPY_UPDATE(tent_xxh3_copy_update_avx2, XXH_TARGET_AVX2, TENT__FUSED_ACC_AVX2, XXH3_accumulate_avx2,
                  XXH3_scrambleAcc_avx2)
TENT__COPY_UPDATE(tent_xxh3_copy_update_avx512, __attribute__((__target__("avx512f,avx2"))), TENT__FUSED_ACC_AVX512,
                  XXH3_accumulate_avx512, XXH3_scrambleAcc_avx512)
#endif
#ifdef TENT_DIGEST_POP_OPTIONS
#pragma GCC pop_options
#undef TENT_DIGEST_POP_OPTIONS
#endif

#ifdef TENT_DIGEST_AVX2
/* 2: AVX-512, 1: AVX2, 0: SSE2 */
static inline int tent_digest_simd(void) {
  static int simd = -1; /* racy first use is benign: every thread computes the same answer */
  if (simd < 0) simd = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
  return simd;
}
#endif

/* XXH3_64bits_update on the fastest code path this CPU runs */
static inline void tent_xxh3_update(XXH3_state_t *st, const void *p, size_t n) {
#ifdef TENT_DIGEST_AVX2
  int simd = tent_digest_simd();
  if (simd == 2)
    tent_xxh3_update_avx512(st, p, n);
  else if (simd == 1)
    tent_xxh3_update_avx2(st, p, n);
  else
    tent_xxh3_update_sse2(st, p, n);
#else
  XXH3_64bits_update(st, p, n);
#endif
}

#ifdef __cplusplus
extern "C" {
#endif

/* bytes copied then folded at a time where the copy and the hash are two passes (no AVX2): the run
 * is still in L1/L2 when the hash reads it back */
#define TENT_DIGEST_RUN (64u << 10)

/* memcpy(dst, src, n), then XXH3_64bits_update(st, dst, n): the same state either way. With AVX2 in
 * one pass (tent_xxh3_copy_update_avx2: the hash's ALU work hides behind the copy's loads and
 * stores; bench/tent_bench/refhub/csrc/copy_hash_fused_micro.c measured it at memcpy's CPU cost per
 * byte, where copy-then-hash cost ~0.02 CPU s/GiB more). The AVX2 loop also where the CPU has
 * AVX-512: the loop is bound by memory, the 512-bit one measured no faster, and on some CPUs 512-bit
 * code lowers the clock. */
static inline void tent_xxh3_copy_update(XXH3_state_t *st, void *dst, const void *src, size_t n) {
#ifdef TENT_DIGEST_AVX2
  if (tent_digest_simd() >= 1) {
    tent_xxh3_copy_update_avx2(st, (xxh_u8 *)dst, (const xxh_u8 *)src, n);
    return;
  }
#endif
  char *o = (char *)dst;
  const char *i = (const char *)src;
  while (n > 0) {
    size_t run = n < TENT_DIGEST_RUN ? n : TENT_DIGEST_RUN;
    memcpy(o, i, run);
    tent_xxh3_update(st, o, run); /* from the copy just written: hot in this core's cache */
    o += run;
    i += run;
    n -= run;
  }
}

/* runs landed ahead of the stream that a digest remembers (their bytes are hashed when the gap closes) */
#define TENT_DIGEST_PENDING 32

typedef struct tent_digest {
  XXH3_state_t state; /* 64-byte aligned (allocate the struct with that alignment) */
  uint64_t next;      /* local address the next folded byte must come from */
  uint64_t folded;    /* bytes folded so far (all sources) */
  uint64_t start, end; /* the stream's local range [start, end); end 0: unbounded */
  /* shared use (tent_digest_land): */
  pthread_mutex_t mu;  /* guards next, folded, folding, the notes (never held while hashing) */
  int folding;         /* a thread is hashing [next, ...) now; the others leave it their runs */
  uint32_t npending;
  uint64_t late;       /* of `folded`, bytes hashed from notes (after the gap before them closed) */
  uint64_t pending[TENT_DIGEST_PENDING][2]; /* landed runs [a, b) ahead of next */
  atomic_uint refs;    /* the owner's and every executor slice's that holds it */
} tent_digest_t;

/* A new digest (64-byte aligned) of the stream [start, end) (end 0: unbounded), one reference held
 * by the caller; NULL when out of memory. */
static inline tent_digest_t *tent_digest_new(uint64_t start, uint64_t end) {
  tent_digest_t *d = aligned_alloc(64, (sizeof(tent_digest_t) + 63) / 64 * 64);
  if (!d) return NULL;
  XXH3_64bits_reset(&d->state);
  d->next = d->start = start;
  d->end = end;
  d->folded = 0;
  pthread_mutex_init(&d->mu, NULL);
  d->folding = 0;
  d->npending = 0;
  d->late = 0;
  atomic_init(&d->refs, 1);
  return d;
}

static inline tent_digest_t *tent_digest_hold(tent_digest_t *d) {
  if (d) atomic_fetch_add(&d->refs, 1);
  return d;
}

static inline void tent_digest_drop(tent_digest_t *d) {
  if (d && atomic_fetch_sub(&d->refs, 1) == 1) {
    pthread_mutex_destroy(&d->mu);
    free(d);
  }
}

/* Does the stream hold local address a? */
static inline int tent_digest_covers(const tent_digest_t *d, uint64_t a) {
  return a >= d->start && (d->end == 0 || a < d->end);
}

/* Empty again, `next` at address next (its range starts there). Not while bytes may still land. */
static inline void tent_digest_reset(tent_digest_t *d, uint64_t next) {
  pthread_mutex_lock(&d->mu);
  XXH3_64bits_reset(&d->state);
  d->next = d->start = next;
  d->folded = 0;
  d->npending = 0;
  d->late = 0;
  pthread_mutex_unlock(&d->mu);
}

/* ---- the folding role: one thread hashes at a time; `mu` held on entry and exit ---- */

/* Take the role (mu held): wait while another thread hashes (at most one run and the notes it
 * drains) when `wait`, else 0 if it is taken. */
static inline int tent_digest__claim(tent_digest_t *d, int wait) {
  while (d->folding) {
    if (!wait) return 0;
    pthread_mutex_unlock(&d->mu);
    sched_yield();
    pthread_mutex_lock(&d->mu);
  }
  d->folding = 1;
  return 1;
}

/* With the role (mu held): hash the noted runs that now continue the stream, drop those behind
 * it; then give the role up. */
static inline void tent_digest__drain(tent_digest_t *d) {
  for (;;) {
    uint64_t a = 0, b = 0;
    for (uint32_t i = 0; i < d->npending;) {
      uint64_t pa = d->pending[i][0], pb = d->pending[i][1];
      if (pb <= d->next) { /* behind the stream (folded another way): forget it */
        d->pending[i][0] = d->pending[d->npending - 1][0];
        d->pending[i][1] = d->pending[--d->npending][1];
        continue;
      }
      if (pa <= d->next && b == 0) {
        a = d->next;
        b = pb;
        d->pending[i][0] = d->pending[d->npending - 1][0];
        d->pending[i][1] = d->pending[--d->npending][1];
        continue;
      }
      i++;
    }
    if (b == 0) break;
    pthread_mutex_unlock(&d->mu);
    tent_xxh3_update(&d->state, (const void *)(uintptr_t)a, (size_t)(b - a));
    pthread_mutex_lock(&d->mu);
    d->next = b;
    d->folded += b - a;
    d->late += b - a;
  }
  d->folding = 0;
}

/* Bytes [p, p + n) of local memory have landed (final: nothing will write them again but the same
 * bytes). Folds what of them continues the stream now, on this thread (from its cache); notes a run
 * ahead of the stream for whichever thread closes the gap; with `wait` (the caller's fallback, all of
 * [start, p + n) landed) waits for a thread hashing now instead of leaving the run to it. Returns the
 * bytes this call hashed itself (the notes it drained included). Any thread; the bytes outside the
 * digest's range are ignored. */
static inline uint64_t tent_digest_land(tent_digest_t *d, const void *p, size_t n, int wait) {
  uint64_t a = (uint64_t)(uintptr_t)p, b = a + n;
  if (!d || n == 0) return 0;
  if (a < d->start) a = d->start;
  if (d->end && b > d->end) b = d->end;
  if (b <= a) return 0;
  pthread_mutex_lock(&d->mu);
  uint64_t before = d->folded;
  if (b <= d->next) { /* folded already */
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  if (a > d->next || !tent_digest__claim(d, wait)) {
    /* ahead of the stream, or another thread hashes now: leave it a note (it drains them before it
     * gives the role up); with no room the caller folds it later */
    if (a < d->next) a = d->next;
    uint32_t i = 0;
    for (; i < d->npending; i++) /* the run that ends where this one starts (the same connection's last) */
      if (d->pending[i][1] == a) {
        d->pending[i][1] = b;
        break;
      }
    if (i == d->npending && d->npending < TENT_DIGEST_PENDING) {
      d->pending[d->npending][0] = a;
      d->pending[d->npending++][1] = b;
    }
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  if (b > d->next) { /* the stream may have moved while this thread waited for the role */
    uint64_t from = d->next > a ? d->next : a;
    if (from == d->next) {
      pthread_mutex_unlock(&d->mu);
      tent_xxh3_update(&d->state, (const void *)(uintptr_t)from, (size_t)(b - from));
      pthread_mutex_lock(&d->mu);
      d->next = b;
      d->folded += b - from;
    }
  }
  tent_digest__drain(d);
  uint64_t mine = d->folded - before;
  pthread_mutex_unlock(&d->mu);
  return mine;
}

/* Fold n bytes at p as the stream's next bytes (whatever their address; `next` advances by n):
 * the caller's own pieces, in order. Waits for a thread hashing now. */
static inline void tent_digest_update(tent_digest_t *d, const void *p, size_t n) {
  pthread_mutex_lock(&d->mu);
  tent_digest__claim(d, 1);
  pthread_mutex_unlock(&d->mu);
  tent_xxh3_update(&d->state, p, n);
  pthread_mutex_lock(&d->mu);
  d->next += n;
  d->folded += n;
  tent_digest__drain(d);
  pthread_mutex_unlock(&d->mu);
}

static inline uint64_t tent_digest_value(tent_digest_t *d) {
  pthread_mutex_lock(&d->mu);
  tent_digest__claim(d, 1); /* a thread hashing now finishes first */
  uint64_t v = XXH3_64bits_digest(&d->state);
  d->folding = 0;
  pthread_mutex_unlock(&d->mu);
  return v;
}

/* memcpy(dst, src, n) that also folds dst's new bytes when dst continues the stream (d may be
 * NULL: a plain copy). Returns 1 when the bytes were folded. */
static inline int tent_digest_copy(tent_digest_t *d, void *dst, const void *src, size_t n) {
  if (d) {
    pthread_mutex_lock(&d->mu);
    if ((uint64_t)(uintptr_t)dst != d->next || (d->end && (uint64_t)(uintptr_t)dst + n > d->end) ||
        !tent_digest__claim(d, 0)) {
      pthread_mutex_unlock(&d->mu);
      d = NULL;
    } else {
      pthread_mutex_unlock(&d->mu);
    }
  }
  if (!d) {
    memcpy(dst, src, n);
    return 0;
  }
  tent_xxh3_copy_update(&d->state, dst, src, n);
  pthread_mutex_lock(&d->mu);
  d->folded += n;
  d->next = (uint64_t)(uintptr_t)dst + n;
  tent_digest__drain(d);
  pthread_mutex_unlock(&d->mu);
  return 1;
}

#ifdef __cplusplus
}
#endif
#endif
