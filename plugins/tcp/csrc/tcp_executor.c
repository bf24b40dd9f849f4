/*
 * tent_tcp executor: the TCP slice executor behind the TENT executor C ABI.
 *
 * Client side: peers live in a generation-counted handle table (tent/handle_table.h). submit()
 * turns each slice into a job of one or more chunks (tent/chunk_queue.h; config `chunk`, default
 * 0 = whole slices) on its (peer, rail) queues: slices the core hints as parts of small,
 * latency-sensitive requests (TENT_HINT_SMALL) on the rail's small-request queue, the others on
 * its bulk queue. A rail has `conns_per_rail`
 * bulk connection slots plus one express slot that only small chunks use, so a small request
 * never waits behind a stream of large ones on the same peer; free workers serve small chunks
 * first. While small requests are active on a rail (one submitted within `qos_window_ms`, in a
 * submit without bulk slices), bulk there runs on `qos_bulk_conns` connections at most: on a
 * shared host every bulk connection is a copying thread on each side competing with the small
 * request's for the cores; and those that still run do so at nice `qos_bulk_nice` (both sides,
 * see "QoS: bulk threads' CPU weight"). A rail with queued chunks and a slot they may use sits in a ready list, so a worker
 * finds work in O(1) however many peers there are; it borrows a persistent connection
 * (connecting lazily), runs its chunks and, for a job's last chunk, reports the slice through
 * host->complete. Small chunks queued together are pipelined on one connection (up to
 * `pipeline` requests and `pipeline_bytes` bytes a run, spread over the free slots): all
 * requests leave in one sendmsg, header and payload together, then the responses are read in
 * order: a READ's answer with one recvmsg (its gap, its payload and the next answer's header),
 * and the target answers the READs already waiting behind one in one sendmsg (send_read_answers).
 * Payload bytes go straight between the user's memory and the socket: no intermediate
 * copies, no Python. A removed peer leaves the table at once and is freed when its last
 * in-flight chunk returns; its queued chunks (both queues) are handed back untouched
 * (TENT_E_REROUTED), as are those of a rail the core aborts.
 *
 * Progress timeout (`slice_timeout_ms`): a chunk fails with TENT_E_TIMEOUT when no byte of it moved
 * for that long while it was being served (connecting included); time spent queued never counts.
 * The chunks of a pipelined run are in service together from the moment the run starts (connect,
 * then one send for all of them) until each one's answer is read; they share one progress clock,
 * which every byte moved on the run's connection resets. Workers (and a waiter reading inline
 * answers) report each chunk's service start/stop, moved payload bytes and congestion (a send
 * that could not hand the kernel a byte for `congestion_ms`: the send buffer is full and not
 * draining) through host->note, from which the core tells a dead rail from a busy one. A failed
 * connect makes the rail fail fast for `connect_backoff_ms` while it has no connection, so a dead
 * rail does not hold every worker.
 *
 * submit_inline (executor ABI, optional entry): when a rail has nothing queued and an idle
 * connection with a free slot, the submitting thread sends the small requests itself (one
 * sendmsg) and nobody is woken: the answers are read by the thread that waits for the batch,
 * through progress() from the core's bounded poll, as soon as they arrive (a request and its
 * answer then cost no thread hand-off at all, like a bare blocking exchange). When the waiter
 * stops polling (or nobody waits), progress(token, -1) hands the connection to a worker. Anything
 * that cannot leave at once is queued as by submit(). Such chunks are in service (and on the
 * progress clock) from their send on. A batch is shared out over the idle connections it may use
 * (at most INLINE_RUNS runs), as workers share queued small chunks over the free slots: the
 * target serves each connection on its own thread, so a batch's requests are served in parallel.
 *
 * Busy poll (`busy_poll_us`, the cap; 0 = off): the waiter polls the socket of its inline run
 * before it sleeps in ppoll, and a server connection that just served a request of up to
 * SPIN_AFTER_BYTES polls for the next one before it sleeps in poll (bulk connections always
 * sleep). It saves a thread wake-up per small request where cores are free; where they are not,
 * the polling thread holds a core its peer needs (docs/benchmarks.md). So by default
 * (`busy_poll_adaptive` 1) each connection, on each side, learns whether and how long to poll
 * from its own outcomes (tent/busy_poll.h: polls that found their bytes in time on a core nobody
 * else wanted keep it polling; misses and lost cores send it to sleep at once, with sparse probes
 * to re-learn); `busy_poll_adaptive` 0 polls the whole cap every time. Either way, at most half
 * the online CPUs (at least one) of an executor's threads poll at once, and none while the
 * executor moves a bulk request (or within BULK_QUIET_MS of one): the copying threads of a stream
 * need those cores, and a small request's tail beside a stream grew 3x when they polled
 * (docs/benchmarks.md). A wait that may not poll sleeps.
 *
 * Server side: one accept thread per listener, one thread per accepted connection, at most
 * `max_conns` connections at once (more are closed at accept; those still authenticating hold at
 * most a quarter of them, for `auth_timeout_ms` at most, the oldest cut first). With an `auth_key` (the per-purpose
 * key tent_core.auth derives from the cluster token) every connection runs the handshake of
 * tent/auth.h first, both ways: a server serves no byte to a client that did not prove the key
 * within `auth_timeout_ms`, a client sends none to a server that did not. A connection idle for
 * `idle_timeout_ms` is closed (clients drop pooled connections before that).
 * Every request is checked against the registered regions (bounds + permission; a sorted table,
 * bisected, so the cost does not grow with the number of registrations). A region is a
 * handle (tcp_register_region returns its id): removing one registration removes exactly it and
 * its permission, even where another registration covers the same bytes. Regions are reference
 * counted so unregister waits for in-flight server I/O, up to `unregister_timeout_ms`; then the
 * connections still using the region are cut (their I/O fails at once) and it is freed.
 * A READ's response header and payload leave in one sendmsg. Every connection runs with
 * TCP_NODELAY (small requests leave at once).
 *
 * Wire protocol (little endian):
 *   request  (32 B): u32 magic 'TNTC', u16 version, u16 opcode, u64 remote_addr,
 *                    u64 length, u64 request id.     WRITE: followed by `length` bytes.
 *   response (24 B): u32 magic, u16 version, u16 pad, i32 status, u32 pad, u64 request id.
 *                    READ with status 0: followed by `length` bytes.
 * A rejected WRITE has its payload drained by the server before the error reply.
 * Version 2: the opcode field is u8 opcode, u8 gap (at most GAP_MAX); `gap` zero bytes go
 * between a header and its payload: a READ's response (version 2, its first pad field = gap)
 * has them before the payload, a WRITE request before its payload (the server skips them; its
 * response echoes the gap). The client picks the gap so that the payload lands in the kernel's
 * socket buffer pages at an offset that is not 1-63 bytes ahead of its source (mod 4 KiB), nor
 * the destination 1-63 bytes ahead of it: a copy whose destination is just ahead of its source
 * modulo 4 KiB runs 2-3x slower on x86 (4K aliasing: every load waits on a store to the same
 * page offset). Without the gap, a 24-byte header put every READ payload from a page-aligned
 * buffer 24 bytes ahead of its source (docs/benchmarks.md, "Why tcp READ was slower than WRITE").
 * A server serves version 1 requests as before.
 *
 * Waiting READs (tent_wait_t in executor_abi.h; Transport.wait_read): opcode WIRE_OP_READ_WAIT (2,
 * version 2 only) is a READ whose 32-byte header is followed by a WAIT_EXT_SIZE extension: u64 word
 * address, u64 floor, u64 lo, u64 hi, u32 wait_ms, u32 0. The target checks the word (8-byte
 * aligned, inside a region it may READ) and the range as for any READ, then answers only once
 * lo <= word <= hi, as a plain READ; while floor <= word < lo it parks the request, re-reading the
 * word on a short timer (WAIT_POLL_MIN_US growing to WAIT_POLL_MAX_US: the word is advanced by
 * the target's own process, which does not tell us), at most min(wait_ms, `wait_max_ms`); then,
 * or when the word leaves [floor, hi] or a region goes away, it answers TENT_E_NOT_READY with no
 * payload. A malformed extension gets TENT_E_PROTOCOL (the framing is intact: the connection
 * stays). A connection's thread serves its requests in order, so a connection parks one READ at
 * most (those behind it wait in the socket: a reader's READs of a partial copy are in stream order
 * anyway); `wait_max_parked` bounds the parked READs of the whole executor (more are answered
 * TENT_E_NOT_READY at once). The initiator never sends one inline (submit_inline queues it).
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
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tent/auth.h"
#include "tent/busy_poll.h"
#include "tent/chunk_queue.h"
#include "tent/config_kv.h"
#include "tent/cpu_relax.h"
#include "tent/digest.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"

#define EXPORT __attribute__((visibility("default")))

#define WIRE_MAGIC 0x43544e54u /* "TNTC" little endian */
#define WIRE_VERSION 1u
#define WIRE_VERSION_GAP 2u /* a request names the gap before its payload (see above) */
#define GAP_MAX 127u
#define ALIAS_BYTES 64u /* a copy's destination this close ahead of its source (mod 4 KiB) is slow */
#define REQ_SIZE 32
#define RSP_SIZE 24
#define PERM_REMOTE_READ 1u
#define PERM_REMOTE_WRITE 2u
#define DRAIN_CHUNK (256 * 1024)
#define MAX_RAILS 64
#define SLOT_FREE (-2)
#define PIPE_MAX 64 /* requests in one pipelined run at most */
#define SPIN_AFTER_BYTES (256u << 10) /* a server connection polls for the next request after ones up to this long */
#define PIPE_BYTES_MAX (1u << 20) /* payload of the READ answers one sendmsg gathers at most */
#define LO_CC_MAX 4         /* names in loopback_congestion at most */
#define TCP_CA_NAME_LEN 16  /* the kernel's TCP_CA_NAME_MAX */
#define BULK_QUIET_MS 5 /* nobody polls while bulk moves, nor this long after it stopped */
#define QOS_LEVEL_IDLE 20 /* qos_bulk_nice 20: SCHED_IDLE rather than a nice value */
#define WIRE_OP_READ_WAIT 2u /* a READ answered once a word reaches a range (see above) */
#define WAIT_EXT_SIZE 40
#define WAIT_POLL_MIN_US 50
#define WAIT_POLL_MAX_US 2000

/* ------------------------------------------------------------------ utils */

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

/* stderr logging is rate limited (a token bucket: LOG_BURST lines, then LOG_PER_S a second), so
 * a peer sending bad requests cannot flood the log; the next line says how many were dropped. */
#define LOG_BURST 10.0
#define LOG_PER_S 1.0
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static double g_log_tokens = LOG_BURST;
static uint64_t g_log_last_ms;
static unsigned long long g_log_suppressed, g_log_lines;

static void slog(const char *fmt, ...) {
  pthread_mutex_lock(&g_log_mu);
  uint64_t now = mono_ms();
  if (g_log_last_ms) {
    g_log_tokens += (double)(now - g_log_last_ms) / 1000.0 * LOG_PER_S;
    if (g_log_tokens > LOG_BURST) g_log_tokens = LOG_BURST;
  }
  g_log_last_ms = now;
  if (g_log_tokens < 1.0) {
    g_log_suppressed++;
    pthread_mutex_unlock(&g_log_mu);
    return;
  }
  g_log_tokens -= 1.0;
  unsigned long long dropped = g_log_suppressed;
  g_log_suppressed = 0;
  g_log_lines++;
  pthread_mutex_unlock(&g_log_mu);
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (dropped) fprintf(stderr, "[tent_tcp] %s (%llu similar line(s) suppressed)\n", line, dropped);
  else fprintf(stderr, "[tent_tcp] %s\n", line);
}

/* out[0..1] = lines written, lines suppressed (process-wide). */
EXPORT void tcp_log_stats(uint64_t *out) {
  pthread_mutex_lock(&g_log_mu);
  out[0] = g_log_lines;
  out[1] = g_log_suppressed;
  pthread_mutex_unlock(&g_log_mu);
}

static void put16(uint8_t *p, uint16_t v) { v = htole16(v); memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { v = htole32(v); memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { v = htole64(v); memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return le16toh(v); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return le32toh(v); }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return le64toh(v); }

/* I/O results (IO_NOT_YET: a waiter's first sleep for a run's answers ended with none of their
 * bytes in, see run_recv_head) */
enum { IO_OK = 0, IO_EOF = 1, IO_TIMEOUT = 2, IO_ERR = 3, IO_NOT_YET = 4 };

/* A client socket's receive timeout (SO_RCVTIMEO) at most: a receive that sleeps wakes this often
 * to look at its progress clock, and a waiter reading inline answers (ex_progress) sleeps in the
 * receive itself in steps of this long while its own step has that much left. */
#define RX_TICK_MS 5

/* Bytes per send/recv call on the client: progress is reported (and the stall clock reset) at
 * least this often while a long slice moves. */
#define PROGRESS_STEP (1u << 20)

/* The client's progress clock for one chunk in service. Its socket wakes every `tick` (SO_RCVTIMEO
 * / SO_SNDTIMEO) to look at it: the progress timeout counts time without a byte moving while the
 * chunk is being served, never time it spent queued. Moved payload bytes go to host->note. A send
 * that cannot hand the kernel a byte for `congestion_ms` (send buffer full and not draining) is
 * reported once per stall as congestion: the fabric pushing back, not (yet) a failure. NULL on the
 * server side: there a timed-out call simply fails. */
typedef struct io_watch {
  const tent_host_api_t *host;
  const tent_slice_t *slice;
  uint64_t last_ms; /* last byte moved (or service start), as io_idle last saw it */
  int timeout_ms, congestion_ms;
  int congested;   /* congestion noted for the current stall */
  tent_digest_t *digest; /* the READ payload being received folds into it as it lands (or NULL) */
  int moved;       /* bytes moved since io_idle last looked: its next look restarts the clock */
} io_watch_t;

/* Payload bytes [p, p + n) of a READ answer just landed in the destination: fold them into the
 * slice's digest now, while they are in this core's cache (tent/digest.h; pieces of the stream
 * landing out of order on other connections are noted and folded in order). */
static void io_landed(io_watch_t *w, const void *p, size_t n) {
  if (w && w->digest && n) tent_digest_land(w->digest, p, n, 0);
}

/* Bytes moved: the stall clock restarts. It is read lazily, by the next io_idle (a call that woke
 * after its socket's tick without moving anything), not here: a small request moves its bytes in
 * one or two calls and never idles, so a clock read per call (tens of ns on a VM, two to three per
 * one-at-a-time request) bought nothing. A stall is then counted from the first idle wake after
 * the last bytes (a blocking call gives up after its socket's tick, tick_ms, without bytes): the
 * progress timeout and the congestion note come at most one tick later than the bytes alone say. */
static void io_moved(io_watch_t *w, size_t n, int payload) {
  if (!w) return;
  w->moved = 1;
  w->congested = 0;
  if (payload) tent_host_note(w->host, w->slice, TENT_NOTE_PROGRESS, n);
}

/* A call woke without moving anything: 1 when the progress timeout is reached. */
static int io_idle(io_watch_t *w, int sending) {
  if (!w) return 1;
  uint64_t now = mono_ms();
  if (w->moved) { /* bytes moved since the last look: the stall starts now */
    w->moved = 0;
    w->last_ms = now;
    return 0;
  }
  uint64_t idle = now - w->last_ms;
  if (idle >= (uint64_t)w->timeout_ms) return 1;
  if (sending && !w->congested && idle >= (uint64_t)w->congestion_ms) {
    w->congested = 1;
    tent_host_note(w->host, w->slice, TENT_NOTE_CONGESTED, idle);
  }
  return 0;
}

/* QoS pieces (see "QoS: bulk threads' CPU weight"): while a thread moves bulk demoted (small
 * requests active), each of its send/recv calls moves at most tl_qos_piece bytes and the thread
 * yields between them. A demoted thread that the scheduler picked while a small request's thread
 * was runnable otherwise kept the core for the whole call: on a core shared with the small
 * request's threads, EEVDF picks a nice-19 thread now and then (it is eligible with no lag) and
 * nothing preempts it until it blocks (no wake-up comes: the small request's thread is already
 * runnable), 150-250 us per 1 MiB slice on the 2-vCPU host of docs/benchmarks.md ("The QoS tail
 * over tcp"). tl_qos_piece is 0 (whole calls) for every other thread. */
static __thread size_t tl_qos_piece;
static __thread atomic_ullong *tl_qos_yields; /* the executor's count of such yields */

/* How many of `want` bytes one call may move for a thread whose pieces are `piece` bytes (0: no
 * limit). Pure (unit-tested through tcp_qos_piece). */
static size_t qos_piece_len(size_t piece, size_t want) { return piece && want > piece ? piece : want; }

/* Between two pieces of a demoted bulk transfer: the core goes to whoever else is runnable. */
static void qos_piece_yield(void) {
  if (!tl_qos_piece) return;
  sched_yield();
  if (tl_qos_yields) atomic_fetch_add_explicit(tl_qos_yields, 1, memory_order_relaxed);
}

/* The leading entries of iov[0..n) one call of at most `limit` bytes takes (>= 1); an entry taken
 * in part is shortened in place, *cut and *cut_len say which and its length to restore. */
static int iov_within(struct iovec *iov, int n, size_t limit, struct iovec **cut, size_t *cut_len) {
  size_t total = 0;
  int i = 0;
  *cut = NULL;
  while (i < n && total + iov[i].iov_len <= limit) total += iov[i++].iov_len;
  if (i < n && total < limit) {
    *cut = &iov[i];
    *cut_len = iov[i].iov_len;
    iov[i].iov_len = limit - total;
    i++;
  }
  return i;
}

/* Send all of buf. A call that times out with zero bytes sent = no progress. */
static int send_all(int fd, const void *buf, size_t len, int more, io_watch_t *w, int payload) {
  const char *p = buf;
  while (len) {
    size_t step = qos_piece_len(tl_qos_piece, w && len > PROGRESS_STEP ? PROGRESS_STEP : len);
    ssize_t n = send(fd, p, step, MSG_NOSIGNAL | (more || step < len ? MSG_MORE : 0));
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      io_moved(w, (size_t)n, payload);
      if (len) qos_piece_yield();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (io_idle(w, 1)) return IO_TIMEOUT;
      continue;
    }
    return IO_ERR;
  }
  return IO_OK;
}

/* Who the bytes of one iovec entry belong to on the client: the slice they serve and whether they
 * are its payload (moved payload is reported as progress) or a protocol header. */
