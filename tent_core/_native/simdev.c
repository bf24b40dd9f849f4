/*
 * tent_core._simdev: a simulated accelerator for tests on machines without one.
 *
 * It gives the core's device paths (path synthesis through staging on either side, stream
 * ordering, refhub's device tensors) something device-like to run against on CPU:
 *
 *  - device memory: arenas of a memfd mapped privately by the owning process (Python:
 *    tent_core.simdev). Device addresses live at SIM_BASE and above, far outside any user address
 *    space: host code and host transports (tcp, shm) cannot dereference them, so a planner that
 *    routed device memory to a host transport fails loudly instead of passing by accident. Only
 *    this library translates them (its own arenas, or a peer's arena the transport mapped);
 *  - streams: one worker thread each, running operations strictly in order (copies, "kernels"
 *    that fill a pattern or compute a checksum, event records, event waits, host gates);
 *  - events with CUDA's semantics: a record marks the stream position; a wait (host or stream)
 *    waits for the most recent record at the time the wait was issued;
 *  - gates: an operation that holds a stream until the host opens it (how the core signals a
 *    user's event "when the transfer is done");
 *  - the `simdev` transport's slice executor (executor ABI v1): slices run on its own streams; a
 *    slice whose batch was registered in the order table waits for that event on its stream
 *    first (the device-side ordering nvlink does with cudaStreamWaitEvent).
 *
 * Teardown drains: removing a mapping or a peer returns once every slice queued through it has
 * run, so the caller may unmap the peer's arena afterwards.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tent/config_kv.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"
#include "tent/order_table.h"

#define EXPORT __attribute__((visibility("default")))
#define SIM_BASE (1ull << 60)
#define MAX_ARENAS 64
#define MAX_EX_STREAMS 8

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void abs_deadline(struct timespec *ts, uint64_t deadline_ns) {
  /* condition variables below use CLOCK_MONOTONIC */
  ts->tv_sec = (time_t)(deadline_ns / 1000000000ull);
  ts->tv_nsec = (long)(deadline_ns % 1000000000ull);
}

static void mono_cond_init(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

/* ------------------------------------------------------------------ local device memory */
typedef struct arena {
  uint64_t base, len;
  uint8_t *host;
} arena_t;

static arena_t g_arenas[MAX_ARENAS];
static int g_narenas;
static pthread_rwlock_t g_arena_lock = PTHREAD_RWLOCK_INITIALIZER;

/* This process's device memory [base, base+len) is backed by host mapping `host`. */
EXPORT int32_t tent_sim_arena_add(uint64_t base, uint64_t len, uint64_t host) {
  if (base < SIM_BASE || !len || base + len < base || !host) return -EINVAL;
  int rc = 0;
  pthread_rwlock_wrlock(&g_arena_lock);
  if (g_narenas == MAX_ARENAS) rc = -ENOSPC;
  for (int i = 0; rc == 0 && i < g_narenas; i++)
    if (base < g_arenas[i].base + g_arenas[i].len && g_arenas[i].base < base + len) rc = -EEXIST;
  if (rc == 0) g_arenas[g_narenas++] = (arena_t){base, len, (uint8_t *)(uintptr_t)host};
  pthread_rwlock_unlock(&g_arena_lock);
  return rc;
}

EXPORT int32_t tent_sim_arena_remove(uint64_t base) {
  int rc = -ENOENT;
  pthread_rwlock_wrlock(&g_arena_lock);
  for (int i = 0; i < g_narenas; i++)
    if (g_arenas[i].base == base) {
      g_arenas[i] = g_arenas[--g_narenas];
      rc = 0;
      break;
    }
  pthread_rwlock_unlock(&g_arena_lock);
  return rc;
}

/* Host pointer behind [addr, addr+n): host memory as is, this process's device memory through its
 * arena; NULL when `addr` is device memory outside every arena (or runs past one). */
static uint8_t *resolve(uint64_t addr, uint64_t n) {
  if (addr < SIM_BASE) return (uint8_t *)(uintptr_t)addr;
  uint8_t *p = NULL;
  pthread_rwlock_rdlock(&g_arena_lock);
  for (int i = 0; i < g_narenas; i++) {
    const arena_t *a = &g_arenas[i];
    if (addr >= a->base && addr - a->base <= a->len && n <= a->len - (addr - a->base)) {
      p = a->host + (addr - a->base);
      break;
    }
  }
  pthread_rwlock_unlock(&g_arena_lock);
  return p;
}

/* ------------------------------------------------------------------ events and gates */
/* An event is reference counted: the host's handle holds one reference and so does every queued
 * stream operation (RECORD, WAIT, an ordered SLICE) and every order-table entry naming it. Like
 * cudaEventDestroy, destroying the handle while a record is still queued is legal: the memory
 * goes once the last of those has run. (Freed at once, a record that ran later locked the mutex of
 * and wrote into freed memory: glibc's heap metadata, found far away as "corrupted double-linked
 * list" aborts in other code.) */
typedef struct sim_event {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded; /* sequence number of the latest record */
  uint64_t reached;  /* highest record its stream has passed */
  atomic_uint refs;
} sim_event_t;

static atomic_long g_live_events; /* events not yet freed (tests check that none outlives its users) */

static void event_ref(sim_event_t *e) { atomic_fetch_add(&e->refs, 1); }

static void event_unref(sim_event_t *e) {
  if (atomic_fetch_sub(&e->refs, 1) != 1) return;
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
  atomic_fetch_sub(&g_live_events, 1);
}

typedef struct sim_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
  int refs; /* the host's (until it opens the gate) + one per stream operation holding it */
} sim_gate_t;

