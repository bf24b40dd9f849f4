/*
 * file_send_probe: what a file-source path in the tcp executor could save on the synthesized path
 * file -> staging -> tcp (docs/benchmarks.md, "A synthesized path"). Not built by make.
 *
 *   gcc -O2 -o /tmp/file_send_probe plugins/tcp/tools/file_send_probe.c -lpthread
 *   /tmp/file_send_probe FILE mem|staged|sendfile|mmap BLOCK N [CHUNK]
 *
 * One TCP connection over loopback to a child process that receives BLOCK bytes N times into one
 * buffer (recv, MSG_WAITALL, as the tcp executor's target does). The sender moves [0, BLOCK) of FILE
 * (read once first, so it is in the page cache):
 *   mem       send() from a buffer already holding it (the tcp stage alone: no file read);
 *   staged    CHUNK-sized pread() into a staging buffer, then send() of it, on two threads with two
 *             buffers (stage 1 of chunk n+1 beside stage 2 of chunk n, as tent_core.staged does);
 *   sendfile  sendfile() from the file straight to the socket (page cache pages go into the
 *             socket buffers by reference: no staging copy and no send copy);
 *   mmap      send() from a read-only shared mapping of the file, made before the clock starts and
 *             not populated (its page faults are counted): the file seen as memory, no staging.
 * Prints GB/s and CPU seconds per GiB of both processes (user + system, getrusage).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
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

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) die("send");
    p += k;
    n -= (size_t)k;
  }
}

/* staged: a reader thread fills two staging buffers in turn, the sender sends each when full */
typedef struct {
  int file, sock;
  size_t block, chunk;
  long n;
  char *buf[2];
  int full[2];
  pthread_mutex_t mu;
  pthread_cond_t cv;
} staged_t;

static void *reader(void *arg) {
  staged_t *s = arg;
  long k = 0;
  for (long i = 0; i < s->n; i++)
    for (size_t off = 0; off < s->block; off += s->chunk, k++) {
      int b = (int)(k & 1);
      pthread_mutex_lock(&s->mu);
      while (s->full[b]) pthread_cond_wait(&s->cv, &s->mu);
      pthread_mutex_unlock(&s->mu);
      size_t len = s->block - off < s->chunk ? s->block - off : s->chunk;
      for (size_t got = 0; got < len;) {
        ssize_t r = pread(s->file, s->buf[b] + got, len - got, (off_t)(off + got));
        if (r <= 0) die("pread");
        got += (size_t)r;
      }
      pthread_mutex_lock(&s->mu);
      s->full[b] = 1;
      pthread_cond_broadcast(&s->cv);
      pthread_mutex_unlock(&s->mu);
    }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s FILE mem|staged|sendfile|mmap BLOCK N [CHUNK]\n", argv[0]);
    return 2;
  }
  const char *mode = argv[2];
  size_t block = strtoull(argv[3], NULL, 0), chunk = argc > 5 ? strtoull(argv[5], NULL, 0) : 16u << 20;
  long n = atol(argv[4]);
  int file = open(argv[1], O_RDONLY);
  if (file < 0) die("open");
  char *mem = mmap(NULL, block, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) die("mmap");
  for (size_t got = 0; got < block;) { /* into the page cache, and the buffer `mem` sends from */
    ssize_t r = pread(file, mem + got, block - got, (off_t)got);
    if (r <= 0) die("pread");
    got += (size_t)r;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (struct sockaddr *)&a, &al))
    die("listen");
  pid_t child = fork();
  if (child == 0) { /* the receiver */
    int c = accept(ls, NULL, NULL);
    if (c < 0) die("accept");
    for (long i = 0; i < n; i++)
      for (size_t got = 0; got < block;) {
        ssize_t r = recv(c, mem + got, block - got, MSG_WAITALL);
        if (r <= 0) die("recv");
        got += (size_t)r;
      }
    char ack = 1;
    send_all(c, &ack, 1);
    _exit(0);
  }
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) die("connect");
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct rusage r0, r1, c1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = now();
  if (!strcmp(mode, "mem")) {
    for (long i = 0; i < n; i++) send_all(s, mem, block);
  } else if (!strcmp(mode, "mmap")) {
    char *map = mmap(NULL, block, PROT_READ, MAP_SHARED, file, 0);
    if (map == MAP_FAILED) die("mmap file");
    for (long i = 0; i < n; i++) send_all(s, map, block);
  } else if (!strcmp(mode, "sendfile")) {
    for (long i = 0; i < n; i++) {
      off_t off = 0;
      while ((size_t)off < block)
        if (sendfile(s, file, &off, block - (size_t)off) <= 0) die("sendfile");
    }
  } else if (!strcmp(mode, "staged")) {
    staged_t st = {.file = file, .sock = s, .block = block, .chunk = chunk, .n = n};
    for (int b = 0; b < 2; b++) {
      st.buf[b] = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (st.buf[b] == MAP_FAILED) die("mmap");
    }
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    pthread_t th;
    pthread_create(&th, NULL, reader, &st);
    long k = 0;
    for (long i = 0; i < n; i++)
      for (size_t off = 0; off < block; off += chunk, k++) {
        int b = (int)(k & 1);
        pthread_mutex_lock(&st.mu);
        while (!st.full[b]) pthread_cond_wait(&st.cv, &st.mu);
        pthread_mutex_unlock(&st.mu);
        send_all(s, st.buf[b], block - off < chunk ? block - off : chunk);
        pthread_mutex_lock(&st.mu);
        st.full[b] = 0;
        pthread_cond_broadcast(&st.cv);
        pthread_mutex_unlock(&st.mu);
      }
    pthread_join(th, NULL);
  } else {
    fprintf(stderr, "mode: mem, staged, sendfile or mmap\n");
    return 2;
  }
  char ack;
  if (recv(s, &ack, 1, MSG_WAITALL) != 1) die("ack");
  double secs = now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  int status;
  waitpid(child, &status, 0);
  getrusage(RUSAGE_CHILDREN, &c1);
  double gib = (double)block * (double)n / (double)(1u << 30);
  printf("%s block %zu x %ld: %.2f GB/s, CPU s/GiB %.3f (sender %.3f, receiver %.3f)\n", mode, block, n,
         (double)block * (double)n / secs / 1e9, (cpu_s(&r1) - cpu_s(&r0) + cpu_s(&c1)) / gib,
         (cpu_s(&r1) - cpu_s(&r0)) / gib, cpu_s(&c1) / gib);
  return 0;
}
