/*
 * pwrite_halves: N threads writing their own 64 MiB / N of one file with buffered pwrite (fio's
 * numjobs=N shape), timing the CPU each thread spends inside pwrite (not built by make).
 *
 *   gcc -O2 -pthread -o /tmp/pwrite_halves plugins/gds/tools/pwrite_halves.c
 *   /tmp/pwrite_halves FILE THREADS IO_BYTES PASSES
 *
 * FILE must hold at least 64 MiB. Prints GB/s and the summed per-thread CPU inside pwrite over the
 * wall time: where the kernel serializes writers of one file (ext4's inode lock), two threads move
 * no more than one, and the second's time inside pwrite goes to spinning or sleeping on the lock.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (64ul << 20)
#define MAX_THREADS 16

static int fd, nthreads, passes;
static size_t io_bytes;
static char *buf;
static double cpu_in[MAX_THREADS];

static double clock_s(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *writer(void *arg) {
  long i = (long)arg;
  size_t per = BLOCK / (size_t)nthreads, lo = (size_t)i * per;
  for (int p = 0; p < passes; p++) {
    for (size_t off = lo; off < lo + per; off += io_bytes) {
      double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      if (pwrite(fd, buf + off, io_bytes, (off_t)off) != (ssize_t)io_bytes) {
        perror("pwrite_halves: pwrite");
        exit(1);
      }
      cpu_in[i] += clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s FILE THREADS IO_BYTES PASSES\n", argv[0]);
    return 2;
  }
  nthreads = atoi(argv[2]);
  io_bytes = strtoul(argv[3], NULL, 0);
  passes = atoi(argv[4]);
  if (nthreads < 1 || nthreads > MAX_THREADS || io_bytes == 0 || (BLOCK / (size_t)nthreads) % io_bytes || passes < 1) {
    fprintf(stderr, "pwrite_halves: THREADS 1-%d, IO_BYTES dividing 64 MiB / THREADS, PASSES >= 1\n", MAX_THREADS);
    return 2;
  }
  fd = open(argv[1], O_WRONLY);
  if (fd < 0) {
    perror("pwrite_halves: open");
    return 1;
  }
  buf = aligned_alloc(4096, BLOCK);
  if (buf == NULL) {
    perror("pwrite_halves: aligned_alloc");
    return 1;
  }
  memset(buf, 7, BLOCK);
  pthread_t t[MAX_THREADS];
  double t0 = clock_s(CLOCK_MONOTONIC);
  for (long i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, writer, (void *)i);
  for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
  double wall = clock_s(CLOCK_MONOTONIC) - t0, cpu = 0;
  for (int i = 0; i < nthreads; i++) cpu += cpu_in[i];
  printf("threads %d, %zu-byte writes: %.2f GB/s, wall %.3f s, CPU inside pwrite %.3f s (%.2f of the wall time)\n",
         nthreads, io_bytes, (double)BLOCK * passes / wall / 1e9, wall, cpu, cpu / wall);
  close(fd);
  return 0;
}
