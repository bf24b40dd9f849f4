/*
 * A running xxh3_64 digest that an executor folds the bytes of a READ into while it copies them.
 *
 * Why: a caller that checks what it received (refhub verifies every byte of a replica) would
 * otherwise read each piece again after it landed, in Python, a second pass over memory (or at
 * best over L2). Folded inside the copy loop, each 64 KiB run is hashed right after it was
 * written, from L1/L2, by the same compiled loop.
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
 */
#ifndef TENT_DIGEST_H
#define TENT_DIGEST_H

#include <stddef.h>
#include <stdint.h>
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
#define XXH_TARGET_SSE2 __attribute__((__target__("sse2")))
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
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
__attribute__((noinline)) XXH_TARGET_SSE2 static void tent_xxh3_update_sse2(XXH3_state_t *st, const void *p, size_t n) {
  XXH3_update(st, (const xxh_u8 *)p, n, XXH3_accumulate_sse2, XXH3_scrambleAcc_sse2);
}
#endif
#ifdef TENT_DIGEST_POP_OPTIONS
#pragma GCC pop_options
#undef TENT_DIGEST_POP_OPTIONS
#endif

/* XXH3_64bits_update on the fastest code path this CPU runs */
static inline void tent_xxh3_update(XXH3_state_t *st, const void *p, size_t n) {
#ifdef TENT_DIGEST_AVX2
  static int avx2 = -1; /* racy first use is benign: every thread computes the same answer */
  if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
  if (avx2)
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

/* bytes copied then folded at a time: the run is still in L1/L2 when the hash reads it back */
#define TENT_DIGEST_RUN (64u << 10)

typedef struct tent_digest {
  XXH3_state_t state; /* 64-byte aligned (allocate the struct with that alignment) */
  uint64_t next;      /* local address the next folded byte must come from */
  uint64_t folded;    /* bytes folded so far (all sources) */
} tent_digest_t;

static inline void tent_digest_reset(tent_digest_t *d, uint64_t next) {
  XXH3_64bits_reset(&d->state);
  d->next = next;
  d->folded = 0;
}

/* Fold n bytes at p (which must be the stream's next bytes, at address d->next). */
static inline void tent_digest_update(tent_digest_t *d, const void *p, size_t n) {
  tent_xxh3_update(&d->state, p, n);
  d->next += n;
  d->folded += n;
}

static inline uint64_t tent_digest_value(const tent_digest_t *d) { return XXH3_64bits_digest(&d->state); }

/* memcpy(dst, src, n) that also folds dst's new bytes when dst continues the stream (d may be
 * NULL: a plain copy). Returns 1 when the bytes were folded. */
static inline int tent_digest_copy(tent_digest_t *d, void *dst, const void *src, size_t n) {
  if (!d || (uint64_t)(uintptr_t)dst != d->next) {
    memcpy(dst, src, n);
    return 0;
  }
  char *o = (char *)dst;
  const char *i = (const char *)src;
  while (n > 0) {
    size_t run = n < TENT_DIGEST_RUN ? n : TENT_DIGEST_RUN;
    memcpy(o, i, run);
    tent_xxh3_update(&d->state, o, run); /* from the copy just written: hot in this core's cache */
    o += run;
    i += run;
    n -= run;
  }
  d->folded += (uint64_t)(o - (char *)dst);
  d->next = (uint64_t)(uintptr_t)o;
  return 1;
}

#ifdef __cplusplus
}
#endif
#endif
