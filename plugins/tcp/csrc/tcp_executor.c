/*
 * tent_tcp executor: the TCP slice executor behind the TENT executor C ABI.
 *
 * Client side: submit() appends slices to per-(peer, rail) FIFO queues. A pool of
 * worker threads takes a slice from a (peer, rail) that has work and a free
 * connection slot (at most conns_per_rail slices in flight per rail), borrows a
 * persistent connection (connecting lazily), runs the slice synchronously on it and
 * reports it through host->complete. Payload bytes go straight between the user's
 * memory and send()/recv(): no intermediate copies, no Python.
 *
 * Server side: one accept thread per listener, one thread per accepted connection.
 * Every request is checked against the registered regions (bounds + permission).
 * Regions are reference counted so unregister waits for in-flight server I/O.
 *
 * Wire protocol (little endian):
 *   request  (32 B): u32 magic 'TNTC', u16 version, u16 opcode, u64 remote_addr,
 *                    u64 length, u64 request id.     WRITE: followed by `length` bytes.
 *   response (24 B): u32 magic, u16 version, u16 pad, i32 status, u32 pad, u64 request id.
 *                    READ with status 0: followed by `length` bytes.
 * A rejected WRITE has its payload drained by the server before the error reply.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "tent/config_kv.h"
#include "tent/executor_abi.h"

#define EXPORT __attribute__((visibility("default")))

#define WIRE_MAGIC 0x43544e54u /* "TNTC" little endian */
#define WIRE_VERSION 1u
#define REQ_SIZE 32
#define RSP_SIZE 24
#define PERM_REMOTE_READ 1u
#define PERM_REMOTE_WRITE 2u
#define DRAIN_CHUNK (256 * 1024)
#define MAX_RAILS 64
#define SLOT_FREE (-2)

/* ------------------------------------------------------------------ utils */

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

static atomic_int g_log_budget = 32; /* stderr logging stays sparse */

static void slog(const char *fmt, ...) {
  if (atomic_fetch_sub(&g_log_budget, 1) <= 0) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("[tent_tcp] ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static void put16(uint8_t *p, uint16_t v) { v = htole16(v); memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { v = htole32(v); memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { v = htole64(v); memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return le16toh(v); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return le32toh(v); }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return le64toh(v); }

/* I/O results */
enum { IO_OK = 0, IO_EOF = 1, IO_TIMEOUT = 2, IO_ERR = 3 };

/* Send all of buf. A call that times out with zero bytes sent = no progress. */
static int send_all(int fd, const void *buf, size_t len, int more) {
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return IO_TIMEOUT;
    return IO_ERR;
  }
  return IO_OK;
}

static int recv_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len) {
    ssize_t n = recv(fd, p, len, MSG_WAITALL);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) return IO_EOF;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return IO_TIMEOUT;
    return IO_ERR;
  }
  return IO_OK;
}

static void set_timeouts(int fd, int ms) {
  struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static void tune_socket(int fd, int sockbuf) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (sockbuf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
  }
}

/* ------------------------------------------------------------------ types */

typedef struct region {
  uint64_t addr, len;
  uint32_t perm;
  int refs;
  int dead;
  struct region *next;
} region_t;

typedef struct slice_queue {
  tent_slice_t *buf;
  size_t cap, head, len;
} slice_queue_t;

typedef struct rail {
  struct sockaddr_in local;  /* sin_addr 0 = don't bind */
  struct sockaddr_in remote;
  char name[96];
  slice_queue_t q;
  int *idle;     /* idle connected fds */
  int nidle;
  int *slot_fd;  /* per in-flight slot: SLOT_FREE, -1 (connecting) or the fd in use */
  int busy;      /* slices in flight on this rail */
  uint64_t down_until_ms; /* connect failed recently: fail fast until then */
  /* counters */
  atomic_ullong bytes, slices, errors, connects;
} rail_t;

typedef struct peer {
  int64_t handle;
  int nrails;
  int removed;
  rail_t *rails;
} peer_t;

struct tcp_exec;

typedef struct listener {
  struct tcp_exec *ex;
  int fd;
  int port;
  pthread_t thread;
  struct listener *next;
} listener_t;

typedef struct sconn {
  struct tcp_exec *ex;
  int fd;
  int done;
  pthread_t thread;
  struct sconn *next;
} sconn_t;

