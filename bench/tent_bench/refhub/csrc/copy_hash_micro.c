/* Microbenchmark: what verifying every received byte costs when the hash runs inside the copy
 * (fused: each worker hashes the piece it just wrote, still in its L2) vs after it (refhub today:
 * the copy lands, then another thread hashes the destination from memory).
 *
 *   cc -O2 -march=native -pthread bench/tent_bench/refhub/csrc/copy_hash_micro.c -o /tmp/copy_hash_micro
 *   /tmp/copy_hash_micro [MiB=512] [threads=2] [piece_KiB=256] [rounds=5]
 *
 * Needs xxhash.h (Debian/Ubuntu: libxxhash-dev); header only (XXH_INLINE_ALL), no library.
 * Modes, each over the same src -> dst bytes, `threads` copy workers taking pieces in order:
 *   copy        memcpy pieces (the shm executor's work: memcpy of page-aligned pieces)
 *   copy+hash   copy, then one xxh3_64 over the destination on one thread (refhub's verify today)
 *   copy+hash2  copy, then xxh3_64 of the destination split over `threads` threads
 *   fused       each worker memcpy's a piece, then xxh3_64's that destination piece (per-piece digests)
 * Prints wall GB/s and CPU seconds per GiB (the process, all threads): medians over rounds. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint8_t *src, *dst;
static size_t total, piece;
static int nthreads;
static atomic_size_t next_piece;
static int mode_hash_in_copy;
static uint64_t *digests;

static double now(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *copy_worker(void *arg) {
  (void)arg;
  size_t n = (total + piece - 1) / piece;
  for (;;) {
    size_t i = atomic_fetch_add(&next_piece, 1);
    if (i >= n) return NULL;
    size_t off = i * piece, len = off + piece <= total ? piece : total - off;
    memcpy(dst + off, src + off, len);
    if (mode_hash_in_copy) digests[i] = XXH3_64bits(dst + off, len);
  }
}

typedef struct {
  size_t off, len;
  uint64_t h;
} span_t;

static void *hash_worker(void *arg) {
  span_t *s = arg;
  s->h = XXH3_64bits(dst + s->off, s->len);
  return NULL;
}

static void run_copy(int fused) {
  pthread_t th[64];
  atomic_store(&next_piece, 0);
  mode_hash_in_copy = fused;
  for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, copy_worker, NULL);
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
}

static void run_hash(int threads) {
  pthread_t th[64];
  span_t sp[64];
  size_t per = (total / threads + 4095) & ~(size_t)4095;
  for (int i = 0; i < threads; i++) {
    sp[i].off = per * i < total ? per * i : total;
    sp[i].len = sp[i].off + per <= total ? per : total - sp[i].off;
    pthread_create(&th[i], NULL, hash_worker, &sp[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  total = (size_t)(argc > 1 ? atof(argv[1]) : 512) << 20;
  nthreads = argc > 2 ? atoi(argv[2]) : 2;
  piece = (size_t)(argc > 3 ? atof(argv[3]) : 256) << 10;
  int rounds = argc > 4 ? atoi(argv[4]) : 5;
  if (nthreads < 1 || nthreads > 64 || piece == 0 || rounds < 1) return 2;
  src = aligned_alloc(4096, total);
  dst = aligned_alloc(4096, total);
  digests = calloc(total / piece + 1, sizeof *digests);
  if (!src || !dst || !digests) return 1;
  uint64_t x = 0x9e3779b97f4a7c15ull; /* a pattern that never repeats */
  for (size_t i = 0; i < total / 8; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ((uint64_t *)src)[i] = x;
  }
  memset(dst, 1, total); /* pre-faulted, as a receiver's tensors are */
  const char *names[] = {"copy", "copy+hash", "copy+hash2", "fused"};
  double gib = total / (double)(1 << 30);
  printf("%zu MiB, %d copy threads, %zu KiB pieces, %d rounds (medians)\n", total >> 20, nthreads, piece >> 10, rounds);
  double wall[4][64], cpu[4][64];
  if (rounds > 64) rounds = 64;
  for (int r = 0; r < rounds; r++) {
    for (int m = 0; m < 4; m++) { /* interleaved: every mode once per round */
      memset(dst, (int)(r * 4 + m), total);
      double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
      run_copy(m == 3);
      if (m == 1) run_hash(1);
      if (m == 2) run_hash(nthreads);
      wall[m][r] = now(CLOCK_MONOTONIC) - w0;
      cpu[m][r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
      if (memcmp(src, dst, total) != 0) return 3;
    }
  }
  double base = 0;
  for (int m = 0; m < 4; m++) {
    qsort(wall[m], rounds, sizeof(double), cmp);
    qsort(cpu[m], rounds, sizeof(double), cmp);
    double w = wall[m][rounds / 2], c = cpu[m][rounds / 2];
    if (m == 0) base = w;
    printf("%-11s %6.2f GB/s  %.3f CPU-s/GiB  wall vs copy %.2fx\n", names[m], total / w / 1e9, c / gib, base / w);
  }
  return 0;
}
