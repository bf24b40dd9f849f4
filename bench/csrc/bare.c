/*
 * tent_bench._bare: the bare limits the small-request benchmarks put next to the engine, in C so
 * no interpreter sits between two system calls (a Python loop around process_vm_readv costs
 * microseconds per call and would flatter the engine).
 *
 *   cma(pid, op, local, remote, block, count, threads=1, piece=0) -> bytes
 *       `count` requests one at a time, each `block` bytes between our `local` and the process
 *       `pid`'s `remote` with process_vm_readv (op 0, READ) or process_vm_writev (op 1, WRITE).
 *       threads > 1: each request is cut into `piece`-byte pieces copied by `threads` threads
 *       (this one and threads-1 helpers that poll for work, so no wake-up is ever paid: the best
 *       a two-thread copy can do). Returns each request's seconds as float64s.
 *   memcpy(dst, src, block, count, threads=1, piece=0) -> bytes
 *       the same with memcpy within this process (the limit of the memfd mode).
 *   batch_cma(pid, op, local, remote, block, n, count, threads=1) -> bytes
 *       `count` batches of `n` requests of `block` bytes at consecutive addresses, the `n`
 *       requests shared by `threads` threads: each batch's seconds.
 *   tcp_serve(host, addr=0, size=0, spin_us=0, adaptive=0) -> port
 *       a tiny request/response TCP server on background threads (one per connection):
 *       header {u32 op, u32 pad, u64 length, u64 offset, 40 bytes pad}; WRITE: `length` bytes follow,
 *       answered by one byte (the header is 64 bytes so that a WRITE's payload does not sit 16
 *       bytes ahead of its source in the socket buffer pages, where the kernel's copy runs 2-3x
 *       slower: 4K aliasing, plugins/tcp/tools/copy_alias.py);
 *       READ: answered by `length` bytes. TCP_NODELAY, as the engine's connections. With `addr`,
 *       requests read from / write into [addr + offset, addr + offset + length) within
 *       [addr, addr + size) (the buffer the
 *       engine serves: the same memory, so the same copy costs; see small.py). With `spin_us`, a
 *       connection polls up to this long for the next request (no sleep) before it blocks in
 *       recv: every time, or with `adaptive` under the tcp executor's rule (tent/busy_poll.h,
 *       the same code), as the engine's server connections do.
 *   tcp_poll_stats() -> dict: the last tcp() loop's busy-poll outcomes on the client side.
 *   tcp_congestion(names) -> str
 *       from now on every socket of this module (tcp_serve's listener, and so the connections it
 *       accepts; tcp() and tcp_batch()'s connections) takes the first congestion control of the
 *       comma-separated `names` the kernel accepts ("" = the host's), as the engine's tcp
 *       transport gives its loopback connections (`loopback_congestion`): the bare loop and the
 *       engine then move their bytes under the same one. Returns the name a probe socket took
 *       ("" for the host's).
 *   tcp_calls(op, block, count) -> bytes
 *       the socket calls of `count` tcp() exchanges alone, made by one thread on both ends of one
 *       loopback connection (tuned as tcp()'s), so that no thread ever waits or is woken: what a
 *       round trip costs with free wake-ups. Per exchange five float64 seconds: the request's send
 *       (READ: the 64-byte header; WRITE: header and payload in one writev), its receipt (recv
 *       MSG_WAITALL), the answer's send (READ: the payload; WRITE: one byte), its receipt, and
 *       a memcpy of `block` bytes between the same two buffers (the copy alone, for scale). The
 *       first exchange's bytes are checked (OSError EIO if they did not arrive).
 *   tcp(host, port, op, block, count, local=0, spin_us=0, adaptive=0) -> bytes
 *       `count` requests one at a time on one connection to a tcp_serve server (a WRITE's
 *       header and payload in one writev, like the engine): each request's seconds. With
 *       `local`, the client's bytes are [local, local + block) (the engine's local buffer). With
 *       `spin_us`, the client polls up to this long for the answer before it blocks in recv (as the
 *       engine's waiter does: the tcp executor's `busy_poll_us`, `busy_poll_adaptive`).
 *   tcp_batch(host, port, op, block, n, count, conns, local, spin_us=0, adaptive=0) -> bytes
 *       `count` batches of `n` requests of `block` bytes ([local + i * block) here, offset
 *       i * block there), one batch in flight, shared out over `conns` connections as the engine
 *       shares an inline batch (consecutive requests, one pipelined run per connection): this
 *       thread sends each run in one writev, then reads the answers connection by connection
 *       (a READ's payload with one recv each, a run's WRITE acks with one), polling before it
 *       sleeps under the same rule as tcp() (one policy per connection, as the engine's slots).
 *       Each batch's seconds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tent/busy_poll.h"

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- copies: one request = `len` bytes at (local + off, remote + off), cut into pieces ---- */
enum { K_CMA_READ, K_CMA_WRITE, K_MEMCPY };