typedef struct tcp_exec {
  const tent_host_api_t *host;
  int nthreads, conns_per_rail, slice_timeout_ms, connect_timeout_ms, sockbuf;

  pthread_mutex_t mu; /* queues, peers, connection pools */
  pthread_cond_t cv;  /* work available / slot freed */
  int stopping;
  peer_t **peers;
  int npeers, cap_peers;
  unsigned rr; /* round-robin cursor over (peer, rail) */
  slice_queue_t orphans; /* slices whose peer was removed: complete with TENT_E_CONNECT */
  pthread_t *workers;
  int nworkers;
  atomic_ullong next_reqid;

  pthread_mutex_t reg_mu; /* regions */
  pthread_cond_t reg_cv;
  region_t *regions;

  pthread_mutex_t srv_mu; /* listeners and server connections */
  listener_t *listeners;
  sconn_t *sconns;
  int wake_fd; /* eventfd, readable once stopping */
} tcp_exec_t;

/* ------------------------------------------------------------------ queues */

static int q_push(slice_queue_t *q, const tent_slice_t *s) {
  if (q->len == q->cap) {
    size_t ncap = q->cap ? q->cap * 2 : 64;
    tent_slice_t *nb = malloc(ncap * sizeof *nb);
    if (!nb) return -1;
    for (size_t i = 0; i < q->len; i++) nb[i] = q->buf[(q->head + i) % q->cap];
    free(q->buf);
    q->buf = nb;
    q->cap = ncap;
    q->head = 0;
  }
  q->buf[(q->head + q->len) % q->cap] = *s;
  q->len++;
  return 0;
}

static int q_reserve(slice_queue_t *q, size_t extra) {
  if (q->len + extra <= q->cap) return 0;
  size_t ncap = q->cap ? q->cap : 64;
  while (ncap < q->len + extra) ncap *= 2;
  tent_slice_t *nb = malloc(ncap * sizeof *nb);
  if (!nb) return -1;
  for (size_t i = 0; i < q->len; i++) nb[i] = q->buf[(q->head + i) % q->cap];
  free(q->buf);
  q->buf = nb;
  q->cap = ncap;
  q->head = 0;
  return 0;
}

static void q_pop(slice_queue_t *q, tent_slice_t *out) {
  *out = q->buf[q->head];
  q->head = (q->head + 1) % q->cap;
  q->len--;
}

/* ------------------------------------------------------------------ config */

static int parse_config(tcp_exec_t *ex, const char *cfg, char *err, size_t errlen) {
  ex->nthreads = 4;
  ex->conns_per_rail = 2;
  ex->slice_timeout_ms = 2000;
  ex->connect_timeout_ms = 1000;
  ex->sockbuf = 4 << 20;
  char key[64], val[256];
  for (const char *c = cfg; tent_config_next(&c, key, sizeof key, val, sizeof val);) {
    char *end = NULL;
    long v = strtol(val, &end, 10);
    int *dst = NULL;
    long lo = 0, hi = 1L << 30;
    if (!strcmp(key, "threads")) dst = &ex->nthreads, lo = 1, hi = 256;
    else if (!strcmp(key, "conns_per_rail")) dst = &ex->conns_per_rail, lo = 1, hi = 64;
    else if (!strcmp(key, "slice_timeout_ms")) dst = &ex->slice_timeout_ms, lo = 1;
    else if (!strcmp(key, "connect_timeout_ms")) dst = &ex->connect_timeout_ms, lo = 1;
    else if (!strcmp(key, "sockbuf")) dst = &ex->sockbuf, lo = 0;
    else continue; /* unknown keys are ignored (the transport may pass extra ones) */
    if (end == val || *end || v < lo || v > hi) {
      snprintf(err, errlen, "bad value for %s: %s", key, val);
      return -1;
    }
    *dst = (int)v;
  }
  return 0;
}

/* ------------------------------------------------------------------ regions */

/* Returns a referenced region or NULL with *status set. */
static region_t *region_acquire(tcp_exec_t *ex, uint64_t addr, uint64_t len, uint32_t need, int *status) {
  region_t *found = NULL;
  int saw_inside = 0;
  pthread_mutex_lock(&ex->reg_mu);
  for (region_t *r = ex->regions; r; r = r->next) {
    if (r->dead) continue;
    if (addr < r->addr || addr - r->addr > r->len || len > r->len - (addr - r->addr)) continue;
    saw_inside = 1;
    if ((r->perm & need) == need) {
      found = r;
      r->refs++;
      break;
    }
  }
  pthread_mutex_unlock(&ex->reg_mu);
  if (!found) *status = saw_inside ? TENT_E_PERMISSION : TENT_E_BOUNDS;
  return found;
}

static void region_release(tcp_exec_t *ex, region_t *r) {
  pthread_mutex_lock(&ex->reg_mu);
  if (--r->refs == 0 && r->dead) pthread_cond_broadcast(&ex->reg_cv);
  pthread_mutex_unlock(&ex->reg_mu);
}