typedef struct iov_owner {
  const tent_slice_t *slice;
  int payload;
} iov_owner_t;

/* Send every byte of iov[0..n) (the array is consumed: entries are advanced in place). With a
 * progress clock `w`, own[i] names the owner of iov[i] (consumed in step): each call hands the
 * kernel at most PROGRESS_STEP bytes, so moved payload is reported as it goes, and a call that
 * wakes without sending anything only fails once the clock runs out. */
static int sendv_all(int fd, struct iovec *iov, int n, io_watch_t *w, const iov_owner_t *own) {
  /* bytes per call at most: PROGRESS_STEP on a progress clock, a QoS piece while demoted */
  size_t limit = qos_piece_len(tl_qos_piece, w ? PROGRESS_STEP : SIZE_MAX);
  while (n > 0) {
    int cnt = n > 1024 ? 1024 : n;
    struct iovec *cut = NULL; /* an entry shortened to keep this call within the limit */
    size_t cut_len = 0;
    if (limit != SIZE_MAX) cnt = iov_within(iov, cnt, limit, &cut, &cut_len);
    int more = cut != NULL || cnt < n;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | (w && more ? MSG_MORE : 0));
    if (cut) cut->iov_len = cut_len;
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (w && own) w->slice = own->slice; /* the slice whose bytes are stuck */
        if (io_idle(w, 1)) return IO_TIMEOUT;
        continue;
      }
      return IO_ERR;
    }
    if (k == 0) return IO_ERR;
    size_t left = (size_t)k;
    if (w) io_moved(w, 0, 0);
    while (n > 0 && left >= iov->iov_len) {
      if (w && own && own->payload && iov->iov_len) {
        w->slice = own->slice;
        io_moved(w, iov->iov_len, 1);
      }
      left -= iov->iov_len;
      iov++;
      if (own) own++;
      n--;
    }
    if (n > 0) {
      if (w && own && own->payload && left) {
        w->slice = own->slice;
        io_moved(w, left, 1);
      }
      iov->iov_base = (char *)iov->iov_base + left;
      iov->iov_len -= left;
    }
    if (n > 0) qos_piece_yield();
  }
  return IO_OK;
}

static int recv_all(int fd, void *buf, size_t len, io_watch_t *w, int payload) {
  char *p = buf;
  while (len) {
    size_t step = qos_piece_len(tl_qos_piece, w && len > PROGRESS_STEP ? PROGRESS_STEP : len);
    ssize_t n = recv(fd, p, step, MSG_WAITALL);
    if (n > 0) {
      if (payload) io_landed(w, p, (size_t)n);
      p += n;
      len -= (size_t)n;
      io_moved(w, (size_t)n, payload);
      if (len) qos_piece_yield();
      continue;
    }
    if (n == 0) return IO_EOF;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (io_idle(w, 0)) return IO_TIMEOUT;
      continue;
    }
    return IO_ERR;
  }
  return IO_OK;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Poll fd for readability, without sleeping, for up to `ns` nanoseconds: 1 once readable (or
 * hung up), 0 when the time ran out. Waking a thread that sleeps in poll/recv costs tens of
 * microseconds on small VMs (the idle vCPU halts; the wake-up is an IPI through the hypervisor),
 * as long as a 64 KiB request itself; an answer or a next request that comes within the bound is
 * caught without it. Every few polls the thread yields, so on a busy host a runnable thread
 * (perhaps the peer we wait for) gets the core. *lost is set when two looks at the socket were
 * TENT_BUSY_POLL_LOST_NS or more apart: the thread lost its core meanwhile (to a thread its
 * yield let in, or a preemption), i.e. someone else wanted it: the adaptive policy's signal. */
#define SPIN_YIELD_EVERY 8
static int spin_readable(int fd, uint64_t ns, int *lost) {
  if (!ns) return 0;
  uint64_t last = mono_ns(), end = last + ns;
  for (unsigned i = 1;; i++) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) return 1;
    uint64_t now = mono_ns();
    if (now - last >= TENT_BUSY_POLL_LOST_NS) *lost = 1;
    if (now >= end) return 0;
    if (i % SPIN_YIELD_EVERY == 0) sched_yield();
    else tent_cpu_relax();
    last = mono_ns();
  }
}

/* Busy-poll outcomes, per side (0 client waiters, 1 server connections): waits, polls, polls
 * that hit, polls that lost their core. */
enum { BP_WAITS, BP_POLLS, BP_HITS, BP_LOST, BP_N };

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
  int64_t id;
  uint64_t addr, len;
  uint32_t perm;
  int refs;
  int dead;
} region_t;

typedef struct rail {
  struct peer *peer;
  struct sockaddr_in local;  /* sin_addr 0 = don't bind */
  struct sockaddr_in remote;
  char name[96];
  tent_chunk_queue_t q;  /* bulk chunks waiting for a connection slot */
  tent_chunk_queue_t qs; /* chunks of small requests (TENT_HINT_SMALL): served first, also by the express slot */
  int *idle;             /* idle connected fds */
  uint64_t *idle_since;  /* when each went idle (ms) */
  int nidle;
  int *slot_fd;          /* per slot: SLOT_FREE, -1 (connecting) or the fd in use; the last is the express slot */
  tent_busy_poll_t *slot_poll; /* per slot: the busy-poll policy of its waiters (used by the slot's holder only) */
  int busy;              /* bulk slots in use */
  int express_busy;      /* the express slot is in use */
  int bulk_busy;         /* slots running bulk chunks (the others run small ones) */
  int wait_busy;         /* slots running waiting READs (at most wait_conns) */
  uint64_t small_until_ms; /* small requests were submitted recently: bulk held to qos_bulk_conns until then */
  uint64_t down_until_ms; /* connect failed recently: fail fast until then */
  int ready;                       /* linked into the executor's ready list */
  struct rail *ready_prev, *ready_next;
  /* counters */
  atomic_ullong bytes, slices, errors, connects;
} rail_t;

typedef struct peer {
  uint64_t handle;
  int nrails;
  int removed; /* out of the table; freed when refs drops to 0 */
  int refs;    /* the table's + one per chunk in flight; under ex->mu */
  rail_t *rails;
} peer_t;

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
  region_t *cur; /* the region this connection's I/O is using now (under ex->reg_mu) */
  int pending;   /* still authenticating (under srv_mu) */
  int evicted;   /* cut to make room for a newer unauthenticated client (under srv_mu) */
  uint64_t accepted_ms;
  char who[64];  /* the client's address, for logs */
  pthread_t thread;
  struct sconn *next;
} sconn_t;

typedef struct tcp_exec {
  const tent_host_api_t *host;
  int nthreads, conns_per_rail, slice_timeout_ms, connect_timeout_ms, sockbuf;
  int auth_on;
  uint8_t auth_key[32];
  int auth_timeout_ms, max_conns, idle_timeout_ms, unregister_timeout_ms;
  int congestion_ms;      /* a send stalled this long is reported as congestion */
  /* congestion control for connections between loopback addresses, in order of preference (the
   * first the kernel accepts; none: the host's); see loopback_cc() */
  char lo_cc[LO_CC_MAX][TCP_CA_NAME_LEN];
  int n_lo_cc;
  atomic_int lo_cc_refused; /* every name was refused once: logged once */
  int connect_backoff_ms; /* after a failed connect, a rail without connections fails fast this long */
  int tick_ms;            /* client sockets wake this often to check their progress clock */
  int qos_bulk_conns;     /* bulk connections a rail runs at most while small requests are active (0: no cap) */
  int qos_window_ms;      /* small requests count as active this long after their submit */
  int qos_serve_nice;     /* the server side demotes too (it tells small requests by size) */
  int qos_bulk_nice;      /* bulk threads' nice value while small requests are active (QOS_LEVEL_IDLE: SCHED_IDLE; 0: off) */
  uint64_t qos_bulk_piece; /* ... and the bytes they move per system call, yielding between (0: whole calls) */
  atomic_ullong qos_yields; /* yields between such pieces */
  atomic_ullong srv_small_until_ms; /* server side: a small request was served recently (bulk ones demoted until then) */
  int receive_digest;     /* READ answers fold into the digest the caller armed for the slice (tent/digest.h) */
  int wait_read;          /* READs carry the wait condition the caller armed (tent_host_wait) */
  int wait_max_ms;        /* server side: a waiting READ is parked this long at most */
  int wait_max_parked;    /* server side: READs parked at once at most */
  int wait_conns;         /* client side: connections of a rail that carry waiting READs at once */
  atomic_int parked_now;  /* server side: waiting READs parked now */
  atomic_ullong waits_served, waits_not_ready, waits_refused; /* answered after waiting / E_NOT_READY / refused (bad, full) */
  pthread_mutex_t wait_mu; /* parked READs sleep on wait_cv; tcp_wait_doorbell wakes them */
  pthread_cond_t wait_cv;
  uint64_t wait_seq;       /* doorbells rung (under wait_mu) */
  int busy_poll_us;       /* a small request's answer / the next request is polled for up to this long before sleeping */
  int busy_poll_adaptive; /* each connection learns whether and how long to poll (tent/busy_poll.h); 0: always the cap */
  atomic_ullong busy_poll[2][BP_N]; /* outcomes: [client, server][BP_*] */
  atomic_int polling_now;  /* threads of this executor polling a socket now ... */
  int max_pollers;         /* ... at most this many: half the online CPUs, at least one */
  atomic_int bulk_active;  /* bulk requests being moved now (client runs, server requests): no polling */
  atomic_ullong bulk_last_ms; /* ... nor within BULK_QUIET_MS of the last one's end */
  uint64_t throttle_until_ms; /* some rail holds bulk back until then: workers look again at that time */

  uint64_t chunk;     /* cut slices into chunks of at most this many bytes (0: whole slices) */
  uint32_t max_parts;
  int pipeline;            /* small requests in one pipelined run at most */
  uint64_t pipeline_bytes; /* bytes of one pipelined run at most (at least one request) */
  struct pipe_run *rx_head, *rx_tail; /* runs sent inline whose responses a worker must read */
  struct pipe_run *spare_runs;        /* finished runs kept for the next inline submit (under mu) */
  int nspare_runs;

  pthread_mutex_t mu; /* queues, peers, connection pools */
  pthread_cond_t cv;  /* work available / slot freed */
  int stopping;
  tent_handle_table_t peers;
  size_t live_peers, allocated_peers; /* in the table; not yet freed (removed ones draining too) */
  rail_t *ready_head, *ready_tail;    /* rails with work a worker may take now, FIFO */
  pthread_t *workers;
  int nworkers;
  atomic_ullong next_reqid;

  pthread_mutex_t reg_mu; /* regions */
  pthread_cond_t reg_cv;   /* CLOCK_MONOTONIC */
  region_t **regions;      /* live regions sorted by addr (then len) */
  size_t nregions, cap_regions;
  uint64_t max_region_len; /* longest ever registered: bounds the backward scan of a lookup */
  int64_t next_region_id;

  pthread_mutex_t srv_mu; /* listeners and server connections */
  listener_t *listeners;
  sconn_t *sconns;
  int active_conns;
  int pending_auth; /* connections still in the handshake: at most max_conns / 4 */
  atomic_ullong refused_conns, auth_failures, idle_closed, cut_conns;
  int wake_fd; /* eventfd, readable once stopping */
} tcp_exec_t;

/* ------------------------------------------------------------------ ready list */

/* A rail is ready when a worker may pop a chunk from it now: it has queued chunks and a free
 * connection slot. Called with ex->mu after anything that changes those. */
static void rail_update_ready(struct tcp_exec *ex, rail_t *r);

/* ------------------------------------------------------------------ config */

/* "cubic,reno" -> names[0..*n): comma-separated congestion control names ("" = none). Pure: -1 on
 * a malformed list (a name empty, too long, or with a character no kernel module name has). */
static int parse_cc_list(const char *val, char names[][TCP_CA_NAME_LEN], int *n) {
  *n = 0;
  if (!*val) return 0;
  for (const char *p = val;;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (!len || len >= TCP_CA_NAME_LEN || *n >= LO_CC_MAX) return -1;
    for (size_t i = 0; i < len; i++)
      if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '_')) return -1;
    memcpy(names[*n], p, len);
    names[(*n)++][len] = 0;
    if (!e) return 0;
    p = e + 1;
  }
}

static int parse_config(tcp_exec_t *ex, const char *cfg, char *err, size_t errlen) {
  ex->nthreads = 4;
  ex->conns_per_rail = 2;
  ex->slice_timeout_ms = 2000;
  ex->connect_timeout_ms = 1000;
  ex->congestion_ms = 0; /* 0: a quarter of the progress timeout */
  ex->connect_backoff_ms = 50;
  ex->qos_bulk_conns = 1;
  ex->qos_window_ms = 5;
  ex->qos_bulk_nice = 19;
  ex->qos_bulk_piece = 128 << 10;
  ex->qos_serve_nice = 1;
  ex->busy_poll_us = 50; /* the tcp transport passes its own (its config is where the defaults are documented) */
  ex->busy_poll_adaptive = 1;
  ex->receive_digest = 1;
  ex->sockbuf = 4 << 20;
  ex->chunk = 0;
  ex->max_parts = 64;
  ex->pipeline = 16;
  ex->pipeline_bytes = 1 << 20;
  ex->auth_on = 0;
  ex->auth_timeout_ms = 5000;
  ex->max_conns = 256;
  ex->idle_timeout_ms = 120000;
  ex->wait_read = 1;
  ex->wait_max_ms = 1000;
  ex->wait_max_parked = 64;
  ex->wait_conns = 2;
  ex->unregister_timeout_ms = 5000;
  ex->n_lo_cc = 0; /* the tcp transport passes its own (its config is where the default is documented) */
  char key[64], val[256];
  for (const char *c = cfg; tent_config_next(&c, key, sizeof key, val, sizeof val);) {
    char *end = NULL;
    long v = strtol(val, &end, 10);
    int *dst = NULL;
    long lo = 0, hi = 1L << 30;
    if (!strcmp(key, "auth_key")) {
      if (!*val) {
        ex->auth_on = 0;
        continue;
      }
      if (strlen(val) != 64) {
        snprintf(err, errlen, "auth_key must be 64 hex digits");
        return -1;
      }
      for (int i = 0; i < 32; i++) {
        unsigned b;
        if (sscanf(val + 2 * i, "%2x", &b) != 1) {
          snprintf(err, errlen, "auth_key must be 64 hex digits");
          return -1;
        }
        ex->auth_key[i] = (uint8_t)b;
      }
      ex->auth_on = 1;
      continue;
    }
    if (!strcmp(key, "loopback_congestion")) {
      if (parse_cc_list(val, ex->lo_cc, &ex->n_lo_cc) != 0) {
        snprintf(err, errlen, "bad value for loopback_congestion: '%s' (comma-separated congestion control names, "
                 "at most %d, each 1-%d of [a-z0-9_])", val, LO_CC_MAX, TCP_CA_NAME_LEN - 1);
        return -1;
      }
      continue;
    }
    if (!strcmp(key, "chunk") || !strcmp(key, "pipeline_bytes") || !strcmp(key, "qos_bulk_piece")) {
      char *e = NULL;
      unsigned long long c = strtoull(val, &e, 10);
      /* a QoS piece is 0 (off) or a page at least: smaller ones would cost a system call per few bytes */
      if (e == val || *e || (!strcmp(key, "qos_bulk_piece") && c && c < 4096)) {
        snprintf(err, errlen, "bad value for %s: %s", key, val);
        return -1;
      }
      if (!strcmp(key, "chunk")) ex->chunk = c;
      else if (!strcmp(key, "qos_bulk_piece")) ex->qos_bulk_piece = c;
      else ex->pipeline_bytes = c;
      continue;
    }
    if (!strcmp(key, "threads")) dst = &ex->nthreads, lo = 1, hi = 256;
    else if (!strcmp(key, "conns_per_rail")) dst = &ex->conns_per_rail, lo = 1, hi = 64;
    else if (!strcmp(key, "slice_timeout_ms")) dst = &ex->slice_timeout_ms, lo = 1;
    else if (!strcmp(key, "connect_timeout_ms")) dst = &ex->connect_timeout_ms, lo = 1;
    else if (!strcmp(key, "congestion_ms")) dst = &ex->congestion_ms, lo = 0;
    else if (!strcmp(key, "connect_backoff_ms")) dst = &ex->connect_backoff_ms, lo = 0;
    else if (!strcmp(key, "qos_bulk_conns")) dst = &ex->qos_bulk_conns, lo = 0, hi = 64;
    else if (!strcmp(key, "qos_window_ms")) dst = &ex->qos_window_ms, lo = 0, hi = 60000;
    else if (!strcmp(key, "qos_serve_nice")) dst = &ex->qos_serve_nice, lo = 0, hi = 1;
    else if (!strcmp(key, "qos_bulk_nice")) dst = &ex->qos_bulk_nice, lo = 0, hi = QOS_LEVEL_IDLE;
    else if (!strcmp(key, "busy_poll_us")) dst = &ex->busy_poll_us, lo = 0, hi = 10000;
    else if (!strcmp(key, "busy_poll_adaptive")) dst = &ex->busy_poll_adaptive, lo = 0, hi = 1;
    else if (!strcmp(key, "receive_digest")) dst = &ex->receive_digest, lo = 0, hi = 1;
    else if (!strcmp(key, "wait_read")) dst = &ex->wait_read, lo = 0, hi = 1;
    else if (!strcmp(key, "wait_max_ms")) dst = &ex->wait_max_ms, lo = 1, hi = 60000;
    else if (!strcmp(key, "wait_max_parked")) dst = &ex->wait_max_parked, lo = 0, hi = 65536;
    else if (!strcmp(key, "wait_conns")) dst = &ex->wait_conns, lo = 1, hi = 65;
    else if (!strcmp(key, "sockbuf")) dst = &ex->sockbuf, lo = 0;
    else if (!strcmp(key, "pipeline")) dst = &ex->pipeline, lo = 1, hi = PIPE_MAX;
    else if (!strcmp(key, "auth_timeout_ms")) dst = &ex->auth_timeout_ms, lo = 1;
    else if (!strcmp(key, "max_conns")) dst = &ex->max_conns, lo = 1, hi = 65536;
    else if (!strcmp(key, "idle_timeout_ms")) dst = &ex->idle_timeout_ms, lo = 1;
    else if (!strcmp(key, "unregister_timeout_ms")) dst = &ex->unregister_timeout_ms, lo = 0;
    else continue; /* unknown keys are ignored (the transport may pass extra ones) */
    if (end == val || *end || v < lo || v > hi) {
      snprintf(err, errlen, "bad value for %s: %s", key, val);
      return -1;
    }
    *dst = (int)v;
  }
  if (ex->congestion_ms <= 0 || ex->congestion_ms > ex->slice_timeout_ms)
    ex->congestion_ms = ex->slice_timeout_ms / 4 > 5 ? ex->slice_timeout_ms / 4 : 5;
  ex->tick_ms = ex->congestion_ms / 2 > 5 ? ex->congestion_ms / 2 : 5;
  if (ex->tick_ms > ex->slice_timeout_ms) ex->tick_ms = ex->slice_timeout_ms;
  return 0;
}