static void gate_unref(sim_gate_t *g) {
  pthread_mutex_lock(&g->mu);
  int last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (last) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
  }
}

EXPORT uint64_t tent_sim_event_create(void) {
  sim_event_t *e = calloc(1, sizeof *e);
  if (!e) return 0;
  pthread_mutex_init(&e->mu, NULL);
  mono_cond_init(&e->cv);
  atomic_init(&e->refs, 1); /* the host's handle */
  atomic_fetch_add(&g_live_events, 1);
  return (uint64_t)(uintptr_t)e;
}

/* Let go of the handle (call once); the event is freed when no queued operation names it any more. */
EXPORT void tent_sim_event_destroy(uint64_t h) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)h;
  if (e) event_unref(e);
}

/* How many events are not freed yet (handles not destroyed, or still named by queued work). */
EXPORT int64_t tent_sim_live_events(void) { return atomic_load(&g_live_events); }

/* The sequence number a waiter issued now must see (0: never recorded, nothing to wait for). */
EXPORT uint64_t tent_sim_event_target(uint64_t h) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)h;
  pthread_mutex_lock(&e->mu);
  uint64_t t = e->recorded;
  pthread_mutex_unlock(&e->mu);
  return t;
}

static void event_reach(sim_event_t *e, uint64_t seq) {
  pthread_mutex_lock(&e->mu);
  if (seq > e->reached) e->reached = seq;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

/* Wait until the event passed record `seq`. 1: it did; 0: deadline (CLOCK_MONOTONIC ns; 0 = none). */
static int event_wait_seq(sim_event_t *e, uint64_t seq, uint64_t deadline_ns, const atomic_int *stop) {
  int ok = 1;
  pthread_mutex_lock(&e->mu);
  while (e->reached < seq) {
    if (stop && atomic_load(stop)) {
      ok = 0;
      break;
    }
    uint64_t d = deadline_ns;
    if (stop) { /* wake up now and then to see `stop` */
      uint64_t soon = now_ns() + 50000000ull;
      if (!d || soon < d) d = soon;
    }
    if (d) {
      struct timespec ts;
      abs_deadline(&ts, d);
      if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT && deadline_ns && now_ns() >= deadline_ns) {
        ok = e->reached >= seq;
        break;
      }
    } else {
      pthread_cond_wait(&e->cv, &e->mu);
    }
  }
  pthread_mutex_unlock(&e->mu);
  return ok;
}

/* 1: the event passed record `seq` (0 is always passed). */
EXPORT int32_t tent_sim_event_passed(uint64_t h, uint64_t seq) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)h;
  pthread_mutex_lock(&e->mu);
  int done = e->reached >= seq;
  pthread_mutex_unlock(&e->mu);
  return done;
}

/* Host wait for record `seq`, at most timeout_ns (0 = no limit). 1 passed, 0 timed out. */
EXPORT int32_t tent_sim_event_wait_seq(uint64_t h, uint64_t seq, uint64_t timeout_ns) {
  return event_wait_seq((sim_event_t *)(uintptr_t)h, seq, timeout_ns ? now_ns() + timeout_ns : 0, NULL);
}

/* 1: every record issued so far has been passed (or none was issued). */
EXPORT int32_t tent_sim_event_query(uint64_t h) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)h;
  pthread_mutex_lock(&e->mu);
  int done = e->reached >= e->recorded;
  pthread_mutex_unlock(&e->mu);
  return done;
}

/* Host wait for the latest record, at most timeout_ns (0 = no limit). 1 done, 0 timed out. */
EXPORT int32_t tent_sim_event_synchronize(uint64_t h, uint64_t timeout_ns) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)h;
  uint64_t seq = tent_sim_event_target(h);
  return event_wait_seq(e, seq, timeout_ns ? now_ns() + timeout_ns : 0, NULL);
}