EXPORT int tcp_register_region(void *self, uint64_t addr, uint64_t len, uint32_t perm) {
  tcp_exec_t *ex = self;
  if (!ex) return -EINVAL;
  region_t *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->addr = addr;
  r->len = len;
  r->perm = perm;
  pthread_mutex_lock(&ex->reg_mu);
  r->next = ex->regions;
  ex->regions = r;
  pthread_mutex_unlock(&ex->reg_mu);
  return 0;
}

EXPORT int tcp_unregister_region(void *self, uint64_t addr, uint64_t len) {
  tcp_exec_t *ex = self;
  if (!ex) return -EINVAL;
  pthread_mutex_lock(&ex->reg_mu);
  region_t **pp = &ex->regions, *r = NULL;
  for (; *pp; pp = &(*pp)->next) {
    if ((*pp)->addr == addr && (*pp)->len == len && !(*pp)->dead) {
      r = *pp;
      *pp = r->next;
      break;
    }
  }
  if (!r) {
    pthread_mutex_unlock(&ex->reg_mu);
    return -ENOENT;
  }
  r->dead = 1; /* unlinked: no new lookups find it; wait for in-flight server I/O */
  while (r->refs > 0) pthread_cond_wait(&ex->reg_cv, &ex->reg_mu);
  pthread_mutex_unlock(&ex->reg_mu);
  free(r);
  return 0;
}

/* ------------------------------------------------------------------ server */

static void sconn_close(sconn_t *c) {
  pthread_mutex_lock(&c->ex->srv_mu);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->done = 1;
  pthread_mutex_unlock(&c->ex->srv_mu);
}

/* Wait until fd is readable or the executor stops. Returns 1 readable, 0 stop. */
static int wait_readable(tcp_exec_t *ex, int fd) {
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = ex->wake_fd, .events = POLLIN}};
    int n = poll(p, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    if (p[1].revents) return 0;
    if (p[0].revents) return 1;
  }
}

static int drain(int fd, uint64_t len) {
  char *scratch = malloc(DRAIN_CHUNK);
  if (!scratch) return IO_ERR;
  int rc = IO_OK;
  while (len && rc == IO_OK) {
    size_t n = len < DRAIN_CHUNK ? (size_t)len : DRAIN_CHUNK;
    rc = recv_all(fd, scratch, n);
    len -= n;
  }
  free(scratch);
  return rc;
}

static int send_response(int fd, int32_t status, uint64_t reqid, int more) {
  uint8_t h[RSP_SIZE] = {0};
  put32(h, WIRE_MAGIC);
  put16(h + 4, WIRE_VERSION);
  put32(h + 8, (uint32_t)status);
  put64(h + 16, reqid);
  return send_all(fd, h, RSP_SIZE, more);
}

static void *sconn_main(void *arg) {
  sconn_t *c = arg;
  tcp_exec_t *ex = c->ex;
  int fd = c->fd;
  uint8_t h[REQ_SIZE];
  for (;;) {
    if (!wait_readable(ex, fd)) break;
    int rc = recv_all(fd, h, REQ_SIZE);
    if (rc != IO_OK) break; /* peer closed / stalled mid-header */
    if (get32(h) != WIRE_MAGIC || get16(h + 4) != WIRE_VERSION) {
      slog("closing connection: bad request header (magic %08x version %u)", get32(h), get16(h + 4));
      break;
    }
    uint32_t op = get16(h + 6);
    uint64_t addr = get64(h + 8), len = get64(h + 16), reqid = get64(h + 24);
    if (op != TENT_OP_READ && op != TENT_OP_WRITE) {
      slog("closing connection: bad opcode %u", op);
      break;
    }
    int status = TENT_OK;
    region_t *r = region_acquire(ex, addr, len, op == TENT_OP_READ ? PERM_REMOTE_READ : PERM_REMOTE_WRITE, &status);
    if (op == TENT_OP_WRITE) {
      if (r) {
        rc = recv_all(fd, (void *)(uintptr_t)addr, (size_t)len);
        region_release(ex, r);
      } else {
        rc = drain(fd, len);
      }
      if (rc != IO_OK) break;
      if (send_response(fd, status, reqid, 0) != IO_OK) break;
    } else {
      if (!r) {
        if (send_response(fd, status, reqid, 0) != IO_OK) break;
        continue;
      }
      rc = send_response(fd, TENT_OK, reqid, 1);
      if (rc == IO_OK) rc = send_all(fd, (const void *)(uintptr_t)addr, (size_t)len, 0);
      region_release(ex, r);
      if (rc != IO_OK) break;
    }
  }
  sconn_close(c);
  return NULL;
}

static void reap_sconns_locked(tcp_exec_t *ex) {
  sconn_t **pp = &ex->sconns;
  while (*pp) {
    sconn_t *c = *pp;
    if (c->done) {
      *pp = c->next;
      pthread_join(c->thread, NULL);
      free(c);
    } else {
      pp = &c->next;
    }
  }
}

static void *accept_main(void *arg) {
  listener_t *l = arg;
  tcp_exec_t *ex = l->ex;
  for (;;) {
    if (!wait_readable(ex, l->fd)) break;
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        slog("accept: %s", strerror(errno));
        poll(NULL, 0, 50);
        continue;
      }
      break;
    }
    tune_socket(fd, ex->sockbuf);
    set_timeouts(fd, ex->slice_timeout_ms);
    sconn_t *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->ex = ex;
    c->fd = fd;
    pthread_mutex_lock(&ex->srv_mu);
    reap_sconns_locked(ex);
    if (ex->stopping || pthread_create(&c->thread, NULL, sconn_main, c) != 0) {
      pthread_mutex_unlock(&ex->srv_mu);
      close(fd);
      free(c);
      continue;
    }
    c->next = ex->sconns;
    ex->sconns = c;
    pthread_mutex_unlock(&ex->srv_mu);
  }
  return NULL;
}

EXPORT int tcp_listen(void *self, const char *ip, int port) {
  tcp_exec_t *ex = self;
  if (!ex) return -EINVAL;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (!ip || !*ip) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  else if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) return -EINVAL;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* set buffers on the listener so accepted sockets inherit them before the handshake */
  if (ex->sockbuf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &ex->sockbuf, sizeof ex->sockbuf);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &ex->sockbuf, sizeof ex->sockbuf);
  }
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 512) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  socklen_t sl = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  listener_t *l = calloc(1, sizeof *l);
  if (!l) {
    close(fd);
    return -ENOMEM;
  }
  l->ex = ex;
  l->fd = fd;
  l->port = ntohs(sa.sin_port);
  pthread_mutex_lock(&ex->srv_mu);
  if (ex->stopping || pthread_create(&l->thread, NULL, accept_main, l) != 0) {
    pthread_mutex_unlock(&ex->srv_mu);
    close(fd);
    free(l);
    return -EAGAIN;
  }
  l->next = ex->listeners;
  ex->listeners = l;
  pthread_mutex_unlock(&ex->srv_mu);
  return l->port;
}

/* ------------------------------------------------------------------ client */

/* Connect one socket for `r`. Returns fd or -1. Called without ex->mu. */
static int rail_connect(tcp_exec_t *ex, rail_t *r) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  tune_socket(fd, ex->sockbuf);
  if (r->local.sin_addr.s_addr && bind(fd, (const struct sockaddr *)&r->local, sizeof r->local) < 0) {
    close(fd);
    return -1;
  }
  int rc = connect(fd, (const struct sockaddr *)&r->remote, sizeof r->remote);
  if (rc < 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  if (rc < 0) {
    uint64_t deadline = mono_ms() + (uint64_t)ex->connect_timeout_ms;
    for (;;) {
      uint64_t now = mono_ms();
      if (now >= deadline) {
        close(fd);
        return -1;
      }
      struct pollfd p[2] = {{.fd = fd, .events = POLLOUT}, {.fd = ex->wake_fd, .events = POLLIN}};
      int n = poll(p, 2, (int)(deadline - now));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || p[1].revents) {
        close(fd);
        return -1;
      }
      if (p[0].revents) break;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
      close(fd);
      return -1;
    }
  }
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  set_timeouts(fd, ex->slice_timeout_ms);
  return fd;
}

static int io_status(int rc) {
  switch (rc) {
    case IO_OK: return TENT_OK;
    case IO_TIMEOUT: return TENT_E_TIMEOUT;
    default: return TENT_E_IO;
  }
}

/* Run one slice on a connected socket. *broken set when the connection must be dropped. */
static int run_slice(tcp_exec_t *ex, int fd, const tent_slice_t *s, int *broken) {
  uint8_t h[REQ_SIZE];
  uint64_t reqid = atomic_fetch_add(&ex->next_reqid, 1);
  put32(h, WIRE_MAGIC);
  put16(h + 4, WIRE_VERSION);
  put16(h + 6, (uint16_t)s->opcode);
  put64(h + 8, s->remote_addr);
  put64(h + 16, s->length);
  put64(h + 24, reqid);
  *broken = 1;
  int rc = send_all(fd, h, REQ_SIZE, s->opcode == TENT_OP_WRITE);
  if (rc == IO_OK && s->opcode == TENT_OP_WRITE) rc = send_all(fd, (const void *)(uintptr_t)s->local_addr, s->length, 0);
  if (rc != IO_OK) return io_status(rc);
  uint8_t rsp[RSP_SIZE];
  rc = recv_all(fd, rsp, RSP_SIZE);
  if (rc != IO_OK) return io_status(rc);
  if (get32(rsp) != WIRE_MAGIC || get16(rsp + 4) != WIRE_VERSION || get64(rsp + 16) != reqid) return TENT_E_PROTOCOL;
  int32_t status = (int32_t)get32(rsp + 8);
  if (status == TENT_OK && s->opcode == TENT_OP_READ) {
    rc = recv_all(fd, (void *)(uintptr_t)s->local_addr, s->length);
    if (rc != IO_OK) return io_status(rc);
  }
  *broken = 0;
  if (status > 0 || status < TENT_E_INTERNAL) status = TENT_E_PROTOCOL;
  return status;
}

/* Find a rail with queued work and a free slot; pops one slice. Called with ex->mu. */
static rail_t *take_work_locked(tcp_exec_t *ex, tent_slice_t *out, peer_t **peer_out) {
  /* count (peer, rail) pairs for the round-robin cursor */
  unsigned total = 0;
  for (int p = 0; p < ex->npeers; p++)
    if (ex->peers[p]) total += (unsigned)ex->peers[p]->nrails;
  if (!total) return NULL;
  unsigned start = ex->rr % total, idx = 0;
  rail_t *best = NULL;
  peer_t *bestp = NULL;
  unsigned best_idx = 0;
  for (int p = 0; p < ex->npeers && !best; p++) {
    peer_t *pe = ex->peers[p];
    if (!pe) continue;
    for (int i = 0; i < pe->nrails; i++, idx++) {
      rail_t *r = &pe->rails[i];
      if (r->q.len && r->busy < ex->conns_per_rail && idx >= start) {
        best = r, bestp = pe, best_idx = idx;
        break;
      }
    }
  }
  if (!best) { /* wrap around */
    idx = 0;
    for (int p = 0; p < ex->npeers && !best; p++) {
      peer_t *pe = ex->peers[p];
      if (!pe) continue;
      for (int i = 0; i < pe->nrails && idx < start; i++, idx++) {
        rail_t *r = &pe->rails[i];
        if (r->q.len && r->busy < ex->conns_per_rail) {
          best = r, bestp = pe, best_idx = idx;
          break;
        }
      }
    }
  }
  if (!best) return NULL;
  ex->rr = best_idx + 1;
  q_pop(&best->q, out);
  *peer_out = bestp;
  return best;
}

static void *worker_main(void *arg) {
  tcp_exec_t *ex = arg;
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    if (ex->stopping) break;
    tent_slice_t s;
    if (ex->orphans.len) {
      q_pop(&ex->orphans, &s);
      pthread_mutex_unlock(&ex->mu);
      ex->host->complete(ex->host->ctx, &s, TENT_E_CONNECT);
      pthread_mutex_lock(&ex->mu);
      continue;
    }
    peer_t *pe = NULL;
    rail_t *r = take_work_locked(ex, &s, &pe);
    if (!r) {
      pthread_cond_wait(&ex->cv, &ex->mu);
      continue;
    }
    int status;
    if (ex->host->is_cancelled(ex->host->ctx, s.token)) {
      pthread_mutex_unlock(&ex->mu);
      ex->host->complete(ex->host->ctx, &s, TENT_E_CANCELLED);
      pthread_mutex_lock(&ex->mu);
      continue;
    }
    if (s.length == 0) {
      pthread_mutex_unlock(&ex->mu);
      ex->host->complete(ex->host->ctx, &s, TENT_OK);
      pthread_mutex_lock(&ex->mu);
      continue;
    }
    if (r->down_until_ms && mono_ms() < r->down_until_ms && r->nidle == 0) {
      atomic_fetch_add(&r->errors, 1);
      pthread_mutex_unlock(&ex->mu);
      ex->host->complete(ex->host->ctx, &s, TENT_E_CONNECT);
      pthread_mutex_lock(&ex->mu);
      continue;
    }
    int slot = 0;
    while (r->slot_fd[slot] != SLOT_FREE) slot++; /* busy < conns_per_rail: a free slot exists */
    r->busy++;
    int fd = r->nidle ? r->idle[--r->nidle] : -1;
    r->slot_fd[slot] = fd;
    pthread_mutex_unlock(&ex->mu);

    int broken = 0;
    status = TENT_E_CONNECT;
    if (fd < 0) {
      fd = rail_connect(ex, r);
      pthread_mutex_lock(&ex->mu);
      if (fd < 0) {
        r->down_until_ms = mono_ms() + (uint64_t)ex->connect_timeout_ms;
      } else {
        r->down_until_ms = 0;
        atomic_fetch_add(&r->connects, 1);
        if (ex->stopping || pe->removed) {
          close(fd);
          fd = -1;
        } else {
          r->slot_fd[slot] = fd;
        }
      }
      pthread_mutex_unlock(&ex->mu);
    }
    if (fd >= 0) status = run_slice(ex, fd, &s, &broken);

    pthread_mutex_lock(&ex->mu);
    if (fd >= 0) {
      if (broken || ex->stopping || pe->removed) close(fd);
      else r->idle[r->nidle++] = fd;
    }
    r->slot_fd[slot] = SLOT_FREE;
    r->busy--;
    if (status == TENT_OK) {
      atomic_fetch_add(&r->bytes, s.length);
      atomic_fetch_add(&r->slices, 1);
    } else {
      atomic_fetch_add(&r->errors, 1);
    }
    if (status != TENT_OK && ex->stopping && status > TENT_E_BOUNDS) status = TENT_E_CANCELLED;
    pthread_cond_signal(&ex->cv); /* a slot freed on this rail */
    pthread_mutex_unlock(&ex->mu);
    ex->host->complete(ex->host->ctx, &s, status);
    pthread_mutex_lock(&ex->mu);
  }
  pthread_mutex_unlock(&ex->mu);
  return NULL;
}

/* ------------------------------------------------------------------ peers */

static void rail_free(rail_t *r) {
  free(r->q.buf);
  free(r->idle);
  free(r->slot_fd);
}

EXPORT int64_t tcp_add_peer(void *self, int nrails, const char **local_ips, const char **remote_ips,
                            const int *remote_ports) {
  tcp_exec_t *ex = self;
  if (!ex || nrails <= 0 || nrails > MAX_RAILS || !remote_ips || !remote_ports) return -EINVAL;
  peer_t *pe = calloc(1, sizeof *pe);
  if (!pe) return -ENOMEM;
  pe->rails = calloc((size_t)nrails, sizeof(rail_t));
  if (!pe->rails) {
    free(pe);
    return -ENOMEM;
  }
  pe->nrails = nrails;
  for (int i = 0; i < nrails; i++) {
    rail_t *r = &pe->rails[i];
    r->local.sin_family = AF_INET;
    r->remote.sin_family = AF_INET;
    r->remote.sin_port = htons((uint16_t)remote_ports[i]);
    const char *lip = local_ips ? local_ips[i] : NULL;
    int bad = !remote_ips[i] || inet_pton(AF_INET, remote_ips[i], &r->remote.sin_addr) != 1 ||
              remote_ports[i] <= 0 || remote_ports[i] > 65535;
    if (!bad && lip && *lip) bad = inet_pton(AF_INET, lip, &r->local.sin_addr) != 1;
    r->idle = calloc((size_t)ex->conns_per_rail, sizeof(int));
    r->slot_fd = calloc((size_t)ex->conns_per_rail, sizeof(int));
    if (bad || !r->idle || !r->slot_fd) {
      for (int j = 0; j <= i; j++) rail_free(&pe->rails[j]);
      free(pe->rails);
      free(pe);
      return bad ? -EINVAL : -ENOMEM;
    }
    if (r->slot_fd)
      for (int k = 0; k < ex->conns_per_rail; k++) r->slot_fd[k] = SLOT_FREE;
    snprintf(r->name, sizeof r->name, "%s->%s:%d", (lip && *lip) ? lip : "*", remote_ips[i], remote_ports[i]);
  }
  pthread_mutex_lock(&ex->mu);
  if (ex->npeers == ex->cap_peers) {
    int ncap = ex->cap_peers ? ex->cap_peers * 2 : 16;
    peer_t **np = realloc(ex->peers, (size_t)ncap * sizeof *np);
    if (!np) {
      pthread_mutex_unlock(&ex->mu);
      for (int j = 0; j < nrails; j++) rail_free(&pe->rails[j]);
      free(pe->rails);
      free(pe);
      return -ENOMEM;
    }
    ex->peers = np;
    ex->cap_peers = ncap;
  }
  ex->peers[ex->npeers++] = pe;
  pe->handle = ex->npeers; /* handle = index + 1 */
  pthread_mutex_unlock(&ex->mu);
  return pe->handle;
}

static peer_t *peer_lookup_locked(tcp_exec_t *ex, uint64_t h) {
  if (h == 0 || h > (uint64_t)ex->npeers) return NULL;
  return ex->peers[h - 1];
}

EXPORT void tcp_remove_peer(void *self, int64_t handle) {
  tcp_exec_t *ex = self;
  if (!ex) return;
  pthread_mutex_lock(&ex->mu);
  peer_t *pe = peer_lookup_locked(ex, (uint64_t)handle);
  if (!pe || pe->removed) {
    pthread_mutex_unlock(&ex->mu);
    return;
  }
  pe->removed = 1;
  for (int i = 0; i < pe->nrails; i++) {
    rail_t *r = &pe->rails[i];
    tent_slice_t s;
    while (r->q.len) { /* queued slices fail as unreachable (retryable: the core may reroute) */
      q_pop(&r->q, &s);
      q_push(&ex->orphans, &s);
    }
    for (int k = 0; k < r->nidle; k++) close(r->idle[k]);
    r->nidle = 0;
    for (int k = 0; k < ex->conns_per_rail; k++)
      if (r->slot_fd[k] >= 0) shutdown(r->slot_fd[k], SHUT_RDWR);
  }
  /* the peer struct stays (handles are indices) until destroy; in-flight workers close their fds */
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
}

/* The core believes this rail is dead: queued slices fail at once (retryable, so the core
 * re-routes them) and in-flight ones are cut short instead of waiting out the progress timer.
 * Returns the number of queued slices handed back, or -EINVAL. */
EXPORT int tcp_abort_rail(void *self, int64_t handle, int rail) {
  tcp_exec_t *ex = self;
  if (!ex) return -EINVAL;
  pthread_mutex_lock(&ex->mu);
  peer_t *pe = peer_lookup_locked(ex, (uint64_t)handle);
  if (!pe || pe->removed || rail < 0 || rail >= pe->nrails) {
    pthread_mutex_unlock(&ex->mu);
    return -EINVAL;
  }
  rail_t *r = &pe->rails[rail];
  int n = 0;
  tent_slice_t s;
  while (r->q.len) {
    q_pop(&r->q, &s);
    q_push(&ex->orphans, &s);
    n++;
  }
  for (int k = 0; k < ex->conns_per_rail; k++)
    if (r->slot_fd[k] >= 0) shutdown(r->slot_fd[k], SHUT_RDWR);
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  return n;
}

/* out[0..3] = bytes ok, slices ok, errors, connects. Returns 0 or -EINVAL. */
EXPORT int tcp_get_rail_counters(void *self, int64_t handle, int rail, uint64_t *out, int nout) {
  tcp_exec_t *ex = self;
  if (!ex || !out) return -EINVAL;
  pthread_mutex_lock(&ex->mu);
  peer_t *pe = peer_lookup_locked(ex, (uint64_t)handle);
  if (!pe || rail < 0 || rail >= pe->nrails) {
    pthread_mutex_unlock(&ex->mu);
    return -EINVAL;
  }
  rail_t *r = &pe->rails[rail];
  uint64_t v[4] = {atomic_load(&r->bytes), atomic_load(&r->slices), atomic_load(&r->errors),
                   atomic_load(&r->connects)};
  pthread_mutex_unlock(&ex->mu);
  for (int i = 0; i < nout && i < 4; i++) out[i] = v[i];
  return 0;
}

/* ------------------------------------------------------------------ ABI */

static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  char dummy[8];
  if (!err || !errlen) err = dummy, errlen = sizeof dummy;
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    snprintf(err, errlen, "incompatible host API");
    return NULL;
  }
  tcp_exec_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  ex->host = host;
  ex->wake_fd = -1;
  if (parse_config(ex, config, err, errlen) != 0) {
    free(ex);
    return NULL;
  }
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->cv, NULL);
  pthread_mutex_init(&ex->reg_mu, NULL);
  pthread_cond_init(&ex->reg_cv, NULL);
  pthread_mutex_init(&ex->srv_mu, NULL);
  atomic_store(&ex->next_reqid, 1);
  ex->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ex->workers = calloc((size_t)ex->nthreads, sizeof(pthread_t));
  if (ex->wake_fd < 0 || !ex->workers) {
    snprintf(err, errlen, "executor init failed: %s", strerror(errno));
    ex_destroy(ex);
    return NULL;
  }
  for (int i = 0; i < ex->nthreads; i++) {
    if (pthread_create(&ex->workers[i], NULL, worker_main, ex) != 0) {
      snprintf(err, errlen, "pthread_create failed");
      ex_destroy(ex);
      return NULL;
    }
    ex->nworkers++;
  }
  return ex;
}

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  tcp_exec_t *ex = self;
  if (!ex) return TENT_E_INTERNAL;
  if (n == 0) return 0;
  pthread_mutex_lock(&ex->mu);
  if (ex->stopping) {
    pthread_mutex_unlock(&ex->mu);
    return TENT_E_CANCELLED;
  }
  /* validate everything first: all or nothing */
  for (uint32_t i = 0; i < n; i++) {
    peer_t *pe = peer_lookup_locked(ex, slices[i].peer);
    if (!pe || slices[i].rail >= (uint32_t)pe->nrails ||
        (slices[i].opcode != TENT_OP_READ && slices[i].opcode != TENT_OP_WRITE)) {
      pthread_mutex_unlock(&ex->mu);
      return TENT_E_INTERNAL;
    }
    slice_queue_t *q = pe->removed ? &ex->orphans : &pe->rails[slices[i].rail].q;
    if (q_reserve(q, n) != 0) {
      pthread_mutex_unlock(&ex->mu);
      return TENT_E_INTERNAL;
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    peer_t *pe = peer_lookup_locked(ex, slices[i].peer);
    q_push(pe->removed ? &ex->orphans : &pe->rails[slices[i].rail].q, &slices[i]);
  }
  if (n == 1) pthread_cond_signal(&ex->cv);
  else pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  return 0;
}

static void ex_destroy(void *self) {
  tcp_exec_t *ex = self;
  if (!ex) return;
  /* 1. stop: wake workers, pollers, and everything blocked in socket I/O */
  pthread_mutex_lock(&ex->mu);
  ex->stopping = 1;
  for (int p = 0; p < ex->npeers; p++) {
    peer_t *pe = ex->peers[p];
    for (int i = 0; i < pe->nrails; i++)
      for (int k = 0; k < ex->conns_per_rail; k++)
        if (pe->rails[i].slot_fd[k] >= 0) shutdown(pe->rails[i].slot_fd[k], SHUT_RDWR);
  }
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  if (ex->wake_fd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(ex->wake_fd, &one, sizeof one);
    (void)w;
  }
  pthread_mutex_lock(&ex->srv_mu);
  ex->stopping = 1;
  for (sconn_t *c = ex->sconns; c; c = c->next)
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&ex->srv_mu);

  /* 2. join */
  for (int i = 0; i < ex->nworkers; i++) pthread_join(ex->workers[i], NULL);
  for (listener_t *l = ex->listeners; l; l = l->next) pthread_join(l->thread, NULL);
  /* accept threads are gone: the sconn list is stable now */
  for (sconn_t *c = ex->sconns; c; c = c->next) pthread_join(c->thread, NULL);

  /* 3. fail what is still queued, free */
  tent_slice_t s;
  while (ex->orphans.len) {
    q_pop(&ex->orphans, &s);
    ex->host->complete(ex->host->ctx, &s, TENT_E_CANCELLED);
  }
  free(ex->orphans.buf);
  for (int p = 0; p < ex->npeers; p++) {
    peer_t *pe = ex->peers[p];
    for (int i = 0; i < pe->nrails; i++) {
      rail_t *r = &pe->rails[i];
      while (r->q.len) {
        q_pop(&r->q, &s);
        ex->host->complete(ex->host->ctx, &s, TENT_E_CANCELLED);
      }
      for (int k = 0; k < r->nidle; k++) close(r->idle[k]);
      rail_free(r);
    }
    free(pe->rails);
    free(pe);
  }
  free(ex->peers);
  while (ex->listeners) {
    listener_t *l = ex->listeners;
    ex->listeners = l->next;
    close(l->fd);
    free(l);
  }
  while (ex->sconns) {
    sconn_t *c = ex->sconns;
    ex->sconns = c->next;
    if (c->fd >= 0) close(c->fd);
    free(c);
  }
  while (ex->regions) {
    region_t *r = ex->regions;
    ex->regions = r->next;
    free(r);
  }
  free(ex->workers);
  if (ex->wake_fd >= 0) close(ex->wake_fd);
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv);
  pthread_mutex_destroy(&ex->reg_mu);
  pthread_cond_destroy(&ex->reg_cv);
  pthread_mutex_destroy(&ex->srv_mu);
  free(ex);
}

static const tent_executor_ops_t g_ops = {
    .abi_version = TENT_EXECUTOR_ABI_VERSION,
    .struct_size = sizeof(tent_executor_ops_t),
    .name = "tcp",
    .create = ex_create,
    .destroy = ex_destroy,
    .submit = ex_submit,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }
