/* Microbenchmark: the cost of hashing a copy's bytes inside the copy, per core. Same src -> dst bytes,
 * each worker thread copying its own region in 64 KiB runs as one xxh3_64 stream:
 *   memcpy       memcpy the runs (what an unverified shm READ costs)
 *   copy,hash    memcpy a run, then XXH3 update over the run just written, hot in L1/L2 (tent_digest_copy
 *                before the fused loop; the hash on the CPU's fastest path, AVX-512 where it has it)
 *   copy,hash2   the same with the AVX2 hash
 *   fused2       one pass: each 64-byte stripe loaded once, stored, and accumulated from the same AVX2
 *                registers (tent_xxh3_copy_update_avx2, tent/digest.h)
 *   fused512     the same with one AVX-512 register per stripe
 *
 *   cc -O2 -march=x86-64 -pthread -Itent_core/include bench/tent_bench/refhub/csrc/copy_hash_fused_micro.c \
 *      -o /tmp/copy_hash_fused_micro
 *   /tmp/copy_hash_fused_micro [region_KiB=262144] [threads=1] [rounds=5] [passes=1]
 *
 * region_KiB per thread: >> L2 (the default 256 MiB) for a working set from memory, or e.g. 256 for hot
 * buffers (then passes > 1 repeats the region to get enough bytes). Every mode runs once per round, in
 * turn (interleaved). Prints per-core GB/s (bytes a thread copied / its wall time) and CPU s/GiB, medians
 * and [min, max] over rounds; checks every digest against one-shot XXH3_64bits of the region. */
#include "tent/digest.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUN (64u << 10)
enum { M_COPY, M_HASH, M_HASH2, M_FUSED2, M_FUSED512, NMODES };
static const char *names[NMODES] = {"memcpy", "copy,hash", "copy,hash2", "fused2", "fused512"};

typedef struct {
  uint8_t *src, *dst;
  size_t len;
  int passes, mode;
  uint64_t digest;
  pthread_t th;
} job_t;

static double now(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
  job_t *j = arg;
  XXH3_state_t st __attribute__((aligned(64)));
  for (int p = 0; p < j->passes; p++) {
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < j->len; off += RUN) {
      size_t n = j->len - off < RUN ? j->len - off : RUN;
      uint8_t *d = j->dst + off, *s = j->src + off;
      switch (j->mode) {
      case M_COPY: memcpy(d, s, n); break;
      case M_HASH: memcpy(d, s, n); tent_xxh3_update(&st, d, n); break;
      case M_HASH2: memcpy(d, s, n); tent_xxh3_update_avx2(&st, d, n); break;
      case M_FUSED2: tent_xxh3_copy_update_avx2(&st, d, s, n); break;
      case M_FUSED512: tent_xxh3_copy_update_avx512(&st, d, s, n); break;
      }
    }
    j->digest = XXH3_64bits_digest(&st);
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t len = (size_t)(argc > 1 ? atof(argv[1]) : 262144) << 10;
  int threads = argc > 2 ? atoi(argv[2]) : 1, rounds = argc > 3 ? atoi(argv[3]) : 5;
  int passes = argc > 4 ? atoi(argv[4]) : 1;
  if (len == 0 || threads < 1 || threads > 16 || rounds < 1 || rounds > 64 || passes < 1) return 2;
  int avx512 = __builtin_cpu_supports("avx512f");
  job_t jobs[16];
  for (int t = 0; t < threads; t++) {
    jobs[t].src = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
    jobs[t].dst = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
    if (!jobs[t].src || !jobs[t].dst) return 1;
    uint64_t x = 0x9e3779b97f4a7c15ull + t;
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      jobs[t].src[i] = (uint8_t)x;
    }
    memset(jobs[t].dst, 1, len); /* pre-faulted, as a receiver's tensors are */
  }
  double wall[NMODES][64], cpu[NMODES][64];
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < NMODES; m++) {
      if (m == M_FUSED512 && !avx512) continue;
      for (int t = 0; t < threads; t++) memset(jobs[t].dst, r + m, len < (64u << 20) ? len : 0);
      double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
      for (int t = 0; t < threads; t++) {
        jobs[t].mode = m, jobs[t].passes = passes, jobs[t].len = len;
        pthread_create(&jobs[t].th, NULL, worker, &jobs[t]);
      }
      for (int t = 0; t < threads; t++) pthread_join(jobs[t].th, NULL);
      wall[m][r] = now(CLOCK_MONOTONIC) - w0;
      cpu[m][r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
      for (int t = 0; t < threads; t++) {
        if (memcmp(jobs[t].src, jobs[t].dst, len) != 0) return 3;
        if (m != M_COPY && jobs[t].digest != XXH3_64bits(jobs[t].src, len)) {
          fprintf(stderr, "%s: digest mismatch\n", names[m]);
          return 4;
        }
      }
    }
  double bytes = (double)len * passes, gib = bytes * threads / (double)(1 << 30);
  printf("%zu KiB per thread x %d passes, %d threads, %d rounds: per-core GB/s median [min, max], CPU s/GiB\n",
         len >> 10, passes, threads, rounds);
  for (int m = 0; m < NMODES; m++) {
    if (m == M_FUSED512 && !avx512) continue;
    qsort(wall[m], rounds, sizeof(double), cmp);
    qsort(cpu[m], rounds, sizeof(double), cmp);
    printf("%-11s %6.2f [%5.2f, %5.2f] GB/s  %.4f CPU-s/GiB\n", names[m], bytes / wall[m][rounds / 2] / 1e9,
           bytes / wall[m][rounds - 1] / 1e9, bytes / wall[m][0] / 1e9, cpu[m][rounds / 2] / gib);
  }
  return 0;
}
