/*
 * wire_client: one request at a time over one loopback connection, in C, speaking either the tcp
 * executor's wire (version 2: a 32-byte header, the gap the initiator would choose, the payload; a
 * 24-byte answer) or the bare request/response server's of bench/csrc/bare.c (a 64-byte header; a
 * WRITE answered with one byte). The same client in front of both servers, so their CPU per
 * request can be compared with nothing of the engine's initiator in the way
 * (plugins/tcp/tools/server_cpu_ab.py builds and runs it; docs/benchmarks.md, "The target's CPU
 * per request"). Not built by make.
 *
 *   gcc -O2 -o /tmp/wire_client plugins/tcp/tools/wire_client.c
 *   /tmp/wire_client PORT tent|bare READ|WRITE BLOCK COUNT REMOTE_ADDR
 *
 * REMOTE_ADDR: the target buffer's address (tent; the bare server takes offset 0 of its own).
 * Environment: TC_SPIN_NS=N spins N ns between requests (an initiator that takes longer per
 * request), TC_TOUCH=BYTES touching that much memory meanwhile. Prints the loop's seconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
static int recv_iov(int fd, struct iovec *v, int n) {
  while (n) {
    struct msghdr m = {.msg_iov = v, .msg_iovlen = n};
    ssize_t k = recvmsg(fd, &m, MSG_WAITALL);
    if (k <= 0) { if (k < 0 && errno == EINTR) continue; return -1; }
    while (n && (size_t)k >= v->iov_len) k -= v->iov_len, v++, n--;
    if (n) v->iov_base = (char *)v->iov_base + k, v->iov_len -= k;
  }
  return 0;
}
static int send_iov(int fd, struct iovec *v, int n) {
  while (n) {
    struct msghdr m = {.msg_iov = v, .msg_iovlen = n};
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k <= 0) { if (k < 0 && errno == EINTR) continue; return -1; }
    while (n && (size_t)k >= v->iov_len) k -= v->iov_len, v++, n--;
    if (n) v->iov_base = (char *)v->iov_base + k, v->iov_len -= k;
  }
  return 0;
}
static uint8_t gapf(uint64_t pos, uint64_t src, uint64_t dst) {
  for (uint32_t g = 0; g <= 127; g++) {
    uint32_t a = (uint32_t)((pos + g - src) & 4095u), b = (uint32_t)((dst - pos - g) & 4095u);
    if ((a == 0 || a >= 64) && (b == 0 || b >= 64)) return (uint8_t)g;
  }
  return 0;
}
int main(int argc, char **argv) {
  if (argc < 7) return 2;
  int port = atoi(argv[1]), tent = !strcmp(argv[2], "tent"), wr = !strcmp(argv[3], "WRITE");
  size_t block = strtoull(argv[4], 0, 0); long count = atol(argv[5]); uint64_t raddr = strtoull(argv[6], 0, 0);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "cubic", 5);
  int one = 1, buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (void *)&a, sizeof a)) { perror("connect"); return 1; }
  char *data = aligned_alloc(4096, block);
  memset(data, 0x5a, block);
  static uint8_t zeros[128], skip[128];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long spin_ns = getenv("TC_SPIN_NS") ? atol(getenv("TC_SPIN_NS")) : 0;
  size_t touch = getenv("TC_TOUCH") ? strtoull(getenv("TC_TOUCH"), 0, 0) : 0;
  char *junk = touch ? malloc(touch) : NULL;
  if (junk) memset(junk, 1, touch);
  for (long i = 0; i < count; i++) {
    if (spin_ns) {
      struct timespec a, b;
      clock_gettime(CLOCK_MONOTONIC, &a);
      size_t p = 0;
      do {
        if (junk) { junk[p] += 1; p = (p + 64) % touch; }
        clock_gettime(CLOCK_MONOTONIC, &b);
      } while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < spin_ns);
    }
    if (tent) {
      uint8_t h[32] = {0}, r[24];
      uint32_t magic = 0x43544e54u; uint16_t ver = 2;
      uint8_t gap = wr ? gapf(32, (uint64_t)data, raddr) : gapf(24, raddr, (uint64_t)data);
      uint16_t op = (uint16_t)((wr ? 1 : 0) | (gap << 8));
      uint64_t len = block, id = (uint64_t)i + 1;
      memcpy(h, &magic, 4); memcpy(h + 4, &ver, 2); memcpy(h + 6, &op, 2); memcpy(h + 8, &raddr, 8); memcpy(h + 16, &len, 8); memcpy(h + 24, &id, 8);
      if (wr) {
        struct iovec v[3] = {{h, 32}, {zeros, gap}, {data, block}};
        if (send_iov(fd, v, 3)) return 1;
        struct iovec rv[1] = {{r, 24}};
        if (recv_iov(fd, rv, 1)) return 1;
      } else {
        struct iovec v[1] = {{h, 32}};
        if (send_iov(fd, v, 1)) return 1;
        struct iovec rv[3] = {{r, 24}, {skip, gap}, {data, block}};
        if (recv_iov(fd, rv, 3)) return 1;
      }
      uint32_t st; memcpy(&st, r + 8, 4);
      if (st) { fprintf(stderr, "status %d\n", (int)st); return 1; }
    } else {
      uint8_t h[64] = {0}, ack; uint32_t op = wr; uint64_t len = block, off = 0;
      memcpy(h, &op, 4); memcpy(h + 8, &len, 8); memcpy(h + 16, &off, 8);
      if (wr) {
        struct iovec v[2] = {{h, 64}, {data, block}};
        if (send_iov(fd, v, 2)) return 1;
        struct iovec rv[1] = {{&ack, 1}};
        if (recv_iov(fd, rv, 1)) return 1;
      } else {
        struct iovec v[1] = {{h, 64}};
        if (send_iov(fd, v, 1)) return 1;
        struct iovec rv[1] = {{data, block}};
        if (recv_iov(fd, rv, 1)) return 1;
      }
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("%.4f\n", s);
  return 0;
}