typedef struct {
  int kind;
  pid_t pid;
  uint64_t local, remote, len, piece;
  atomic_ullong next;     /* next piece offset to take */
  atomic_ullong done;     /* bytes finished */
  atomic_int error;       /* first errno */
  atomic_ulong gen;       /* request number: helpers start work when it moves */
  atomic_int stop;
} job_t;

static int copy_piece(job_t *j, uint64_t off, uint64_t n) {
  char *l = (char *)(uintptr_t)(j->local + off), *r = (char *)(uintptr_t)(j->remote + off);
  if (j->kind == K_MEMCPY) {
    memcpy(l, r, n);
    return 0;
  }
  while (n) {
    struct iovec li = {l, n}, ri = {r, n};
    ssize_t k = j->kind == K_CMA_READ ? process_vm_readv(j->pid, &li, 1, &ri, 1, 0) : process_vm_writev(j->pid, &li, 1, &ri, 1, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (k == 0) return EFAULT;
    l += k;
    r += k;
    n -= (uint64_t)k;
  }
  return 0;
}

/* Take pieces of the current request until none is left. */
static void work(job_t *j) {
  for (;;) {
    uint64_t off = atomic_fetch_add(&j->next, j->piece);
    if (off >= j->len) return;
    uint64_t n = j->len - off < j->piece ? j->len - off : j->piece;
    int e = copy_piece(j, off, n);
    if (e) {
      int z = 0;
      atomic_compare_exchange_strong(&j->error, &z, e);
    }
    atomic_fetch_add(&j->done, n);
  }
}

static void *helper(void *arg) {
  job_t *j = arg;
  unsigned long seen = 0;
  while (!atomic_load(&j->stop)) {
    unsigned long g = atomic_load(&j->gen);
    if (g == seen) {
      relax();
      continue;
    }
    seen = g;
    work(j);
  }
  return NULL;
}

/* count requests, one at a time; per-request seconds into out. 0 or an errno. */
static int run_requests(job_t *j, uint64_t block, Py_ssize_t count, int threads, double *out) {
  pthread_t th[64];
  int started = 0;
  for (int i = 1; i < threads && i < 64; i++)
    if (pthread_create(&th[started], NULL, helper, j) == 0) started++;
  j->len = block;
  for (Py_ssize_t i = 0; i < count && !atomic_load(&j->error); i++) {
    uint64_t t0 = now_ns();
    atomic_store(&j->done, 0);
    atomic_store(&j->next, 0);
    atomic_fetch_add(&j->gen, 1);
    work(j);
    while (atomic_load(&j->done) < block) relax();
    out[i] = (double)(now_ns() - t0) / 1e9;
  }
  atomic_store(&j->stop, 1);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  return atomic_load(&j->error);
}

static PyObject *copies(int kind, pid_t pid, uint64_t local, uint64_t remote, uint64_t block, Py_ssize_t count,
                        int threads, uint64_t piece) {
  if (count <= 0 || block == 0 || threads < 1 || threads > 64) {
    PyErr_SetString(PyExc_ValueError, "need count > 0, block > 0, 1 <= threads <= 64");
    return NULL;
  }
  PyObject *res = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(double));
  if (!res) return NULL;
  job_t *j = calloc(1, sizeof *j);
  if (!j) {
    Py_DECREF(res);
    return PyErr_NoMemory();
  }
  j->kind = kind;
  j->pid = pid;
  j->local = local;
  j->remote = remote;
  j->piece = piece && threads > 1 ? piece : block;
  int err;
  Py_BEGIN_ALLOW_THREADS;
  err = run_requests(j, block, count, threads, (double *)PyBytes_AS_STRING(res));
  Py_END_ALLOW_THREADS;
  free(j);
  if (err) {
    Py_DECREF(res);
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return res;
}

static PyObject *py_cma(PyObject *m, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"pid", "op", "local", "remote", "block", "count", "threads", "piece", NULL};
  int pid, op, threads = 1;
  unsigned long long local, remote, block, piece = 0;
  Py_ssize_t count;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iiKKKn|iK", kwlist, &pid, &op, &local, &remote, &block, &count, &threads,
                                   &piece))
    return NULL;
  return copies(op == 0 ? K_CMA_READ : K_CMA_WRITE, pid, local, remote, block, count, threads, piece);
}