/* A connection whose peer is a loopback address (127/8) gets the first congestion control of
 * `loopback_congestion` the kernel accepts. Loopback has no bottleneck to pace for, yet a pacing
 * congestion control (BBR, the default of some hosts) paces every skb there too: with no fq qdisc
 * TCP paces internally, so a 1 MiB burst of answers (a batch of 16 x 64 KiB READs gathered in one
 * sendmsg) leaves skb by skb instead of back to back (docs/benchmarks.md, "tcp batches and the
 * host's congestion control"). Other peers keep the host's choice. A name the
 * kernel refuses (not built, or not in tcp_allowed_congestion_control for an unprivileged
 * process) is skipped; when all are, the host's stays (logged once). */
static int ipv4_is_loopback(struct in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

static void loopback_cc(tcp_exec_t *ex, int fd, struct in_addr peer) {
  if (!ex->n_lo_cc || !ipv4_is_loopback(peer)) return;
  for (int i = 0; i < ex->n_lo_cc; i++)
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, ex->lo_cc[i], (socklen_t)strlen(ex->lo_cc[i])) == 0) return;
  if (!atomic_exchange(&ex->lo_cc_refused, 1))
    slog("loopback_congestion: the kernel refused every name (%s%s): loopback connections keep the host's", ex->lo_cc[0],
         ex->n_lo_cc > 1 ? ", ..." : "");
}

/* ------------------------------------------------------------------ QoS: bulk threads' CPU weight */

/* While small requests are active, the threads moving a bulk request (a client worker's bulk run;
 * a server connection serving a request longer than SPIN_AFTER_BYTES) run at nice `qos_bulk_nice`
 * (1-19), or under SCHED_IDLE (QOS_LEVEL_IDLE): on a host with fewer free cores than copying
 * threads, the small request's threads then win every core they wake up for, and bulk takes the
 * rest (docs/benchmarks.md, "The QoS tail over tcp"). A thread's level is set before each piece of
 * work it takes, so it costs a syscall only on a change, and bulk runs at full weight again from
 * its next request once the small requests stop. The client knows its small requests (the core's
 * hint); a server knows them by size, as it does for busy polling: a request of up to
 * SPIN_AFTER_BYTES opens the server's window for qos_window_ms (`qos_serve_nice` 0: the server
 * side never demotes). */

/* The level (0: the thread's own; 1-19: a nice value; QOS_LEVEL_IDLE: SCHED_IDLE) a thread should
 * run its next piece of work at: `knob` for bulk work while small requests are active (now_ms
 * before small_until_ms), else its own. Pure (unit-tested through tcp_qos_bulk_level). */
static int qos_bulk_level(int knob, int bulk, uint64_t now_ms, uint64_t small_until_ms) {
  return knob > 0 && knob <= QOS_LEVEL_IDLE && bulk && now_ms < small_until_ms ? knob : 0;
}

static __thread int tl_qos_level;  /* the level the calling thread runs at now */
static __thread int tl_qos_nice;   /* its own nice value and policy, saved when it first leaves them */
static __thread int tl_qos_policy;
static __thread int tl_qos_stuck;  /* the last move was refused: an idle thread does not retry in a loop */
static __thread int tl_qos_exempt; /* its own policy is real time: never moved */

/* Move the calling thread to `level` (see qos_bulk_level). A thread whose own policy is neither
 * SCHED_OTHER nor SCHED_BATCH (real time: someone chose it) is left alone, and none is ever
 * raised above its own weight. Returns 0, or -1 when the kernel refused (the level is unchanged). */
static int qos_thread_set(int level) {
  if (level == tl_qos_level || tl_qos_exempt) return 0;
  pid_t tid = (pid_t)syscall(SYS_gettid);
  if (tl_qos_level == 0) {
    int pol = sched_getscheduler(0);
    if (pol < 0) return -1;
    pol &= ~SCHED_RESET_ON_FORK;
    if (pol != SCHED_OTHER && pol != SCHED_BATCH) {
      tl_qos_exempt = 1;
      return 0;
    }
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)tid);
    if (nice == -1 && errno) return -1;
    tl_qos_nice = nice;
    tl_qos_policy = pol;
  }
  struct sched_param sp = {0};
  if (level == QOS_LEVEL_IDLE) { /* (SCHED_RESET_ON_FORK dropped: these threads fork nothing) */
    if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) return -1;
  } else {
    if (tl_qos_level == QOS_LEVEL_IDLE && sched_setscheduler(0, tl_qos_policy, &sp) != 0) return -1;
    int nice = level > tl_qos_nice ? level : tl_qos_nice; /* never below its own */
    if (setpriority(PRIO_PROCESS, (id_t)tid, nice) != 0) {
      if (tl_qos_level == QOS_LEVEL_IDLE) tl_qos_level = -1; /* out of SCHED_IDLE already, its nice unknown */
      return -1;
    }
  }
  tl_qos_level = level;
  return 0;
}

/* A thread of this executor's about to do work at `level`; a refusal is logged (rate limited).
 * While demoted it moves its bytes in qos_bulk_piece pieces (tl_qos_piece). */
static void qos_thread_level(tcp_exec_t *ex, int level) {
  tl_qos_piece = level ? (size_t)ex->qos_bulk_piece : 0;
  tl_qos_yields = &ex->qos_yields;
  tl_qos_stuck = qos_thread_set(level) != 0;
  if (tl_qos_stuck)
    slog("qos_bulk_nice: could not move a thread to level %d (now %d): %s", level, tl_qos_level, strerror(errno));
}

/* A demoted thread about to sleep: back to its own weight first, so that it wakes up for its next
 * work (a small request's, maybe) as itself. */
static int qos_thread_demoted(void) { return tl_qos_level != 0 && !tl_qos_stuck; }

/* A server connection is about to serve a request: a small one opens the server's QoS window, a
 * bulk one runs demoted while it is open. */
static void qos_server_request(tcp_exec_t *ex, int small) {
  uint64_t now = mono_ms();
  if (small) {
    atomic_store_explicit(&ex->srv_small_until_ms, now + (uint64_t)ex->qos_window_ms, memory_order_relaxed);
    qos_thread_level(ex, 0);
    return;
  }
  uint64_t until = atomic_load_explicit(&ex->srv_small_until_ms, memory_order_relaxed);
  qos_thread_level(ex, qos_bulk_level(ex->qos_bulk_nice, 1, now, until));
}

/* Whether this process may undo a demotion (lowering a nice value back, or leaving SCHED_IDLE,
 * takes CAP_SYS_NICE or a matching RLIMIT_NICE): tried once on a throwaway thread, which is left
 * demoted if not. */
static void *qos_probe_main(void *arg) {
  int *level = arg;
  *level = qos_thread_set(*level) == 0 && qos_thread_set(0) == 0;
  return NULL;
}

static atomic_int g_qos_probed[QOS_LEVEL_IDLE + 1]; /* per level: 0 not yet, 1 may, -1 may not (logged once) */

static int qos_may_demote(int level) {
  int known = atomic_load(&g_qos_probed[level]);
  if (known) return known > 0;
  pthread_t t;
  int ok = level;
  if (pthread_create(&t, NULL, qos_probe_main, &ok) != 0) return 0; /* not known: tried again next time */
  pthread_join(t, NULL);
  int was = 0;
  if (atomic_compare_exchange_strong(&g_qos_probed[level], &was, ok ? 1 : -1) && !ok)
    slog("qos_bulk_nice %d: off, this process may not undo a demotion (it takes CAP_SYS_NICE or RLIMIT_NICE)", level);
  return ok;
}

/* ------------------------------------------------------------------ regions */

/* First index whose region starts above addr (regions sorted by addr). reg_mu held. */
static size_t region_upper(const tcp_exec_t *ex, uint64_t addr) {
  size_t lo = 0, hi = ex->nregions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ex->regions[mid]->addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Returns a referenced region or NULL with *status set; `c` (the serving connection, or NULL)
 * records it.
 * Candidates are the regions starting at or below addr, newest start first; none starting more
 * than the longest registration below addr can contain it, so (registrations rarely
 * overlapping) the scan stops after one or two. */
static region_t *region_acquire(tcp_exec_t *ex, sconn_t *c, uint64_t addr, uint64_t len, uint32_t need, int *status) {
  region_t *found = NULL;
  int saw_inside = 0;
  pthread_mutex_lock(&ex->reg_mu);
  for (size_t i = region_upper(ex, addr); i-- > 0;) {
    region_t *r = ex->regions[i];
    if (addr - r->addr > ex->max_region_len) break;
    if (addr - r->addr > r->len || len > r->len - (addr - r->addr)) continue;
    saw_inside = 1;
    if ((r->perm & need) == need) {
      found = r;
      r->refs++;
      if (c) c->cur = r;
      break;
    }
  }
  pthread_mutex_unlock(&ex->reg_mu);
  if (!found) *status = saw_inside ? TENT_E_PERMISSION : TENT_E_BOUNDS;
  return found;
}

/* The region holding a waiting READ's word (8 bytes, readable), referenced, or NULL with *status
 * set. Not the connection's `cur`: unregister finds a parked READ through `dead` (wait_word). */
static region_t *word_region_acquire(tcp_exec_t *ex, uint64_t addr, int *status) {
  return region_acquire(ex, NULL, addr, 8, PERM_REMOTE_READ, status);
}

static void word_region_release(tcp_exec_t *ex, region_t *r) {
  pthread_mutex_lock(&ex->reg_mu);
  if (--r->refs == 0 && r->dead) pthread_cond_broadcast(&ex->reg_cv);
  pthread_mutex_unlock(&ex->reg_mu);
}

/* Park until lo <= *word <= hi: TENT_OK, or TENT_E_NOT_READY once the word left [floor, hi], a
 * region went away (unregister waits for us) or wait_ms passed. Re-reads the word whenever the
 * process rings the doorbell (tcp_wait_doorbell, after it advanced a word: Transport.word_written),
 * and on a timer growing from WAIT_POLL_MIN_US to WAIT_POLL_MAX_US for writers that ring none. */
static int wait_word(tcp_exec_t *ex, const region_t *data, const region_t *wr, uint64_t word, uint64_t floor,
                     uint64_t lo, uint64_t hi, uint32_t wait_ms) {
  const volatile _Atomic uint64_t *w = (const volatile _Atomic uint64_t *)(uintptr_t)word;
  uint64_t v = atomic_load_explicit(w, memory_order_acquire);
  if (v >= lo && v <= hi) return TENT_OK;
  if (v < floor || v > hi) {
    atomic_fetch_add(&ex->waits_not_ready, 1);
    return TENT_E_NOT_READY;
  }
  if (atomic_fetch_add(&ex->parked_now, 1) >= ex->wait_max_parked) {
    atomic_fetch_sub(&ex->parked_now, 1);
    atomic_fetch_add(&ex->waits_refused, 1);
    return TENT_E_NOT_READY;
  }
  uint64_t deadline = mono_ns() + (uint64_t)(wait_ms < (uint32_t)ex->wait_max_ms ? wait_ms : (uint32_t)ex->wait_max_ms) * 1000000ull;
  uint32_t step_us = WAIT_POLL_MIN_US;
  int status = TENT_E_NOT_READY;
  pthread_mutex_lock(&ex->wait_mu);
  uint64_t seq = ex->wait_seq;
  pthread_mutex_unlock(&ex->wait_mu);
  for (;;) {
    pthread_mutex_lock(&ex->wait_mu);
    if (ex->wait_seq == seq) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (uint64_t)step_us * 1000ull;
      ts.tv_sec = (time_t)(at / 1000000000ull);
      ts.tv_nsec = (long)(at % 1000000000ull);
      pthread_cond_timedwait(&ex->wait_cv, &ex->wait_mu, &ts);
    }
    seq = ex->wait_seq;
    pthread_mutex_unlock(&ex->wait_mu);
    if (step_us < WAIT_POLL_MAX_US) step_us = step_us * 2 < WAIT_POLL_MAX_US ? step_us * 2 : WAIT_POLL_MAX_US;
    if (__atomic_load_n(&data->dead, __ATOMIC_ACQUIRE) || __atomic_load_n(&wr->dead, __ATOMIC_ACQUIRE)) break;
    v = atomic_load_explicit(w, memory_order_acquire);
    if (v >= lo && v <= hi) {
      status = TENT_OK;
      break;
    }
    if (v < floor || v > hi || mono_ns() >= deadline || __atomic_load_n(&ex->stopping, __ATOMIC_RELAXED)) break;
  }
  atomic_fetch_sub(&ex->parked_now, 1);
  atomic_fetch_add(status == TENT_OK ? &ex->waits_served : &ex->waits_not_ready, 1);
  return status;
}

static void region_release(tcp_exec_t *ex, sconn_t *c, region_t *r) {
  pthread_mutex_lock(&ex->reg_mu);
  c->cur = NULL;
  if (--r->refs == 0 && r->dead) pthread_cond_broadcast(&ex->reg_cv);
  pthread_mutex_unlock(&ex->reg_mu);
}

/* Register [addr, addr+len) with `perm`: returns the registration's id (> 0) or -errno. */
EXPORT int64_t tcp_register_region(void *self, uint64_t addr, uint64_t len, uint32_t perm) {
  tcp_exec_t *ex = self;
  if (!ex || perm > (PERM_REMOTE_READ | PERM_REMOTE_WRITE) || addr + len < addr) return -EINVAL;
  region_t *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->addr = addr;
  r->len = len;
  r->perm = perm;
  pthread_mutex_lock(&ex->reg_mu);
  if (ex->nregions == ex->cap_regions) {
    size_t cap = ex->cap_regions ? ex->cap_regions * 2 : 64;
    region_t **n = realloc(ex->regions, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&ex->reg_mu);
      free(r);
      return -ENOMEM;
    }
    ex->regions = n;
    ex->cap_regions = cap;
  }
  r->id = ++ex->next_region_id;
  size_t pos = region_upper(ex, addr); /* registrations in address order append at the end */
  memmove(&ex->regions[pos + 1], &ex->regions[pos], (ex->nregions - pos) * sizeof *ex->regions);
  ex->regions[pos] = r;
  ex->nregions++;
  if (len > ex->max_region_len) ex->max_region_len = len;
  pthread_mutex_unlock(&ex->reg_mu);
  return r->id;
}

/* Remove registration `id`: no new request finds it once this starts; it returns when no server
 * I/O uses it any more. In-flight I/O gets `timeout_ms` (< 0: the executor's
 * unregister_timeout_ms) to finish, then its connections are cut. 0: drained in time, 1: drained
 * after cutting connections, -ENOENT: no such registration. */
EXPORT int tcp_unregister_region(void *self, int64_t id, int timeout_ms) {
  tcp_exec_t *ex = self;
  if (!ex) return -EINVAL;
  if (timeout_ms < 0) timeout_ms = ex->unregister_timeout_ms;
  pthread_mutex_lock(&ex->reg_mu);
  region_t *r = NULL;
  for (size_t i = 0; i < ex->nregions; i++) {
    if (ex->regions[i]->id == id) {
      r = ex->regions[i];
      memmove(&ex->regions[i], &ex->regions[i + 1], (ex->nregions - i - 1) * sizeof *ex->regions);
      ex->nregions--;
      break;
    }
  }
  if (!r) {
    pthread_mutex_unlock(&ex->reg_mu);
    return -ENOENT;
  }
  r->dead = 1; /* unlinked: no new lookups find it; wait for in-flight server I/O */
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_sec += timeout_ms / 1000;
  dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  while (r->refs > 0)
    if (pthread_cond_timedwait(&ex->reg_cv, &ex->reg_mu, &dl) == ETIMEDOUT) break;
  int cut = 0;
  if (r->refs > 0) {
    /* a reader too slow (or stalled on purpose) to finish: cut its connection, its I/O fails now */
    pthread_mutex_lock(&ex->srv_mu);
    for (sconn_t *c = ex->sconns; c; c = c->next) {
      if (c->cur == r && c->fd >= 0) {
        shutdown(c->fd, SHUT_RDWR);
        cut++;
        atomic_fetch_add(&ex->cut_conns, 1);
      }
    }
    pthread_mutex_unlock(&ex->srv_mu);
    slog("unregister: %d connection(s) still using region %#llx after %d ms: cut", cut,
         (unsigned long long)r->addr, timeout_ms);
    while (r->refs > 0) pthread_cond_wait(&ex->reg_cv, &ex->reg_mu); /* their syscalls return at once */
  }
  pthread_mutex_unlock(&ex->reg_mu);
  free(r);
  return cut ? 1 : 0;
}

/* ------------------------------------------------------------------ server */

static void sconn_close(sconn_t *c) {
  pthread_mutex_lock(&c->ex->srv_mu);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  if (!c->done) c->ex->active_conns--;
  c->done = 1;
  pthread_mutex_unlock(&c->ex->srv_mu);
}

/* The budget a wait may poll for now: what its policy says, if fewer than max_pollers threads of
 * this executor poll already (a batch spread over several connections has as many server threads
 * waiting for the next one: left alone they would all poll, holding every core the initiator
 * needs). A non-zero result holds a poller slot until busy_poll_done. */
static uint32_t busy_poll_claim(tcp_exec_t *ex, tent_busy_poll_t *bp, uint64_t now_ns) {
  uint32_t budget = tent_busy_poll_begin(bp);
  if (!budget) return 0;
  if (atomic_load_explicit(&ex->bulk_active, memory_order_relaxed) > 0 ||
      (int64_t)(now_ns / 1000000ull - atomic_load_explicit(&ex->bulk_last_ms, memory_order_relaxed)) < BULK_QUIET_MS)
    /* (signed: a bulk request that ended after now_ns was read is within the quiet time too) */
    return 0; /* bulk moves: its threads need the cores */
  if (atomic_fetch_add(&ex->polling_now, 1) < ex->max_pollers) return budget;
  atomic_fetch_sub(&ex->polling_now, 1);
  return 0; /* sleeps: measured as any sleeping wait */
}