EXPORT uint64_t tent_sim_gate_create(void) {
  sim_gate_t *g = calloc(1, sizeof *g);
  if (!g) return 0;
  pthread_mutex_init(&g->mu, NULL);
  mono_cond_init(&g->cv);
  g->refs = 1;
  return (uint64_t)(uintptr_t)g;
}

/* Open the gate and let go of it (call once): it is freed when no stream operation holds it. */
EXPORT void tent_sim_gate_open(uint64_t h) {
  sim_gate_t *g = (sim_gate_t *)(uintptr_t)h;
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  gate_unref(g);
}

/* ------------------------------------------------------------------ streams */
enum { OP_COPY, OP_FILL, OP_WSUM, OP_RECORD, OP_WAIT, OP_GATE, OP_SLEEP, OP_SLICE };

struct executor;

typedef struct sim_op {
  int type;
  uint64_t dst, src, n;
  uint64_t arg;         /* FILL: seed; WSUM: first word index; SLEEP: microseconds */
  uint64_t *out;        /* WSUM: where the partial sum goes; COPY/FILL/WSUM: status word (optional) */
  int32_t *status;      /* where a failed copy/kernel reports -EFAULT (optional) */
  sim_event_t *ev;      /* RECORD / WAIT */
  uint64_t seq;         /* RECORD: this record's number; WAIT: the record to see */
  uint64_t deadline_ns; /* WAIT / GATE: give up after (0 = never) */
  sim_gate_t *gate;
  struct executor *ex; /* SLICE */
  tent_slice_t s;
  int slice_status;
} sim_op_t;

typedef struct sim_stream {
  pthread_mutex_t mu;
  pthread_cond_t cv, cv_idle;
  sim_op_t *q;
  size_t cap, head, len;
  uint64_t enq, done; /* operations queued / finished, ever */
  atomic_int stop;
  int autofree; /* released: the thread frees the stream once its queue is empty */
  pthread_t thr;
  uint64_t delay_ns_per_mib; /* emulated copy cost (0: memcpy speed) */
} sim_stream_t;

static void stream_dispose(sim_stream_t *st);

static void run_slice(sim_stream_t *st, sim_op_t *op);

static int grow(sim_stream_t *st, size_t extra) { /* mu held */
  if (st->len + extra <= st->cap) return 0;
  size_t cap = st->cap ? st->cap : 64;
  while (cap < st->len + extra) cap *= 2;
  sim_op_t *n = malloc(cap * sizeof *n);
  if (!n) return -1;
  for (size_t i = 0; i < st->len; i++) n[i] = st->q[(st->head + i) % st->cap];
  free(st->q);
  st->q = n;
  st->cap = cap;
  st->head = 0;
  return 0;
}

static void push_locked(sim_stream_t *st, const sim_op_t *op) { /* mu held, room reserved */
  st->q[(st->head + st->len) % st->cap] = *op;
  st->len++;
  st->enq++;
  pthread_cond_signal(&st->cv);
}

static int enqueue(sim_stream_t *st, const sim_op_t *op) {
  pthread_mutex_lock(&st->mu);
  if (grow(st, 1) != 0) {
    pthread_mutex_unlock(&st->mu);
    return -ENOMEM;
  }
  push_locked(st, op);
  pthread_mutex_unlock(&st->mu);
  return 0;
}

static const uint64_t WSUM_M1 = 0x9E3779B97F4A7C15ull, WSUM_M2 = 0xC2B2AE3D27D4EB4Full;

/* sum over 8-byte little-endian words w_i (the last one zero-padded) of (w_i*M1) ^ ((first+i)*M2) */
static uint64_t wsum(const uint8_t *p, uint64_t n, uint64_t first) {
  uint64_t h = 0, i = 0, words = n / 8;
  for (; i < words; i++) {
    uint64_t w;
    memcpy(&w, p + 8 * i, 8);
    h += (w * WSUM_M1) ^ ((first + i) * WSUM_M2);
  }
  if (n % 8) {
    uint64_t w = 0;
    memcpy(&w, p + 8 * words, n % 8);
    h += (w * WSUM_M1) ^ ((first + words) * WSUM_M2);
  }
  return h;
}