static PyObject *py_memcpy(PyObject *m, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"dst", "src", "block", "count", "threads", "piece", NULL};
  int threads = 1;
  unsigned long long dst, src, block, piece = 0;
  Py_ssize_t count;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "KKKn|iK", kwlist, &dst, &src, &block, &count, &threads, &piece)) return NULL;
  return copies(K_MEMCPY, 0, dst, src, block, count, threads, piece);
}

/* batches: n requests of `block` bytes each, taken by `threads` threads, `count` times */
static PyObject *py_batch_cma(PyObject *m, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"pid", "op", "local", "remote", "block", "n", "count", "threads", NULL};
  int pid, op, threads = 1;
  unsigned long long local, remote, block;
  Py_ssize_t n, count;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iiKKKnn|i", kwlist, &pid, &op, &local, &remote, &block, &n, &count,
                                   &threads))
    return NULL;
  if (n <= 0) {
    PyErr_SetString(PyExc_ValueError, "n must be > 0");
    return NULL;
  }
  /* a batch of n requests at consecutive addresses is one request of n*block bytes in pieces of
   * `block`: each piece is one system call, as each request of the batch is for the engine */
  return copies(op == 0 ? K_CMA_READ : K_CMA_WRITE, pid, local, remote, block * (uint64_t)n, count, threads, block);
}

/* ---- tcp ---- */
/* Poll fd for readability without sleeping for up to `ns` (yielding every few polls), as the
 * engine's tcp executor does before it sleeps: 1 readable, 0 time ran out; *lost: the thread lost
 * its core meanwhile (two looks TENT_BUSY_POLL_LOST_NS apart). */
static int spin_readable(int fd, uint64_t ns, int *lost) {
  if (!ns) return 0;
  uint64_t last = now_ns(), end = last + ns;
  for (unsigned i = 1;; i++) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) return 1;
    uint64_t now = now_ns();
    if (now - last >= TENT_BUSY_POLL_LOST_NS) *lost = 1;
    if (now >= end) return 0;
    if (i % 8 == 0) sched_yield();
    else relax();
    last = now_ns();
  }
}

/* The engine polls only around small requests: its waiter for answers of requests sent inline
 * (tcp `inline_bytes`), a server connection after serving one (SPIN_AFTER_BYTES); both 256 KiB. */
#define POLL_AFTER_BYTES (256u << 10)

/* Wait for fd to become readable the engine's way: poll first as the policy says, then block
 * (the caller's recv blocks); the policy learns when the bytes came, and the exchange's whole
 * cycle since `cycle_start` (a client's send, a server's receipt of the previous request). */
static void wait_readable(int fd, tent_busy_poll_t *bp, uint64_t cycle_start) {
  if (!bp->cap_ns) return;
  uint64_t t0 = now_ns();
  uint32_t budget = tent_busy_poll_begin(bp);
  int lost = 0;
  if (!spin_readable(fd, budget, &lost)) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
  }
  uint64_t now = now_ns();
  tent_busy_poll_end(bp, budget, now - t0, cycle_start && cycle_start <= t0 ? now - cycle_start : now - t0, lost);
}

