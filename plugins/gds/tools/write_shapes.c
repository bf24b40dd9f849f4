/*
 * write_shapes: 64 MiB buffered WRITEs to one file, several shapes interleaved in one process, to
 * tell what a buffered write's cost depends on (not built by make).
 *
 *   gcc -O2 -pthread -o /tmp/write_shapes plugins/gds/tools/write_shapes.c
 *   /tmp/write_shapes FILE TRIALS PASSES SHAPE [SHAPE ...]
 *
 * A SHAPE is SRC:IO_KIB:THREADS: the source memory (anon: private anonymous pages, as fio's
 * malloc'ed buffers; memfd: a MAP_SHARED memfd mapping, as the engine's allocate()), the bytes per
 * pwrite, and the writer threads (each its own contiguous part of the 64 MiB, fio's numjobs
 * shape); a suffix p (one writer) adds a companion thread that reads the next piece's source while
 * the writer writes, a suffix w has each writer read its own piece's source just before its
 * pwrite (what fio's scramble_buffers does). Every trial runs every shape once (PASSES x 64 MiB), in rotating order, and prints its
 * GB/s and the CPU seconds per GB spent inside pwrite (all threads) and in the whole process; the
 * end prints the medians. FILE must hold at least 64 MiB; both sources are pre-faulted.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (64ul << 20)
#define MAX_SHAPES 16
#define MAX_TRIALS 64
#define MAX_THREADS 8

typedef struct {
  char *src;
  size_t io;
  int threads;
  int prefetch; /* a companion thread reads the next piece's source while the writer writes */
  int selfwarm; /* each writer reads its piece's source itself just before its pwrite (fio's scramble) */
  char name[64];
} shape_t;

static int fd, passes;
static shape_t shapes[MAX_SHAPES];
static double gbps[MAX_SHAPES][MAX_TRIALS], in_s[MAX_SHAPES][MAX_TRIALS], proc_s[MAX_SHAPES][MAX_TRIALS];

typedef struct {
  shape_t *sh;
  int i;
  double cpu_in;
} arg_t;

static atomic_long writing_piece; /* prefetch shapes: the piece the writer is at (-1: done) */

static double clock_s(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double proc_cpu(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

/* Reads (one load per cache line) piece k+1 while the writer writes piece k: the copy under the
 * file's inode lock then reads its source from the cache instead of DRAM. */
static void *prefetcher(void *p) {
  arg_t *a = p;
  size_t io = a->sh->io, pieces = BLOCK / io;
  unsigned long sink = 0;
  for (int k = 0; k < passes; k++)
    for (size_t j = 0; j < pieces; j++) {
      long want = (long)(k * pieces + j) - 1, at;
      while ((at = atomic_load(&writing_piece)) < want && at != -2) sched_yield();
      if (at == -2) return NULL; /* the writer is done (it may have passed this piece already) */
      const volatile unsigned long *src = (const volatile unsigned long *)(a->sh->src + j * io);
      for (size_t w = 0; w < io / sizeof *src; w += 64 / sizeof *src) sink += src[w];
    }
  a->cpu_in = (double)(sink & 1) * 0; /* keeps the loads */
  return NULL;
}

static void *writer(void *p) {
  arg_t *a = p;
  size_t per = BLOCK / (size_t)a->sh->threads, lo = (size_t)a->i * per;
  long piece = 0;
  for (int k = 0; k < passes; k++)
    for (size_t off = lo; off < lo + per; off += a->sh->io, piece++) {
      if (a->sh->prefetch) atomic_store(&writing_piece, piece);
      if (a->sh->selfwarm) {
        unsigned long sink = 0;
        for (size_t w = 0; w < a->sh->io; w += 64) sink += *(const volatile unsigned char *)(a->sh->src + off + w);
        __asm__ volatile("" : : "r"(sink));
      }
      double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      if (pwrite(fd, a->sh->src + off, a->sh->io, (off_t)off) != (ssize_t)a->sh->io) {
        perror("write_shapes: pwrite");
        exit(1);
      }
      a->cpu_in += clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    }
  if (a->sh->prefetch) atomic_store(&writing_piece, -2);
  return NULL;
}

static char *source(const char *kind) {
  char *p;
  if (!strcmp(kind, "anon")) {
    p = aligned_alloc(4096, BLOCK);
  } else if (!strcmp(kind, "memfd")) {
    int m = memfd_create("write_shapes", MFD_CLOEXEC);
    if (m < 0 || ftruncate(m, BLOCK)) return NULL;
    p = mmap(NULL, BLOCK, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
    if (p == MAP_FAILED) return NULL;
  } else {
    return NULL;
  }
  if (!p) return NULL;
  for (size_t i = 0; i < BLOCK; i++) p[i] = (char)(i * 2654435761u >> 13); /* faulted, non-repeating */
  return p;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  double t[MAX_TRIALS];
  memcpy(t, v, (size_t)n * sizeof *t);
  qsort(t, (size_t)n, sizeof *t, cmp);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s FILE TRIALS PASSES SRC:IO_KIB:THREADS ...\n", argv[0]);
    return 2;
  }
  int trials = atoi(argv[2]), n = argc - 4;
  passes = atoi(argv[3]);
  if (trials < 1 || trials > MAX_TRIALS || passes < 1 || n > MAX_SHAPES) {
    fprintf(stderr, "write_shapes: TRIALS 1-%d, PASSES >= 1, at most %d shapes\n", MAX_TRIALS, MAX_SHAPES);
    return 2;
  }
  char *anon = NULL, *memfd = NULL;
  for (int s = 0; s < n; s++) {
    char kind[16];
    unsigned long kib;
    int th;
    char pf = 0;
    if (sscanf(argv[4 + s], "%15[^:]:%lu:%d%c", kind, &kib, &th, &pf) < 3 || (pf && pf != 'p' && pf != 'w') || (pf == 'p' && th != 1) || th < 1 || th > MAX_THREADS || kib == 0 ||
        (BLOCK / (size_t)th) % (kib << 10)) {
      fprintf(stderr, "write_shapes: bad shape %s (IO_KIB must divide 64 MiB / THREADS)\n", argv[4 + s]);
      return 2;
    }
    char **src = !strcmp(kind, "anon") ? &anon : !strcmp(kind, "memfd") ? &memfd : NULL;
    if (!src) {
      fprintf(stderr, "write_shapes: SRC is anon or memfd, not %s\n", kind);
      return 2;
    }
    if (!*src && !(*src = source(kind))) {
      perror("write_shapes: source");
      return 1;
    }
    shapes[s] = (shape_t){*src, kib << 10, th, pf == 'p', pf == 'w', ""};
    snprintf(shapes[s].name, sizeof shapes[s].name, "%s", argv[4 + s]);
  }
  fd = open(argv[1], O_WRONLY);
  if (fd < 0) {
    perror("write_shapes: open");
    return 1;
  }
  double gb = (double)BLOCK * passes / 1e9;
  for (int t = 0; t < trials; t++) {
    for (int j = 0; j < n; j++) {
      int s = (t + j) % n;
      pthread_t th[MAX_THREADS];
      arg_t a[MAX_THREADS];
      double c0 = proc_cpu(), t0 = clock_s(CLOCK_MONOTONIC);
      for (int i = 0; i < shapes[s].threads; i++) {
        a[i] = (arg_t){&shapes[s], i, 0};
        pthread_create(&th[i], NULL, writer, &a[i]);
      }
      pthread_t pth;
      arg_t pa = {&shapes[s], 0, 0};
      atomic_store(&writing_piece, 0);
      if (shapes[s].prefetch) pthread_create(&pth, NULL, prefetcher, &pa);
      double cin = 0;
      for (int i = 0; i < shapes[s].threads; i++) {
        pthread_join(th[i], NULL);
        cin += a[i].cpu_in;
      }
      if (shapes[s].prefetch) pthread_join(pth, NULL);
      double wall = clock_s(CLOCK_MONOTONIC) - t0;
      gbps[s][t] = gb / wall;
      in_s[s][t] = cin / gb;
      proc_s[s][t] = (proc_cpu() - c0) / gb;
      printf("trial %d %-16s %6.2f GB/s  in pwrite %.4f s/GB  process %.4f s/GB\n", t, shapes[s].name, gbps[s][t],
             in_s[s][t], proc_s[s][t]);
    }
    fflush(stdout);
  }
  printf("median of %d trials x %d x 64 MiB:\n", trials, passes);
  for (int s = 0; s < n; s++)
    printf("%-16s %6.2f GB/s  in pwrite %.4f s/GB  process %.4f s/GB\n", shapes[s].name, median(gbps[s], trials),
           median(in_s[s], trials), median(proc_s[s], trials));
  close(fd);
  return 0;
}
