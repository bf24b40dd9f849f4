/*
 * tent_shm._executor: same-host slice executor for tent_core (executor ABI v1).
 *
 * Two data paths, chosen per peer:
 *   - CMA:   process_vm_readv / process_vm_writev against the peer's pid.
 *   - memfd: the peer's memfd-backed buffers are mmap'ed (MAP_SHARED) into this
 *            process by the Python side; the executor translates remote addresses
 *            through a per-peer mapping table and memcpy's.
 *
 * Worker threads (config `threads`, default 2) block on a condition variable and take
 * work items from a FIFO. A slice longer than `chunk` bytes (default 1 MiB) is split
 * into chunk-sized work items so every worker copies (a 4 MiB request uses both cores); the
 * last finished chunk reports the slice through host->complete exactly once, with the first
 * error seen.
 *
 * submit_inline (executor ABI, optional entry): the calling thread copies itself. One slice of
 * at most one chunk is copied at once, with no queue, no worker and no wake-up: the slice is
 * reported before the call returns. Several slices (or a longer one) are queued, one worker is
 * woken, and the caller works through the queue alongside it until it has copied `inline_budget`
 * bytes (default 4 MiB) or nothing is left, then polls briefly for the workers' last pieces (only
 * when at most one per worker is left: a larger batch is left to the workers at once, so a caller
 * that pipelines batches queues the next before this one drained), so a request of a few MiB is
 * copied by two threads and usually reported before the call returns.
 *
 * Digest (tent/digest.h): when the caller of submit_inline armed a digest (host->digest), the
 * caller copies every slice of that call itself, whole and in order, and a memfd READ that
 * continues the digest's stream is copied in 64 KiB runs, each folded into the digest right after
 * it landed (still in this core's cache). CMA copies are not folded (process_vm_readv may stop
 * half way): the caller folds those bytes itself.
 *
 * A CMA peer's pidfd is polled before copies (a pid the peer no longer owns must never be
 * written), at most once per PID_CHECK_NS per peer: a pid cannot be reused faster than the
 * kernel cycles through the whole pid space, which takes far longer than that.
 *
 * Private (non-ABI) exports used by tent_shm.plugin through ctypes:
 *   uint64_t tent_shm_peer_add(void *ex, int32_t pid, int32_t mode);
 *   int32_t  tent_shm_peer_remove(void *ex, uint64_t peer);
 *   int32_t  tent_shm_peer_set_dead(void *ex, uint64_t peer);
 *   int32_t  tent_shm_map_add(void *ex, uint64_t peer, uint64_t remote_base, uint64_t length,
 *                             uint64_t local_addr, int32_t writable);
 *   int32_t  tent_shm_map_remove(void *ex, uint64_t peer, uint64_t remote_base);
 *   int32_t  tent_shm_cma_probe(int32_t pid, uint64_t remote_addr, uint64_t local_addr, uint64_t length);
 *   int64_t  tent_shm_mmap_fd(int32_t fd, uint64_t offset, uint64_t length, int32_t writable, int32_t populate);
 *   int32_t  tent_shm_munmap(uint64_t addr, uint64_t length);
 *   uint32_t tent_shm_threads(void *ex);
 *   uint64_t tent_shm_chunk(void *ex);
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tent/chunk_queue.h"
#include "tent/cpu_relax.h"
#include "tent/config_kv.h"
#include "tent/digest.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"
#include "tent/reader_lock.h"

#define EXPORT __attribute__((visibility("default")))

#define SHM_MODE_CMA 0
#define SHM_MODE_MEMFD 1
#define MAX_THREADS 64
#define PID_CHECK_NS 1000000ull /* 1 ms */

/* ---------------------------------------------------------------- peers */
typedef struct mapping {
  uint64_t rbase, len, laddr; /* laddr == 0: a known remote buffer this path cannot reach */
  int writable;
} mapping_t;

typedef struct peer {
  atomic_int refs;
  uint64_t handle;
  pid_t pid;
  int mode;
  int pidfd;
  atomic_ullong alive_until_ns; /* the pidfd said "running" recently enough to skip polling it */
  atomic_int dead;
  int removed;     /* under the executor's copy_lock (write) */
  mapping_t *maps; /* sorted by rbase, non-overlapping; changed under copy_lock (write) */
  size_t nmaps, cap;
} peer_t;

/* ---------------------------------------------------------------- work */
typedef tent_job_t job_t;
typedef tent_chunk_t work_t;

typedef struct executor {
  const tent_host_api_t *host;
  uint32_t nthreads;
  uint64_t chunk;
  uint64_t inline_budget; /* bytes the caller of submit_inline copies at most (beyond its first piece) */
  pthread_t threads[MAX_THREADS];
  uint32_t started;

  pthread_mutex_t mu; /* queue */
  pthread_cond_t cv;
  tent_chunk_queue_t q;
  int stop;

  /* Copies hold copy_lock's read side from the peer lookup to the end of the copy: the peer table
   * and every peer's mappings change only under its write side (peer and mapping changes are
   * rare, copies are not), so a copy costs two locked instructions of locking in all */
  tent_reader_lock_t copy_lock;
  pthread_mutex_t peers_mu; /* the table for the control calls (with copy_lock's write side to change it) */
  tent_handle_table_t peers;
} executor_t;

static void peer_unref(peer_t *p) {
  if (atomic_fetch_sub(&p->refs, 1) == 1) {
    if (p->pidfd >= 0) close(p->pidfd);
    free(p->maps);
    free(p);
  }
}

static peer_t *peer_get(executor_t *ex, uint64_t h) {
  pthread_mutex_lock(&ex->peers_mu);
  peer_t *p = tent_ht_get(&ex->peers, h);
  if (p) atomic_fetch_add(&p->refs, 1);
  pthread_mutex_unlock(&ex->peers_mu);
  return p;
}

static inline uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int pidfd_exited(int pidfd) {
  if (pidfd < 0) return 0;
  struct pollfd pf = {.fd = pidfd, .events = POLLIN};
  return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP));
}

/* The peer process is gone (remembered); polls its pidfd at most once per PID_CHECK_NS. `now`:
 * the caller's fresh clock reading, or 0 to read it here. */
static int peer_gone(peer_t *p, uint64_t now) {
  if (atomic_load_explicit(&p->dead, memory_order_relaxed)) return 1;
  if (p->pidfd < 0) return 0;
  if (!now) now = mono_ns();
  if (now < atomic_load_explicit(&p->alive_until_ns, memory_order_relaxed)) return 0;
  if (pidfd_exited(p->pidfd)) {
    atomic_store(&p->dead, 1);
    return 1;
  }
  atomic_store_explicit(&p->alive_until_ns, now + PID_CHECK_NS, memory_order_relaxed);
  return 0;
}

/* mapping lookup: the mapping containing [addr, addr+len), or NULL */
static const mapping_t *map_find(const peer_t *p, uint64_t addr, uint64_t len) {
  size_t lo = 0, hi = p->nmaps;
  while (lo < hi) { /* last mapping with rbase <= addr */
    size_t mid = (lo + hi) / 2;
    if (p->maps[mid].rbase <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return NULL;
  const mapping_t *m = &p->maps[lo - 1];
  if (addr - m->rbase > m->len) return NULL;
  if (len > m->len - (addr - m->rbase)) return NULL;
  return m;
}

/* ---------------------------------------------------------------- copies */
static int errno_status(int e) {
  switch (e) {
    case ESRCH:
      return TENT_E_IO; /* peer gone */
    case EFAULT:
    case ENOMEM: /* remote range not mapped */
      return TENT_E_BOUNDS;
    case EPERM:
    case EACCES:
      return TENT_E_CONNECT; /* ptrace policy forbids CMA: another path (memfd, tcp) may work */
    default:
      return TENT_E_INTERNAL;
  }
}

static int cma_copy(pid_t pid, uint32_t op, uint64_t local, uint64_t remote, uint64_t len) {
  while (len > 0) {
    struct iovec l = {(void *)(uintptr_t)local, (size_t)len};
    struct iovec r = {(void *)(uintptr_t)remote, (size_t)len};
    ssize_t n = op == TENT_OP_READ ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno);
    }
    if (n == 0) return TENT_E_BOUNDS;
    local += (uint64_t)n;
    remote += (uint64_t)n;
    len -= (uint64_t)n;
  }
  return TENT_OK;
}

/* `now`: a clock reading taken just before (the inline path: the slice's submit stamp), or 0.
 * `d`: the caller's armed digest (submit_inline on the caller's own slices only), or NULL. */
static int run_work(executor_t *ex, const work_t *w, uint64_t now, tent_digest_t *d) {
  const tent_slice_t *s = &w->job->s;
  if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE) return TENT_E_PROTOCOL;
  if (s->length == 0) return TENT_OK;
  if (s->remote_addr + s->length < s->remote_addr) return TENT_E_BOUNDS;
  tent_rl_read_lock(&ex->copy_lock);
  peer_t *p = tent_ht_get(&ex->peers, s->peer);
  int st;
  if (!p) {
    st = TENT_E_CONNECT;
  } else if (peer_gone(p, now)) {
    st = TENT_E_IO;
  } else if (p->mode == SHM_MODE_CMA) {
    st = cma_copy(p->pid, s->opcode, s->local_addr + w->off, s->remote_addr + w->off, w->len);
  } else {
    const mapping_t *m = p->removed ? NULL : map_find(p, s->remote_addr, s->length);
    if (p->removed) {
      st = TENT_E_IO;
    } else if (!m) {
      st = TENT_E_BOUNDS;
    } else if (m->laddr == 0) {
      st = TENT_E_CONNECT; /* registered remotely but not memfd-backed: another transport */
    } else if (s->opcode == TENT_OP_WRITE && !m->writable) {
      st = TENT_E_PERMISSION;
    } else {
      char *mapped = (char *)(uintptr_t)(m->laddr + (s->remote_addr - m->rbase) + w->off);
      char *local = (char *)(uintptr_t)(s->local_addr + w->off);
      if (s->opcode == TENT_OP_READ)
        tent_digest_copy(d, local, mapped, w->len); /* d NULL, or not this stream's next bytes: memcpy */
      else
        memcpy(mapped, local, w->len);
      st = TENT_OK;
    }
  }
  tent_rl_read_unlock(&ex->copy_lock);
  return st;
}

static void finish_work(executor_t *ex, work_t *w, int st) {
  job_t *j = w->job;
  int final;
  if (tent_job_chunk_done(j, st, &final)) {
    ex->host->complete(ex->host->ctx, &j->s, final);
    free(j);
  }
}

static void process(executor_t *ex, work_t *w) {
  int st;
  if (atomic_load(&w->job->status) != TENT_OK) {
    st = TENT_OK; /* an earlier chunk failed: skip the copy, keep its status */
  } else if (ex->host->is_cancelled(ex->host->ctx, w->job->s.token)) {
    st = TENT_E_CANCELLED;
  } else {
    st = run_work(ex, w, 0, NULL);
  }
  finish_work(ex, w, st);
}

/* Take one queued chunk and run it on the calling thread; its size in *copied. 0 if the queue
 * was empty. */
static int help_one(executor_t *ex, uint64_t *copied) {
  work_t w;
  pthread_mutex_lock(&ex->mu);
  int got = !ex->stop && tent_cq_pop(&ex->q, &w) == 0;
  pthread_mutex_unlock(&ex->mu);
  if (!got) return 0;
  *copied = w.len;
  process(ex, &w);
  return 1;
}

static void *worker_main(void *arg) {
  executor_t *ex = arg;
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    while (!ex->stop && ex->q.len == 0) pthread_cond_wait(&ex->cv, &ex->mu);
    work_t w;
    if (ex->stop || tent_cq_pop(&ex->q, &w) != 0) break;
    int more = ex->q.len > 0;
    pthread_mutex_unlock(&ex->mu);
    if (more) pthread_cond_signal(&ex->cv); /* hand the rest to an idle worker */
    process(ex, &w);
    pthread_mutex_lock(&ex->mu);
  }
  pthread_mutex_unlock(&ex->mu);
  return NULL;
}

/* ---------------------------------------------------------------- ABI */
static void parse_config(executor_t *ex, const char *cfg) {
  ex->nthreads = 2;
  ex->chunk = 1u << 20;
  ex->inline_budget = 4u << 20;
  char k[64], v[256];
  for (const char *c = cfg; tent_config_next(&c, k, sizeof k, v, sizeof v);) {
    if (!strcmp(k, "threads")) {
      long t = strtol(v, NULL, 10);
      ex->nthreads = t < 1 ? 1 : (t > MAX_THREADS ? MAX_THREADS : (uint32_t)t);
    } else if (!strcmp(k, "chunk")) {
      ex->chunk = strtoull(v, NULL, 10);
    } else if (!strcmp(k, "inline_budget")) {
      ex->inline_budget = strtoull(v, NULL, 10);
    }
  }
}

static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    snprintf(err, errlen, "tent_shm: host API version mismatch");
    return NULL;
  }
  executor_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    snprintf(err, errlen, "tent_shm: out of memory");
    return NULL;
  }
  ex->host = host;
  parse_config(ex, config);
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->cv, NULL);
  pthread_mutex_init(&ex->peers_mu, NULL);
  tent_rl_init(&ex->copy_lock);
  for (uint32_t i = 0; i < ex->nthreads; i++) {
    int rc = pthread_create(&ex->threads[i], NULL, worker_main, ex);
    if (rc) {
      snprintf(err, errlen, "tent_shm: pthread_create: %s", strerror(rc));
      ex_destroy(ex);
      return NULL;
    }
    ex->started++;
  }
  return ex;
}

static void ex_destroy(void *self) {
  executor_t *ex = self;
  if (!ex) return;
  pthread_mutex_lock(&ex->mu);
  ex->stop = 1;
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  for (uint32_t i = 0; i < ex->started; i++) pthread_join(ex->threads[i], NULL);
  /* every queued slice is still reported exactly once */
  work_t w;
  while (tent_cq_pop(&ex->q, &w) == 0) finish_work(ex, &w, TENT_E_CANCELLED);
  tent_cq_free(&ex->q);
  for (size_t i = 0; i < ex->peers.cap; i++)
    if (ex->peers.items[i]) peer_unref(ex->peers.items[i]);
  tent_ht_free(&ex->peers);
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv);
  pthread_mutex_destroy(&ex->peers_mu);
  tent_rl_destroy(&ex->copy_lock);
  free(ex);
}

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  /* one worker gains nothing from cutting; more share a slice in page-aligned pieces */
  return tent_cq_submit(&ex->q, &ex->mu, &ex->cv, &ex->stop, slices, n, ex->nthreads > 1 ? ex->chunk : 0, 65536);
}

/* How long the caller of submit_inline waits, polling, for the workers to finish the other pieces
 * of what it queued, once the queue is empty: about what one 1 MiB piece takes on a slow core.
 * Polling keeps the completion off the workers' wake-up of a sleeping waiter (tens of
 * microseconds on small VMs); past it the caller leaves, and the last piece reports the slice. */
#define HOLD_POLL_NS 1000000ull /* 1 ms */
#define HOLD_YIELD_NS 50000ull  /* after this much polling, poll with sched_yield */

/* The caller copies: one piece at once (reported before return, nothing queued, nobody woken).
 * More pieces are queued for the workers (one woken, it wakes the next) with one extra count per
 * job, the caller's hold; the caller copies alongside the workers until it has done
 * inline_budget bytes or the queue is empty, then polls (bounded by HOLD_POLL_NS) until the
 * workers finished the other pieces of its jobs and lets go of its hold: whoever finishes a job
 * last, caller or worker, reports it, exactly once, with the first error any piece saw. */
static int ex_submit_inline(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  if (n == 0) return TENT_OK;
  tent_digest_t *d = tent_host_digest(ex->host, &slices[0]);
  if (d || (n == 1 && (ex->chunk == 0 || slices[0].length <= ex->chunk))) {
    /* one piece, or the caller's digested stream: every slice copied here, whole, in order,
     * each reported before return (a digest folds in stream order; the caller's own threads,
     * one per stream, are the parallelism then) */
    for (uint32_t i = 0; i < n; i++) {
      tent_job_t j; /* reported below, never queued: it can live on this stack */
      j.s = slices[i];
      atomic_init(&j.remaining, 1);
      atomic_init(&j.status, TENT_OK);
      work_t w = {&j, 0, j.s.length};
      tent_digest_t *di = i == 0 ? d : tent_host_digest(ex->host, &j.s);
      int st = ex->host->is_cancelled(ex->host->ctx, j.s.token) ? TENT_E_CANCELLED : run_work(ex, &w, j.s.submit_ns, di);
      ex->host->complete(ex->host->ctx, &j.s, st);
    }
    return TENT_OK;
  }
  job_t *few[8], **jobs = n <= 8 ? few : malloc(n * sizeof *jobs);
  uint64_t *plan = malloc(2 * (size_t)n * sizeof *plan); /* parts, per */
  size_t total = 0;
  uint32_t made = 0;
  int rc = jobs && plan ? TENT_OK : TENT_E_INTERNAL;
  for (; rc == TENT_OK && made < n; made++) {
    plan[2 * made] = tent_cq_parts(slices[made].length, ex->chunk, 65536, &plan[2 * made + 1]);
    total += plan[2 * made];
    jobs[made] = tent_job_new(&slices[made], (uint32_t)plan[2 * made] + 1); /* + the caller's hold */
    if (!jobs[made]) rc = TENT_E_INTERNAL;
  }
  if (rc == TENT_OK) {
    pthread_mutex_lock(&ex->mu);
    if (ex->stop || tent_cq_reserve(&ex->q, total) != 0) {
      rc = TENT_E_INTERNAL;
    } else {
      for (uint32_t i = 0; i < n; i++) tent_cq_push_job(&ex->q, jobs[i], plan[2 * i], plan[2 * i + 1]);
      pthread_cond_signal(&ex->cv);
    }
    pthread_mutex_unlock(&ex->mu);
  }
  free(plan);
  if (rc != TENT_OK) { /* nothing queued, nothing reported: the core finalizes the slices */
    if (jobs)
      for (uint32_t i = 0; i < made; i++) free(jobs[i]);
    if (jobs != few) free(jobs);
    return rc;
  }
  uint64_t done = 0, c = 0;
  while (done < ex->inline_budget && help_one(ex, &c)) done += c;
  /* Hold only for the workers' last pieces (at most one per worker left of these jobs). With more
   * left, the workers are still working through the queue: a caller that pipelines batches (a
   * window of READs) would otherwise spin here for each of them, taking a core from the workers,
   * and submit its next batch only once this one had drained, leaving them idle in between
   * (refhub's 16 MiB batches: ~30% more CPU per GiB than one batch). It leaves at once instead;
   * the last piece reports each job. */
  uint64_t left = 0;
  for (uint32_t i = 0; i < n; i++) left += atomic_load(&jobs[i]->remaining) - 1;
  uint64_t until = left <= ex->nthreads ? mono_ns() + HOLD_POLL_NS : 0;
  for (uint32_t i = 0; i < n; i++) {
    job_t *j = jobs[i];
    while (atomic_load(&j->remaining) > 1) {
      if (done < ex->inline_budget && help_one(ex, &c)) {
        done += c;
        continue;
      }
      uint64_t now = mono_ns();
      if (now >= until) break;
      if (now + HOLD_POLL_NS - until < HOLD_YIELD_NS)
        tent_cpu_relax();
      else
        sched_yield(); /* a worker waiting for this core (a loaded machine) runs first */
    }
    int final;
    if (tent_job_chunk_done(j, TENT_OK, &final)) { /* the hold was the last: the caller reports */
      ex->host->complete(ex->host->ctx, &j->s, final);
      free(j);
    }
  }
  if (jobs != few) free(jobs);
  return TENT_OK;
}

static const tent_executor_ops_t g_ops = {
    TENT_EXECUTOR_ABI_VERSION, sizeof(tent_executor_ops_t), "shm", ex_create, ex_destroy, ex_submit, ex_submit_inline,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }

/* ---------------------------------------------------------------- private API */
EXPORT uint64_t tent_shm_peer_add(void *self, int32_t pid, int32_t mode) {
  executor_t *ex = self;
  if (!ex || (mode != SHM_MODE_CMA && mode != SHM_MODE_MEMFD)) return 0;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return 0;
  atomic_init(&p->refs, 1);
  p->pid = pid;
  p->mode = mode;
  p->pidfd = -1;
#ifdef SYS_pidfd_open
  if (pid > 0) p->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
  if (p->pidfd < 0) p->pidfd = -1;
#endif

  tent_rl_write_lock(&ex->copy_lock);
  pthread_mutex_lock(&ex->peers_mu);
  uint64_t h = tent_ht_insert(&ex->peers, p);
  p->handle = h;
  pthread_mutex_unlock(&ex->peers_mu);
  tent_rl_write_unlock(&ex->copy_lock);
  if (!h) peer_unref(p);
  return h;
}

/* Forget a peer. Returns once no copy touches its mappings any more. */
EXPORT int32_t tent_shm_peer_remove(void *self, uint64_t h) {
  executor_t *ex = self;
  peer_t *p = peer_get(ex, h);
  if (!p) return -ENOENT;
  tent_rl_write_lock(&ex->copy_lock);
  pthread_mutex_lock(&ex->peers_mu);
  int owned = tent_ht_take(&ex->peers, h) == p;
  pthread_mutex_unlock(&ex->peers_mu);
  p->removed = 1;
  p->nmaps = 0;
  tent_rl_write_unlock(&ex->copy_lock);
  if (owned) peer_unref(p); /* the table's reference */
  peer_unref(p);
  return owned ? 0 : -ENOENT;
}

EXPORT int32_t tent_shm_peer_set_dead(void *self, uint64_t h) {
  peer_t *p = peer_get(self, h);
  if (!p) return -ENOENT;
  atomic_store(&p->dead, 1);
  peer_unref(p);
  return 0;
}

EXPORT int32_t tent_shm_map_add(void *self, uint64_t h, uint64_t rbase, uint64_t len, uint64_t laddr,
                                int32_t writable) {
  if (len == 0 || rbase + len < rbase) return -EINVAL;
  executor_t *ex = self;
  peer_t *p = peer_get(ex, h);
  if (!p) return -ENOENT;
  int rc = 0;
  tent_rl_write_lock(&ex->copy_lock);
  size_t pos = 0;
  while (pos < p->nmaps && p->maps[pos].rbase < rbase) pos++;
  if (pos < p->nmaps && p->maps[pos].rbase == rbase) {
    p->maps[pos] = (mapping_t){rbase, len, laddr, writable != 0}; /* replace */
  } else if ((pos > 0 && p->maps[pos - 1].rbase + p->maps[pos - 1].len > rbase) ||
             (pos < p->nmaps && rbase + len > p->maps[pos].rbase)) {
    rc = -EEXIST; /* overlaps another mapping */
  } else {
    if (p->nmaps == p->cap) {
      size_t cap = p->cap ? p->cap * 2 : 8;
      mapping_t *n = realloc(p->maps, cap * sizeof(mapping_t));
      if (!n) rc = -ENOMEM;
      else {
        p->maps = n;
        p->cap = cap;
      }
    }
    if (rc == 0) {
      memmove(&p->maps[pos + 1], &p->maps[pos], (p->nmaps - pos) * sizeof(mapping_t));
      p->maps[pos] = (mapping_t){rbase, len, laddr, writable != 0};
      p->nmaps++;
    }
  }
  tent_rl_write_unlock(&ex->copy_lock);
  peer_unref(p);
  return rc;
}

/* Remove the mapping at remote_base. Returns once no copy uses it (the caller may munmap). */
EXPORT int32_t tent_shm_map_remove(void *self, uint64_t h, uint64_t rbase) {
  executor_t *ex = self;
  peer_t *p = peer_get(ex, h);
  if (!p) return -ENOENT;
  int rc = -ENOENT;
  tent_rl_write_lock(&ex->copy_lock);
  for (size_t i = 0; i < p->nmaps; i++)
    if (p->maps[i].rbase == rbase) {
      memmove(&p->maps[i], &p->maps[i + 1], (p->nmaps - i - 1) * sizeof(mapping_t));
      p->nmaps--;
      rc = 0;
      break;
    }
  tent_rl_write_unlock(&ex->copy_lock);
  peer_unref(p);
  return rc;
}

/* Read `length` bytes at the peer's remote_addr into local_addr: 0 or -errno. */
EXPORT int32_t tent_shm_cma_probe(int32_t pid, uint64_t remote_addr, uint64_t local_addr, uint64_t length) {
  struct iovec l = {(void *)(uintptr_t)local_addr, (size_t)length};
  struct iovec r = {(void *)(uintptr_t)remote_addr, (size_t)length};
  ssize_t n = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
  if (n < 0) return -errno;
  return (uint64_t)n == length ? 0 : -EFAULT;
}

/* mmap `length` bytes of fd at `offset` (any alignment) MAP_SHARED; returns the address of
 * byte `offset`, or -errno. */
EXPORT int64_t tent_shm_mmap_fd(int32_t fd, uint64_t offset, uint64_t length, int32_t writable, int32_t populate) {
  long pg = sysconf(_SC_PAGESIZE);
  uint64_t delta = offset % (uint64_t)pg;
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  void *a = mmap(NULL, length + delta, PROT_READ | (writable ? PROT_WRITE : 0), flags, fd, (off_t)(offset - delta));
  if (a == MAP_FAILED) return -(int64_t)errno;
  return (int64_t)((uintptr_t)a + delta);
}

EXPORT int32_t tent_shm_munmap(uint64_t addr, uint64_t length) {
  long pg = sysconf(_SC_PAGESIZE);
  uint64_t delta = addr % (uint64_t)pg;
  return munmap((void *)(uintptr_t)(addr - delta), length + delta) == 0 ? 0 : -errno;
}

EXPORT uint32_t tent_shm_threads(void *self) { return ((executor_t *)self)->nthreads; }
EXPORT uint64_t tent_shm_chunk(void *self) { return ((executor_t *)self)->chunk; }