static void emulate_cost(sim_stream_t *st, uint64_t n) {
  if (!st->delay_ns_per_mib || !n) return;
  uint64_t ns = st->delay_ns_per_mib * n / (1u << 20);
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

/* splitmix64's finalizer: the verification pattern of tent_core.testing.pattern (one word per
 * 8-byte position, mixed with a key derived from the seed; never repeats) */
#define SPLITMIX64_GOLDEN 0x9E3779B97F4A7C15ull
static uint64_t splitmix64_mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void run_op(sim_stream_t *st, sim_op_t *op) {
  switch (op->type) {
    case OP_COPY: {
      uint8_t *d = resolve(op->dst, op->n), *s = resolve(op->src, op->n);
      if (!d || !s) {
        if (op->status) *op->status = -EFAULT;
        break;
      }
      memmove(d, s, op->n);
      emulate_cost(st, op->n);
      break;
    }
    case OP_FILL: { /* tent_core.testing.pattern(n, seed): byte i = byte i%8 (little-endian) of word i/8 */
      uint8_t *d = resolve(op->dst, op->n);
      if (!d) {
        if (op->status) *op->status = -EFAULT;
        break;
      }
      uint64_t key = splitmix64_mix(op->arg + SPLITMIX64_GOLDEN), v = 0;
      for (uint64_t i = 0; i < op->n; i++) {
        if ((i & 7) == 0) v = splitmix64_mix(((i >> 3) ^ key) + SPLITMIX64_GOLDEN);
        d[i] = (uint8_t)(v >> (8 * (i & 7)));
      }
      emulate_cost(st, op->n);
      break;
    }
    case OP_WSUM: {
      const uint8_t *s = resolve(op->src, op->n);
      if (!s) {
        if (op->status) *op->status = -EFAULT;
        break;
      }
      *op->out = wsum(s, op->n, op->arg);
      break;
    }
    case OP_RECORD:
      event_reach(op->ev, op->seq);
      break;
    case OP_WAIT:
      if (!event_wait_seq(op->ev, op->seq, op->deadline_ns, &st->stop) && op->status) *op->status = -ETIMEDOUT;
      break;
    case OP_GATE: {
      sim_gate_t *g = op->gate;
      pthread_mutex_lock(&g->mu);
      while (!g->open && !atomic_load(&st->stop)) {
        uint64_t d = now_ns() + 50000000ull;
        if (op->deadline_ns && op->deadline_ns < d) d = op->deadline_ns;
        struct timespec ts;
        abs_deadline(&ts, d);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (op->deadline_ns && now_ns() >= op->deadline_ns) break; /* a lost gate never holds a stream forever */
      }
      pthread_mutex_unlock(&g->mu);
      gate_unref(g);
      break;
    }
    case OP_SLEEP: {
      struct timespec ts = {(time_t)(op->arg / 1000000ull), (long)(op->arg % 1000000ull) * 1000};
      nanosleep(&ts, NULL);
      break;
    }
    case OP_SLICE:
      run_slice(st, op);
      break;
  }
  if (op->ev) event_unref(op->ev); /* the reference the operation took when it was queued */
}

static void *stream_main(void *arg) {
  sim_stream_t *st = arg;
  pthread_mutex_lock(&st->mu);
  for (;;) {
    while (!st->len && !atomic_load(&st->stop) && !st->autofree) pthread_cond_wait(&st->cv, &st->mu);
    if (!st->len && st->autofree) { /* released and drained: nobody holds the stream any more */
      pthread_mutex_unlock(&st->mu);
      stream_dispose(st);
      return NULL;
    }
    if (!st->len) break; /* stopped and drained */
    sim_op_t op = st->q[st->head];
    pthread_mutex_unlock(&st->mu);
    run_op(st, &op);
    pthread_mutex_lock(&st->mu);
    st->head = (st->head + 1) % st->cap;
    st->len--;
    st->done++;
    pthread_cond_broadcast(&st->cv_idle);
  }
  pthread_mutex_unlock(&st->mu);
  return NULL;
}

static sim_stream_t *stream_new(uint64_t delay_ns_per_mib) {
  sim_stream_t *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  pthread_mutex_init(&st->mu, NULL);
  pthread_cond_init(&st->cv, NULL);
  mono_cond_init(&st->cv_idle);
  st->delay_ns_per_mib = delay_ns_per_mib;
  if (pthread_create(&st->thr, NULL, stream_main, st) != 0) {
    free(st);
    return NULL;
  }
  return st;
}

/* Wait until every operation queued before `upto` ran. 1 done, 0 deadline. */
static int stream_wait_done(sim_stream_t *st, uint64_t upto, uint64_t deadline_ns) {
  int ok = 1;
  pthread_mutex_lock(&st->mu);
  while (st->done < upto) {
    if (!deadline_ns) {
      pthread_cond_wait(&st->cv_idle, &st->mu);
      continue;
    }
    struct timespec ts;
    abs_deadline(&ts, deadline_ns);
    if (pthread_cond_timedwait(&st->cv_idle, &st->mu, &ts) == ETIMEDOUT && st->done < upto) {
      ok = 0;
      break;
    }
  }
  pthread_mutex_unlock(&st->mu);
  return ok;
}

static void stream_dispose(sim_stream_t *st) {
  free(st->q);
  pthread_mutex_destroy(&st->mu);
  pthread_cond_destroy(&st->cv);
  pthread_cond_destroy(&st->cv_idle);
  free(st);
}

static void stream_free(sim_stream_t *st) { /* runs what is queued, then stops */
  if (!st) return;
  pthread_mutex_lock(&st->mu);
  atomic_store(&st->stop, 1);
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
  pthread_join(st->thr, NULL);
  stream_dispose(st);
}

/* Like cudaStreamDestroy: returns at once; the stream goes once its queued work has run. */
EXPORT void tent_sim_stream_release(uint64_t h) {
  sim_stream_t *st = (sim_stream_t *)(uintptr_t)h;
  if (!st) return;
  pthread_detach(st->thr);
  pthread_mutex_lock(&st->mu);
  st->autofree = 1;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
}

EXPORT uint64_t tent_sim_stream_create(uint64_t delay_ns_per_mib) { return (uint64_t)(uintptr_t)stream_new(delay_ns_per_mib); }
EXPORT void tent_sim_stream_destroy(uint64_t h) { stream_free((sim_stream_t *)(uintptr_t)h); }

/* Host wait for everything queued on the stream so far. 1 done, 0 timed out (timeout_ns 0 = none). */
EXPORT int32_t tent_sim_stream_synchronize(uint64_t h, uint64_t timeout_ns) {
  sim_stream_t *st = (sim_stream_t *)(uintptr_t)h;
  pthread_mutex_lock(&st->mu);
  uint64_t upto = st->enq;
  pthread_mutex_unlock(&st->mu);
  return stream_wait_done(st, upto, timeout_ns ? now_ns() + timeout_ns : 0);
}

/* Record `ev` at the stream's current end. Returns the record's sequence number (0 on error). */
EXPORT uint64_t tent_sim_event_record(uint64_t ev_h, uint64_t stream_h) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)ev_h;
  sim_stream_t *st = (sim_stream_t *)(uintptr_t)stream_h;
  pthread_mutex_lock(&st->mu);
  if (grow(st, 1) != 0) {
    pthread_mutex_unlock(&st->mu);
    return 0;
  }
  pthread_mutex_lock(&e->mu);
  uint64_t seq = ++e->recorded;
  pthread_mutex_unlock(&e->mu);
  event_ref(e); /* dropped once the record ran */
  sim_op_t op = {.type = OP_RECORD, .ev = e, .seq = seq};
  push_locked(st, &op);
  pthread_mutex_unlock(&st->mu);
  return seq;
}

/* Later work on `stream` waits for the event's latest record (as of this call). */
EXPORT int32_t tent_sim_stream_wait_event(uint64_t stream_h, uint64_t ev_h) {
  sim_event_t *e = (sim_event_t *)(uintptr_t)ev_h;
  sim_op_t op = {.type = OP_WAIT, .ev = e, .seq = tent_sim_event_target(ev_h)};
  event_ref(e); /* dropped once the wait ran */
  int rc = enqueue((sim_stream_t *)(uintptr_t)stream_h, &op);
  if (rc != 0) event_unref(e);
  return rc;
}

EXPORT int32_t tent_sim_memcpy_async(uint64_t stream_h, uint64_t dst, uint64_t src, uint64_t n, int32_t *status) {
  sim_op_t op = {.type = OP_COPY, .dst = dst, .src = src, .n = n, .status = status};
  return enqueue((sim_stream_t *)(uintptr_t)stream_h, &op);
}

/* Synchronous copy between any two addresses this process can resolve. 0 or -EFAULT. */
EXPORT int32_t tent_sim_memcpy(uint64_t dst, uint64_t src, uint64_t n) {
  uint8_t *d = resolve(dst, n), *s = resolve(src, n);
  if (!d || !s) return -EFAULT;
  memmove(d, s, n);
  return 0;
}

/* A "kernel" writing tent_core.testing.pattern(n, seed) into device memory at dst. */
EXPORT int32_t tent_sim_launch_fill(uint64_t stream_h, uint64_t dst, uint64_t n, uint64_t seed, int32_t *status) {
  sim_op_t op = {.type = OP_FILL, .dst = dst, .n = n, .arg = seed, .status = status};
  return enqueue((sim_stream_t *)(uintptr_t)stream_h, &op);
}

/* A "kernel" computing the wsum64 partial sum of [src, src+n) (word index `first`) into *out. */
EXPORT int32_t tent_sim_launch_wsum(uint64_t stream_h, uint64_t src, uint64_t n, uint64_t first, uint64_t *out,
                                    int32_t *status) {
  sim_op_t op = {.type = OP_WSUM, .src = src, .n = n, .arg = first, .out = out, .status = status};
  return enqueue((sim_stream_t *)(uintptr_t)stream_h, &op);
}