static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static int recv_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t k = recv(fd, c, n, MSG_WAITALL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static char g_cc[4][16]; /* tcp_congestion(): names in order of preference */
static int g_ncc;

static const char *apply_cc(int fd) {
  for (int i = 0; i < g_ncc; i++)
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, g_cc[i], (socklen_t)strlen(g_cc[i])) == 0) return g_cc[i];
  return "";
}

static void nodelay(int fd) {
  apply_cc(fd);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

typedef struct serve_mem {
  int fd;
  int spin_us; /* poll up to this long for the next request before sleeping in recv */
  int adaptive; /* ... as tent/busy_poll.h says (else every time) */
  char *addr; /* NULL: a buffer of the connection's own */
  uint64_t size;
} serve_mem_t;

static void *serve_conn(void *arg) {
  serve_mem_t mem = *(serve_mem_t *)arg;
  free(arg);
  int fd = mem.fd;
  size_t cap = 0;
  char *buf = NULL;
  uint8_t h[64];
  tent_busy_poll_t bp;
  tent_busy_poll_init(&bp, (uint32_t)mem.spin_us * 1000u, mem.adaptive);
  uint64_t last_len = 0, served = 0;
  for (;;) {
    /* as the engine's server connection: poll first as the policy says, then sleep in the recv of
     * the header itself (not in a poll before it); the policy learns when the header was in */
    uint64_t t0 = 0;
    uint32_t budget = 0;
    int lost = 0;
    if (last_len <= POLL_AFTER_BYTES && bp.cap_ns) {
      t0 = now_ns();
      budget = tent_busy_poll_begin(&bp);
      spin_readable(fd, budget, &lost);
    }
    if (recv_all(fd, h, sizeof h)) break;
    if (t0) {
      uint64_t now = now_ns();
      tent_busy_poll_end(&bp, budget, now - t0, served && served <= t0 ? now - served : now - t0, lost);
    }
    served = now_ns();
    uint32_t op;
    uint64_t len, off;
    memcpy(&op, h, 4);
    memcpy(&len, h + 8, 8);
    memcpy(&off, h + 16, 8);
    if (len > (1ull << 31)) break;
    last_len = len;
    if (mem.addr && off <= mem.size && len <= mem.size - off) {
      char ack = 1, *at = mem.addr + off;
      if (op == 1 ? recv_all(fd, at, len) || send_all(fd, &ack, 1) : send_all(fd, at, len)) break;
      continue;
    }
    if (len > cap) {
      char *nb = realloc(buf, len);
      if (!nb) break;
      /* real bytes: untouched pages all map the kernel's zero page, and a READ sent from one
       * cache-hot 4 KiB page is no baseline for a server sending from a registered buffer */
      memset(nb + cap, 0x5a, len - cap);
      buf = nb;
      cap = len;
    }
    if (op == 1) {
      char ack = 1;
      if (recv_all(fd, buf, len) || send_all(fd, &ack, 1)) break;
    } else if (send_all(fd, buf, len)) {
      break;
    }
  }
  free(buf);
  close(fd);
  return NULL;
}

static void *accept_loop(void *arg) {
  serve_mem_t lmem = *(serve_mem_t *)arg;
  free(arg);
  int lfd = lmem.fd;
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;
    }
    nodelay(fd);
    pthread_t t;
    serve_mem_t *mem = malloc(sizeof *mem);
    if (mem) *mem = (serve_mem_t){fd, lmem.spin_us, lmem.adaptive, lmem.addr, lmem.size};
    if (!mem || pthread_create(&t, NULL, serve_conn, mem) != 0) {
      free(mem);
      close(fd);
      continue;
    }
    pthread_detach(t);
  }
  return NULL;
}

