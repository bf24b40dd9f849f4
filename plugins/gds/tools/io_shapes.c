/*
 * io_shapes: one file range moved three ways, interleaved, to tell the kernel's limits from the
 * engine's (not built by make).
 *
 *   gcc -O2 -pthread -o /tmp/io_shapes plugins/gds/tools/io_shapes.c
 *   /tmp/io_shapes FILE r|w TRIALS REQUESTS [PIECE_MIB]
 *
 * REQUESTS times the range [0, 64 MiB) of FILE (buffered pread/pwrite of PIECE_MIB pieces, default
 * 1), per trial in each of three shapes, in rotating order: one thread; two threads taking pieces
 * from a shared counter with a barrier after every 64 MiB (the gds executor's shape for one
 * request at a time); two threads each on its own half without a barrier (fio's numjobs=2 shape).
 * Prints GB/s and CPU seconds per GB of every trial. On ext4 the kernel holds the inode's lock for
 * a whole buffered write, so two writers of one file cannot beat one.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ul << 20)
#define BLOCK (64 * MIB)
#define MAX_TRIALS 64

static int fd, writing, requests;
static char *buf;
static size_t piece = MIB;
static atomic_long next_piece;
static pthread_barrier_t bar;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static void io(size_t off, size_t len) {
  ssize_t n = writing ? pwrite(fd, buf + off, len, (off_t)off) : pread(fd, buf + off, len, (off_t)off);
  if (n != (ssize_t)len) {
    perror("io_shapes: pread/pwrite");
    exit(1);
  }
}

static void *shared(void *first) {
  for (int r = 0; r < requests; r++) {
    long k;
    while ((k = atomic_fetch_add(&next_piece, 1)) < (long)(BLOCK / piece)) io((size_t)k * piece, piece);
    pthread_barrier_wait(&bar);
    if (first) atomic_store(&next_piece, 0);
    pthread_barrier_wait(&bar);
  }
  return NULL;
}

static void *half(void *which) {
  size_t base = (uintptr_t)which * BLOCK / 2;
  for (int r = 0; r < requests; r++)
    for (size_t o = 0; o < BLOCK / 2; o += piece) io(base + o, piece);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s FILE r|w TRIALS REQUESTS [PIECE_MIB]\n", argv[0]);
    return 2;
  }
  writing = argv[2][0] == 'w';
  int trials = atoi(argv[3]);
  requests = atoi(argv[4]);
  if (argc > 5) piece = strtoul(argv[5], NULL, 10) * MIB;
  if (trials < 1 || trials > MAX_TRIALS || requests < 1 || piece == 0 || BLOCK % (2 * piece)) {
    fprintf(stderr, "io_shapes: TRIALS 1..%d, REQUESTS >= 1, PIECE_MIB dividing 32\n", MAX_TRIALS);
    return 2;
  }
  fd = open(argv[1], O_RDWR);
  if (fd < 0) {
    perror(argv[1]);
    return 1;
  }
  buf = aligned_alloc(4096, BLOCK);
  memset(buf, 7, BLOCK);
  pthread_barrier_init(&bar, NULL, 2);
  const char *names[3] = {"one thread", "two, shared + barrier", "two halves (fio)"};
  double gbps[3][MAX_TRIALS], cpu_gb[3][MAX_TRIALS];
  for (int t = 0; t < trials; t++)
    for (int k = 0; k < 3; k++) {
      int m = (k + t) % 3;
      double c0 = cpu(), t0 = now();
      pthread_t a, b;
      if (m == 0) {
        for (int r = 0; r < requests; r++)
          for (size_t o = 0; o < BLOCK; o += piece) io(o, piece);
      } else {
        atomic_store(&next_piece, 0);
        void *(*fn)(void *) = m == 1 ? shared : half;
        pthread_create(&a, NULL, fn, (void *)0);
        pthread_create(&b, NULL, fn, (void *)1);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
      }
      double gb = (double)BLOCK * requests / 1e9;
      gbps[m][t] = gb / (now() - t0);
      cpu_gb[m][t] = (cpu() - c0) / gb;
    }
  for (int m = 0; m < 3; m++) {
    printf("%s %-22s GB/s", writing ? "WRITE" : "READ", names[m]);
    for (int t = 0; t < trials; t++) printf(" %.2f", gbps[m][t]);
    printf("; CPU s/GB");
    for (int t = 0; t < trials; t++) printf(" %.3f", cpu_gb[m][t]);
    printf("\n");
  }
  return 0;
}