/* A "kernel" that just takes `us` microseconds (a slow producer). */
EXPORT int32_t tent_sim_launch_sleep(uint64_t stream_h, uint64_t us) {
  sim_op_t op = {.type = OP_SLEEP, .arg = us};
  return enqueue((sim_stream_t *)(uintptr_t)stream_h, &op);
}

/* Hold the stream until the gate opens (or deadline_ns, CLOCK_MONOTONIC; 0 = never). */
EXPORT int32_t tent_sim_launch_gate(uint64_t stream_h, uint64_t gate_h, uint64_t deadline_ns) {
  sim_gate_t *g = (sim_gate_t *)(uintptr_t)gate_h;
  pthread_mutex_lock(&g->mu);
  g->refs++;
  pthread_mutex_unlock(&g->mu);
  sim_op_t op = {.type = OP_GATE, .gate = g, .deadline_ns = deadline_ns};
  int rc = enqueue((sim_stream_t *)(uintptr_t)stream_h, &op);
  if (rc != 0) gate_unref(g);
  return rc;
}

/* Host-side wsum64 over host memory (the reference the tests and refhub compare with). */
EXPORT uint64_t tent_sim_wsum_host(uint64_t src, uint64_t n, uint64_t first) { return wsum((const uint8_t *)(uintptr_t)src, n, first); }

EXPORT uint64_t tent_sim_now_ns(void) { return now_ns(); }

/* ------------------------------------------------------------------ the simdev executor */
typedef struct region {
  uint64_t rbase, len, lptr;
  int writable;
} region_t;

typedef struct peer {
  region_t *r;
  size_t n, cap;
} peer_t;

typedef struct executor {
  const tent_host_api_t *host;
  uint32_t nstreams;
  sim_stream_t *streams[MAX_EX_STREAMS];
  atomic_uint rr;
  pthread_rwlock_t tab;
  tent_handle_table_t peers;
  tent_order_table_t order;
  pthread_mutex_t order_mu; /* an entry's event reference is taken and dropped under it */
  atomic_ullong st_slices, st_bytes, st_waits;
  pthread_mutex_t submit_mu;
  int closing;
} executor_t;

static int translate(executor_t *ex, const tent_slice_t *s, uint64_t *rptr) { /* tab read lock held */
  peer_t *p = tent_ht_get(&ex->peers, s->peer);
  if (!p) return TENT_E_CONNECT;
  size_t lo = 0, hi = p->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->r[mid].rbase <= s->remote_addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return TENT_E_BOUNDS;
  const region_t *r = &p->r[lo - 1];
  uint64_t off = s->remote_addr - r->rbase;
  if (off > r->len || s->length > r->len - off) return TENT_E_BOUNDS;
  if (s->opcode == TENT_OP_WRITE && !r->writable) return TENT_E_PERMISSION;
  *rptr = r->lptr + off;
  return TENT_OK;
}

static void run_slice(sim_stream_t *stream, sim_op_t *op) {
  executor_t *ex = op->ex;
  tent_slice_t *s = &op->s;
  int st = op->slice_status;
  /* stream ordering: the batch waits for its event here, on this stream, not on the host */
  if (st == TENT_OK && op->ev && !event_wait_seq(op->ev, op->seq, op->deadline_ns, &stream->stop)) st = TENT_E_TIMEOUT;
  if (st == TENT_OK && ex->host->is_cancelled(ex->host->ctx, s->token)) st = TENT_E_CANCELLED;
  if (st == TENT_OK && s->length) {
    uint8_t *local = resolve(s->local_addr, s->length);
    uint8_t *remote = (uint8_t *)(uintptr_t)op->src; /* translated at submit */
    if (!local)
      st = TENT_E_BOUNDS; /* local device address outside this process's arenas */
    else if (s->opcode == TENT_OP_READ)
      memmove(local, remote, s->length);
    else
      memmove(remote, local, s->length);
    emulate_cost(stream, s->length);
  }
  if (st == TENT_OK) {
    atomic_fetch_add(&ex->st_slices, 1);
    atomic_fetch_add(&ex->st_bytes, s->length);
  }
  ex->host->complete(ex->host->ctx, s, st);
}

static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    snprintf(err, errlen, "simdev: host API version mismatch");
    return NULL;
  }
  executor_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    snprintf(err, errlen, "simdev: out of memory");
    return NULL;
  }
  ex->host = host;
  ex->nstreams = 2;
  uint64_t delay = 0;
  char k[64], v[64];
  for (const char *c = config; c && tent_config_next(&c, k, sizeof k, v, sizeof v);) {
    if (!strcmp(k, "streams")) {
      long t = strtol(v, NULL, 10);
      ex->nstreams = t < 1 ? 1 : (t > MAX_EX_STREAMS ? MAX_EX_STREAMS : (uint32_t)t);
    } else if (!strcmp(k, "copy_ns_per_mib")) {
      delay = strtoull(v, NULL, 10);
    }
  }
  pthread_rwlock_init(&ex->tab, NULL);
  pthread_mutex_init(&ex->submit_mu, NULL);
  tent_ot_init(&ex->order);
  pthread_mutex_init(&ex->order_mu, NULL);
  for (uint32_t i = 0; i < ex->nstreams; i++) {
    ex->streams[i] = stream_new(delay);
    if (!ex->streams[i]) {
      snprintf(err, errlen, "simdev: cannot start stream threads");
      ex_destroy(ex);
      return NULL;
    }
  }
  return ex;
}

static void ex_destroy(void *self) {
  executor_t *ex = self;
  if (!ex) return;
  for (uint32_t i = 0; i < ex->nstreams; i++) stream_free(ex->streams[i]); /* runs queued slices: each reported once */
  for (size_t i = 0; i < ex->peers.cap; i++) {
    peer_t *p = ex->peers.items[i];
    if (p) {
      free(p->r);
      free(p);
    }
  }
  tent_ht_free(&ex->peers);
  for (int i = 0; i < TENT_ORDER_SLOTS; i++) /* entries never removed: their event references */
    if (ex->order.e[i].token) event_unref((sim_event_t *)(uintptr_t)ex->order.e[i].event);
  tent_ot_destroy(&ex->order);
  pthread_mutex_destroy(&ex->order_mu);
  pthread_rwlock_destroy(&ex->tab);
  pthread_mutex_destroy(&ex->submit_mu);
  free(ex);
}

/* The order entry of `token`, if any, with a reference on its event for the operation that waits
 * for it (taken under order_mu: the entry's own reference may be dropped right after). */
static int order_lookup(executor_t *ex, uint64_t token, tent_order_t *out) {
  if (__atomic_load_n(&ex->order.used, __ATOMIC_ACQUIRE) == 0) return 0;
  pthread_mutex_lock(&ex->order_mu);
  int found = tent_ot_get(&ex->order, token, out);
  if (found) event_ref((sim_event_t *)(uintptr_t)out->event);
  pthread_mutex_unlock(&ex->order_mu);
  return found;
}

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  if (!n) return TENT_OK;
  /* one submit at a time: reserve room on every stream, then push (all or nothing) */
  pthread_mutex_lock(&ex->submit_mu);
  uint32_t first = atomic_fetch_add(&ex->rr, n);
  for (uint32_t i = 0; i < ex->nstreams; i++) {
    sim_stream_t *st = ex->streams[i];
    pthread_mutex_lock(&st->mu);
    int rc = grow(st, (size_t)n);
    pthread_mutex_unlock(&st->mu);
    if (rc != 0) {
      pthread_mutex_unlock(&ex->submit_mu);
      return TENT_E_INTERNAL;
    }
  }
  pthread_rwlock_rdlock(&ex->tab); /* queued under the lock: a remover drains what it saw */
  for (uint32_t i = 0; i < n; i++) {
    const tent_slice_t *s = &slices[i];
    sim_stream_t *st = ex->streams[(first + i) % ex->nstreams];
    sim_op_t op = {.type = OP_SLICE, .ex = ex, .s = *s};
    uint64_t rptr = 0;
    if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE)
      op.slice_status = TENT_E_PROTOCOL;
    else if (s->remote_addr + s->length < s->remote_addr)
      op.slice_status = TENT_E_BOUNDS;
    else
      op.slice_status = translate(ex, s, &rptr);
    op.src = rptr;
    tent_order_t ord;
    if (op.slice_status == TENT_OK && order_lookup(ex, s->token, &ord)) { /* op holds an event reference */
      op.ev = (sim_event_t *)(uintptr_t)ord.event;
      op.seq = ord.seq;
      op.deadline_ns = ord.deadline_ns;
      atomic_fetch_add(&ex->st_waits, 1);
    }
    pthread_mutex_lock(&st->mu);
    push_locked(st, &op);
    pthread_mutex_unlock(&st->mu);
  }
  pthread_rwlock_unlock(&ex->tab);
  pthread_mutex_unlock(&ex->submit_mu);
  return TENT_OK;
}

static const tent_executor_ops_t g_ops = {
    TENT_EXECUTOR_ABI_VERSION, sizeof(tent_executor_ops_t), "simdev", ex_create, ex_destroy, ex_submit,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }

static void drain(executor_t *ex) {
  uint64_t upto[MAX_EX_STREAMS];
  for (uint32_t i = 0; i < ex->nstreams; i++) {
    pthread_mutex_lock(&ex->streams[i]->mu);
    upto[i] = ex->streams[i]->enq;
    pthread_mutex_unlock(&ex->streams[i]->mu);
  }
  for (uint32_t i = 0; i < ex->nstreams; i++) stream_wait_done(ex->streams[i], upto[i], 0);
}

EXPORT uint64_t tent_simx_peer_add(void *self) {
  executor_t *ex = self;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return 0;
  pthread_rwlock_wrlock(&ex->tab);
  uint64_t h = tent_ht_insert(&ex->peers, p);
  pthread_rwlock_unlock(&ex->tab);
  if (!h) free(p);
  return h;
}

/* Returns once no slice queued through the peer's mappings runs any more. */
EXPORT int32_t tent_simx_peer_remove(void *self, uint64_t h) {
  executor_t *ex = self;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = tent_ht_take(&ex->peers, h);
  pthread_rwlock_unlock(&ex->tab);
  if (!p) return -ENOENT;
  free(p->r);
  free(p);
  drain(ex);
  return 0;
}

EXPORT int32_t tent_simx_map_add(void *self, uint64_t h, uint64_t rbase, uint64_t len, uint64_t lptr, int32_t writable) {
  executor_t *ex = self;
  if (rbase + len < rbase || !lptr) return -EINVAL;
  int rc = 0;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = tent_ht_get(&ex->peers, h);
  if (!p) {
    rc = -ENOENT;
  } else {
    size_t pos = 0;
    while (pos < p->n && p->r[pos].rbase < rbase) pos++;
    region_t nr = {rbase, len, lptr, writable != 0};
    if (pos < p->n && p->r[pos].rbase == rbase) {
      p->r[pos] = nr;
    } else if ((pos > 0 && p->r[pos - 1].rbase + p->r[pos - 1].len > rbase) || (pos < p->n && rbase + len > p->r[pos].rbase)) {
      rc = -EEXIST;
    } else {
      if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        region_t *nn = realloc(p->r, cap * sizeof *nn);
        if (!nn)
          rc = -ENOMEM;
        else {
          p->r = nn;
          p->cap = cap;
        }
      }
      if (rc == 0) {
        memmove(&p->r[pos + 1], &p->r[pos], (p->n - pos) * sizeof(region_t));
        p->r[pos] = nr;
        p->n++;
      }
    }
  }
  pthread_rwlock_unlock(&ex->tab);
  return rc;
}

/* Returns once no slice queued through the mapping runs any more. */
EXPORT int32_t tent_simx_map_remove(void *self, uint64_t h, uint64_t rbase) {
  executor_t *ex = self;
  int rc = -ENOENT;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = tent_ht_get(&ex->peers, h);
  for (size_t i = 0; p && i < p->n; i++)
    if (p->r[i].rbase == rbase) {
      memmove(&p->r[i], &p->r[i + 1], (p->n - i - 1) * sizeof(region_t));
      p->n--;
      rc = 0;
      break;
    }
  pthread_rwlock_unlock(&ex->tab);
  if (rc == 0) drain(ex);
  return rc;
}

/* Slices of batch `token` submitted from now on wait for record `seq` of `event` on their stream.
 * The entry holds a reference on the event (the application may destroy its handle meanwhile). */
EXPORT int32_t tent_simx_order_add(void *self, uint64_t token, uint64_t event, uint64_t seq, uint64_t deadline_ns) {
  executor_t *ex = self;
  if (!event) return -EINVAL;
  pthread_mutex_lock(&ex->order_mu);
  event_ref((sim_event_t *)(uintptr_t)event);
  int rc = tent_ot_add(&ex->order, token, event, seq, deadline_ns);
  if (rc != 0) event_unref((sim_event_t *)(uintptr_t)event);
  pthread_mutex_unlock(&ex->order_mu);
  return rc;
}

EXPORT int32_t tent_simx_order_remove(void *self, uint64_t token) {
  executor_t *ex = self;
  tent_order_t ord;
  pthread_mutex_lock(&ex->order_mu);
  int rc = tent_ot_get(&ex->order, token, &ord) ? tent_ot_remove(&ex->order, token) : -ENOENT;
  if (rc == 0) event_unref((sim_event_t *)(uintptr_t)ord.event);
  pthread_mutex_unlock(&ex->order_mu);
  return rc;
}

EXPORT void tent_simx_stats(void *self, uint64_t out[3]) {
  executor_t *ex = self;
  out[0] = atomic_load(&ex->st_slices);
  out[1] = atomic_load(&ex->st_bytes);
  out[2] = atomic_load(&ex->st_waits);
}