static PyObject *py_tcp_serve(PyObject *m, PyObject *args) {
  const char *host;
  unsigned long long addr = 0, size = 0;
  int spin_us = 0, adaptive = 0;
  if (!PyArg_ParseTuple(args, "s|KKii", &host, &addr, &size, &spin_us, &adaptive)) return NULL;
  if (spin_us < 0 || spin_us > 10000) {
    PyErr_SetString(PyExc_ValueError, "spin_us must be 0..10000");
    return NULL;
  }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    PyErr_SetString(PyExc_ValueError, "host must be an IPv4 address");
    return NULL;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  apply_cc(fd); /* set by setsockopt on the listener, the accepted connections keep it */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  socklen_t sl = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 64) || getsockname(fd, (struct sockaddr *)&sa, &sl)) {
    if (fd >= 0) close(fd);
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  pthread_t t;
  serve_mem_t *mem = malloc(sizeof *mem);
  if (mem) *mem = (serve_mem_t){fd, spin_us, adaptive, (char *)(uintptr_t)addr, addr ? size : 0};
  if (!mem || pthread_create(&t, NULL, accept_loop, mem) != 0) {
    free(mem);
    close(fd);
    PyErr_SetString(PyExc_RuntimeError, "pthread_create failed");
    return NULL;
  }
  pthread_detach(t);
  return PyLong_FromLong(ntohs(sa.sin_port));
}

static tent_busy_poll_t g_last_client; /* the last tcp() loop's polling state (under the GIL) */

static PyObject *py_tcp(PyObject *m, PyObject *args) {
  const char *host;
  int port, op;
  unsigned long long block;
  Py_ssize_t count;
  unsigned long long local = 0;
  int spin_us = 0, adaptive = 0;
  if (!PyArg_ParseTuple(args, "siiKn|Kii", &host, &port, &op, &block, &count, &local, &spin_us, &adaptive)) return NULL;
  if (spin_us < 0 || spin_us > 10000) {
    PyErr_SetString(PyExc_ValueError, "spin_us must be 0..10000");
    return NULL;
  }
  tent_busy_poll_t bp;
  tent_busy_poll_init(&bp, block <= POLL_AFTER_BYTES ? (uint32_t)spin_us * 1000u : 0, adaptive);
  if (count <= 0 || block == 0 || block > (1ull << 31)) {
    PyErr_SetString(PyExc_ValueError, "need count > 0 and 0 < block <= 2 GiB");
    return NULL;
  }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    PyErr_SetString(PyExc_ValueError, "host must be an IPv4 address");
    return NULL;
  }
  PyObject *res = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(double));
  char *own = local ? NULL : malloc(block);
  char *data = local ? (char *)(uintptr_t)local : own;
  if (!res || !data) {
    Py_XDECREF(res);
    free(own);
    return PyErr_NoMemory();
  }
  if (own) memset(own, 0x5a, block);
  double *out = (double *)PyBytes_AS_STRING(res);
  int err = 0;
  Py_BEGIN_ALLOW_THREADS;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || (nodelay(fd), connect(fd, (struct sockaddr *)&sa, sizeof sa)) != 0) {
    err = errno;
  } else {
    uint8_t h[64] = {0};
    uint32_t o = (uint32_t)op;
    uint64_t len = block;
    memcpy(h, &o, 4);
    memcpy(h + 8, &len, 8);
    for (Py_ssize_t i = 0; i < count && !err; i++) {
      uint64_t t0 = now_ns();
      if (op == 1) {
        struct iovec iov[2] = {{h, sizeof h}, {data, block}};
        size_t left = sizeof h + block;
        int k = 0;
        while (left && !err) { /* header and payload in one writev, as the engine sends them */
          ssize_t w = writev(fd, iov + k, 2 - k);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) {
            err = errno ? errno : EPIPE;
            break;
          }
          left -= (size_t)w;
          while (k < 2 && (size_t)w >= iov[k].iov_len) w -= (ssize_t)iov[k++].iov_len;
          if (k < 2) {
            iov[k].iov_base = (char *)iov[k].iov_base + w;
            iov[k].iov_len -= (size_t)w;
          }
        }
        char ack;
        if (!err) wait_readable(fd, &bp, t0);
        if (!err && recv_all(fd, &ack, 1)) err = errno ? errno : EPIPE;
      } else {
        if (send_all(fd, h, sizeof h) || (wait_readable(fd, &bp, t0), recv_all(fd, data, block))) err = errno ? errno : EPIPE;
      }
      out[i] = (double)(now_ns() - t0) / 1e9;
    }
  }
  if (fd >= 0) close(fd);
  Py_END_ALLOW_THREADS;
  g_last_client = bp;
  free(own);
  if (err) {
    Py_DECREF(res);
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return res;
}