/* A wait that began with a poll of `budget` ns (0: none) ended `waited_ns` after it began and
 * `cycle_ns` after its exchange began: the policy learns from it, the counters count it. */
static void busy_poll_done(tcp_exec_t *ex, int side, tent_busy_poll_t *bp, uint32_t budget, uint64_t waited_ns,
                           uint64_t cycle_ns, int lost) {
  tent_busy_poll_end(bp, budget, waited_ns, cycle_ns, lost);
  if (budget) atomic_fetch_sub(&ex->polling_now, 1);
  atomic_ullong *c = ex->busy_poll[side];
  atomic_fetch_add_explicit(&c[BP_WAITS], 1, memory_order_relaxed);
  if (!budget) return;
  atomic_fetch_add_explicit(&c[BP_POLLS], 1, memory_order_relaxed);
  if (waited_ns <= budget && !lost) atomic_fetch_add_explicit(&c[BP_HITS], 1, memory_order_relaxed);
  if (lost) atomic_fetch_add_explicit(&c[BP_LOST], 1, memory_order_relaxed);
}

/* Wait until fd is readable, the executor stops, or `timeout_ms` (< 0: forever) passes.
 * Returns 1 readable, 0 stop, -1 timed out. */
static int wait_readable(tcp_exec_t *ex, int fd, int timeout_ms) {
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = ex->wake_fd, .events = POLLIN}};
    int n = poll(p, 2, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    if (n == 0) return -1;
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
    rc = recv_all(fd, scratch, n, NULL, 0);
    len -= n;
  }
  free(scratch);
  return rc;
}

#ifndef TCP_INQ
#define TCP_INQ 36 /* Linux >= 4.18; older headers */
#endif
#ifndef TCP_CM_INQ
#define TCP_CM_INQ TCP_INQ
#endif

/* A WRITE's payload after its gap: one recvmsg (MSG_WAITALL) for both while it fills them.
 * *inq: the bytes still in the socket's receive queue right after it, as the kernel reports them
 * with TCP_INQ (set on server sockets), or -1 where it does not (or nothing was read): whether
 * the next request is in already, so that this one's answer may leave with the next one's. */
static int recv_after_gap(int fd, uint32_t gap, void *dst, size_t len, int *inq) {
  uint8_t skip[GAP_MAX];
  struct iovec iov[2] = {{skip, gap}, {dst, len}};
  struct iovec *v = gap ? iov : iov + 1;
  size_t n = (gap ? 1u : 0u) + (len ? 1u : 0u);
  *inq = -1;
  while (n) {
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec *cut = NULL; /* a QoS piece (while demoted) */
    size_t cut_len = 0;
    int cnt = tl_qos_piece ? iov_within(v, (int)n, tl_qos_piece, &cut, &cut_len) : (int)n;
    struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)cnt, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t k = recvmsg(fd, &m, MSG_WAITALL);
    if (cut) cut->iov_len = cut_len;
    if (k == 0) return IO_EOF;
    if (k < 0) {
      if (errno == EINTR) continue;
      return IO_ERR; /* a timeout (SO_RCVTIMEO) included: the server side has no progress clock */
    }
    *inq = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
      if (cm->cmsg_level == IPPROTO_TCP && cm->cmsg_type == TCP_CM_INQ && cm->cmsg_len >= CMSG_LEN(sizeof(int)))
        memcpy(inq, CMSG_DATA(cm), sizeof *inq);
    while (n && (size_t)k >= v->iov_len) k -= (ssize_t)v->iov_len, v++, n--;
    if (n) v->iov_base = (char *)v->iov_base + k, v->iov_len -= (size_t)k;
    if (n) qos_piece_yield();
  }
  return IO_OK;
}

/* READs answered in one sendmsg at most (the one read plus those already waiting behind it); also
 * the WRITE answers a connection holds back at most. */
#define GATHER_READS 16

/* The answers a server connection holds back: a WRITE's while the request after it is in
 * already (a pipelined run of WRITEs), so that a run's answers leave in one call with the last
 * one's, or in front of whatever this connection sends next, instead of one send each: each send
 * on loopback runs the whole transmit and receive path of its segment here, and the initiator
 * reads a run of WRITEs' answers all at once anyway. A lone WRITE's answer is never held: one is
 * held only while the next request's header is in already (so the wait for it does not sleep),
 * and goes out with the next answer (a READ's in the same sendmsg), or before a READ parks. */
typedef struct {
  uint8_t h[GATHER_READS][RSP_SIZE];
  uint32_t n;
} held_t;

static void rsp_fill(uint8_t *h, int32_t status, uint64_t reqid, uint32_t version, uint32_t gap) {
  memset(h, 0, RSP_SIZE);
  put32(h, WIRE_MAGIC);
  put16(h + 4, (uint16_t)version);
  put16(h + 6, (uint16_t)gap);
  put32(h + 8, (uint32_t)status);
  put64(h + 16, reqid);
}

/* The held answers, sent now (before a wait, or anything that must not overtake them). */
static int held_flush(int fd, held_t *held) {
  if (!held->n) return IO_OK;
  struct iovec iov = {held->h, held->n * (size_t)RSP_SIZE};
  held->n = 0;
  return sendv_all(fd, &iov, 1, NULL, NULL);
}

/* An answer without payload, behind the held ones; `hold`: it may wait for the next answer. */
static int send_response(int fd, held_t *held, int32_t status, uint64_t reqid, uint32_t version, uint32_t gap,
                         int hold) {
  if (hold && held->n < GATHER_READS) {
    rsp_fill(held->h[held->n++], status, reqid, version, gap);
    return IO_OK;
  }
  uint8_t h[RSP_SIZE];
  rsp_fill(h, status, reqid, version, gap);
  if (!held->n) return send_all(fd, h, RSP_SIZE, 0, NULL, 0);
  struct iovec iov[2] = {{held->h, held->n * (size_t)RSP_SIZE}, {h, RSP_SIZE}};
  held->n = 0;
  return sendv_all(fd, iov, 2, NULL, NULL);
}

/* A server connection reads its requests through a small buffer: one plain recv takes whatever
 * is in (up to RX_BUF bytes), so a pipelined run of READs (their headers leave in one sendmsg)
 * costs one call for all of its headers, and a lone request one recv without the ancillary data
 * (TCP_INQ) a look behind it needed before (a recvmsg of the header with TCP_INQ, then a
 * MSG_PEEK and a recv of the READs behind it: three calls per run, and the cmsg's cost on every
 * request). What it reads past a header belongs to the requests after it: a WRITE's gap and the
 * first bytes of its payload are taken from the buffer (a memcpy of at most RX_BUF bytes), the
 * rest lands in place with recv as before, at the same offsets in the stream, so the gap the
 * initiator chose still keeps the kernel's copy clear of 4K aliasing. */
#define RX_BUF (GATHER_READS * REQ_SIZE)

typedef struct {
  uint8_t b[RX_BUF];
  uint32_t off, len; /* the bytes read but not yet taken: b[off, off + len) */
  int drained;       /* the last recv took all the socket had (it returned less than it could) */
} rxbuf_t;

/* Take up to n buffered bytes into dst (NULL: drop them); returns how many. */
static uint32_t rx_take(rxbuf_t *rx, void *dst, uint64_t n) {
  uint32_t k = n < rx->len ? (uint32_t)n : rx->len;
  if (dst && k) memcpy(dst, rx->b + rx->off, k);
  rx->off += k;
  rx->len -= k;
  if (!rx->len) rx->off = 0;
  return k;
}

/* One recv into the buffer's free room (flags: 0 or MSG_DONTWAIT): bytes read, 0 none (EAGAIN,
 * a timeout included), or IO_EOF / IO_ERR as a negative number. */
static ssize_t rx_recv(int fd, rxbuf_t *rx, int flags) {
  if (rx->off) { /* what is left is less than a header, or a few of them: cheap to move */
    memmove(rx->b, rx->b + rx->off, rx->len);
    rx->off = 0;
  }
  size_t room = RX_BUF - rx->len;
  for (;;) {
    ssize_t n = recv(fd, rx->b + rx->len, room, flags);
    if (n > 0) {
      rx->len += (uint32_t)n;
      rx->drained = (size_t)n < room;
      return n;
    }
    if (n == 0) return -IO_EOF;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      rx->drained = 1;
      return 0;
    }
    return -IO_ERR;
  }
}

/* A whole request header in the buffer, read if need be (like recv_all: the socket's timeout,
 * SO_RCVTIMEO, ticks). IO_TIMEOUT: it ran out before any byte of the header (the caller
 * decides); within one, the header stalled (IO_ERR). */
static int rx_header(int fd, rxbuf_t *rx) {
  while (rx->len < REQ_SIZE) {
    ssize_t n = rx_recv(fd, rx, 0);
    if (n < 0) return (int)-n;
    if (n == 0) return rx->len ? IO_ERR : IO_TIMEOUT;
  }
  return IO_OK;
}

/* n bytes into dst (NULL: dropped): those buffered, then the rest from the socket. */
static int rx_read(int fd, rxbuf_t *rx, void *dst, uint64_t n) {
  uint32_t k = rx_take(rx, dst, n);
  if (k == n) return IO_OK;
  return dst ? recv_all(fd, (char *)dst + k, n - k, NULL, 0) : drain(fd, n - k);
}

/* A server connection's sleeping wait for its next request: in the recv of the header itself,
 * not in a poll before it. Waking a thread in recv costs a system call less than waking it in
 * poll and then calling recv, and its timeout is the socket's (SO_RCVTIMEO, slice_timeout_ms: a
 * timer-wheel tick, not an hrtimer armed per wait): about 1 us of a 64 KiB round trip here
 * (docs/benchmarks.md). The executor's stop wakes it with shutdown(), as it wakes every server
 * connection. Returns 1 with the header in the buffer, 0 closed (or stopping, or a stalled
 * header), -1 idle for idle_timeout_ms (checked every slice_timeout_ms). */
static int wait_header(tcp_exec_t *ex, int fd, rxbuf_t *rx) {
  uint64_t since = mono_ms();
  for (;;) {
    int rc = rx_header(fd, rx);
    if (rc == IO_OK) return 1;
    if (rc != IO_TIMEOUT || __atomic_load_n(&ex->stopping, __ATOMIC_RELAXED)) return 0;
    if (mono_ms() - since >= (uint64_t)ex->idle_timeout_ms) return -1;
  }
}

/* Answer a READ of [addr, addr + len) in region `r` (referenced by the caller), together with the
 * READs already complete behind it that fall in the same region: the initiator sends a batch's
 * requests to a connection as one pipelined run, and answering them one sendmsg each cost a
 * wait, a recv and a sendmsg per request on this side, and an answer at a time on the other.
 * The answers go out in one sendmsg (the kernel still pushes each full segment as it fills, so
 * the first answer leaves as early as before); their bytes are the same as answered one by one,
 * so the gaps the initiator chose still hold. Anything else behind it (a WRITE, a READ outside
 * the region, a header still arriving, a malformed one) stays in the buffer for the main loop.
 * The headers behind it are those the buffer holds; the socket is looked at again (one recv
 * that does not wait) only where more may be there: `look` (the READ was parked, so more may
 * have come meanwhile), or the last recv filled the buffer. */
static int send_read_answers(int fd, rxbuf_t *rx, held_t *held, const region_t *r, uint32_t version, uint32_t gap,
                             uint64_t addr, uint64_t len, uint64_t reqid, int look) {
  static const uint8_t zeros[GAP_MAX];
  uint8_t rh[GATHER_READS][RSP_SIZE];
  struct iovec iov[1 + 3 * GATHER_READS];
  int n = 0;
  if (held->n) iov[n++] = (struct iovec){held->h, held->n * (size_t)RSP_SIZE}; /* the WRITE answers before it */
  uint32_t k = 0;
  int gather = len <= SPIN_AFTER_BYTES;
  if (gather && (look || !rx->drained) && rx->len < (GATHER_READS - 1) * REQ_SIZE && rx_recv(fd, rx, MSG_DONTWAIT) < 0)
    return IO_ERR; /* broken: its answer could not be read either */
  uint64_t bytes = len;
  for (;;) {
    memset(rh[k], 0, RSP_SIZE);
    put32(rh[k], WIRE_MAGIC);
    put16(rh[k] + 4, (uint16_t)version);
    put16(rh[k] + 6, (uint16_t)gap);
    put64(rh[k] + 16, reqid);
    iov[n++] = (struct iovec){rh[k], RSP_SIZE};
    if (gap) iov[n++] = (struct iovec){(void *)zeros, gap};
    if (len) iov[n++] = (struct iovec){(void *)(uintptr_t)addr, (size_t)len};
    if (!gather || ++k == GATHER_READS || rx->len < REQ_SIZE) break;
    const uint8_t *h = rx->b + rx->off; /* the next request, whole in the buffer */
    uint32_t op = get16(h + 6);
    version = get16(h + 4);
    if (get32(h) != WIRE_MAGIC || version != WIRE_VERSION_GAP || (op & 0xff) != TENT_OP_READ) break;
    gap = op >> 8;
    addr = get64(h + 8);
    len = get64(h + 16);
    reqid = get64(h + 24);
    if (gap > GAP_MAX || !len || len > SPIN_AFTER_BYTES || bytes + len > PIPE_BYTES_MAX || addr < r->addr ||
        addr - r->addr > r->len || len > r->len - (addr - r->addr))
      break;
    bytes += len;
    rx_take(rx, NULL, REQ_SIZE); /* answered with the others */
  }
  held->n = 0;
  return sendv_all(fd, iov, n, NULL, NULL);
}

