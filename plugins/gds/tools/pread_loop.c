/*
 * pread_loop: the bare limit the gds-vs-fio figures are checked against (not built by make).
 *
 *   gcc -O2 -o /tmp/pread_loop plugins/gds/tools/pread_loop.c
 *   /tmp/pread_loop FILE r|w BS BLOCK N [DEST_OFFSET]
 *
 * N times the range [0, BLOCK) of FILE in BS-sized pread/pwrite calls (buffered), into / out of a
 * page-aligned buffer of BLOCK bytes (plus DEST_OFFSET bytes: 16 shows what fio's malloc'ed
 * buffers cost a READ). Prints GB/s and the process's CPU time.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_s(const struct rusage *r) {
  return (double)(r->ru_utime.tv_sec + r->ru_stime.tv_sec) + 1e-6 * (double)(r->ru_utime.tv_usec + r->ru_stime.tv_usec);
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s FILE r|w BS BLOCK N [DEST_OFFSET]\n", argv[0]);
    return 2;
  }
  int wr = argv[2][0] == 'w';
  size_t bs = strtoull(argv[3], NULL, 10), block = strtoull(argv[4], NULL, 10);
  long n = atol(argv[5]);
  size_t shift = argc > 6 ? strtoull(argv[6], NULL, 10) : 0;
  int fd = open(argv[1], O_RDWR);
  char *raw = aligned_alloc(4096, block + 4096), *buf = raw + shift;
  if (fd < 0 || !raw || bs == 0 || block % bs) {
    perror("setup");
    return 1;
  }
  for (size_t o = 0; o < block; o += bs) /* warm: the file's pages cached, the buffer faulted in */
    if (pread(fd, buf + o, bs, (off_t)o) != (ssize_t)bs) return 1;
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = now();
  for (long i = 0; i < n; i++)
    for (size_t o = 0; o < block; o += bs)
      if ((wr ? pwrite(fd, buf + o, bs, (off_t)o) : pread(fd, buf + o, bs, (off_t)o)) != (ssize_t)bs) {
        perror("io");
        return 1;
      }
  double t = now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  printf("%s bs=%zu block=%zu n=%ld: %.3f GB/s  %.1f us/block  wall %.3f s cpu %.3f s\n", wr ? "WRITE" : "READ", bs, block,
         n, (double)block * (double)n / t / 1e9, t / (double)n * 1e6, t, cpu_s(&r1) - cpu_s(&r0));
  free(raw);
  return 0;
}