#define BATCH_CONNS_MAX 16

static int connect_to(const struct sockaddr_in *sa) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  nodelay(fd);
  if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Send every byte of iov[0..n) (consumed in place). */
static int writev_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n > 1024 ? 1024 : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    while (n > 0 && (size_t)w >= iov->iov_len) w -= (ssize_t)iov->iov_len, iov++, n--;
    if (n > 0) iov->iov_base = (char *)iov->iov_base + w, iov->iov_len -= (size_t)w;
  }
  return 0;
}

static PyObject *py_tcp_batch(PyObject *m, PyObject *args) {
  const char *host;
  int port, op, conns;
  unsigned long long block, local;
  Py_ssize_t n, count;
  int spin_us = 0, adaptive = 0;
  if (!PyArg_ParseTuple(args, "siiKnniK|ii", &host, &port, &op, &block, &n, &count, &conns, &local, &spin_us, &adaptive))
    return NULL;
  if (spin_us < 0 || spin_us > 10000 || count <= 0 || n <= 0 || n > 1024 || block == 0 || block > (1ull << 31) ||
      conns < 1 || conns > BATCH_CONNS_MAX || !local) {
    PyErr_SetString(PyExc_ValueError, "need 0 <= spin_us <= 10000, count > 0, 0 < n <= 1024, 0 < block <= 2 GiB, "
                                      "1 <= conns <= 16 and a local buffer");
    return NULL;
  }
  if (conns > n) conns = (int)n;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    PyErr_SetString(PyExc_ValueError, "host must be an IPv4 address");
    return NULL;
  }
  PyObject *res = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(double));
  uint8_t *hdr = calloc((size_t)n, 64);
  struct iovec *iov = malloc((size_t)n * 2 * sizeof *iov);
  char *acks = malloc((size_t)n);
  if (!res || !hdr || !iov || !acks) {
    Py_XDECREF(res);
    free(hdr), free(iov), free(acks);
    return PyErr_NoMemory();
  }
  double *out = (double *)PyBytes_AS_STRING(res);
  char *data = (char *)(uintptr_t)local;
  int fds[BATCH_CONNS_MAX], err = 0, nfd = 0;
  tent_busy_poll_t bp[BATCH_CONNS_MAX];
  Py_ssize_t per = (n + conns - 1) / conns;
  for (Py_ssize_t i = 0; i < n; i++) {
    uint32_t o = (uint32_t)op;
    uint64_t len = block, off = (uint64_t)i * block;
    memcpy(hdr + 64 * i, &o, 4);
    memcpy(hdr + 64 * i + 8, &len, 8);
    memcpy(hdr + 64 * i + 16, &off, 8);
  }
  Py_BEGIN_ALLOW_THREADS;
  for (; nfd < conns; nfd++) {
    tent_busy_poll_init(&bp[nfd], block <= POLL_AFTER_BYTES ? (uint32_t)spin_us * 1000u : 0, adaptive);
    if ((fds[nfd] = connect_to(&sa)) < 0) {
      err = errno ? errno : ECONNREFUSED;
      break;
    }
  }
  for (Py_ssize_t b = 0; b < count && !err; b++) {
    uint64_t t0 = now_ns();
    for (int c = 0; c < conns && !err; c++) { /* one pipelined run per connection, one writev */
      int k = 0;
      for (Py_ssize_t i = c * per; i < n && i < (c + 1) * per; i++) {
        iov[k++] = (struct iovec){hdr + 64 * i, 64};
        if (op == 1) iov[k++] = (struct iovec){data + (uint64_t)i * block, block};
      }
      if (k && writev_all(fds[c], iov, k)) err = errno ? errno : EPIPE;
    }
    for (int c = 0; c < conns && !err; c++) { /* the answers, connection by connection */
      Py_ssize_t lo = c * per, hi = (c + 1) * per < n ? (c + 1) * per : n;
      if (lo >= hi) continue;
      wait_readable(fds[c], &bp[c], t0);
      if (op == 1) {
        if (recv_all(fds[c], acks, (size_t)(hi - lo))) err = errno ? errno : EPIPE;
      } else {
        for (Py_ssize_t i = lo; i < hi && !err; i++)
          if (recv_all(fds[c], data + (uint64_t)i * block, block)) err = errno ? errno : EPIPE;
      }
    }
    out[b] = (double)(now_ns() - t0) / 1e9;
  }
  for (int c = 0; c < nfd; c++) close(fds[c]);
  Py_END_ALLOW_THREADS;
  free(hdr), free(iov), free(acks);
  if (err) {
    Py_DECREF(res);
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return res;
}