static void *sconn_main(void *arg) {
  sconn_t *c = arg;
  tcp_exec_t *ex = c->ex;
  int fd = c->fd;
  uint8_t h[REQ_SIZE];
  pthread_setname_np(pthread_self(), "tent-tcp-serve"); /* for perf sched / top -H: which thread waits */
  if (ex->auth_on) {
    char why[160];
    int rc = tent_auth_server(fd, ex->auth_key, sizeof ex->auth_key, NULL, 0, ex->auth_timeout_ms, why, sizeof why);
    pthread_mutex_lock(&ex->srv_mu);
    if (!c->evicted) ex->pending_auth--;
    c->pending = 0;
    pthread_mutex_unlock(&ex->srv_mu);
    if (rc != TENT_AUTH_OK) {
      atomic_fetch_add(&ex->auth_failures, 1);
      slog("refused a connection from %s: %s", c->who, why);
      sconn_close(c);
      return NULL;
    }
  }
  rxbuf_t rx = {.drained = 1}; /* the requests read and not yet served */
  held_t held = {.n = 0};      /* WRITE answers held back while the next request was in */
  int one = 1; /* recv_after_gap learns whether the next request is in (failing: it reports -1, nothing is held) */
  setsockopt(fd, IPPROTO_TCP, TCP_INQ, &one, sizeof one);
  int spin = 0; /* the last request was small: its client may send the next one at once */
  uint64_t served_ns = 0; /* when the last request's header was in: the server's exchange cycle starts */
  tent_busy_poll_t bp;
  tent_busy_poll_init(&bp, (uint32_t)ex->busy_poll_us * 1000u, ex->busy_poll_adaptive);
  int bulk_held = 0; /* this connection counts in ex->bulk_active (a bulk request in service) */
  for (;;) {
    if (bulk_held) { /* the bulk request was served (every path of the last iteration ends here) */
      atomic_store(&ex->bulk_last_ms, mono_ms());
      atomic_fetch_sub(&ex->bulk_active, 1);
      bulk_held = 0;
    }
    if (qos_thread_demoted() && mono_ms() >= atomic_load(&ex->srv_small_until_ms)) qos_thread_level(ex, 0); /* idle */
    /* sleep in the header's recv (wait_header) where the socket's timeout ticks at least as often
     * as the idle timeout needs; else in poll, as before */
    int in_recv = ex->slice_timeout_ms <= ex->idle_timeout_ms, w;
    if (rx.len >= REQ_SIZE) {
      w = 1; /* the next request came in with the last one's read: no wait */
    } else if (spin) {
      uint64_t t0 = mono_ns();
      uint32_t budget = busy_poll_claim(ex, &bp, t0);
      int lost = 0;
      if (spin_readable(fd, budget, &lost)) w = 1;
      else if (in_recv) w = wait_header(ex, fd, &rx);
      else w = wait_readable(ex, fd, ex->idle_timeout_ms);
      if (w > 0) {
        uint64_t now = mono_ns();
        busy_poll_done(ex, 1, &bp, budget, now - t0, now - served_ns, lost);
      }
      else if (budget) atomic_fetch_sub(&ex->polling_now, 1); /* the slot only: no outcome */
    } else if (in_recv) {
      w = wait_header(ex, fd, &rx);
    } else {
      w = wait_readable(ex, fd, ex->idle_timeout_ms);
    }
    if (w < 0) atomic_fetch_add(&ex->idle_closed, 1); /* idle too long: the client reconnects when it needs to */
    if (w <= 0) break;
    int rc = rx_header(fd, &rx); /* buffered already, unless the wait was a poll */
    if (rc != IO_OK) break;      /* peer closed / stalled mid-header */
    rx_take(&rx, h, REQ_SIZE);
    served_ns = ex->busy_poll_us ? mono_ns() : 0;
    uint32_t version = get16(h + 4);
    if (get32(h) != WIRE_MAGIC || (version != WIRE_VERSION && version != WIRE_VERSION_GAP)) {
      slog("closing connection from %s: bad request header (magic %08x version %u)", c->who, get32(h), version);
      break;
    }
    uint32_t op = get16(h + 6), gap = 0;
    if (version == WIRE_VERSION_GAP) gap = op >> 8, op &= 0xff;
    uint64_t addr = get64(h + 8), len = get64(h + 16), reqid = get64(h + 24);
    int waiting = op == WIRE_OP_READ_WAIT && version == WIRE_VERSION_GAP;
    if ((op != TENT_OP_READ && op != TENT_OP_WRITE && !waiting) || gap > GAP_MAX) {
      slog("closing connection from %s: bad opcode %u (gap %u)", c->who, op, gap);
      break;
    }
    int status = TENT_OK;
    uint8_t ext[WAIT_EXT_SIZE];
    uint64_t word = 0, floor = 0, lo = 0, hi = 0;
    uint32_t wait_ms = 0;
    if (waiting) {
      if (rx_read(fd, &rx, ext, WAIT_EXT_SIZE) != IO_OK) break;
      op = TENT_OP_READ;
      word = get64(ext), floor = get64(ext + 8), lo = get64(ext + 16), hi = get64(ext + 24), wait_ms = get32(ext + 32);
      if ((word & 7u) || !(floor <= lo && lo <= hi) || !wait_ms || get32(ext + 36)) {
        slog("refused a waiting READ from %s: bad condition (word %#llx, floor %llu, lo %llu, hi %llu, %u ms)", c->who,
             (unsigned long long)word, (unsigned long long)floor, (unsigned long long)lo, (unsigned long long)hi, wait_ms);
        atomic_fetch_add(&ex->waits_refused, 1);
        if (send_response(fd, &held, TENT_E_PROTOCOL, reqid, version, 0, 0) != IO_OK) break;
        continue;
      }
    }
    spin = len <= SPIN_AFTER_BYTES; /* bulk connections sleep between requests: no core burnt beside a stream */
    if (ex->qos_bulk_nice && ex->qos_serve_nice) qos_server_request(ex, spin);
    if (!spin) { /* and nobody polls while one is served */
      atomic_fetch_add(&ex->bulk_active, 1);
      bulk_held = 1;
    }
    region_t *r = region_acquire(ex, c, addr, len, op == TENT_OP_READ ? PERM_REMOTE_READ : PERM_REMOTE_WRITE, &status);
    if (op == TENT_OP_WRITE) {
      /* the gap and the payload's first bytes may have come with the header */
      uint32_t g = rx_take(&rx, NULL, gap), got = g == gap ? rx_take(&rx, r ? (void *)(uintptr_t)addr : NULL, len) : 0;
      int inq = -1;
      if (r) {
        rc = recv_after_gap(fd, gap - g, (char *)(uintptr_t)addr + got, (size_t)(len - got), &inq);
        region_release(ex, c, r);
      } else {
        rc = drain(fd, gap - g + len - got);
      }
      if (rc != IO_OK) {
        held_flush(fd, &held); /* best effort: the WRITEs before it were done */
        break;
      }
      /* held while the next request is in already (in the buffer, or the socket after this payload) */
      if (send_response(fd, &held, status, reqid, version, gap, rx.len >= REQ_SIZE || inq >= REQ_SIZE) != IO_OK) break;
    } else {
      int look = 0; /* what followed the header may have grown while it was parked: look */
      if (!r) {
        if (send_response(fd, &held, status, reqid, version, 0, 0) != IO_OK) break;
        continue;
      }
      if (waiting) {
        if (held_flush(fd, &held) != IO_OK) { /* its park may be long: nothing waits behind it */
          region_release(ex, c, r);
          break;
        }
        region_t *wr = word_region_acquire(ex, word, &status);
        if (wr) {
          status = wait_word(ex, r, wr, word, floor, lo, hi, wait_ms);
          word_region_release(ex, wr);
        }
        if (status != TENT_OK) {
          region_release(ex, c, r);
          if (send_response(fd, &held, status, reqid, version, 0, 0) != IO_OK) break;
          continue;
        }
        look = 1;
      }
      rc = send_read_answers(fd, &rx, &held, r, version, gap, addr, len, reqid, look); /* header, gap, payload: one sendmsg */
      region_release(ex, c, r);
      if (rc != IO_OK) break;
    }
  }
  if (bulk_held) {
    atomic_store(&ex->bulk_last_ms, mono_ms());
    atomic_fetch_sub(&ex->bulk_active, 1);
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
    if (wait_readable(ex, l->fd, -1) <= 0) break;
    struct sockaddr_in from;
    socklen_t fromlen = sizeof from;
    int fd = accept4(l->fd, (struct sockaddr *)&from, &fromlen, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        slog("accept: %s", strerror(errno));
        poll(NULL, 0, 50);
        continue;
      }
      break;
    }
    char who[64] = "?";
    if (fromlen >= sizeof from && from.sin_family == AF_INET) {
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
      snprintf(who, sizeof who, "%s:%d", ip, ntohs(from.sin_port));
    }
    pthread_mutex_lock(&ex->srv_mu);
    reap_sconns_locked(ex);
    /* A thread and an fd per connection: never more than max_conns of them. Clients that have not
     * authenticated (yet) hold at most a quarter; when those are all taken, the oldest of them is cut
     * for the newcomer: a flood of clients that never authenticate cannot lock real peers out (a
     * peer finishes its handshake in a round trip or two, long before it is the oldest). */
    if (ex->auth_on && ex->pending_auth >= (ex->max_conns + 3) / 4) {
      sconn_t *oldest = NULL;
      for (sconn_t *o = ex->sconns; o; o = o->next)
        if (o->pending && !o->evicted && o->fd >= 0 && (!oldest || o->accepted_ms < oldest->accepted_ms)) oldest = o;
      if (oldest) {
        oldest->evicted = 1;
        ex->pending_auth--; /* its handshake fails now; it no longer counts against newcomers */
        shutdown(oldest->fd, SHUT_RDWR);
        atomic_fetch_add(&ex->refused_conns, 1);
      }
    }
    int full = ex->active_conns >= ex->max_conns || (ex->auth_on && ex->pending_auth >= (ex->max_conns + 3) / 4);
    pthread_mutex_unlock(&ex->srv_mu);
    if (full) {
      close(fd);
      atomic_fetch_add(&ex->refused_conns, 1);
      slog("refused a connection from %s: %d connections open (max_conns)", who, ex->max_conns);
      continue;
    }
    tune_socket(fd, ex->sockbuf);
    loopback_cc(ex, fd, from.sin_addr);
    set_timeouts(fd, ex->slice_timeout_ms);
    sconn_t *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->ex = ex;
    c->fd = fd;
    snprintf(c->who, sizeof c->who, "%s", who);
    pthread_mutex_lock(&ex->srv_mu);
    if (ex->stopping || pthread_create(&c->thread, NULL, sconn_main, c) != 0) {
      pthread_mutex_unlock(&ex->srv_mu);
      close(fd);
      free(c);
      continue;
    }
    ex->active_conns++;
    if (ex->auth_on) {
      ex->pending_auth++;
      c->pending = 1;
    }
    c->accepted_ms = mono_ms();
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
  loopback_cc(ex, fd, r->remote.sin_addr);
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
  if (ex->auth_on) {
    char why[160];
    int rc = tent_auth_client(fd, ex->auth_key, sizeof ex->auth_key, NULL, 0, ex->connect_timeout_ms, why, sizeof why);
    if (rc != TENT_AUTH_OK) {
      slog("rail %s: %s", r->name, why);
      close(fd);
      return -1;
    }
  }
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  set_timeouts(fd, ex->tick_ms); /* wake up to check the chunk's progress clock (io_watch_t) */
  if (ex->tick_ms > RX_TICK_MS) { /* receives tick finer: a waiter sleeps in them (run_recv_head) */
    struct timeval tv = {.tv_sec = 0, .tv_usec = RX_TICK_MS * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  return fd;
}

/* ------------------------------------------------------------------ jobs */

/* A slice taken by submit, with the digest its READ answers fold into: the one the caller armed
 * for this slice's destination (tent_host_digest, asked on the submitting thread), held until the
 * slice is reported (the caller's object may be gone by then, after a timeout). */
typedef struct tcp_job {
  tent_job_t base; /* first: chunks point at it */
  tent_digest_t *digest;
  int waits;        /* a waiting READ: `wait` is its condition (tent_host_wait, asked in submit) */
  tent_wait_t wait;
} tcp_job_t;

static tent_job_t *job_new(const tcp_exec_t *ex, const tent_slice_t *s, uint32_t chunks) {
  tcp_job_t *j = malloc(sizeof *j);
  if (!j) return NULL;
  j->base.s = *s;
  atomic_init(&j->base.remaining, chunks);
  atomic_init(&j->base.status, TENT_OK);
  j->digest = ex->receive_digest && s->opcode == TENT_OP_READ && s->length
                  ? tent_digest_hold(tent_host_digest(ex->host, s)) : NULL;
  const tent_wait_t *w = ex->wait_read ? tent_host_wait(ex->host, s) : NULL;
  j->waits = w != NULL;
  if (w) {
    j->wait = *w;
    /* the initiator's progress clock must not fire while the target parks it */
    uint32_t cap = ex->slice_timeout_ms / 2 > 1 ? (uint32_t)ex->slice_timeout_ms / 2 : 1;
    if (j->wait.wait_ms > cap) j->wait.wait_ms = cap;
  }
  return &j->base;
}

static tent_digest_t *job_digest(const tent_job_t *j) { return ((const tcp_job_t *)j)->digest; }

static int chunk_waits(const tent_chunk_t *c) { return ((const tcp_job_t *)c->job)->waits; }

static int head_waits(const tent_chunk_queue_t *q) { return q->len > 0 && chunk_waits(&q->items[q->head]); }

static void job_free(tent_job_t *j) {
  if (!j) return;
  tent_digest_drop(job_digest(j));
  free(j);
}

/* ------------------------------------------------------------------ pipelined runs */

/* A run: chunks of one rail executed back to back on one connection. Its requests leave in one
 * sendmsg (headers and WRITE payloads interleaved), its responses are read in order. A run of
 * one chunk is the plain request/response exchange. */
typedef struct pipe_run {
  rail_t *r;
  int slot, fd;
  int small;                 /* a run of small chunks (else bulk: counts in rail.bulk_busy) */
  int waits;                 /* a run of waiting READs (counts in rail.wait_busy) */
  uint32_t k;
  uint32_t reported;         /* chunks [0, reported) were reported as their answers came in */
  uint64_t token;            /* the batch of a run sent inline (its waiter may read the answers) */
  int send_rc;               /* IO_* of the send phase */
  uint64_t sent_ns;          /* inline runs: when the send began (busy-poll cycles; 0: unknown) */
  uint64_t hold_ns;          /* its waiter sleeps in the first receive until then at most (0: no limit) */
  uint64_t first_ns;         /* when the first bytes of its answers came in that receive */
  uint64_t done_ms;          /* its waiter's clock after the answers (run_finish's idle stamp; 0: read it) */
  struct pipe_run *next;     /* in ex->rx while a worker is to read its responses */
  io_watch_t watch;          /* the run's progress clock: every chunk of it is in service */
  tent_chunk_t c[PIPE_MAX];
  uint64_t reqid[PIPE_MAX];
  int status[PIPE_MAX];
  uint8_t gap[PIPE_MAX];     /* zero bytes between a header and its payload (version 2) */
  uint8_t hdr[PIPE_MAX][REQ_SIZE];
  uint8_t ext[PIPE_MAX][WAIT_EXT_SIZE]; /* a waiting READ's condition, after its header */
} pipe_run_t;

static void finish_chunk(tcp_exec_t *ex, const tent_chunk_t *c, int status);

static int nslots(const tcp_exec_t *ex) { return ex->conns_per_rail + 1; } /* the last is the express slot */

/* The run enters service (before its connect, if any, and its send): its progress clock starts now
 * (queue time never counts) and each chunk's service start is reported. */
static void run_start(tcp_exec_t *ex, pipe_run_t *pr, uint64_t now_ms) {
  pr->watch = (io_watch_t){ex->host, &pr->c[0].job->s, now_ms, ex->slice_timeout_ms, ex->congestion_ms, 0, NULL};
  pr->hold_ns = 0;
  pr->done_ms = 0;
  for (uint32_t i = 0; i < pr->k; i++) tent_host_note(ex->host, &pr->c[i].job->s, TENT_NOTE_START, pr->c[i].len);
}

/* A chunk of a run leaves service: STOP, then its report (the job may be freed by it). */
static void run_chunk_done(tcp_exec_t *ex, const tent_chunk_t *c, int status) {
  tent_host_note(ex->host, &c->job->s, TENT_NOTE_STOP, 0);
  finish_chunk(ex, c, status);
}

#define SPARE_RUNS 8

/* A run struct of an inline submit back to the spares (or freed). */
static void run_put(tcp_exec_t *ex, pipe_run_t *pr) {
  if (!pr) return;
  pthread_mutex_lock(&ex->mu);
  if (ex->nspare_runs < SPARE_RUNS) {
    pr->next = ex->spare_runs;
    ex->spare_runs = pr;
    ex->nspare_runs++;
    pr = NULL;
  }
  pthread_mutex_unlock(&ex->mu);
  free(pr);
}

/* A run struct for an inline submit, taken by a caller that holds ex->mu: a spare one, or a new
 * one (allocated under the lock: only when no spare is left); NULL when out of memory. */
static pipe_run_t *run_take_locked(tcp_exec_t *ex) {
  pipe_run_t *pr = ex->spare_runs;
  if (!pr) return malloc(sizeof(pipe_run_t));
  ex->spare_runs = pr->next;
  ex->nspare_runs--;
  return pr;
}

/* run_put for a caller that holds ex->mu */
static void run_give_locked(tcp_exec_t *ex, pipe_run_t *pr) {
  if (ex->nspare_runs < SPARE_RUNS) {
    pr->next = ex->spare_runs;
    ex->spare_runs = pr;
    ex->nspare_runs++;
  } else {
    free(pr);
  }
}

/* The gap for a payload that would start at byte `pos` of its sender's stream: the smallest one
 * that puts it neither 1..ALIAS_BYTES-1 bytes ahead of its source `src` nor behind the
 * destination `dst` by as little (modulo 4 KiB), so neither the sender's copy into the socket
 * buffer nor the receiver's copy out of it (on loopback, the same pages) hits 4K aliasing. The
 * kernel fills a socket's buffer pages from offset 0 once its earlier data is acknowledged, so
 * a payload's position in its stream, counted from the start of its run (the requests of a run
 * leave together, their answers come back together), is where it lands modulo 4 KiB. Two
 * windows of ALIAS_BYTES - 1 leave a gap <= GAP_MAX free. */
static uint8_t payload_gap(uint64_t pos, uint64_t src, uint64_t dst) {
  for (uint32_t g = 0; g <= GAP_MAX; g++) {
    uint32_t ahead_of_src = (uint32_t)((pos + g - src) & 4095u), behind_dst = (uint32_t)((dst - pos - g) & 4095u);
    if ((ahead_of_src == 0 || ahead_of_src >= ALIAS_BYTES) && (behind_dst == 0 || behind_dst >= ALIAS_BYTES)) return (uint8_t)g;
  }
  return 0;
}

/* Send every request of the run, on its progress clock. `*stream`: bytes this thread sent just
 * before (into socket buffer pages not yet released: runs sent back to back by one thread share
 * its pages), advanced past this run. */
static int run_send(tcp_exec_t *ex, pipe_run_t *pr, uint64_t *stream) {
  static const uint8_t zeros[GAP_MAX];
  struct iovec iov[4 * PIPE_MAX];
  iov_owner_t own[4 * PIPE_MAX];
  int n = 0;
  uint64_t sent = *stream, answers = 0; /* bytes sent before this request, and before its answer */
  for (uint32_t i = 0; i < pr->k; i++) {
    const tent_chunk_t *c = &pr->c[i];
    const tent_slice_t *s = &c->job->s;
    uint8_t *h = pr->hdr[i];
    int gapped = c->len > 0, write = s->opcode == TENT_OP_WRITE;
    const tcp_job_t *tj = (const tcp_job_t *)c->job;
    int waits = !write && tj->waits;
    if (waits) gapped = 1; /* the waiting opcode exists in version 2 only (a gap of 0 is fine) */
    uint64_t local = s->local_addr + c->off, remote = s->remote_addr + c->off;
    pr->reqid[i] = atomic_fetch_add(&ex->next_reqid, 1);
    if (!gapped) pr->gap[i] = 0;
    else if (write) pr->gap[i] = payload_gap(sent + REQ_SIZE, local, remote);
    else pr->gap[i] = payload_gap(answers + RSP_SIZE, remote, local);
    sent += REQ_SIZE + (waits ? WAIT_EXT_SIZE : 0) + (write && gapped ? pr->gap[i] + c->len : 0);
    answers += RSP_SIZE + (!write && gapped ? pr->gap[i] + c->len : 0);
    put32(h, WIRE_MAGIC);
    put16(h + 4, gapped ? WIRE_VERSION_GAP : WIRE_VERSION);
    put16(h + 6, (uint16_t)((waits ? WIRE_OP_READ_WAIT : s->opcode) | (gapped ? (uint32_t)pr->gap[i] << 8 : 0)));
    put64(h + 8, s->remote_addr + c->off);
    put64(h + 16, c->len);
    put64(h + 24, pr->reqid[i]);
    own[n] = (iov_owner_t){s, 0};
    iov[n++] = (struct iovec){h, REQ_SIZE};
    if (waits) {
      uint8_t *e = pr->ext[i];
      put64(e, tj->wait.word_addr);
      put64(e + 8, tj->wait.floor);
      put64(e + 16, tj->wait.lo);
      put64(e + 24, tj->wait.hi);
      put32(e + 32, tj->wait.wait_ms);
      put32(e + 36, 0);
      own[n] = (iov_owner_t){s, 0};
      iov[n++] = (struct iovec){e, WAIT_EXT_SIZE};
    }
    if (write && pr->gap[i]) {
      own[n] = (iov_owner_t){s, 0};
      iov[n++] = (struct iovec){(void *)zeros, pr->gap[i]};
    }
    if (s->opcode == TENT_OP_WRITE && c->len) {
      own[n] = (iov_owner_t){s, 1};
      iov[n++] = (struct iovec){(void *)(uintptr_t)(s->local_addr + c->off), c->len};
    }
  }
  *stream = sent;
  return sendv_all(pr->fd, iov, n, &pr->watch, own);
}

/* A pooled connection may have been closed by the server (idle timeout, restart): true if `fd`
 * has been idle long enough that the server may have dropped it, or already shows EOF/HUP. */
static int idle_fd_stale(tcp_exec_t *ex, int fd, uint64_t since, uint64_t now) {
  if (now <= since) return 0; /* pooled after `now` was read (an inline submit's stamp): just used */
  if (now - since >= (uint64_t)ex->idle_timeout_ms / 2) return 1;
  if (now - since < 200) return 0; /* just used: not worth a syscall */
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  return poll(&p, 1, 0) > 0;
}

static int io_status(int rc) {
  switch (rc) {
    case IO_OK: return TENT_OK;
    case IO_TIMEOUT: return TENT_E_TIMEOUT;
    default: return TENT_E_IO;
  }
}

/* Is `h` the header of the answer to request i of the run? */
static int rsp_matches(const pipe_run_t *pr, uint32_t i, const uint8_t *h) {
  uint32_t version = pr->c[i].len ? WIRE_VERSION_GAP : WIRE_VERSION;
  uint32_t gap = get16(h + 6);
  return get32(h) == WIRE_MAGIC && get16(h + 4) == version && get64(h + 16) == pr->reqid[i] &&
         (gap == pr->gap[i] || ((int32_t)get32(h + 8) != TENT_OK && gap == 0));
}

/* A lone READ's answer: header and payload in one readv (nothing else can follow on the
 * connection, so the payload buffer never receives another answer's bytes). On the run's
 * progress clock like recv_all. */
static int run_recv_one_read(pipe_run_t *pr) {
  const tent_chunk_t *c = &pr->c[0];
  io_watch_t *w = &pr->watch;
  uint8_t h[RSP_SIZE], gap[GAP_MAX];
  size_t g = pr->gap[0];
  char *dst = (char *)(uintptr_t)(c->job->s.local_addr + c->off);
  struct iovec iov[3] = {{h, RSP_SIZE}, {gap, g}, {dst, c->len}};
  if (!g) iov[1] = iov[2];
  ssize_t n;
  int rc = IO_OK, st = TENT_OK;
  for (;;) {
    struct iovec *cut = NULL; /* a QoS piece (a demoted worker reading a bulk answer) */
    size_t cut_len = 0;
    int cnt = tl_qos_piece ? iov_within(iov, g ? 3 : 2, tl_qos_piece, &cut, &cut_len) : (g ? 3 : 2);
    n = readv(pr->fd, iov, cnt);
    if (cut) cut->iov_len = cut_len;
    if (n > 0) break;
    if (n == 0) {
      rc = IO_EOF;
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      rc = IO_ERR;
      break;
    }
    if (io_idle(w, 0)) {
      rc = IO_TIMEOUT;
      break;
    }
    if (pr->hold_ns && mono_ns() + RX_TICK_MS * 1000000ull > pr->hold_ns) return IO_NOT_YET; /* see run_recv_head */
  }
  if (pr->hold_ns) pr->first_ns = mono_ns(), pr->hold_ns = 0;
  size_t after = 0, gap_got = 0, got = 0; /* bytes past the header: of the gap, of the payload */
  if (rc == IO_OK) {
    after = n > RSP_SIZE ? (size_t)n - RSP_SIZE : 0;
    gap_got = after < g ? after : g;
    got = after - gap_got;
    w->slice = &c->job->s;
    w->digest = job_digest(c->job);
    io_moved(w, got, got > 0);
    if (n < RSP_SIZE) rc = recv_all(pr->fd, h + n, RSP_SIZE - (size_t)n, w, 0);
  }
  if (rc == IO_OK && !rsp_matches(pr, 0, h)) st = TENT_E_PROTOCOL;
  if (rc == IO_OK && st == TENT_OK) {
    int32_t status = (int32_t)get32(h + 8);
    if (status == TENT_OK) {
      io_landed(w, dst, got); /* only now: the answer is this request's */
      if (gap_got < g) rc = recv_all(pr->fd, gap + gap_got, g - gap_got, w, 0);
      if (rc == IO_OK && got < c->len) rc = recv_all(pr->fd, dst + got, c->len - got, w, 1);
    } else if (after) {
      st = TENT_E_PROTOCOL; /* a refusal carries no payload */
    }
    if (status > 0 || status < TENT_E_NOT_READY) status = TENT_E_PROTOCOL; /* the lowest status on the wire */
    if (rc == IO_OK && st == TENT_OK) {
      pr->status[0] = status;
      return 0;
    }
  }
  pr->status[0] = st != TENT_OK ? st : io_status(rc);
  return 1;
}

/* Fill iov[0..n) from fd (the array is consumed), on the run's progress clock: recvmsg with
 * MSG_WAITALL, so a READ answer's gap, its payload and the header of the answer after it cost one
 * call once their bytes are in (three recv calls before: a pipelined run of READs paid 3 system
 * calls per answer on the waiting thread, a run of WRITEs one for all its answers). Entry
 * `payload` (-1: none) is the slice's payload: its bytes are reported as progress. *got: the
 * bytes received, also when it fails. */
static int recvv_all(int fd, struct iovec *iov, int n, io_watch_t *w, int payload, size_t *got) {
  *got = 0;
  while (n > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = recvmsg(fd, &m, MSG_WAITALL);
    if (k == 0) return IO_EOF;
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (io_idle(w, 0)) return IO_TIMEOUT;
        continue;
      }
      return IO_ERR;
    }
    size_t left = (size_t)k, moved = 0;
    *got += (size_t)k;
    while (n > 0 && left >= iov->iov_len) {
      if (payload == 0) moved += iov->iov_len;
      left -= iov->iov_len;
      iov++, n--, payload--;
    }
    if (n > 0 && left) {
      if (payload == 0) moved += left;
      iov->iov_base = (char *)iov->iov_base + left;
      iov->iov_len -= left;
    }
    io_moved(w, moved, moved > 0);
  }
  return IO_OK;
}

/* The run's first answer bytes, `len` of them, as recv_all. With pr->hold_ns (its waiter reads the
 * answers, ex_progress) the waiter sleeps for them in this receive itself, the socket's receive
 * timeout (RX_TICK_MS) ticking, rather than in a ppoll before it: one system call less per request,
 * like a server connection's wait_header. IO_NOT_YET when none of them came and the waiter's step
 * has no tick left (nothing was consumed: the run goes back as it was). */
static int run_recv_head(pipe_run_t *pr, void *buf, size_t len) {
  if (!pr->hold_ns) return recv_all(pr->fd, buf, len, &pr->watch, 0);
  for (;;) {
    ssize_t n = recv(pr->fd, buf, len, MSG_WAITALL);
    if (n > 0) {
      pr->first_ns = mono_ns();
      pr->hold_ns = 0;
      io_moved(&pr->watch, (size_t)n, 0);
      return (size_t)n == len ? IO_OK : recv_all(pr->fd, (char *)buf + n, len - (size_t)n, &pr->watch, 0);
    }
    if (n == 0) return IO_EOF;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERR;
    if (io_idle(&pr->watch, 0)) return IO_TIMEOUT;
    if (mono_ns() + RX_TICK_MS * 1000000ull > pr->hold_ns) return IO_NOT_YET;
  }
}

/* Read the run's responses into pr->status, on its progress clock. Returns 1 when the connection
 * must be dropped (an I/O or protocol error: the chunks not answered get that status); with
 * pr->hold_ns, IO_NOT_YET (nothing read, nothing reported) when no answer came in time. */
static int run_recv(tcp_exec_t *ex, pipe_run_t *pr) {
  if (pr->k == 1 && pr->c[0].job->s.opcode == TENT_OP_READ && pr->c[0].len) return run_recv_one_read(pr);
  uint8_t rsp[RSP_SIZE * PIPE_MAX];
  int all_writes = 1;
  for (uint32_t i = 0; i < pr->k; i++) all_writes &= pr->c[i].job->s.opcode == TENT_OP_WRITE;
  uint32_t i = 0;
  int rc = IO_OK, st = TENT_OK, have_next = 0; /* have_next: answer i's header is in rsp already */
  if (all_writes && pr->k > 1) rc = run_recv_head(pr, rsp, RSP_SIZE * (size_t)pr->k); /* all answers at once */
  else rc = run_recv_head(pr, rsp, RSP_SIZE), have_next = 1; /* the first answer's header */
  if (rc == IO_NOT_YET) return IO_NOT_YET;
  for (; rc == IO_OK && i < pr->k; i++) {
    const tent_chunk_t *c = &pr->c[i];
    const uint8_t *h = rsp + (all_writes && pr->k > 1 ? RSP_SIZE * i : 0);
    /* the wait for this answer is this chunk's: the slice the watch named may be reported (freed) */
    pr->watch.slice = &c->job->s;
    if (!(all_writes && pr->k > 1) && !have_next && (rc = recv_all(pr->fd, rsp, RSP_SIZE, &pr->watch, 0)) != IO_OK) break;
    have_next = 0;
    if (!rsp_matches(pr, i, h)) {
      st = TENT_E_PROTOCOL;
      break;
    }
    int32_t status = (int32_t)get32(h + 8);
    if (status == TENT_OK && c->job->s.opcode == TENT_OP_READ && c->len) {
      /* gap, payload and the next answer's header in one call: an answer that was accepted
       * carries exactly gap + len bytes, so whatever follows is the next answer's header */
      uint8_t gap[GAP_MAX];
      struct iovec iov[3] = {{gap, pr->gap[i]}, {(void *)(uintptr_t)(c->job->s.local_addr + c->off), c->len}, {rsp, RSP_SIZE}};
      size_t got;
      have_next = i + 1 < pr->k;
      pr->watch.slice = &c->job->s;
      pr->watch.digest = job_digest(c->job);
      rc = pr->gap[i] ? recvv_all(pr->fd, iov, 2 + have_next, &pr->watch, 1, &got)
                      : recvv_all(pr->fd, iov + 1, 1 + have_next, &pr->watch, 0, &got);
      if (rc == IO_OK || got >= pr->gap[i] + c->len) /* the payload landed whole: fold it while it is in this core's cache */
        io_landed(&pr->watch, (void *)(uintptr_t)(c->job->s.local_addr + c->off), c->len);
      if (rc != IO_OK) {
        if (got >= pr->gap[i] + c->len) pr->status[i++] = TENT_OK; /* this one came whole: the next one failed */
        break;
      }
    }
    if (status > 0 || status < TENT_E_NOT_READY) status = TENT_E_PROTOCOL; /* the lowest status on the wire */
    pr->status[i] = status;
    if (i + 1 < pr->k) { /* report it now (not the last: run_finish gives the connection back first) */
      if (status == TENT_OK) {
        atomic_fetch_add(&pr->r->bytes, c->len);
        atomic_fetch_add(&pr->r->slices, 1);
      } else {
        atomic_fetch_add(&pr->r->errors, 1);
      }
      run_chunk_done(ex, c, status);
      pr->reported = i + 1;
    }
  }
  if (i == pr->k) return 0;
  if (st == TENT_OK) st = io_status(rc);
  for (; i < pr->k; i++) pr->status[i] = st;
  return 1;
}

/* ------------------------------------------------------------------ ready list */

static int slot_free_bulk(const tcp_exec_t *ex, const rail_t *r) { return r->busy < ex->conns_per_rail; }

/* May a bulk run start on `r` now? A free bulk slot is not enough while small requests are active
 * on the rail (submitted within qos_window_ms): then bulk runs on qos_bulk_conns connections at
 * most, so large transfers keep moving but do not fill every connection, kernel socket buffer and
 * core with their bytes while a small request waits for its turn (measured: the P99 of 64 KiB
 * requests beside a 64 MiB stream, docs/benchmarks.md). A rail held back this way is looked at
 * again when its window ends (throttle_until_ms). Called with ex->mu. */
static int bulk_may_start(tcp_exec_t *ex, rail_t *r) {
  if (!slot_free_bulk(ex, r)) return 0;
  if (ex->qos_bulk_conns <= 0 || r->bulk_busy < ex->qos_bulk_conns || !r->small_until_ms) return 1;
  uint64_t now = mono_ms();
  if (now >= r->small_until_ms) {
    r->small_until_ms = 0;
    return 1;
  }
  if (r->small_until_ms > ex->throttle_until_ms) ex->throttle_until_ms = r->small_until_ms;
  return 0;
}

/* The next chunk of queue `q` is a waiting READ (a run led by one carries waiting READs only). */
static int head_waits(const tent_chunk_queue_t *q);

/* May a small run start on `r` now? A free slot, and for waiting READs fewer than wait_conns of the
 * rail's connections carrying them: a connection parks them in order, so two keep the link busy
 * (one is answered while the next run crosses), and each more is one more TCP flow sharing the hop
 * (their standing queues made each hop of a pipeline chain trail its source by 40-100 ms instead
 * of 15-20: docs/benchmarks.md, "Burst"). Called with ex->mu. */
static int small_may_start(tcp_exec_t *ex, rail_t *r) {
  if (r->qs.len == 0 || !(slot_free_bulk(ex, r) || !r->express_busy)) return 0;
  return !head_waits(&r->qs) || r->wait_busy < ex->wait_conns;
}

static int bulk_run_may_start(tcp_exec_t *ex, rail_t *r) {
  return r->q.len > 0 && (!head_waits(&r->q) || r->wait_busy < ex->wait_conns) && bulk_may_start(ex, r);
}

static int rail_is_ready(tcp_exec_t *ex, rail_t *r) {
  if (r->peer->removed) return 0;
  return small_may_start(ex, r) || bulk_run_may_start(ex, r);
}

/* Small requests were just submitted on `r`: bulk is held back for the QoS window. ex->mu held. */
static void rail_note_small(tcp_exec_t *ex, rail_t *r, uint64_t now_ms) {
  if ((ex->qos_bulk_conns > 0 || ex->qos_bulk_nice > 0) && ex->qos_window_ms > 0) r->small_until_ms = now_ms + (uint64_t)ex->qos_window_ms;
}

static void ready_unlink(tcp_exec_t *ex, rail_t *r) {
  if (!r->ready) return;
  if (r->ready_prev) r->ready_prev->ready_next = r->ready_next;
  else ex->ready_head = r->ready_next;
  if (r->ready_next) r->ready_next->ready_prev = r->ready_prev;
  else ex->ready_tail = r->ready_prev;
  r->ready_prev = r->ready_next = NULL;
  r->ready = 0;
}

static void ready_append(tcp_exec_t *ex, rail_t *r) {
  r->ready_prev = ex->ready_tail;
  r->ready_next = NULL;
  if (ex->ready_tail) ex->ready_tail->ready_next = r;
  else ex->ready_head = r;
  ex->ready_tail = r;
  r->ready = 1;
}

static void rail_update_ready(tcp_exec_t *ex, rail_t *r) {
  int want = rail_is_ready(ex, r);
  if (want && !r->ready) ready_append(ex, r);
  else if (!want && r->ready) ready_unlink(ex, r);
}

/* ------------------------------------------------------------------ workers */

/* Account one finished chunk; reports the slice when it was its job's last chunk. */
static void finish_chunk(tcp_exec_t *ex, const tent_chunk_t *c, int status) {
  tent_job_t *j = c->job;
  int final;
  if (tent_job_chunk_done(j, status, &final)) {
    ex->host->complete(ex->host->ctx, &j->s, final);
    job_free(j);
  }
}

/* Fail every chunk of a queue taken off a rail (called without ex->mu) and free it. */
static void fail_queue(tcp_exec_t *ex, tent_chunk_queue_t *q, int status) {
  tent_chunk_t c;
  while (tent_cq_pop(q, &c) == 0) finish_chunk(ex, &c, status);
  tent_cq_free(q);
}

/* Take a rail's queued chunks out (O(1)), bulk and small; the caller fails them after dropping
 * ex->mu. */
static void rail_take_queues(tcp_exec_t *ex, rail_t *r, tent_chunk_queue_t out[2]) {
  out[0] = r->q;
  out[1] = r->qs;
  memset(&r->q, 0, sizeof r->q);
  memset(&r->qs, 0, sizeof r->qs);
  ready_unlink(ex, r);
}

static void rail_shutdown_slots(tcp_exec_t *ex, rail_t *r) {
  for (int k = 0; k < nslots(ex); k++)
    if (r->slot_fd[k] >= 0) shutdown(r->slot_fd[k], SHUT_RDWR);
}

static void rail_free(rail_t *r) {
  tent_cq_free(&r->q);
  tent_cq_free(&r->qs);
  for (int k = 0; k < r->nidle; k++) close(r->idle[k]);
  free(r->idle);
  free(r->idle_since);
  free(r->slot_fd);
  free(r->slot_poll);
}

static void peer_free(peer_t *pe) {
  for (int i = 0; i < pe->nrails; i++) rail_free(&pe->rails[i]);
  free(pe->rails);
  free(pe);
}

/* Drop one reference; a removed peer is freed with its last. Called with ex->mu. */
static void peer_unref_locked(tcp_exec_t *ex, peer_t *pe) {
  if (--pe->refs > 0) return;
  for (int i = 0; i < pe->nrails; i++) ready_unlink(ex, &pe->rails[i]);
  ex->allocated_peers--;
  peer_free(pe);
}

/* Claim a slot on `r` for a run of small (`small`) or bulk chunks: the express slot first for
 * small ones. -1 when none is free. Called with ex->mu. */
static int slot_claim(tcp_exec_t *ex, rail_t *r, int small, uint64_t now_ms) {
  int slot = -1;
  if (small && !r->express_busy) {
    slot = ex->conns_per_rail;
    r->express_busy = 1;
  } else if (slot_free_bulk(ex, r)) {
    slot = 0;
    while (r->slot_fd[slot] != SLOT_FREE) slot++; /* busy < conns_per_rail: a free bulk slot exists */
    r->busy++;
  }
  if (slot >= 0 && !small) {
    r->bulk_busy++;
    atomic_fetch_add(&ex->bulk_active, 1);
  }
  if (slot >= 0) {
    int fd = -1;
    uint64_t now = now_ms;
    while (r->nidle && fd < 0) { /* a pooled connection the server may have closed is dropped */
      r->nidle--;
      fd = r->idle[r->nidle];
      if (idle_fd_stale(ex, fd, r->idle_since[r->nidle], now)) {
        close(fd);
        fd = -1;
      }
    }
    r->slot_fd[slot] = fd;
    r->peer->refs++;
  }
  return slot;
}

/* Give back a slot claimed without a connection and never used. Called with ex->mu. */
static void slot_unclaim(tcp_exec_t *ex, rail_t *r, int slot) {
  r->slot_fd[slot] = SLOT_FREE;
  if (slot == ex->conns_per_rail) r->express_busy = 0;
  else r->busy--;
  peer_unref_locked(ex, r->peer); /* the peer is in the table: never the last reference */
}