static PyObject *py_tcp_poll_stats(PyObject *m, PyObject *unused) {
  const tent_busy_poll_t *b = &g_last_client;
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:I,s:I,s:I}", "waits", (unsigned long long)b->waits, "polls",
                       (unsigned long long)b->polls, "hits", (unsigned long long)b->hits, "lost",
                       (unsigned long long)b->lost, "budget_ns", b->budget_ns, "poll_ns", b->poll_ns, "sleep_ns",
                       b->sleep_ns);
}

/* A connected loopback pair in this process, both ends tuned as tcp()'s: 0 or an errno. */
static int tcp_pair(int fds[2]) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t sl = sizeof sa;
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), err = 0;
  fds[0] = fds[1] = -1;
  if (lfd < 0) return errno;
  if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1) || getsockname(lfd, (struct sockaddr *)&sa, &sl) ||
      (fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
      (nodelay(fds[0]), connect(fds[0], (struct sockaddr *)&sa, sizeof sa)) || (fds[1] = accept(lfd, NULL, NULL)) < 0)
    err = errno ? errno : EIO;
  else
    nodelay(fds[1]);
  close(lfd);
  if (err) {
    if (fds[0] >= 0) close(fds[0]);
    fds[0] = fds[1] = -1;
  }
  return err;
}

static PyObject *py_tcp_calls(PyObject *m, PyObject *args) {
  int op;
  unsigned long long block;
  Py_ssize_t count;
  if (!PyArg_ParseTuple(args, "iKn", &op, &block, &count)) return NULL;
  /* both ends' bytes sit in the socket buffers at once: keep them within tcp()'s 4 MiB */
  if (count <= 0 || block == 0 || block > (1ull << 20)) {
    PyErr_SetString(PyExc_ValueError, "need count > 0 and 0 < block <= 1 MiB");
    return NULL;
  }
  PyObject *res = PyBytes_FromStringAndSize(NULL, count * 5 * (Py_ssize_t)sizeof(double));
  char *cbuf = malloc(block), *sbuf = malloc(block);
  if (!res || !cbuf || !sbuf) {
    Py_XDECREF(res);
    free(cbuf);
    free(sbuf);
    return PyErr_NoMemory();
  }
  memset(cbuf, 0x5a, block); /* real pages on both ends, as tcp() and tcp_serve() have */
  memset(sbuf, 0xa5, block);
  double *out = (double *)PyBytes_AS_STRING(res);
  int err, fds[2];
  Py_BEGIN_ALLOW_THREADS;
  err = tcp_pair(fds);
  uint8_t h[64] = {0};
  char ack = 1;
  for (Py_ssize_t i = 0; i < count && !err; i++) {
    uint64_t t[6];
    t[0] = now_ns();
    if (op == 1) {
      struct iovec iov[2] = {{h, sizeof h}, {cbuf, block}}; /* the size fits the socket buffer: one call */
      if (writev(fds[0], iov, 2) != (ssize_t)(sizeof h + block)) err = errno ? errno : EIO;
      t[1] = now_ns();
      if (!err && (recv_all(fds[1], h, sizeof h) || recv_all(fds[1], sbuf, block))) err = errno ? errno : EPIPE;
      t[2] = now_ns();
      if (!err && send_all(fds[1], &ack, 1)) err = errno ? errno : EPIPE;
      t[3] = now_ns();
      if (!err && recv_all(fds[0], &ack, 1)) err = errno ? errno : EPIPE;
    } else {
      if (send_all(fds[0], h, sizeof h)) err = errno ? errno : EPIPE;
      t[1] = now_ns();
      if (!err && recv_all(fds[1], h, sizeof h)) err = errno ? errno : EPIPE;
      t[2] = now_ns();
      if (!err && send_all(fds[1], sbuf, block)) err = errno ? errno : EPIPE;
      t[3] = now_ns();
      if (!err && recv_all(fds[0], cbuf, block)) err = errno ? errno : EPIPE;
    }
    t[4] = now_ns();
    if (!err && i == 0 && memcmp(cbuf, sbuf, block)) err = EIO; /* the bytes crossed (they differed before) */
    memcpy(op == 1 ? sbuf : cbuf, op == 1 ? cbuf : sbuf, block);
    __asm__ __volatile__("" ::"r"(cbuf), "r"(sbuf) : "memory"); /* the copy is not optimised away */
    t[5] = now_ns();
    for (int k = 0; k < 5; k++) out[i * 5 + k] = (double)(t[k + 1] - t[k]) / 1e9;
  }
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
  Py_END_ALLOW_THREADS;
  free(cbuf);
  free(sbuf);
  if (err) {
    Py_DECREF(res);
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return res;
}

static PyObject *py_tcp_congestion(PyObject *m, PyObject *args) {
  const char *names;
  if (!PyArg_ParseTuple(args, "s", &names)) return NULL;
  char cc[4][16] = {{0}};
  int n = 0;
  for (const char *p = names; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (!len || len >= sizeof cc[0] || n >= 4) {
      PyErr_Format(PyExc_ValueError, "tcp_congestion: bad list %R (at most 4 names of 1-15 characters)", args);
      return NULL;
    }
    memcpy(cc[n], p, len);
    cc[n++][len] = 0;
    p = e ? e + 1 : p + len;
  }
  memcpy(g_cc, cc, sizeof cc);
  g_ncc = n;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PyErr_SetFromErrno(PyExc_OSError);
  const char *took = apply_cc(fd);
  close(fd);
  return PyUnicode_FromString(took);
}

static PyMethodDef methods[] = {
    {"tcp_congestion", py_tcp_congestion, METH_VARARGS,
     "tcp_congestion(names): this module's sockets take the first of these congestion controls the kernel accepts"},
    {"cma", (PyCFunction)(void (*)(void))py_cma, METH_VARARGS | METH_KEYWORDS,
     "cma(pid, op, local, remote, block, count, threads=1, piece=0) -> per-request seconds (float64 bytes)"},
    {"memcpy", (PyCFunction)(void (*)(void))py_memcpy, METH_VARARGS | METH_KEYWORDS,
     "memcpy(dst, src, block, count, threads=1, piece=0) -> per-request seconds (float64 bytes)"},
    {"batch_cma", (PyCFunction)(void (*)(void))py_batch_cma, METH_VARARGS | METH_KEYWORDS,
     "batch_cma(pid, op, local, remote, block, n, count, threads=1) -> per-batch seconds (float64 bytes)"},
    {"tcp_serve", py_tcp_serve, METH_VARARGS,
     "tcp_serve(host, addr=0, size=0, spin_us=0, adaptive=0) -> port of a bare request/response server"},
    {"tcp", py_tcp, METH_VARARGS,
     "tcp(host, port, op, block, count, local=0, spin_us=0, adaptive=0) -> per-request seconds (float64 bytes)"},
    {"tcp_batch", py_tcp_batch, METH_VARARGS,
     "tcp_batch(host, port, op, block, n, count, conns, local, spin_us=0, adaptive=0): batches shared over conns"},
    {"tcp_poll_stats", py_tcp_poll_stats, METH_NOARGS,
     "tcp_poll_stats() -> the last tcp() loop's client waits, polls, hits, lost cores, budget, poll/sleep cycle ns"},
    {"tcp_calls", py_tcp_calls, METH_VARARGS,
     "tcp_calls(op, block, count) -> per exchange the seconds of its four socket calls (one thread, no waits) and a memcpy"},
    {NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_bare", "bare limits for the small-request benchmarks", -1,
                                    methods};

PyMODINIT_FUNC PyInit__bare(void) { return PyModule_Create(&moddef); }