/* Give a run's slot (and connection) back and report its chunks. Called without ex->mu. */
static void run_finish(tcp_exec_t *ex, pipe_run_t *pr, int broken) {
  rail_t *r = pr->r;
  peer_t *pe = r->peer;
  pthread_mutex_lock(&ex->mu);
  if (pr->fd >= 0) {
    if (broken || ex->stopping || pe->removed) close(pr->fd);
    else {
      /* a waiter's stamp from the end of its wait (at most microseconds old: never later than now,
       * so the connection only looks that much longer idle) spares a clock read per request */
      r->idle_since[r->nidle] = pr->done_ms ? pr->done_ms : mono_ms();
      r->idle[r->nidle++] = pr->fd;
    }
  }
  r->slot_fd[pr->slot] = SLOT_FREE;
  if (pr->slot == ex->conns_per_rail) r->express_busy = 0;
  else r->busy--;
  if (pr->waits) r->wait_busy--;
  if (!pr->small) {
    r->bulk_busy--;
    atomic_store(&ex->bulk_last_ms, mono_ms());
    atomic_fetch_sub(&ex->bulk_active, 1);
  }
  for (uint32_t i = pr->reported; i < pr->k; i++) {
    if (pr->status[i] == TENT_OK) {
      atomic_fetch_add(&r->bytes, pr->c[i].len);
      atomic_fetch_add(&r->slices, 1);
    } else {
      atomic_fetch_add(&r->errors, 1);
    }
    if (pr->status[i] != TENT_OK && ex->stopping && pr->status[i] > TENT_E_BOUNDS) pr->status[i] = TENT_E_CANCELLED;
  }
  if (!pe->removed) rail_update_ready(ex, r); /* a slot freed on this rail */
  peer_unref_locked(ex, pe);
  if (ex->ready_head) pthread_cond_signal(&ex->cv); /* work a worker can take now (nobody is woken for nothing) */
  pthread_mutex_unlock(&ex->mu);
  for (uint32_t i = pr->reported; i < pr->k; i++) run_chunk_done(ex, &pr->c[i], pr->status[i]);
}

/* Why a popped chunk must not run (its status), or TENT_OK when it should. `down`: the rail's
 * connects are failing. */
static int chunk_skip_status(tcp_exec_t *ex, const tent_chunk_t *c, int down) {
  if (atomic_load(&c->job->status) != TENT_OK) return TENT_OK + 1; /* an earlier chunk failed: skip, its status stands */
  if (ex->host->is_cancelled(ex->host->ctx, c->job->s.token)) return TENT_E_CANCELLED;
  if (c->len == 0) return TENT_OK + 1;
  if (down) return TENT_E_CONNECT;
  return TENT_OK;
}

/* Connect the run's slot if it has no connection yet, send and read the answers, give it back. */
static void run_exchange(tcp_exec_t *ex, pipe_run_t *pr) {
  rail_t *r = pr->r;
  peer_t *pe = r->peer;
  run_start(ex, pr, mono_ms()); /* in service from here: a connect that hangs is no progress either */
  if (pr->fd < 0) {
    int fd = rail_connect(ex, r);
    pthread_mutex_lock(&ex->mu);
    if (fd < 0) {
      r->down_until_ms = mono_ms() + (uint64_t)ex->connect_backoff_ms;
    } else {
      r->down_until_ms = 0;
      atomic_fetch_add(&r->connects, 1);
      if (ex->stopping || pe->removed) {
        close(fd);
        fd = -1;
      } else {
        r->slot_fd[pr->slot] = fd;
      }
    }
    pthread_mutex_unlock(&ex->mu);
    pr->fd = fd;
    if (fd < 0) {
      for (uint32_t i = 0; i < pr->k; i++) pr->status[i] = TENT_E_CONNECT;
      run_finish(ex, pr, 1);
      return;
    }
    pr->watch.last_ms = mono_ms(); /* connected: that was progress */
  }
  uint64_t stream = 0; /* a worker's earlier runs were answered: their pages are released */
  int rc = run_send(ex, pr, &stream);
  int broken = 1;
  if (rc != IO_OK)
    for (uint32_t i = 0; i < pr->k; i++) pr->status[i] = io_status(rc);
  else
    broken = run_recv(ex, pr);
  run_finish(ex, pr, broken);
}

/* A QoS window ended: every rail's readiness again (bulk held back may start now). ex->mu held. */
static void rails_recheck_locked(tcp_exec_t *ex) {
  for (size_t p = 0; p < ex->peers.cap; p++) {
    peer_t *pe = ex->peers.items[p];
    for (int i = 0; pe && i < pe->nrails; i++) rail_update_ready(ex, &pe->rails[i]);
  }
  if (ex->ready_head) pthread_cond_broadcast(&ex->cv);
}

static void *worker_main(void *arg) {
  tcp_exec_t *ex = arg;
  pthread_setname_np(pthread_self(), "tent-tcp-work");
  pipe_run_t *pr = malloc(sizeof *pr);
  tent_chunk_t skipped[PIPE_MAX];
  int skip_status[PIPE_MAX];
  if (!pr) {
    slog("worker: out of memory");
    return NULL;
  }
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    if (ex->rx_head) { /* responses of a run sent inline: read them before anything else */
      pipe_run_t *rx = ex->rx_head;
      ex->rx_head = rx->next;
      if (!ex->rx_head) ex->rx_tail = NULL;
      pthread_mutex_unlock(&ex->mu);
      if (ex->qos_bulk_nice) qos_thread_level(ex, 0); /* small requests' answers */
      run_finish(ex, rx, run_recv(ex, rx));
      run_put(ex, rx);
      pthread_mutex_lock(&ex->mu);
      continue;
    }
    if (ex->stopping) break;
    rail_t *r = ex->ready_head;
    if (!r && qos_thread_demoted()) { /* going idle (see qos_thread_demoted) */
      pthread_mutex_unlock(&ex->mu);
      qos_thread_level(ex, 0);
      pthread_mutex_lock(&ex->mu);
      continue;
    }
    if (!r && ex->throttle_until_ms) { /* bulk held back by the QoS window: look again when it ends */
      uint64_t now = mono_ms();
      if (now < ex->throttle_until_ms) {
        uint64_t ms = ex->throttle_until_ms - now;
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += (time_t)(ms / 1000);
        dl.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&ex->cv, &ex->mu, &dl);
        continue;
      }
      ex->throttle_until_ms = 0;
      rails_recheck_locked(ex);
      continue;
    }
    if (!r) {
      pthread_cond_wait(&ex->cv, &ex->mu);
      continue;
    }
    /* small chunks first; several of them pipelined on one connection, shared out over the
     * slots free for them */
    int small = small_may_start(ex, r);
    if (!small && !bulk_run_may_start(ex, r)) { /* nothing it may start now (a stale ready entry) */
      ready_unlink(ex, r);
      rail_update_ready(ex, r);
      continue;
    }
    tent_chunk_queue_t *q = small ? &r->qs : &r->q;
    int waits = head_waits(q);
    uint32_t want = 1;
    if (small) {
      int free_slots = (ex->conns_per_rail - r->busy) + !r->express_busy;
      if (waits && free_slots > ex->wait_conns - r->wait_busy) free_slots = ex->wait_conns - r->wait_busy;
      want = (uint32_t)((q->len + (size_t)free_slots - 1) / (size_t)free_slots);
      if (want > (uint32_t)ex->pipeline) want = (uint32_t)ex->pipeline;
    }
    int down = r->down_until_ms && mono_ms() < r->down_until_ms && r->nidle == 0;
    uint32_t nskip = 0;
    uint64_t bytes = 0;
    pr->k = 0;
    pr->reported = 0;
    while (pr->k < want && q->len > 0) {
      tent_chunk_t *head = &q->items[q->head];
      if (pr->k > 0 && bytes + head->len > ex->pipeline_bytes) break;
      if (chunk_waits(head) != waits) break; /* a run waits or not as a whole (wait_busy) */
      tent_chunk_t c;
      tent_cq_pop(q, &c);
      int st = chunk_skip_status(ex, &c, down);
      if (st != TENT_OK) {
        skipped[nskip] = c;
        skip_status[nskip++] = st == TENT_OK + 1 ? TENT_OK : st;
        if (st == TENT_E_CONNECT) atomic_fetch_add(&r->errors, 1);
        if (nskip == PIPE_MAX) break;
        continue;
      }
      bytes += c.len;
      pr->status[pr->k] = TENT_OK;
      pr->c[pr->k++] = c;
    }
    ready_unlink(ex, r); /* round robin: the rail goes to the back of the ready list (or leaves it) */
    if (pr->k > 0) {
      pr->r = r;
      pr->small = small;
      pr->waits = waits;
      if (waits) r->wait_busy++;
      pr->slot = slot_claim(ex, r, small, mono_ms());
      pr->fd = r->slot_fd[pr->slot];
    }
    int qos_level = ex->qos_bulk_nice && pr->k > 0 ? qos_bulk_level(ex->qos_bulk_nice, !small, mono_ms(), r->small_until_ms) : 0;
    rail_update_ready(ex, r);
    if (pr->k > 0 && (r->qs.len > 0 || r->q.len > 0)) pthread_cond_signal(&ex->cv); /* more for another worker */
    pthread_mutex_unlock(&ex->mu);
    if (ex->qos_bulk_nice && pr->k > 0) qos_thread_level(ex, qos_level);
    for (uint32_t i = 0; i < nskip; i++) finish_chunk(ex, &skipped[i], skip_status[i]);
    if (pr->k > 0) run_exchange(ex, pr);
    pthread_mutex_lock(&ex->mu);
  }
  pthread_mutex_unlock(&ex->mu);
  free(pr);
  return NULL;
}

/* ------------------------------------------------------------------ peers */

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
    r->peer = pe;
    r->local.sin_family = AF_INET;
    r->remote.sin_family = AF_INET;
    r->remote.sin_port = htons((uint16_t)remote_ports[i]);
    const char *lip = local_ips ? local_ips[i] : NULL;
    int bad = !remote_ips[i] || inet_pton(AF_INET, remote_ips[i], &r->remote.sin_addr) != 1 ||
              remote_ports[i] <= 0 || remote_ports[i] > 65535;
    if (!bad && lip && *lip) bad = inet_pton(AF_INET, lip, &r->local.sin_addr) != 1;
    r->idle = calloc((size_t)nslots(ex), sizeof(int));
    r->idle_since = calloc((size_t)nslots(ex), sizeof(uint64_t));
    r->slot_fd = calloc((size_t)nslots(ex), sizeof(int));
    r->slot_poll = calloc((size_t)nslots(ex), sizeof(tent_busy_poll_t));
    if (bad || !r->idle || !r->idle_since || !r->slot_fd || !r->slot_poll) {
      pe->nrails = i + 1;
      peer_free(pe);
      return bad ? -EINVAL : -ENOMEM;
    }
    for (int k = 0; k < nslots(ex); k++) {
      r->slot_fd[k] = SLOT_FREE;
      tent_busy_poll_init(&r->slot_poll[k], (uint32_t)ex->busy_poll_us * 1000u, ex->busy_poll_adaptive);
    }
    snprintf(r->name, sizeof r->name, "%s->%s:%d", (lip && *lip) ? lip : "*", remote_ips[i], remote_ports[i]);
  }
  pthread_mutex_lock(&ex->mu);
  uint64_t h = tent_ht_insert(&ex->peers, pe);
  if (!h || h > (uint64_t)INT64_MAX) { /* out of memory (or handles exhausted: never in practice) */
    if (h) tent_ht_take(&ex->peers, h);
    pthread_mutex_unlock(&ex->mu);
    peer_free(pe);
    return -ENOMEM;
  }
  pe->handle = h;
  pe->refs = 1; /* the table's */
  ex->live_peers++;
  ex->allocated_peers++;
  pthread_mutex_unlock(&ex->mu);
  return (int64_t)h;
}

/* Forget a peer: its handle stops resolving at once, queued chunks are handed back untouched
 * (TENT_E_REROUTED, retryable: the core may re-route them) before this returns, in-flight ones are cut short;
 * the peer is freed when the last of them returns. */
EXPORT void tcp_remove_peer(void *self, int64_t handle) {
  tcp_exec_t *ex = self;
  if (!ex) return;
  tent_chunk_queue_t queued[MAX_RAILS][2];
  pthread_mutex_lock(&ex->mu);
  peer_t *pe = tent_ht_take(&ex->peers, (uint64_t)handle);
  if (!pe) {
    pthread_mutex_unlock(&ex->mu);
    return;
  }
  pe->removed = 1;
  ex->live_peers--;
  int nrails = pe->nrails;
  for (int i = 0; i < nrails; i++) {
    rail_t *r = &pe->rails[i];
    rail_take_queues(ex, r, queued[i]);
    for (int k = 0; k < r->nidle; k++) close(r->idle[k]);
    r->nidle = 0;
    rail_shutdown_slots(ex, r);
  }
  peer_unref_locked(ex, pe); /* the table's reference: freed now unless chunks are in flight */
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  for (int i = 0; i < nrails; i++) { /* untouched: the core re-routes them */
    fail_queue(ex, &queued[i][0], TENT_E_REROUTED);
    fail_queue(ex, &queued[i][1], TENT_E_REROUTED);
  }
}

/* The core stopped trusting this rail: queued chunks are handed back at once (TENT_E_REROUTED,
 * retryable and untouched, so the core re-routes them). With `in_flight`, chunks being served are
 * cut short too (their connections shut down: they fail and are retried elsewhere) instead of
 * waiting out the progress timer; without it they finish or time out on their own (a rail that
 * merely looked stalled loses nothing). Returns the number of queued chunks handed back, or -EINVAL. */
EXPORT int tcp_abort_rail(void *self, int64_t handle, int rail, int in_flight) {
  tcp_exec_t *ex = self;
  if (!ex) return -EINVAL;
  pthread_mutex_lock(&ex->mu);
  peer_t *pe = tent_ht_get(&ex->peers, (uint64_t)handle);
  if (!pe || rail < 0 || rail >= pe->nrails) {
    pthread_mutex_unlock(&ex->mu);
    return -EINVAL;
  }
  rail_t *r = &pe->rails[rail];
  tent_chunk_queue_t q[2];
  rail_take_queues(ex, r, q);
  if (in_flight) rail_shutdown_slots(ex, r); /* the express slot's connection too */
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  int n = (int)(q[0].len + q[1].len);
  fail_queue(ex, &q[0], TENT_E_REROUTED); /* untouched: not an error of this rail */
  fail_queue(ex, &q[1], TENT_E_REROUTED);
  return n;
}

/* out[0..3] = bytes ok, chunks ok, errors, connects. Returns 0 or -EINVAL. */
EXPORT int tcp_get_rail_counters(void *self, int64_t handle, int rail, uint64_t *out, int nout) {
  tcp_exec_t *ex = self;
  if (!ex || !out) return -EINVAL;
  pthread_mutex_lock(&ex->mu);
  peer_t *pe = tent_ht_get(&ex->peers, (uint64_t)handle);
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

/* out[0..2] = peers in the table, peers not yet freed (removed ones still draining count),
 * handle-table capacity. */
EXPORT void tcp_peer_stats(void *self, uint64_t *out) {
  tcp_exec_t *ex = self;
  pthread_mutex_lock(&ex->mu);
  out[0] = ex->live_peers;
  out[1] = ex->allocated_peers;
  out[2] = ex->peers.cap;
  pthread_mutex_unlock(&ex->mu);
}

/* out[0..4] = server connections open, refused at the cap, refused by authentication, closed
 * idle, cut by an unregister deadline. */
/* out[0..7] = busy-poll outcomes: client waiters' waits, polls, hits, polls that lost their core,
 * then the same for server connections (waits after a small request). */
EXPORT void tcp_busy_poll_stats(void *self, uint64_t *out) {
  tcp_exec_t *ex = self;
  for (int side = 0; side < 2; side++)
    for (int k = 0; k < BP_N; k++) out[side * BP_N + k] = atomic_load(&ex->busy_poll[side][k]);
}

/* The policy of tent/busy_poll.h over a trace, for tests: wait i's bytes are there poll_ns[i] after
 * it begins if it polls (a poll during it loses its core iff lost[i]), sleep_ns[i] after it
 * begins if it sleeps (at once, or after a poll that ran out first); budget_out[i] = what wait i
 * polled. out_state = the final budget_ns, score, probe_gap, until_probe, poll_ns, sleep_ns. */
EXPORT void tcp_busy_poll_replay(uint32_t cap_ns, int adaptive, uint64_t n, const uint64_t *poll_ns,
                                 const uint64_t *sleep_ns, const uint8_t *lost, uint32_t *budget_out,
                                 uint32_t *out_state) {
  tent_busy_poll_t st;
  tent_busy_poll_init(&st, cap_ns, adaptive);
  for (uint64_t i = 0; i < n; i++) {
    uint32_t b = tent_busy_poll_begin(&st);
    int caught = b && poll_ns[i] <= b;
    uint64_t waited = caught ? poll_ns[i] : (b && poll_ns[i] > sleep_ns[i] ? poll_ns[i] : sleep_ns[i]);
    tent_busy_poll_end(&st, b, waited, waited, b && lost[i]);
    budget_out[i] = b;
  }
  uint32_t state[6] = {st.budget_ns, st.score, st.probe_gap, st.until_probe, st.poll_ns, st.sleep_ns};
  memcpy(out_state, state, sizeof state);
}

/* The QoS demotion policy (qos_bulk_level), for tests. */
EXPORT int tcp_qos_bulk_level(int knob, int bulk, uint64_t now_ms, uint64_t small_until_ms) {
  return qos_bulk_level(knob, bulk, now_ms, small_until_ms);
}

EXPORT int tcp_qos_bulk_nice(void *self) { return ((tcp_exec_t *)self)->qos_bulk_nice; }

EXPORT uint64_t tcp_qos_piece(uint64_t piece, uint64_t want) { return qos_piece_len((size_t)piece, (size_t)want); }

EXPORT void tcp_qos_stats(void *self, uint64_t out[1]) { out[0] = atomic_load(&((tcp_exec_t *)self)->qos_yields); }

/* The process advanced a word that parked READs may wait for: they look again now. Cheap when
 * none is parked (one atomic load). */
EXPORT void tcp_wait_doorbell(void *self) {
  tcp_exec_t *ex = self;
  if (!ex || atomic_load(&ex->parked_now) == 0) return;
  pthread_mutex_lock(&ex->wait_mu);
  ex->wait_seq++;
  pthread_cond_broadcast(&ex->wait_cv);
  pthread_mutex_unlock(&ex->wait_mu);
}

EXPORT void tcp_server_stats(void *self, uint64_t *out) {
  tcp_exec_t *ex = self;
  pthread_mutex_lock(&ex->srv_mu);
  out[0] = (uint64_t)ex->active_conns;
  pthread_mutex_unlock(&ex->srv_mu);
  out[1] = atomic_load(&ex->refused_conns);
  out[2] = atomic_load(&ex->auth_failures);
  out[3] = atomic_load(&ex->idle_closed);
  out[4] = atomic_load(&ex->cut_conns);
  out[5] = (uint64_t)atomic_load(&ex->parked_now);
  out[6] = atomic_load(&ex->waits_served);
  out[7] = atomic_load(&ex->waits_not_ready);
  out[8] = atomic_load(&ex->waits_refused);
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
  pthread_mutex_init(&ex->reg_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ex->cv, &ca); /* timed waits (the QoS window) on the monotonic clock */
  pthread_cond_init(&ex->reg_cv, &ca);
  pthread_cond_init(&ex->wait_cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&ex->wait_mu, NULL);
  pthread_mutex_init(&ex->srv_mu, NULL);
  atomic_store(&ex->next_reqid, 1);
  if (ex->qos_bulk_nice && !qos_may_demote(ex->qos_bulk_nice)) ex->qos_bulk_nice = 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  ex->max_pollers = cpus >= 4 ? (int)(cpus / 2) : 1;
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

/* The queue a slice's chunks go to: those of small requests to the small queue. */
static int is_small(const tent_slice_t *s) { return (s->attempt & TENT_HINT_SMALL) != 0; }

static tent_chunk_queue_t *job_queue(rail_t *r, const tent_slice_t *s) { return is_small(s) ? &r->qs : &r->q; }

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  tcp_exec_t *ex = self;
  if (!ex) return TENT_E_INTERNAL;
  if (n == 0) return TENT_OK;
  /* jobs are made outside the lock; the submit is all or nothing */
  tent_job_t *one_job[1];
  uint64_t one_plan[2];
  tent_job_t **jobs = n == 1 ? one_job : malloc(n * sizeof *jobs);
  uint64_t *plan = n == 1 ? one_plan : malloc(2 * (size_t)n * sizeof *plan); /* parts, per */
  int rc = jobs && plan ? TENT_OK : TENT_E_INTERNAL;
  uint32_t made = 0;
  for (; rc == TENT_OK && made < n; made++) {
    plan[2 * made] = tent_cq_parts(slices[made].length, ex->chunk, ex->max_parts, &plan[2 * made + 1]);
    jobs[made] = job_new(ex, &slices[made], (uint32_t)plan[2 * made]);
    if (!jobs[made]) rc = TENT_E_INTERNAL;
  }
  uint32_t gone = 0; /* slices naming a removed peer: reported unreachable after the lock */
  if (rc == TENT_OK) {
    pthread_mutex_lock(&ex->mu);
    if (ex->stopping) rc = TENT_E_CANCELLED;
    for (uint32_t i = 0; rc == TENT_OK && i < n; i++) {
      const tent_slice_t *s = &slices[i];
      peer_t *pe = tent_ht_get(&ex->peers, s->peer);
      if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE) rc = TENT_E_INTERNAL;
      else if (pe) rc = s->rail < (uint32_t)pe->nrails ? TENT_OK : TENT_E_INTERNAL;
      else if (tent_ht_was_issued(&ex->peers, s->peer)) plan[2 * i] = 0, gone++; /* 0 parts: gone */
      else rc = TENT_E_INTERNAL;
    }
    uint32_t pushed = 0;
    for (; rc == TENT_OK && pushed < n; pushed++) {
      if (plan[2 * pushed] == 0) continue;
      peer_t *pe = tent_ht_get(&ex->peers, slices[pushed].peer);
      rail_t *r = &pe->rails[slices[pushed].rail];
      tent_chunk_queue_t *q = job_queue(r, &slices[pushed]);
      if (tent_cq_reserve(q, plan[2 * pushed]) != 0) {
        rc = TENT_E_INTERNAL;
        while (pushed-- > 0) { /* take back what this submit queued, newest first */
          if (plan[2 * pushed] == 0) continue;
          peer_t *p2 = tent_ht_get(&ex->peers, slices[pushed].peer);
          job_queue(&p2->rails[slices[pushed].rail], &slices[pushed])->len -= plan[2 * pushed];
        }
        break;
      }
      tent_cq_push_job(q, jobs[pushed], plan[2 * pushed], plan[2 * pushed + 1]);
    }
    if (rc == TENT_OK) {
      uint64_t bulk = 0, small = 0; /* wake as many workers as can start at once, not all of them */
      for (uint32_t i = 0; i < n; i++) {
        if (!plan[2 * i]) continue;
        if (is_small(&slices[i])) small += plan[2 * i];
        else bulk += plan[2 * i];
      }
      for (uint32_t i = 0; i < n; i++) {
        if (!plan[2 * i]) continue;
        rail_t *r = &((peer_t *)tent_ht_get(&ex->peers, slices[i].peer))->rails[slices[i].rail];
        /* small requests submitted together with bulk ones (a bulk batch and its little
         * bookkeeping read) are part of that throughput work: they hold no bulk back */
        if (!bulk && is_small(&slices[i])) rail_note_small(ex, r, mono_ms());
        rail_update_ready(ex, r);
      }
      uint64_t wake = bulk + (small + (uint64_t)ex->pipeline - 1) / (uint64_t)ex->pipeline;
      if (wake >= (uint64_t)ex->nworkers) pthread_cond_broadcast(&ex->cv);
      else
        while (wake-- > 0) pthread_cond_signal(&ex->cv);
    }
    pthread_mutex_unlock(&ex->mu);
  }
  if (rc != TENT_OK) {
    for (uint32_t i = 0; i < made; i++) job_free(jobs[i]);
  } else if (gone) {
    for (uint32_t i = 0; i < n; i++) {
      if (plan[2 * i] == 0) {
        ex->host->complete(ex->host->ctx, &jobs[i]->s, TENT_E_REROUTED); /* peer forgotten: retryable */
        job_free(jobs[i]);
      }
    }
  }
  if (n != 1) {
    free(jobs);
    free(plan);
  }
  return rc;
}

#define INLINE_RUNS 4 /* runs one submit_inline sends at most */

/* Slices of small requests to one rail leave on the caller's thread when the rail has nothing queued and an
 * idle connection in a free slot: up to INLINE_RUNS pipelined runs are sent here, one sendmsg
 * each, and handed to a worker to read the answers. The rest is queued as submit() would. */
static int ex_submit_inline(void *self, const tent_slice_t *slices, uint32_t n) {
  tcp_exec_t *ex = self;
  if (!ex) return TENT_E_INTERNAL;
  if (n == 0) return TENT_OK;
  for (uint32_t i = 0; i < n; i++) /* one rail, whole small slices: anything else takes the queue */
    if ((ex->wait_read && tent_host_wait(ex->host, &slices[i])) || slices[i].peer != slices[0].peer || slices[i].rail != slices[0].rail || !is_small(&slices[i]) ||
        (ex->chunk && slices[i].length > ex->chunk) || (slices[i].opcode != TENT_OP_READ && slices[i].opcode != TENT_OP_WRITE))
      return ex_submit(self, slices, n);
  tent_job_t *one_job[1];
  tent_job_t **jobs = n == 1 ? one_job : malloc(n * sizeof *jobs);
  pipe_run_t *runs[INLINE_RUNS] = {0};
  int nruns = 0;
  int rc = jobs ? TENT_OK : TENT_E_INTERNAL;
  uint32_t made = 0;
  for (; rc == TENT_OK && made < n; made++)
    if (!(jobs[made] = job_new(ex, &slices[made], 1))) rc = TENT_E_INTERNAL;
  int gone = 0;
  /* one clock for the whole inline submit (a VM's clock read costs tens of ns): the QoS window, the
   * pooled connections' idle check, the runs' progress clocks and their send stamp. It is the
   * core's submit stamp (CLOCK_MONOTONIC, taken just before this call), so no clock is read here;
   * a connection pooled after it counts as just used (idle_fd_stale) */
  uint64_t t_ns = 0, now_ms = 0;
  if (rc == TENT_OK) {
    t_ns = slices[0].submit_ns ? slices[0].submit_ns : mono_ns();
    now_ms = t_ns / 1000000ull;
    pthread_mutex_lock(&ex->mu);
    peer_t *pe = tent_ht_get(&ex->peers, slices[0].peer);
    if (ex->stopping) rc = TENT_E_CANCELLED;
    else if (!pe && tent_ht_was_issued(&ex->peers, slices[0].peer)) gone = 1;
    else if (!pe || slices[0].rail >= (uint32_t)pe->nrails) rc = TENT_E_INTERNAL;
    rail_t *r = pe && rc == TENT_OK && !gone ? &pe->rails[slices[0].rail] : NULL;
    if (r && tent_cq_reserve(&r->qs, n) != 0) rc = TENT_E_INTERNAL; /* room for all: nothing can fail below */
    if (r && rc == TENT_OK) {
      uint32_t i = 0;
      rail_note_small(ex, r, now_ms);
      /* a batch is shared out over the connections it can leave on now (as workers share queued
       * small chunks over the free slots): the target serves each connection on its own thread,
       * so the requests of one batch are served in parallel rather than one after another */
      int free_slots = (ex->conns_per_rail - r->busy) + !r->express_busy;
      int can = r->nidle < free_slots ? r->nidle : free_slots;
      if (can > INLINE_RUNS) can = INLINE_RUNS;
      uint32_t per = can > 1 ? (n + (uint32_t)can - 1) / (uint32_t)can : n;
      if (per > (uint32_t)ex->pipeline) per = (uint32_t)ex->pipeline;
      /* send now only when no small request waits before these on the rail (they would overtake
       * it); queued bulk chunks they may overtake: small requests are served first anyway */
      while (i < n && nruns < INLINE_RUNS && r->qs.len == 0 && r->nidle > 0 &&
             (slot_free_bulk(ex, r) || !r->express_busy)) {
        /* the run struct is taken here, under the lock already held, only when a run leaves: a
         * submit that queues (the rail busy: requests queued back to back) takes no run, and
         * one that sends takes the lock once rather than once more per run (run_get, run_put) */
        pipe_run_t *pr = run_take_locked(ex);
        if (!pr) break; /* out of memory: the rest is queued */
        runs[nruns] = pr;
        pr->r = r;
        pr->small = 1;
        pr->waits = 0; /* waiting READs never go inline */
        pr->slot = slot_claim(ex, r, 1, now_ms);
        pr->fd = r->slot_fd[pr->slot];
        if (pr->fd < 0) { /* the pooled connections were stale: a worker connects (never this thread) */
          slot_unclaim(ex, r, pr->slot);
          runs[nruns] = NULL;
          run_give_locked(ex, pr);
          break;
        }
        pr->k = 0;
        pr->reported = 0;
        pr->token = slices[0].token;
        uint64_t bytes = 0;
        while (i < n && pr->k < per && (pr->k == 0 || bytes + slices[i].length <= ex->pipeline_bytes)) {
          bytes += slices[i].length;
          pr->status[pr->k] = TENT_OK;
          pr->c[pr->k++] = (tent_chunk_t){jobs[i], 0, slices[i].length};
          i++;
        }
        nruns++;
      }
      for (; i < n; i++) tent_cq_push_job(&r->qs, jobs[i], 1, slices[i].length);
      rail_update_ready(ex, r);
      if (r->ready) pthread_cond_signal(&ex->cv);
    }
    pthread_mutex_unlock(&ex->mu);
  }
  if (rc != TENT_OK || gone) { /* no run was taken */
    for (uint32_t i = 0; i < made; i++) {
      if (rc == TENT_OK) ex->host->complete(ex->host->ctx, &jobs[i]->s, TENT_E_REROUTED); /* peer forgotten: retryable */
      job_free(jobs[i]);
    }
    if (n != 1) free(jobs);
    return rc;
  }
  if (n != 1) free(jobs);
  /* send on this thread; the waiter reads the answers through progress() (or a worker, after
   * the hand-off): nobody is woken here */
  uint64_t stream = 0; /* the runs leave back to back from this thread */
  for (int k = 0; k < nruns; k++) {
    pipe_run_t *pr = runs[k];
    run_start(ex, pr, now_ms);
    pr->sent_ns = ex->busy_poll_us ? t_ns : 0;
    pr->send_rc = run_send(ex, pr, &stream);
    if (pr->send_rc != IO_OK) {
      for (uint32_t i = 0; i < pr->k; i++) pr->status[i] = io_status(pr->send_rc);
      run_finish(ex, pr, 1);
      run_put(ex, pr);
      continue;
    }
    pthread_mutex_lock(&ex->mu);
    pr->next = NULL;
    if (ex->rx_tail) ex->rx_tail->next = pr;
    else ex->rx_head = pr;
    ex->rx_tail = pr;
    pthread_mutex_unlock(&ex->mu);
  }
  return TENT_OK;
}

/* Read the answers of a run of batch `token` sent inline on the calling (waiting) thread, waiting
 * up to budget_ns for them to arrive; budget_ns < 0: wake workers to read them instead. */
static int ex_progress(void *self, uint64_t token, int64_t budget_ns) {
  tcp_exec_t *ex = self;
  if (!ex) return 0;
  pthread_mutex_lock(&ex->mu);
  pipe_run_t *prev = NULL, *pr = ex->rx_head;
  while (pr && pr->token != token) {
    prev = pr;
    pr = pr->next;
  }
  if (!pr || budget_ns < 0) {
    int n = 0;
    for (pipe_run_t *q = pr; q && n < ex->nworkers; q = q->next) n += q->token == token;
    while (n-- > 0) pthread_cond_signal(&ex->cv);
    pthread_mutex_unlock(&ex->mu);
    return 0;
  }
  if (prev) prev->next = pr->next; /* claimed: no worker takes it now */
  else ex->rx_head = pr->next;
  if (ex->rx_tail == pr) ex->rx_tail = prev;
  pthread_mutex_unlock(&ex->mu);
  /* the run holds its slot: that slot's policy is this thread's alone until the run is done */
  tent_busy_poll_t *bp = &pr->r->slot_poll[pr->slot];
  uint64_t t0 = mono_ns();
  uint32_t spin = busy_poll_claim(ex, bp, t0);
  if (spin && (int64_t)spin > budget_ns) spin = budget_ns > 0 ? (uint32_t)budget_ns : 1;
  int n = 1, lost = 0, err = 0, broken = -1;
  int hit = spin_readable(pr->fd, spin, &lost);
  uint64_t polled = hit ? mono_ns() : 0;
  if (budget_ns >= (int64_t)RX_TICK_MS * 1000000 && ex->tick_ms >= RX_TICK_MS) {
    /* read the answers now, sleeping in their first receive if they are not in yet (run_recv_head),
     * not in a ppoll before it: the receive after the ppoll is a system call per request the bare
     * exchange lacks */
    pr->hold_ns = t0 + (uint64_t)budget_ns;
    pr->first_ns = 0;
    broken = run_recv(ex, pr);
    pr->hold_ns = 0;
    n = broken != IO_NOT_YET;
  } else if (!hit) {
    struct pollfd p = {.fd = pr->fd, .events = POLLIN};
    struct timespec ts = {.tv_sec = budget_ns / 1000000000, .tv_nsec = budget_ns % 1000000000};
    n = ppoll(&p, 1, &ts, NULL);
    err = errno;
  }
  /* The wait ended when the poll saw the answer's bytes, or else when they came (the first receive
   * returned with them). The exchange's cycle, which the policy compares between polled and slept
   * waits, ends when the first receive returned for both (its copy in both), so they compare alike. */
  uint64_t first = n > 0 ? pr->first_ns : 0, end = first ? first : mono_ns(), now = polled ? polled : end;
  pr->first_ns = 0;
  busy_poll_done(ex, 0, bp, spin, now - t0, pr->sent_ns && pr->sent_ns <= t0 ? end - pr->sent_ns : end - t0, lost);
  pr->sent_ns = 0; /* a later step of the same wait compares its own part */
  if (n == 0 || (n < 0 && err == EINTR)) { /* not yet: give it back */
    pthread_mutex_lock(&ex->mu);
    pr->next = ex->rx_head;
    ex->rx_head = pr;
    if (!ex->rx_tail) ex->rx_tail = pr;
    pthread_mutex_unlock(&ex->mu);
    return 0;
  }
  if (broken < 0) broken = run_recv(ex, pr); /* answers arriving (or the connection broke): read them here */
  pr->done_ms = end / 1000000ull;
  run_finish(ex, pr, broken);
  run_put(ex, pr);
  return 1;
}

static void ex_destroy(void *self) {
  tcp_exec_t *ex = self;
  if (!ex) return;
  /* 1. stop: wake workers, pollers, and everything blocked in socket I/O */
  pthread_mutex_lock(&ex->mu);
  ex->stopping = 1;
  for (size_t p = 0; p < ex->peers.cap; p++) {
    peer_t *pe = ex->peers.items[p];
    for (int i = 0; pe && i < pe->nrails; i++) rail_shutdown_slots(ex, &pe->rails[i]);
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

  /* 2. join: in-flight chunks are reported (removed peers freed) before their workers exit */
  for (int i = 0; i < ex->nworkers; i++) pthread_join(ex->workers[i], NULL);
  for (listener_t *l = ex->listeners; l; l = l->next) pthread_join(l->thread, NULL);
  /* accept threads are gone: the sconn list is stable now */
  for (sconn_t *c = ex->sconns; c; c = c->next) pthread_join(c->thread, NULL);

  /* 3. fail what is still queued (each slice reported exactly once), free */
  for (size_t p = 0; p < ex->peers.cap; p++) {
    peer_t *pe = ex->peers.items[p];
    if (!pe) continue;
    for (int i = 0; i < pe->nrails; i++) {
      tent_chunk_queue_t q[2];
      rail_take_queues(ex, &pe->rails[i], q);
      fail_queue(ex, &q[0], TENT_E_CANCELLED);
      fail_queue(ex, &q[1], TENT_E_CANCELLED);
    }
    peer_free(pe);
  }
  tent_ht_free(&ex->peers);
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
  for (size_t i = 0; i < ex->nregions; i++) free(ex->regions[i]);
  free(ex->regions);
  while (ex->spare_runs) {
    pipe_run_t *pr = ex->spare_runs;
    ex->spare_runs = pr->next;
    free(pr);
  }
  free(ex->workers);
  if (ex->wake_fd >= 0) close(ex->wake_fd);
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv);
  pthread_mutex_destroy(&ex->reg_mu);
  pthread_cond_destroy(&ex->reg_cv);
  pthread_mutex_destroy(&ex->wait_mu);
  pthread_cond_destroy(&ex->wait_cv);
  pthread_mutex_destroy(&ex->srv_mu);
  memset(ex->auth_key, 0, sizeof ex->auth_key);
  free(ex);
}

static const tent_executor_ops_t g_ops = {
    .abi_version = TENT_EXECUTOR_ABI_VERSION,
    .struct_size = sizeof(tent_executor_ops_t),
    .name = "tcp",
    .create = ex_create,
    .destroy = ex_destroy,
    .submit = ex_submit,
    .submit_inline = ex_submit_inline,
    .progress = ex_progress,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }
