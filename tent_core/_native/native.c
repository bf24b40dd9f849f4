/*
 * tent_core._native: the core's compiled hot path.
 *
 *  - Batch: atomic completion counting; waiters block on a condition variable
 *    with the GIL released (no spinning: on two cores a spin collapses throughput).
 *  - host API handed to every executor: complete() updates per-rail telemetry
 *    slots and the batch; retryable failures go to a process-wide queue whose
 *    eventfd wakes the engine's progress thread (which re-schedules them).
 *  - submit()/submit_one(): stamp slices and call the executor's submit.
 *  - Batch doubles as the application's batch handle (tent_core.batch.BatchHandle subclasses it):
 *    the handle's fields live here so the fast path can make one without running Python.
 *  - Digest: a running xxh3_64 (tent/digest.h) a caller arms for its submits on one thread
 *    (FastPath's digest=): an executor copying a READ on that thread folds the bytes into it.
 *  - FastPath: the submit path of requests whose plan is cached (FastEntry, keyed by remote
 *    segment, local buffer, op, priority, tag): validation, bounds/permission checks against the
 *    peer's buffer table (RemoteSegment, bisected), slicing and the executor call, with no Python
 *    frame per request or slice. A miss (or anything unusual) returns None: the Python planner
 *    runs, raises the precise error or plans the request and fills the cache.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tent/cpu_relax.h"
#include "tent/digest.h"
#include "tent/executor_abi.h"
#include "tent/reader_lock.h"

/* ---- telemetry slots: rows of TENT_STAT_FIELDS int64 counters (layout in executor_abi.h),
 * shared with Python as a numpy view ---- */
#define ST_FIELDS TENT_STAT_FIELDS

static int64_t *g_stats = NULL;
static uint32_t g_stats_slots = 0;

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A slice's stat_index is a slot (low STAT_SLOT_BITS) and the generation of the rail that held the
 * slot when the slice was planned (the bits above). Slots are reused (rails.py): a slice stamped
 * with a generation the row no longer has, or with none (0: raw submits of tests and tools), is
 * counted nowhere, so a late submit through a stale plan, a retry or a heartbeat never lands on the
 * row of the rail that holds the slot now. */
#define STAT_SLOT_BITS 12
#define STAT_SLOT_MASK ((1u << STAT_SLOT_BITS) - 1)
#define STAT_NONE 0xFFFFFFFFu

/* The row a stamped slice counts on (its generation was checked when it was stamped). */
static inline int64_t *slot(uint32_t i) {
  if (!g_stats || i == STAT_NONE || (i & STAT_SLOT_MASK) >= g_stats_slots) return NULL;
  return g_stats + (size_t)(i & STAT_SLOT_MASK) * ST_FIELDS;
}

/* The row, if its holder is still the one the index names. */
static inline int64_t *slot_current(uint32_t i) {
  int64_t *st = slot(i);
  uint32_t gen = i >> STAT_SLOT_BITS;
  if (!st || !gen || __atomic_load_n(&st[TENT_STAT_GENERATION], __ATOMIC_ACQUIRE) != (int64_t)gen) return NULL;
  return st;
}

/* ---- completion notifier: an eventfd a finishing batch signals itself ----
 * A serving thread that owns replies deferred until batches finish (target staging's copies) polls
 * the fd with its sockets: the thread that finishes a batch wakes it directly, no waiter thread in
 * between. Reference-counted: a batch armed with it holds a reference until it signals or is freed,
 * so the fd is never closed (and its number reused) while a finisher may still write to it. */
typedef struct notifier {
  atomic_int refs;
  int fd;
} notifier_t;

static void notifier_unref(notifier_t *n) {
  if (atomic_fetch_sub(&n->refs, 1) == 1) {
    close(n->fd);
    free(n);
  }
}

static void notifier_signal(notifier_t *n) {
  uint64_t one = 1;
  ssize_t r = write(n->fd, &one, sizeof one); /* EAGAIN: the counter is saturated, the reader is due anyway */
  (void)r;
}

/* ---- batch ---- */
typedef struct batch {
  atomic_int refs;
  atomic_long remaining;
  atomic_int cancelled;
  atomic_int first_error;
  atomic_long bytes_done;
  atomic_long retries;
  /* the executor (ops, handle) that may leave work of this batch to its waiter (submit_inline +
   * progress in executor_abi.h); 0 when none */
  atomic_ullong poll_ops, poll_exec;
  /* threads asleep (or about to sleep) on cv: the finisher takes the mutex and broadcasts only
   * when one may be, so a batch finished before anyone waits costs no lock and no syscall */
  atomic_int sleepers;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct batch *next_free; /* in its thread's cache of finished batches */
  /* the wait conditions armed for its submit (Engine.submit_when): a copy, so that a slice re-issued
   * from another thread (a retry) still waits at the target. Set before its slices are handed over */
  tent_wait_t *waits;
  uint32_t nwaits;
  /* signalled once when remaining reaches 0 (Batch.notify); taken by whoever sees that first */
  _Atomic(notifier_t *) notify;
} batch_t;

/* Finished batches are kept for reuse by the thread that let go of the last reference: a submit
 * on the same thread then needs no allocation and no mutex/condvar setup. Enough for a few hundred
 * requests queued back to back (submit many, wait later), whose handles the application drops
 * together; a thread that never submits (an executor's worker letting go of a dropped handle's
 * batch) keeps at most this many. The list runs through the batches themselves, so the thread's
 * own storage is three words, in the initial-exec TLS model: no __tls_get_addr call per submit. */
#define BATCH_CACHE 256
#define TLS_IE __attribute__((tls_model("initial-exec")))
static __thread batch_t *tl_free TLS_IE;
static __thread int tl_nfree TLS_IE, tl_registered TLS_IE;
static pthread_key_t g_batch_cache_key;

static void batch_free(batch_t *b) {
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  free(b);
}

static void waits_drop(void);

static void batch_cache_drop(void *unused) { /* thread exit: nothing stays behind */
  waits_drop();
  while (tl_free) {
    batch_t *b = tl_free;
    tl_free = b->next_free;
    batch_free(b);
  }
  tl_nfree = 0;
}

static void batch_unref(batch_t *b) {
  if (atomic_fetch_sub(&b->refs, 1) == 1) {
    notifier_t *n = atomic_exchange(&b->notify, NULL); /* armed and never finished: nobody waits any more */
    if (n) notifier_unref(n);
    free(b->waits);
    b->waits = NULL;
    b->nwaits = 0;
    if (tl_nfree < BATCH_CACHE && (tl_registered || pthread_setspecific(g_batch_cache_key, (void *)1) == 0)) {
      tl_registered = 1; /* nobody holds it: its mutex and condvar are idle */
      b->next_free = tl_free;
      tl_free = b;
      tl_nfree++;
      return;
    }
    batch_free(b);
  }
}

static void batch_finish_one(batch_t *b) {
  if (atomic_fetch_sub(&b->remaining, 1) == 1) {
    /* seq_cst on both sides (Dekker): a waiter that registered before it saw remaining > 0 is
     * seen here, and it holds the mutex from registering until cond_wait releases it */
    if (atomic_load(&b->sleepers) > 0) {
      pthread_mutex_lock(&b->mu);
      pthread_cond_broadcast(&b->cv);
      pthread_mutex_unlock(&b->mu);
    }
    /* seq_cst against Batch.notify's exchange-then-load: exactly one side takes the notifier */
    notifier_t *n = atomic_load(&b->notify) ? atomic_exchange(&b->notify, NULL) : NULL;
    if (n) {
      notifier_signal(n);
      notifier_unref(n);
    }
    batch_unref(b); /* the in-flight reference */
  }
}

static void batch_set_error(batch_t *b, int status) {
  int expected = 0;
  atomic_compare_exchange_strong(&b->first_error, &expected, status);
}

/* ---- failure queue (retryable slices) ---- */
typedef struct failure {
  tent_slice_t slice;
  int32_t status;
  int32_t pad;
} failure_t;

static pthread_mutex_t g_fail_mu = PTHREAD_MUTEX_INITIALIZER;
static failure_t *g_fail = NULL;
static size_t g_fail_len = 0, g_fail_cap = 0;
static int g_fail_fd = -1;

/* The progress thread's watch state (recovery.Progress): PROGRESS_AWAKE while it ticks at its
 * cadence; PROGRESS_ARMED while it checks that no submit happens for a quiet period (a submit sets
 * it back to AWAKE, no syscall); PROGRESS_IDLE while it sleeps long with nothing to watch: the next
 * submit sets it AWAKE and signals the failure eventfd, which the thread waits on. An awake thread
 * costs a submit one relaxed load; a sleeping one costs the first submit after it one write(2). */
enum { PROGRESS_AWAKE = 0, PROGRESS_ARMED = 1, PROGRESS_IDLE = 2 };
static int g_progress_state = PROGRESS_AWAKE;
static uint64_t g_progress_wakes = 0; /* submits that found it IDLE (tests, benchmarks) */

static inline void progress_poke(void) {
  if (__builtin_expect(__atomic_load_n(&g_progress_state, __ATOMIC_RELAXED) == PROGRESS_AWAKE, 1)) return;
  if (__atomic_exchange_n(&g_progress_state, PROGRESS_AWAKE, __ATOMIC_SEQ_CST) == PROGRESS_IDLE) {
    __atomic_fetch_add(&g_progress_wakes, 1, __ATOMIC_RELAXED);
    uint64_t one = 1;
    ssize_t w = write(g_fail_fd, &one, sizeof one);
    (void)w;
  }
}

static void host_complete(void *ctx, const tent_slice_t *s, int32_t status) {
  (void)ctx;
  batch_t *b = (batch_t *)(uintptr_t)s->token;
  uint64_t t = now_ns();
  int64_t *st = slot(s->stat_index);
  if (st) {
    if (status == TENT_OK) {
      int64_t lat = (int64_t)(t - s->submit_ns);
      __atomic_fetch_add(&st[TENT_STAT_BYTES_DONE], (int64_t)s->length, __ATOMIC_RELAXED);
      __atomic_fetch_add(&st[TENT_STAT_SLICES_DONE], 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&st[TENT_STAT_LATENCY_NS_SUM], lat, __ATOMIC_RELAXED);
      __atomic_store_n(&st[TENT_STAT_LAST_LATENCY_NS], lat, __ATOMIC_RELAXED);
      __atomic_store_n(&st[TENT_STAT_LAST_COMPLETE_NS], (int64_t)t, __ATOMIC_RELAXED);
    } else if (status != TENT_E_CANCELLED && status != TENT_E_REROUTED && status != TENT_E_NOT_READY) {
      /* a slice handed back untouched (rerouted), cancelled, or a waiting READ whose bytes were not
       * there yet (the path answered) did not fail on this rail */
      __atomic_fetch_add(&st[TENT_STAT_ERRORS], 1, __ATOMIC_RELAXED);
    }
    /* out of flight last, after its counts: a released slot is reused once nothing is in flight
     * on it (rails.py), and then no count of this slice may follow */
    __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_BYTES], (int64_t)s->length, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_SLICES], 1, __ATOMIC_RELEASE);
  }
  if (status == TENT_OK) {
    atomic_fetch_add(&b->bytes_done, (long)s->length);
    batch_finish_one(b);
    return;
  }
  if (tent_status_retryable(status) && !atomic_load(&b->cancelled)) {
    pthread_mutex_lock(&g_fail_mu);
    if (g_fail_len == g_fail_cap) {
      size_t cap = g_fail_cap ? g_fail_cap * 2 : 256;
      failure_t *n = realloc(g_fail, cap * sizeof(failure_t));
      if (!n) {
        pthread_mutex_unlock(&g_fail_mu);
        batch_set_error(b, TENT_E_INTERNAL);
        batch_finish_one(b);
        return;
      }
      g_fail = n;
      g_fail_cap = cap;
    }
    g_fail[g_fail_len].slice = *s;
    g_fail[g_fail_len].status = status;
    g_fail_len++;
    pthread_mutex_unlock(&g_fail_mu);
    uint64_t one = 1;
    ssize_t w = write(g_fail_fd, &one, sizeof one);
    (void)w;
    return;
  }
  batch_set_error(b, atomic_load(&b->cancelled) ? TENT_E_CANCELLED : status);
  batch_finish_one(b);
}

static int host_is_cancelled(void *ctx, uint64_t token) {
  (void)ctx;
  batch_t *b = (batch_t *)(uintptr_t)token;
  return atomic_load_explicit(&b->cancelled, memory_order_relaxed);
}

/* Service telemetry: the rail's row learns when pieces enter and leave service and when bytes
 * move, so the core's stall detection counts time without progress while served, not queued. */
static void host_note(void *ctx, const tent_slice_t *s, int32_t event, uint64_t value) {
  (void)ctx;
  int64_t *st = slot_current(s->stat_index);
  if (!st) return;
  switch (event) {
    case TENT_NOTE_START:
      __atomic_fetch_add(&st[TENT_STAT_SERVING], 1, __ATOMIC_RELAXED);
      __atomic_store_n(&st[TENT_STAT_PROGRESS_NS], (int64_t)now_ns(), __ATOMIC_RELAXED);
      break;
    case TENT_NOTE_PROGRESS:
      if (value) {
        __atomic_fetch_add(&st[TENT_STAT_BYTES_MOVED], (int64_t)value, __ATOMIC_RELAXED);
        __atomic_store_n(&st[TENT_STAT_PROGRESS_NS], (int64_t)now_ns(), __ATOMIC_RELAXED);
      }
      break;
    case TENT_NOTE_STOP:
      __atomic_fetch_sub(&st[TENT_STAT_SERVING], 1, __ATOMIC_RELAXED);
      break;
    case TENT_NOTE_CONGESTED:
      __atomic_fetch_add(&st[TENT_STAT_CONGESTION], 1, __ATOMIC_RELAXED);
      break;
    default:
      break;
  }
}

/* The digests armed on this thread for the submit in progress (FastPath's digest=, digest_arm):
 * only the submitting thread sees them. An executor asks for a slice's (host_digest): the first
 * armed one whose stream range holds the slice's destination. */
#define ARM_MAX 64
static __thread tent_digest_t **tl_digests TLS_IE;
static __thread uint32_t tl_ndigest TLS_IE;
static __thread tent_digest_t *tl_arm_buf[ARM_MAX] TLS_IE; /* digest_arm's */

static void *host_digest(void *ctx, const tent_slice_t *s) {
  (void)ctx;
  for (uint32_t i = 0; i < tl_ndigest; i++)
    if (tent_digest_covers(tl_digests[i], s->local_addr)) return tl_digests[i];
  return NULL;
}

/* The wait conditions armed on this thread for the submit in progress (Engine.submit_when, wait_arm):
 * a copy, owned by the thread. An executor asks for a READ slice's (host_wait): the first one whose
 * destination range holds the slice's destination. */
#define WAIT_ARM_MAX 4096
static __thread tent_wait_t *tl_waits TLS_IE;
static __thread uint32_t tl_nwait TLS_IE, tl_wait_cap TLS_IE;

static void waits_drop(void) {
  free(tl_waits);
  tl_waits = NULL;
  tl_nwait = tl_wait_cap = 0;
}

static const tent_wait_t *host_wait(void *ctx, const tent_slice_t *s) {
  (void)ctx;
  const batch_t *b = (const batch_t *)(uintptr_t)s->token; /* the core's slices carry their batch */
  if (!b) return NULL;
  for (uint32_t i = 0; i < b->nwaits; i++)
    if (s->local_addr >= b->waits[i].local_start && s->local_addr < b->waits[i].local_end) return &b->waits[i];
  return NULL;
}

/* An executor about to sleep inside submit_inline (host_block_begin/end): the GIL goes if this
 * thread holds it (exec_submit_gil may have released it already, with a digest armed; a thread
 * the core's C code runs has none). PyGILState_Check alone answers 1 for every thread once a
 * subinterpreter exists, so the thread's own state must also be the running one. */
static void *host_block_begin(void *ctx) {
  (void)ctx;
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState *running = PyThreadState_GetUnchecked();
#else
  PyThreadState *running = _PyThreadState_UncheckedGet();
#endif
  PyThreadState *mine = PyGILState_GetThisThreadState();
  if (!running || running != mine || !PyGILState_Check()) return NULL;
  return (void *)PyEval_SaveThread();
}

static void host_block_end(void *ctx, void *token) {
  (void)ctx;
  if (token) PyEval_RestoreThread((PyThreadState *)token);
}

static tent_host_api_t g_host = {TENT_EXECUTOR_ABI_VERSION, sizeof(tent_host_api_t), NULL, host_complete,
                                 host_is_cancelled, host_note, host_digest, host_wait,
                                 host_block_begin, host_block_end};

/* ---- Python Batch type ---- */
typedef struct {
  PyObject_HEAD batch_t *b;
  long total;
  /* the handle's side (tent_core.batch.BatchHandle) */
  PyObject *engine;       /* owner the progress thread hands this batch's failures to */
  double deadline;        /* time.monotonic() seconds */
  double submitted_at;
  long num_requests;
  char deadline_hit;
  char is_probe;          /* heartbeat slices of the rail monitor */
  PyObject *routes;       /* route -> Decision record of the planner (or None) */
  PyObject *pieces;       /* (route, lo, hi, decision) list of the planner (or None) */
  PyObject *fast;         /* FastEntry, or a tuple of them, the fast path used (or None) */
  PyObject *tracked_in;   /* the in-flight dict the fast path put this handle in, under */
  PyObject *tracked_key;  /* this key (NULL when it did not) */
} BatchObject;

static PyTypeObject BatchType;


/* A fresh batch_t for `total` slices; NULL when out of memory. */
static batch_t *batch_create(long total) {
  batch_t *b;
  if (tl_free) {
    /* Relaxed: the batch is this thread's alone until its slices are handed over, which
     * publishes it (the executor's queue lock, or this very thread running them inline); a
     * seq_cst store is a locked instruction on x86, nine of them per submit otherwise. */
    b = tl_free;
    tl_free = b->next_free;
    tl_nfree--;
    atomic_store_explicit(&b->cancelled, 0, memory_order_relaxed);
    atomic_store_explicit(&b->first_error, 0, memory_order_relaxed);
    atomic_store_explicit(&b->bytes_done, 0, memory_order_relaxed);
    atomic_store_explicit(&b->retries, 0, memory_order_relaxed);
    atomic_store_explicit(&b->poll_ops, 0, memory_order_relaxed);
    atomic_store_explicit(&b->poll_exec, 0, memory_order_relaxed);
    atomic_store_explicit(&b->sleepers, 0, memory_order_relaxed);
  } else {
    b = calloc(1, sizeof(batch_t));
    if (!b) return NULL;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
  }
  atomic_store_explicit(&b->remaining, total, memory_order_relaxed);
  atomic_store_explicit(&b->refs, total > 0 ? 2 : 1, memory_order_relaxed);
  return b;
}

/* `now`: now_ns() of the caller, or 0 to read the clock here */
static void batch_fields_init(BatchObject *self, uint64_t now) {
  Py_INCREF(Py_None);
  self->engine = Py_None;
  Py_INCREF(Py_None);
  self->routes = Py_None;
  Py_INCREF(Py_None);
  self->pieces = Py_None;
  Py_INCREF(Py_None);
  self->fast = Py_None;
  self->deadline = INFINITY;
  self->submitted_at = (double)(now ? now : now_ns()) / 1e9;
}

/* Batch(total) : a new completion counter; Batch(other) shares `other`'s counter (a handle made
 * around an existing batch). Handle fields come from keywords engine, deadline, num_requests. */
/* A Batch (or subclass) object. Python subclasses are heap types, which CPython always makes
 * GC-tracked; one that adds no instance storage (BatchHandle: `__slots__ = ()`) can only show the
 * collector its type, since Batch's own fields are not traversed. Untracking such an instance
 * loses nothing and spares every submit a share of the young-generation collections that
 * thousands of live handles would otherwise cost. */
static BatchObject *batch_obj_alloc(PyTypeObject *type);

static PyObject *Batch_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  PyObject *total_obj, *engine = NULL;
  double deadline = INFINITY;
  long num_requests = 0;
  static char *kwlist[] = {"total", "engine", "deadline", "num_requests", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Odl", kwlist, &total_obj, &engine, &deadline, &num_requests)) return NULL;
  batch_t *b;
  long total;
  if (PyObject_TypeCheck(total_obj, &BatchType)) {
    b = ((BatchObject *)total_obj)->b;
    total = ((BatchObject *)total_obj)->total;
    atomic_fetch_add(&b->refs, 1);
  } else {
    total = PyLong_AsLong(total_obj);
    if (total == -1 && PyErr_Occurred()) return NULL;
    if (total < 0) {
      PyErr_SetString(PyExc_ValueError, "total must be >= 0");
      return NULL;
    }
    b = batch_create(total);
    if (!b) return PyErr_NoMemory();
  }
  BatchObject *self = batch_obj_alloc(type);
  if (!self) {
    batch_unref(b);
    return NULL;
  }
  self->b = b;
  self->total = total;
  batch_fields_init(self, 0);
  if (engine) {
    Py_INCREF(engine);
    Py_SETREF(self->engine, engine);
  }
  self->deadline = deadline;
  self->num_requests = num_requests;
  return (PyObject *)self;
}

/* What a Batch holds, released (its memory and type are the caller's). */
static void batch_fields_release(BatchObject *self) {
  Py_XDECREF(self->tracked_in);
  Py_XDECREF(self->tracked_key);
  if (self->b) batch_unref(self->b);
  Py_XDECREF(self->engine);
  Py_XDECREF(self->routes);
  Py_XDECREF(self->pieces);
  Py_XDECREF(self->fast);
}

static void Batch_dealloc(BatchObject *self) {
  batch_fields_release(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int batch_progress(batch_t *b, int64_t budget_ns);

/* A finished batch the fast path tracked leaves the in-flight dict (if it is still there, under
 * this handle): nothing of it can fail any more, so recovery has no use for it. GIL held. */
static void handle_untrack(BatchObject *self) {
  PyObject *d = self->tracked_in, *key = self->tracked_key;
  if (!d) return;
  self->tracked_in = self->tracked_key = NULL;
  PyObject *et = NULL, *ev = NULL, *tb = NULL;
  int pending = PyErr_Occurred() != NULL; /* nearly never: no fetch and restore per wait */
  if (pending) PyErr_Fetch(&et, &ev, &tb);
  PyObject *v = PyDict_GetItemWithError(d, key); /* borrowed */
  if (v == (PyObject *)self) {
    /* the dict's reference goes; the caller holds another (self is its argument) */
    if (PyDict_DelItem(d, key) < 0) PyErr_Clear();
  } else if (!v) {
    PyErr_Clear(); /* the progress thread's sweep took it already */
  }
  if (pending) PyErr_Restore(et, ev, tb);
  Py_DECREF(key);
  Py_DECREF(d);
}

/* A waiter offers its thread to an executor (progress()) in steps of at most this long: an
 * answer later than that goes to a worker while the waiter sleeps on the batch. */
#define WAIT_POLL_STEP_NS 20000000ull /* 20 ms */

/* How long wait() polls the counter before it sleeps on the condition variable. Waking a
 * sleeping thread costs tens of microseconds on small VMs, longer than a small transfer
 * itself; a short poll catches those completions first. Set from the engine config. */
static atomic_llong g_wait_spin_ns = 0;

/* Wait for `b` up to `timeout` seconds (< 0: no limit); 1 when every slice finished. Called with
 * the GIL released. `now`: the caller's clock read just before (0: none), which the deadline of a
 * waiter reading its answers and its first step take instead of two more reads. */
static int batch_wait_nogil(batch_t *b, double timeout, int may_spin, uint64_t now) {
  int done;
  long long spin = may_spin ? atomic_load_explicit(&g_wait_spin_ns, memory_order_relaxed) : 0;
  if (atomic_load(&b->poll_ops)) {
    /* an executor left work of this batch to its waiter (answers of requests sent inline): this
     * thread reads them as they arrive, in bounded steps, then hands what is left to workers */
    uint64_t end = UINT64_MAX;
    if (timeout >= 0) {
      if (!now) now = now_ns();
      end = now + (uint64_t)(timeout * 1e9);
    }
    while (atomic_load(&b->remaining) > 0) {
      uint64_t step = WAIT_POLL_STEP_NS;
      if (end != UINT64_MAX) { /* no clock read per step without a timeout (tens of ns each on a VM) */
        if (!now) now = now_ns(); /* the first step has the caller's */
        if (now >= end) break;
        if (end - now < step) step = end - now;
      }
      if (!batch_progress(b, (int64_t)step)) break;
      now = 0; /* a later step reads the clock */
    }
    if (atomic_load(&b->remaining) > 0) batch_progress(b, -1); /* the hand-off */
  }
  /* the answers were read on this thread (a request sent inline): done, without the spin's and
   * the deadline's clock reads, the batch mutex and the sleepers count below */
  if (atomic_load(&b->remaining) == 0) {
    done = 1;
    goto out;
  }
  if (spin > 0) {
    if (timeout >= 0 && spin > (long long)(timeout * 1e9)) spin = (long long)(timeout * 1e9);
    uint64_t until = now_ns() + (uint64_t)spin;
    while (atomic_load(&b->remaining) > 0 && now_ns() < until) tent_cpu_relax();
  }
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout >= 0) {
    long sec = (long)timeout;
    long nsec = (long)((timeout - (double)sec) * 1e9);
    dl.tv_sec += sec;
    dl.tv_nsec += nsec;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec += 1;
      dl.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&b->mu);
  atomic_fetch_add(&b->sleepers, 1);
  while (atomic_load(&b->remaining) > 0) {
    if (timeout < 0) {
      pthread_cond_wait(&b->cv, &b->mu);
    } else if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT) {
      break;
    }
  }
  atomic_fetch_sub(&b->sleepers, 1);
  done = atomic_load(&b->remaining) == 0;
  pthread_mutex_unlock(&b->mu);
out:
  return done;
}

static PyObject *Batch_wait(BatchObject *self, PyObject *args) {
  double timeout = -1.0;
  int may_spin = 1; /* 0: a waiter that knows the batch takes far longer than the spin (a MiBs copy) sleeps at once */
  if (!PyArg_ParseTuple(args, "|dp", &timeout, &may_spin)) return NULL;
  batch_t *b = self->b;
  if (atomic_load(&b->remaining) == 0) {
    handle_untrack(self);
    Py_RETURN_TRUE;
  }
  int done;
  Py_BEGIN_ALLOW_THREADS;
  done = batch_wait_nogil(b, timeout, may_spin, 0);
  Py_END_ALLOW_THREADS;
  if (done) handle_untrack(self);
  return PyBool_FromLong(done);
}

static PyObject *Batch_cancel(BatchObject *self, PyObject *unused) {
  atomic_store(&self->b->cancelled, 1);
  Py_RETURN_NONE;
}

/* Finalize one slice from Python (retries exhausted, or never submitted). */
static PyObject *Batch_fail_slice(BatchObject *self, PyObject *args) {
  int status;
  if (!PyArg_ParseTuple(args, "i", &status)) return NULL;
  if (atomic_load(&self->b->remaining) <= 0) {
    PyErr_SetString(PyExc_RuntimeError, "batch has no outstanding slice");
    return NULL;
  }
  batch_set_error(self->b, atomic_load(&self->b->cancelled) ? TENT_E_CANCELLED : status);
  batch_finish_one(self->b);
  Py_RETURN_NONE;
}

/* Finalize one outstanding unit as successful from Python (staged paths drive their own pipeline). */
static PyObject *Batch_complete_slice(BatchObject *self, PyObject *args) {
  long long nbytes = 0;
  if (!PyArg_ParseTuple(args, "|L", &nbytes)) return NULL;
  if (atomic_load(&self->b->remaining) <= 0) {
    PyErr_SetString(PyExc_RuntimeError, "batch has no outstanding slice");
    return NULL;
  }
  atomic_fetch_add(&self->b->bytes_done, (long)nbytes);
  batch_finish_one(self->b);
  Py_RETURN_NONE;
}

/* wait_handle(timeout=None): BatchHandle.wait's fast side. A batch that finishes without an
 * error (now, or within the wait, which runs here as `_wait` runs it) answers True here; a failure
 * or a wait that ran out goes to the handle's Python `_wait`, which raises the typed errors. */
/* tent_core.batch's globals (set_hook_namespace): while its COMPLETION_HOOK is set, every wait
 * runs `_wait`, which reports the end of the batch to the hook. */
static PyObject *g_hook_ns = NULL;

/* Batch.wait_handle's method descriptor (borrowed from the static type's dict): FastPath.run calls
 * it directly on a handle whose type resolves `wait` to it */
static PyObject *g_wait_handle = NULL;

/* The answer of the last lookup and the version of the namespace it was read from: every change
 * of a dict bumps its version tag (PEP 509; deprecated from 3.12, where the lookup runs every time),
 * so a namespace nobody touched since answers without a lookup. */
#if PY_VERSION_HEX < 0x030C0000
#define HOOK_VERSIONED 1
static uint64_t g_hook_ver;
static int g_hook_off_cached = -1;
#endif

static int hook_off(void) {
  if (!g_hook_ns) return 1;
#ifdef HOOK_VERSIONED
  uint64_t ver = ((PyDictObject *)g_hook_ns)->ma_version_tag;
  if (g_hook_off_cached >= 0 && ver == g_hook_ver) return g_hook_off_cached;
#endif
  static PyObject *key = NULL; /* interned once: no string made per wait */
  if (!key && !(key = PyUnicode_InternFromString("COMPLETION_HOOK"))) {
    PyErr_Clear();
    return 0; /* the Python side decides */
  }
  PyObject *h = PyDict_GetItemWithError(g_hook_ns, key); /* borrowed */
  if (!h && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  int off = !h || h == Py_None;
#ifdef HOOK_VERSIONED
  g_hook_ver = ver;
  g_hook_off_cached = off;
#endif
  return off;
}

static PyObject *py_set_hook_namespace(PyObject *m, PyObject *ns) {
  if (!PyDict_Check(ns)) {
    PyErr_SetString(PyExc_TypeError, "set_hook_namespace(globals dict)");
    return NULL;
  }
  Py_INCREF(ns);
  Py_XSETREF(g_hook_ns, ns);
#ifdef HOOK_VERSIONED
  g_hook_off_cached = -1;
#endif
  Py_RETURN_NONE;
}

static PyObject *Batch_wait_handle(BatchObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  batch_t *b = self->b;
  PyObject *zero = NULL; /* the timeout `_wait` gets after a native wait that ran out: none is left */
  if (!kwnames && nargs <= 1 && hook_off()) {
    if (atomic_load(&b->remaining) == 0 && atomic_load(&b->first_error) == 0) {
      handle_untrack(self);
      Py_RETURN_TRUE;
    }
    /* Still running: wait here, as `_wait` would (up to the deadline, or the timeout if sooner),
     * without its Python frame, clock reads and attribute lookups: a small tcp request's answer
     * is read by this very wait (progress()), so this path ran for every one of them, several
     * microseconds each. A batch finished without error answers True; a failure, or time running
     * out, goes to `_wait` (which raises the typed error or returns False) with no time left. */
    double timeout = -1.0; /* no limit */
    if (nargs == 1 && args[0] != Py_None) {
      timeout = PyFloat_AsDouble(args[0]);
      if (timeout == -1.0 && PyErr_Occurred()) return NULL;
      if (timeout < 0) timeout = 0;
    }
    uint64_t t = now_ns();
    double now = (double)t / 1e9, left = self->deadline - now;
    if (left < 0) left = 0;
    if (timeout >= 0 && (timeout < left || isinf(left))) left = timeout;
    else if (isinf(left) || isnan(left)) left = -1.0;
    int done;
    Py_BEGIN_ALLOW_THREADS;
    done = batch_wait_nogil(b, left, 1, t);
    Py_END_ALLOW_THREADS;
    if (done && atomic_load(&b->first_error) == 0) {
      handle_untrack(self);
      Py_RETURN_TRUE;
    }
    if (!done && nargs == 1 && args[0] != Py_None && !(zero = PyFloat_FromDouble(0.0))) return NULL;
  }
  static PyObject *name = NULL;
  if (!name && !(name = PyUnicode_InternFromString("_wait"))) {
    Py_XDECREF(zero);
    return NULL;
  }
  PyObject *meth = PyObject_GetAttr((PyObject *)self, name);
  if (!meth) {
    Py_XDECREF(zero);
    return NULL;
  }
  PyObject *r = zero ? PyObject_CallOneArg(meth, zero) : PyObject_Vectorcall(meth, args, (size_t)nargs, kwnames);
  Py_DECREF(meth);
  Py_XDECREF(zero);
  return r;
}

/* ---- Python Notifier type ---- */
typedef struct {
  PyObject_HEAD notifier_t *n;
} NotifierObject;

static PyTypeObject NotifierType;

static PyObject *Notifier_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  if (!PyArg_ParseTuple(args, ":Notifier")) return NULL;
  NotifierObject *self = (NotifierObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  notifier_t *n = calloc(1, sizeof(notifier_t));
  if (!n) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  n->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (n->fd < 0) {
    free(n);
    Py_DECREF(self);
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  atomic_store(&n->refs, 1);
  self->n = n;
  return (PyObject *)self;
}

static void Notifier_dealloc(NotifierObject *self) {
  if (self->n) notifier_unref(self->n); /* armed batches keep the fd open until they let go */
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Notifier_drain(NotifierObject *self, PyObject *unused) {
  uint64_t v = 0;
  ssize_t r = read(self->n->fd, &v, sizeof v);
  return PyLong_FromUnsignedLongLong(r == (ssize_t)sizeof v ? v : 0);
}

static PyObject *Notifier_fileno(NotifierObject *self, PyObject *unused) { return PyLong_FromLong(self->n->fd); }

static PyMethodDef Notifier_methods[] = {
    {"fileno", (PyCFunction)Notifier_fileno, METH_NOARGS, "the eventfd: readable once an armed batch finished"},
    {"drain", (PyCFunction)Notifier_drain, METH_NOARGS, "reset the eventfd; returns how many signals it held (never blocks)"},
    {NULL}};

static PyTypeObject NotifierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.Notifier",
    .tp_basicsize = sizeof(NotifierObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Notifier_new,
    .tp_dealloc = (destructor)Notifier_dealloc,
    .tp_methods = Notifier_methods,
    .tp_doc = "Notifier(): an eventfd that batches armed with Batch.notify signal when they finish",
};

/* notify(notifier): signal it once when this batch finishes (at once when it has). One notifier per
 * batch: arming another replaces it. */
static PyObject *Batch_notify(BatchObject *self, PyObject *arg) {
  if (!PyObject_TypeCheck(arg, &NotifierType)) {
    PyErr_SetString(PyExc_TypeError, "notify(Notifier)");
    return NULL;
  }
  notifier_t *n = ((NotifierObject *)arg)->n;
  batch_t *b = self->b;
  atomic_fetch_add(&n->refs, 1);
  notifier_t *old = atomic_exchange(&b->notify, n);
  if (old) notifier_unref(old);
  if (atomic_load(&b->remaining) <= 0) { /* finished already, or before the finisher saw it armed */
    notifier_t *m = atomic_exchange(&b->notify, NULL);
    if (m) {
      notifier_signal(m);
      notifier_unref(m);
    }
  }
  Py_RETURN_NONE;
}

/* kick(): work an executor left to this batch's waiter goes on without one (see progress() in
 * executor_abi.h): for non-blocking polls of the handle and the progress thread's sweep. */
static PyObject *Batch_kick(BatchObject *self, PyObject *unused) {
  if (atomic_load(&self->b->remaining) > 0 && atomic_load(&self->b->poll_ops)) {
    Py_BEGIN_ALLOW_THREADS;
    batch_progress(self->b, -1);
    Py_END_ALLOW_THREADS;
  }
  Py_RETURN_NONE;
}

static PyObject *Batch_note_retry(BatchObject *self, PyObject *unused) {
  atomic_fetch_add(&self->b->retries, 1);
  Py_RETURN_NONE;
}

static PyObject *Batch_get_remaining(BatchObject *self, void *c) { return PyLong_FromLong(atomic_load(&self->b->remaining)); }
static PyObject *Batch_get_error(BatchObject *self, void *c) { return PyLong_FromLong(atomic_load(&self->b->first_error)); }
static PyObject *Batch_get_bytes(BatchObject *self, void *c) { return PyLong_FromLong(atomic_load(&self->b->bytes_done)); }
static PyObject *Batch_get_retries(BatchObject *self, void *c) { return PyLong_FromLong(atomic_load(&self->b->retries)); }
static PyObject *Batch_get_cancelled(BatchObject *self, void *c) { return PyBool_FromLong(atomic_load(&self->b->cancelled)); }
static PyObject *Batch_get_token(BatchObject *self, void *c) { return PyLong_FromUnsignedLongLong((uintptr_t)self->b); }
static PyObject *Batch_get_total(BatchObject *self, void *c) { return PyLong_FromLong(self->total); }
static PyObject *Batch_get_self(BatchObject *self, void *c) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyMethodDef Batch_methods[] = {
    {"wait", (PyCFunction)Batch_wait, METH_VARARGS, "wait(timeout=-1, spin=True) -> bool: True when every slice finished; spin=False sleeps without polling first"},
    {"cancel", (PyCFunction)Batch_cancel, METH_NOARGS, "mark cancelled; queued slices complete as cancelled"},
    {"fail_slice", (PyCFunction)Batch_fail_slice, METH_VARARGS, "finalize one outstanding slice with an error"},
    {"complete_slice", (PyCFunction)Batch_complete_slice, METH_VARARGS, "finalize one outstanding slice as done"},
    {"note_retry", (PyCFunction)Batch_note_retry, METH_NOARGS, "count one retry"},
    {"kick", (PyCFunction)Batch_kick, METH_NOARGS, "hand work left to a waiter over to the executor's workers"},
    {"notify", (PyCFunction)Batch_notify, METH_O, "notify(Notifier): signal its eventfd once when this batch finishes"},
    {"wait_handle", (PyCFunction)(void (*)(void))Batch_wait_handle, METH_FASTCALL | METH_KEYWORDS,
     "wait_handle(timeout=None): True at once for a batch finished without error, else self._wait(timeout)"},
    {NULL}};

static PyGetSetDef Batch_getset[] = {
    {"remaining", (getter)Batch_get_remaining, NULL, NULL, NULL},
    {"error", (getter)Batch_get_error, NULL, NULL, NULL},
    {"bytes_done", (getter)Batch_get_bytes, NULL, NULL, NULL},
    {"retries", (getter)Batch_get_retries, NULL, NULL, NULL},
    {"cancelled", (getter)Batch_get_cancelled, NULL, NULL, NULL},
    {"token", (getter)Batch_get_token, NULL, NULL, NULL},
    {"total", (getter)Batch_get_total, NULL, NULL, NULL},
    {"_batch", (getter)Batch_get_self, NULL, "the completion counter (the handle itself)", NULL},
    {NULL}};

static PyMemberDef Batch_members[] = {
    {"engine", T_OBJECT, offsetof(BatchObject, engine), 0, "owner of the batch (gets its failures)"},
    {"deadline", T_DOUBLE, offsetof(BatchObject, deadline), 0, "time.monotonic() seconds"},
    {"submitted_at", T_DOUBLE, offsetof(BatchObject, submitted_at), 0, "time.monotonic() at submit"},
    {"num_requests", T_LONG, offsetof(BatchObject, num_requests), 0, NULL},
    {"_deadline_hit", T_BOOL, offsetof(BatchObject, deadline_hit), 0, NULL},
    {"is_probe", T_BOOL, offsetof(BatchObject, is_probe), 0, "heartbeat slices of the rail monitor"},
    {"_routes", T_OBJECT, offsetof(BatchObject, routes), 0, NULL},
    {"_pieces", T_OBJECT, offsetof(BatchObject, pieces), 0, NULL},
    {"_fast", T_OBJECT, offsetof(BatchObject, fast), READONLY, "plan-cache entries the fast path used"},
    {NULL}};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = Batch_new,
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
    .tp_members = Batch_members,
};

/* Subclasses whose slots hold only data that never refers back to a handle (registered by
 * untrack_handles): their instances are untracked too. Tracked handles count as young objects,
 * so thousands queued (submit back to back, wait later) would run the collector every few hundred
 * submits, and it would walk them all again in every older-generation pass. */
#define UNTRACKED_TYPES 4
static PyTypeObject *g_untracked_types[UNTRACKED_TYPES];

/* Handles of a registered type (BatchHandle) that were let go, kept for the next submit: a
 * submit(reqs).wait() loop makes and drops one handle per request, and the generic allocation and
 * deallocation of a Python subclass instance (PyType_GenericAlloc: malloc, zeroing, GC link and
 * tracking, a type reference; subtype_dealloc: the trashcan, the base lookup, GC unlink, free)
 * was what that form paid above run(), which makes none. A kept handle holds nothing but its
 * type reference (fields and slots released at dealloc, zeroed again at reuse) and is untracked.
 * As many are kept as the thread's batch cache keeps batches (BATCH_CACHE): requests queued back
 * to back (submit many, wait later) drop their handles together, and with 16 kept, 184 of the next
 * 200 submits allocated theirs again (malloc, GC link, a count toward the next collection).
 * Guarded by the GIL; off where there is none, or where _Py_NewReference is not public. */
#define HANDLE_FREELIST_MAX BATCH_CACHE
#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX < 0x030D0000
#define HANDLE_FREELIST HANDLE_FREELIST_MAX
static PyObject *g_free_handles[HANDLE_FREELIST];
static int g_nfree_handles, g_max_free_handles = HANDLE_FREELIST;
#endif

static void handle_dealloc(PyObject *o);

static BatchObject *batch_obj_alloc(PyTypeObject *type) {
#ifdef HANDLE_FREELIST
  if (g_nfree_handles > 0 && Py_TYPE(g_free_handles[g_nfree_handles - 1]) == type) {
    PyObject *o = g_free_handles[--g_nfree_handles];
    /* everything after the header (fields and __slots__) starts zeroed, as tp_alloc leaves it */
    memset((char *)o + sizeof(PyObject), 0, (size_t)type->tp_basicsize - sizeof(PyObject));
    _Py_NewReference(o);
    return (BatchObject *)o;
  }
#endif
  PyObject *o = type->tp_alloc(type, 0);
  if (o && type != &BatchType && PyObject_IS_GC(o) && type->tp_dictoffset == 0) {
    int untrack = type->tp_basicsize == BatchType.tp_basicsize;
    for (int i = 0; !untrack && i < UNTRACKED_TYPES && g_untracked_types[i]; i++) untrack = g_untracked_types[i] == type;
    if (untrack) PyObject_GC_UnTrack(o);
  }
  return (BatchObject *)o;
}

/* untrack_handles(type): `type` (a Batch subclass without __dict__) declares that its slots never
 * hold a reference back to a handle, so its instances need no cycle collection. */
static PyObject *py_untrack_handles(PyObject *m, PyObject *arg) {
  if (!PyType_Check(arg) || !PyType_IsSubtype((PyTypeObject *)arg, &BatchType) ||
      ((PyTypeObject *)arg)->tp_dictoffset != 0) {
    PyErr_SetString(PyExc_TypeError, "untrack_handles(a _native.Batch subclass with __slots__ and no __dict__)");
    return NULL;
  }
  PyTypeObject *t = (PyTypeObject *)arg;
  for (int i = 0; i < UNTRACKED_TYPES; i++) {
    if (g_untracked_types[i] == t) Py_RETURN_NONE;
    if (!g_untracked_types[i]) {
      Py_INCREF(arg);
      g_untracked_types[i] = t;
      /* A direct subclass with nothing for subtype_dealloc to do beyond its slots (no finalizer,
       * no weak references, no __dict__) is deallocated by handle_dealloc, which keeps a few for
       * reuse. Its subclasses still go through subtype_dealloc, which then calls handle_dealloc as
       * their base's (see there). */
      if (t->tp_base == &BatchType && (t->tp_flags & Py_TPFLAGS_HEAPTYPE) && PyType_IS_GC(t) && !t->tp_finalize &&
          !t->tp_del && t->tp_weaklistoffset == 0 && t->tp_dictoffset == 0)
        t->tp_dealloc = handle_dealloc;
      Py_RETURN_NONE;
    }
  }
  PyErr_SetString(PyExc_RuntimeError, "untrack_handles: too many handle types");
  return NULL;
}

/* tp_dealloc of a registered handle type (see py_untrack_handles), in place of subtype_dealloc.
 * Called for its own instances, and as the base's dealloc by subtype_dealloc for a Python subclass
 * of it, which has then cleared the subclass's own slots and re-tracked the object, and leaves this
 * function the handle type's slots and the type's reference, as any heap base's dealloc. */
static void handle_dealloc(PyObject *o) {
  PyTypeObject *type = Py_TYPE(o), *h = type;
  while (h && h->tp_dealloc != handle_dealloc) h = h->tp_base;
  PyObject_GC_UnTrack(o);
  if (h) /* the registered type's __slots__ (members of its own, writable object slots) */
    for (PyMemberDef *m = h->tp_members; m && m->name; m++)
      if (m->type == T_OBJECT_EX && !(m->flags & READONLY)) Py_CLEAR(*(PyObject **)((char *)o + m->offset));
  batch_fields_release((BatchObject *)o);
#ifdef HANDLE_FREELIST
  if (type == h && g_nfree_handles < g_max_free_handles) {
    ((BatchObject *)o)->b = NULL; /* released above */
    g_free_handles[g_nfree_handles++] = o; /* keeps its type reference until reused */
    return;
  }
#endif
  type->tp_free(o);
  Py_DECREF(type);
}

/* handle_freelist(n=None) -> int: how many released handles are kept for reuse (at most 256; 0:
 * none, and those kept are freed); returns the previous bound. For tests that need every submit to
 * allocate its handle (a collection run by that allocation). */
static PyObject *py_handle_freelist(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "handle_freelist(n=None)");
    return NULL;
  }
  long n = -1; /* -1: leave the bound as it is */
  if (nargs == 1 && args[0] != Py_None) {
    n = PyLong_AsLong(args[0]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > HANDLE_FREELIST_MAX) {
      PyErr_Format(PyExc_ValueError, "handle_freelist: n must be within [0, %d], got %ld", HANDLE_FREELIST_MAX, n);
      return NULL;
    }
  }
#ifdef HANDLE_FREELIST
  int prev = g_max_free_handles;
  if (n >= 0) {
    g_max_free_handles = (int)n;
    while (g_nfree_handles > g_max_free_handles) {
      PyObject *o = g_free_handles[--g_nfree_handles];
      PyTypeObject *type = Py_TYPE(o);
      type->tp_free(o);
      Py_DECREF(type);
    }
  }
  return PyLong_FromLong(prev);
#else
  return PyLong_FromLong(0); /* none kept in this build */
#endif
}


/* ---- Digest: a running xxh3_64 of a stream of bytes in this process's memory ----
 * Executors fold what they copy on the submitting thread (tent/digest.h); the caller folds the
 * rest with update() (from its buffer, in order), then reads intdigest(). One thread at a time per
 * Digest: a submit with it armed and update() run without the GIL. */
typedef struct {
  PyObject_HEAD
  tent_digest_t *d; /* 64-byte aligned */
} DigestObject;

static PyTypeObject DigestType;

static PyObject *Digest_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"next", "end", NULL};
  unsigned long long next = 0, end = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|KK", kwlist, &next, &end)) return NULL;
  if (end && end <= next) {
    PyErr_SetString(PyExc_ValueError, "Digest: end must be 0 (unbounded) or past next");
    return NULL;
  }
  DigestObject *self = (DigestObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->d = tent_digest_new(next, end);
  if (!self->d) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return (PyObject *)self;
}

static void Digest_dealloc(DigestObject *self) {
  tent_digest_drop(self->d); /* an executor may still hold it (a slice in flight after a timeout) */
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Digest_reset(DigestObject *self, PyObject *arg) {
  unsigned long long next = PyLong_AsUnsignedLongLong(arg);
  if (next == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  tent_digest_reset(self->d, next);
  Py_RETURN_NONE;
}

/* update(buffer): fold the buffer's bytes (the stream's next ones); `next` advances by its length */
static PyObject *Digest_update(DigestObject *self, PyObject *arg) {
  Py_buffer v;
  if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
  if (v.len >= (1 << 16)) {
    Py_BEGIN_ALLOW_THREADS;
    tent_digest_update(self->d, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS;
  } else {
    tent_digest_update(self->d, v.buf, (size_t)v.len);
  }
  PyBuffer_Release(&v);
  Py_RETURN_NONE;
}

/* land(buffer, wait=True): the buffer's bytes (at their own address) landed: fold what of them
 * continues the stream (see tent_digest_land); returns the bytes this call hashed */
static PyObject *Digest_land(DigestObject *self, PyObject *args) {
  Py_buffer v;
  int wait = 1;
  if (!PyArg_ParseTuple(args, "y*|p", &v, &wait)) return NULL;
  uint64_t got;
  Py_BEGIN_ALLOW_THREADS; /* it may wait for another thread's hash, and hashes MiBs itself */
  got = tent_digest_land(self->d, v.buf, (size_t)v.len, wait);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&v);
  return PyLong_FromUnsignedLongLong(got);
}

/* copy(dst, src) -> folded: memcpy src into dst (same length) the way an executor copies a READ
 * (tent_digest_copy): when dst is where the stream stands, its new bytes are folded in the same pass */
static PyObject *Digest_copy(DigestObject *self, PyObject *args) {
  Py_buffer dst, src;
  if (!PyArg_ParseTuple(args, "w*y*", &dst, &src)) return NULL;
  if (dst.len != src.len) {
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyErr_SetString(PyExc_ValueError, "Digest.copy: dst and src differ in length");
    return NULL;
  }
  int folded;
  Py_BEGIN_ALLOW_THREADS;
  folded = tent_digest_copy(self->d, dst.buf, src.buf, (size_t)dst.len);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&dst);
  PyBuffer_Release(&src);
  return PyBool_FromLong(folded);
}

static PyObject *Digest_intdigest(DigestObject *self, PyObject *unused) {
  uint64_t v;
  Py_BEGIN_ALLOW_THREADS; /* waits for a thread hashing now */
  v = tent_digest_value(self->d);
  Py_END_ALLOW_THREADS;
  return PyLong_FromUnsignedLongLong(v);
}

static PyObject *Digest_get_next(DigestObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->d->next); }
static PyObject *Digest_get_folded(DigestObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->d->folded); }
static PyObject *Digest_get_late(DigestObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->d->late); }
static PyObject *Digest_get_start(DigestObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->d->start); }
static PyObject *Digest_get_end(DigestObject *self, void *c) { return PyLong_FromUnsignedLongLong(self->d->end); }

static PyMethodDef Digest_methods[] = {
    {"reset", (PyCFunction)Digest_reset, METH_O, "reset(next): empty digest; the stream starts at address next"},
    {"update", (PyCFunction)Digest_update, METH_O, "update(buffer): fold the stream's next bytes"},
    {"land", (PyCFunction)Digest_land, METH_VARARGS,
     "land(buffer, wait=True) -> bytes hashed here: the buffer's bytes landed at their address; fold what "
     "continues the stream (with wait, after a thread hashing now)"},
    {"copy", (PyCFunction)Digest_copy, METH_VARARGS,
     "copy(dst, src) -> folded: copy src into dst (same length); when dst continues the stream (its address "
     "is next) its new bytes are folded in the same pass, else a plain copy (False)"},
    {"intdigest", (PyCFunction)Digest_intdigest, METH_NOARGS, "xxh3_64 of the bytes folded so far"},
    {NULL}};

static PyGetSetDef Digest_getset[] = {
    {"next", (getter)Digest_get_next, NULL, "local address of the stream's next byte to fold", NULL},
    {"folded", (getter)Digest_get_folded, NULL, "bytes folded so far", NULL},
    {"late", (getter)Digest_get_late, NULL, "of folded, bytes hashed from notes: they landed ahead of the stream", NULL},
    {"start", (getter)Digest_get_start, NULL, "local address where the stream starts", NULL},
    {"end", (getter)Digest_get_end, NULL, "local address where the stream ends (0: unbounded)", NULL},
    {NULL}};

static PyTypeObject DigestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.Digest",
    .tp_basicsize = sizeof(DigestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Digest(next=0, end=0): a running xxh3_64 of the stream of local memory [next, end) (end 0: "
              "unbounded); a transport that copies a READ inside engine.submit(..., digest=d) (inline_digest), or "
              "receives one (receive_digest), folds it in; thread-safe",
    .tp_new = Digest_new,
    .tp_dealloc = (destructor)Digest_dealloc,
    .tp_methods = Digest_methods,
    .tp_getset = Digest_getset,
};

/* The digests of a submit's digest= (None, a Digest, or a list/tuple of them; None entries are
 * skipped) into out[ARM_MAX]; -1 with an exception set. The caller keeps the objects alive. */
static int parse_digests(PyObject *o, tent_digest_t **out, uint32_t *n) {
  *n = 0;
  if (o == Py_None) return 0;
  if (PyObject_TypeCheck(o, &DigestType)) {
    out[(*n)++] = ((DigestObject *)o)->d;
    return 0;
  }
  if (PyList_Check(o) || PyTuple_Check(o)) {
    Py_ssize_t k = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    Py_ssize_t i = 0;
    for (; i < k; i++) {
      if (items[i] == Py_None) continue;
      if (!PyObject_TypeCheck(items[i], &DigestType)) break;
      if (*n >= ARM_MAX) {
        PyErr_Format(PyExc_ValueError, "submit: at most %d digests (tent_core.DIGESTS_PER_SUBMIT), got more", ARM_MAX);
        return -1;
      }
      out[(*n)++] = ((DigestObject *)items[i])->d;
    }
    if (i == k) return 0;
  }
  PyErr_SetString(PyExc_TypeError, "submit: digest must be a tent_core.Digest, a list of them, or None");
  return -1;
}

/* digest_arm(digest, a list of them, or None): what this thread's submits fold their READs into,
 * until disarmed (None). The caller keeps the objects alive while they are armed (the planner's
 * submit path). */
static PyObject *py_digest_arm(PyObject *m, PyObject *arg) {
  uint32_t n;
  if (parse_digests(arg, tl_arm_buf, &n) < 0) return NULL;
  tl_digests = tl_arm_buf;
  tl_ndigest = n;
  Py_RETURN_NONE;
}

/* wait_arm(buffer of packed tent_wait_t, or None): the conditions this thread's submits hand to the
 * executors that ask (tent_host_wait), until disarmed (None). Copied: the caller's buffer may go. */
static PyObject *py_wait_arm(PyObject *m, PyObject *arg) {
  (void)m;
  if (arg == Py_None) {
    tl_nwait = 0;
    Py_RETURN_NONE;
  }
  Py_buffer v;
  if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
  if (v.len % (Py_ssize_t)sizeof(tent_wait_t) || v.len / (Py_ssize_t)sizeof(tent_wait_t) > WAIT_ARM_MAX) {
    PyBuffer_Release(&v);
    PyErr_Format(PyExc_ValueError, "wait_arm: a whole number of %zu-byte tent_wait_t, at most %d",
                 sizeof(tent_wait_t), WAIT_ARM_MAX);
    return NULL;
  }
  uint32_t n = (uint32_t)(v.len / (Py_ssize_t)sizeof(tent_wait_t));
  if (n > tl_wait_cap) {
    tent_wait_t *w = realloc(tl_waits, (size_t)n * sizeof *w);
    if (!w) {
      PyBuffer_Release(&v);
      return PyErr_NoMemory();
    }
    tl_waits = w;
    tl_wait_cap = n;
    /* freed at the thread's exit with its batch cache (batch_cache_drop) */
    if (!tl_registered && pthread_setspecific(g_batch_cache_key, (void *)1) == 0) tl_registered = 1;
  }
  if (n) memcpy(tl_waits, v.buf, (size_t)n * sizeof(tent_wait_t));
  tl_nwait = n;
  PyBuffer_Release(&v);
  Py_RETURN_NONE;
}

/* ---- submit ---- */
static int stamp_and_account(tent_slice_t *s, uint64_t token, uint64_t t) {
  s->token = token;
  s->submit_ns = t;
  int64_t *st = slot(s->stat_index);
  if (st) {
    __atomic_fetch_add(&st[TENT_STAT_INFLIGHT_BYTES], (int64_t)s->length, __ATOMIC_RELAXED);
    /* in flight first, then the generation (both seq_cst, against stat_retire/stat_claim): either
     * the slot's reuse sees this slice in flight and waits, or this sees the slot retired */
    __atomic_fetch_add(&st[TENT_STAT_INFLIGHT_SLICES], 1, __ATOMIC_SEQ_CST);
    uint32_t gen = s->stat_index >> STAT_SLOT_BITS;
    if (!gen || __atomic_load_n(&st[TENT_STAT_GENERATION], __ATOMIC_SEQ_CST) != (int64_t)gen) {
      __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_BYTES], (int64_t)s->length, __ATOMIC_RELAXED);
      __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_SLICES], 1, __ATOMIC_RELEASE);
      s->stat_index = STAT_NONE; /* its rail is gone: it counts nowhere, here and at completion */
    }
  }
  return 0;
}

static void unaccount(const tent_slice_t *s) {
  int64_t *st = slot(s->stat_index);
  if (st) {
    __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_BYTES], (int64_t)s->length, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_SLICES], 1, __ATOMIC_RELAXED);
  }
}

/* ---- live executors ----
 * Every executor the core may submit to is registered here when created and retired before it is
 * destroyed. submit() looks its (ops, handle) pair up under the read lock and holds it across the
 * executor's submit call, so a retired or never-created handle is refused (TENT_E_INTERNAL), and
 * retire() returns only when no submit is inside the executor any more: destroy can follow safely. */
typedef struct live_exec {
  uint64_t ops, handle;
} live_exec_t;

static live_exec_t *g_live = NULL;
static size_t g_live_len = 0, g_live_cap = 0;

/* The table's lock (tent/reader_lock.h): a submit pays two locked instructions; writers
 * (register, retire: engine start and close) hold new submits back and wait for those inside to
 * leave. Readers never nest (an executor call does not enter another). */
static tent_reader_lock_t g_live_lock = TENT_READER_LOCK_INIT;
static inline void live_read_lock(void) { tent_rl_read_lock(&g_live_lock); }
static inline void live_read_unlock(void) { tent_rl_read_unlock(&g_live_lock); }
static void live_write_lock(void) { tent_rl_write_lock(&g_live_lock); } /* GIL released */
static void live_write_unlock(void) { tent_rl_write_unlock(&g_live_lock); }

static int live_find(uint64_t ops, uint64_t handle) { /* read lock held */
  for (size_t i = 0; i < g_live_len; i++)
    if (g_live[i].handle == handle && g_live[i].ops == ops) return 1;
  return 0;
}

/* Lock the executor for one submit; 0 when it is not live (nothing locked then). */
static int exec_enter(uint64_t ops, uint64_t handle) {
  if (!ops || !handle) return 0;
  live_read_lock();
  if (live_find(ops, handle)) return 1;
  live_read_unlock();
  return 0;
}

static void exec_leave(void) { live_read_unlock(); }

static PyObject *py_executor_register(PyObject *m, PyObject *args) {
  unsigned long long ops_p, exec_p;
  if (!PyArg_ParseTuple(args, "KK", &ops_p, &exec_p)) return NULL;
  if (!ops_p || !exec_p) {
    PyErr_SetString(PyExc_ValueError, "executor ops and handle must be non-zero");
    return NULL;
  }
  const tent_executor_ops_t *ops = (const tent_executor_ops_t *)(uintptr_t)ops_p;
  if (ops->abi_version != TENT_EXECUTOR_ABI_VERSION || ops->struct_size < TENT_EXECUTOR_OPS_BASE_SIZE || !ops->submit) {
    PyErr_SetString(PyExc_ValueError, "executor ops table has the wrong ABI version or size");
    return NULL;
  }
  int rc = 0;
  Py_BEGIN_ALLOW_THREADS;
  live_write_lock();
  if (!live_find(ops_p, exec_p)) {
    if (g_live_len == g_live_cap) {
      size_t cap = g_live_cap ? g_live_cap * 2 : 16;
      live_exec_t *n = realloc(g_live, cap * sizeof *n);
      if (!n) rc = -1;
      else {
        g_live = n;
        g_live_cap = cap;
      }
    }
    if (rc == 0) g_live[g_live_len++] = (live_exec_t){ops_p, exec_p};
  }
  live_write_unlock();
  Py_END_ALLOW_THREADS;
  if (rc) return PyErr_NoMemory();
  Py_RETURN_NONE;
}

/* executor_retire(ops, handle) -> bool: after return no submit reaches the executor (it waits for
 * submits in progress). False when it was not registered. */
static PyObject *py_executor_retire(PyObject *m, PyObject *args) {
  unsigned long long ops_p, exec_p;
  if (!PyArg_ParseTuple(args, "KK", &ops_p, &exec_p)) return NULL;
  int found = 0;
  Py_BEGIN_ALLOW_THREADS;
  live_write_lock();
  for (size_t i = 0; i < g_live_len; i++)
    if (g_live[i].handle == exec_p && g_live[i].ops == ops_p) {
      g_live[i] = g_live[--g_live_len];
      found = 1;
      break;
    }
  live_write_unlock();
  Py_END_ALLOW_THREADS;
  return PyBool_FromLong(found);
}

static inline tent_executor_ops_t *ops_of(uint64_t ops_p) { return (tent_executor_ops_t *)(uintptr_t)ops_p; }

static inline int ops_has_inline(const tent_executor_ops_t *ops) {
  return ops->struct_size >= TENT_EXECUTOR_OPS_INLINE_SIZE && ops->submit_inline != NULL;
}

static inline int ops_has_progress(const tent_executor_ops_t *ops) {
  return ops->struct_size >= TENT_EXECUTOR_OPS_PROGRESS_SIZE && ops->progress != NULL;
}

/* Let the executor that may have left work of `b` to its waiter finish some (or hand it off). */
static int batch_progress(batch_t *b, int64_t budget_ns) {
  uint64_t ops_p = atomic_load(&b->poll_ops), exec_p = atomic_load(&b->poll_exec);
  if (!ops_p || !exec_enter(ops_p, exec_p)) return 0;
  int rc = ops_of(ops_p)->progress((void *)(uintptr_t)exec_p, (uintptr_t)b, budget_ns);
  exec_leave();
  return rc;
}

/* Stamp, account and hand n slices to a live executor (its submit_inline when `want_inline` and it
 * has one). Returns the executor's rc; on a refusal the slices are unaccounted again (none was
 * reported: the caller finalizes them). TENT_E_INTERNAL when (ops, exec) is not live. */
static int exec_submit_at(uint64_t ops_p, uint64_t exec_p, batch_t *b, tent_slice_t *s, uint32_t n, int want_inline,
                          uint64_t t) {
  if (!exec_enter(ops_p, exec_p)) return TENT_E_INTERNAL;
  const tent_executor_ops_t *ops = ops_of(ops_p);
  uint64_t token = (uintptr_t)b;
  if (tl_nwait && !b->waits) { /* Engine.submit_when: the batch keeps its conditions (retries too) */
    b->waits = malloc((size_t)tl_nwait * sizeof *b->waits);
    if (!b->waits) {
      exec_leave();
      return TENT_E_INTERNAL;
    }
    memcpy(b->waits, tl_waits, (size_t)tl_nwait * sizeof *b->waits);
    b->nwaits = tl_nwait;
  }
  for (uint32_t i = 0; i < n; i++) stamp_and_account(&s[i], token, t);
  int inl = want_inline && ops_has_inline(ops);
  if (inl && ops_has_progress(ops)) { /* it may leave work to the waiter: one such executor per batch */
    unsigned long long none = 0;
    if (atomic_compare_exchange_strong(&b->poll_ops, &none, ops_p)) atomic_store(&b->poll_exec, exec_p);
    else inl = none == ops_p && atomic_load(&b->poll_exec) == exec_p;
  }
  int rc = inl ? ops->submit_inline((void *)(uintptr_t)exec_p, s, n) : ops->submit((void *)(uintptr_t)exec_p, s, n);
  exec_leave();
  /* the progress thread watches them (deadlines, stalls, telemetry): woken if it slept, after the
   * executor took them, so that the first request after a sleep is under way before the wake-up */
  progress_poke();
  if (rc != 0)
    for (uint32_t i = 0; i < n; i++) unaccount(&s[i]);
  return rc;
}

/* exec_submit_at called with the GIL held. With a digest armed, an inline READ is a copy + hash of
 * up to the transport's inline size (MiBs) on this thread: run without the GIL, so the caller's
 * other threads (one lane per core, each folding its own stream) copy at the same time. */
static int exec_submit_gil(uint64_t ops_p, uint64_t exec_p, batch_t *b, tent_slice_t *s, uint32_t n, int want_inline,
                           uint64_t t) {
  if (!(want_inline && tl_ndigest)) return exec_submit_at(ops_p, exec_p, b, s, n, want_inline, t);
  int rc;
  Py_BEGIN_ALLOW_THREADS;
  rc = exec_submit_at(ops_p, exec_p, b, s, n, want_inline, t);
  Py_END_ALLOW_THREADS;
  return rc;
}

static int exec_submit(uint64_t ops_p, uint64_t exec_p, batch_t *b, tent_slice_t *s, uint32_t n, int want_inline) {
  return exec_submit_gil(ops_p, exec_p, b, s, n, want_inline, now_ns());
}

/* submit(ops, exec, batch, slices_buffer, inline=False) -> 0 or negative status. The buffer holds
 * n tent_slice_t; token and submit_ns are filled in here. TENT_E_INTERNAL (nothing submitted)
 * when (ops, exec) is not a live executor. With inline, the executor may run the slices on this
 * thread (see submit_inline in executor_abi.h). */
static PyObject *py_submit(PyObject *m, PyObject *args) {
  unsigned long long ops_p, exec_p;
  BatchObject *bo;
  Py_buffer view;
  int want_inline = 0;
  if (!PyArg_ParseTuple(args, "KKO!w*|p", &ops_p, &exec_p, &BatchType, &bo, &view, &want_inline)) return NULL;
  if (view.len % sizeof(tent_slice_t)) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "slice buffer size is not a multiple of sizeof(tent_slice_t)");
    return NULL;
  }
  int rc = exec_submit(ops_p, exec_p, bo->b, (tent_slice_t *)view.buf, (uint32_t)(view.len / sizeof(tent_slice_t)), want_inline);
  PyBuffer_Release(&view);
  return PyLong_FromLong(rc);
}

/* submit_one(ops, exec, batch, opcode, local, remote, length, peer, rail, stat_index, attempt[, inline]) */
static PyObject *py_submit_one(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
  if ((nargs != 11 && nargs != 12) || !PyObject_TypeCheck(args[2], &BatchType)) {
    PyErr_SetString(PyExc_TypeError, "submit_one(ops, exec, batch, opcode, local, remote, length, peer, rail, stat, attempt[, inline])");
    return NULL;
  }
  tent_slice_t s;
  unsigned long long v[11];
  for (int i = 0; i < 11; i++) {
    if (i == 2) continue;
    v[i] = PyLong_AsUnsignedLongLong(args[i]);
    if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  int want_inline = nargs == 12 ? PyObject_IsTrue(args[11]) : 0;
  if (want_inline < 0) return NULL;
  s.opcode = (uint32_t)v[3];
  s.local_addr = v[4];
  s.remote_addr = v[5];
  s.length = v[6];
  s.peer = v[7];
  s.rail = (uint32_t)v[8];
  s.stat_index = (uint32_t)v[9];
  s.attempt = (uint32_t)v[10];
  return PyLong_FromLong(exec_submit(v[0], v[1], ((BatchObject *)args[2])->b, &s, 1, want_inline));
}

/* executor_inline(ops) -> bool: the ops table has submit_inline */
static PyObject *py_executor_inline(PyObject *m, PyObject *arg) {
  unsigned long long ops_p = PyLong_AsUnsignedLongLong(arg);
  if (ops_p == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (!ops_p) Py_RETURN_FALSE;
  return PyBool_FromLong(ops_has_inline(ops_of(ops_p)));
}

/* ---- the fast path ------------------------------------------------------------------------- */

/* RemoteSegment(rows): a peer's segment as the fast path checks it; rows are (offset, addr, length,
 * perm, kind) sorted by offset (the order PeerDirectory keeps). Lookup is a bisection, so the cost
 * of a request does not grow with the number of buffers in the segment. */
typedef struct {
  uint64_t off, addr, len;
  uint32_t perm;
  int32_t kind;
} rbuf_t;

typedef struct {
  PyObject_HEAD rbuf_t *b;
  Py_ssize_t n;
} RemoteSegmentObject;

static PyObject *RemoteSegment_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  PyObject *rows;
  if (!PyArg_ParseTuple(args, "O", &rows)) return NULL;
  PyObject *seq = PySequence_Fast(rows, "RemoteSegment(rows): rows must be a sequence");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  RemoteSegmentObject *self = (RemoteSegmentObject *)type->tp_alloc(type, 0);
  if (!self) goto fail;
  self->b = PyMem_Calloc(n ? (size_t)n : 1, sizeof(rbuf_t));
  if (!self->b) {
    PyErr_NoMemory();
    goto fail;
  }
  self->n = n;
  for (Py_ssize_t i = 0; i < n; i++) {
    unsigned long long off, addr, len;
    unsigned int perm;
    int kind;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KKKIi", &off, &addr, &len, &perm, &kind)) goto fail;
    if (i > 0 && off < self->b[i - 1].off) {
      PyErr_SetString(PyExc_ValueError, "RemoteSegment rows must be sorted by offset");
      goto fail;
    }
    self->b[i] = (rbuf_t){off, addr, len, perm, kind};
  }
  Py_DECREF(seq);
  return (PyObject *)self;
fail:
  Py_DECREF(seq);
  Py_XDECREF(self);
  return NULL;
}

static void RemoteSegment_dealloc(RemoteSegmentObject *self) {
  PyMem_Free(self->b);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t RemoteSegment_len(RemoteSegmentObject *self) { return self->n; }

/* extended(rows) -> a new RemoteSegment: these rows, then `rows` (which must sort after them).
 * A copy of the table plus the new rows: the peer registered more buffers. */
static PyObject *RemoteSegment_extended(RemoteSegmentObject *self, PyObject *rows) {
  PyObject *args = PyTuple_Pack(1, rows);
  if (!args) return NULL;
  RemoteSegmentObject *tail = (RemoteSegmentObject *)RemoteSegment_new(Py_TYPE(self), args, NULL);
  Py_DECREF(args);
  if (!tail) return NULL;
  if (self->n && tail->n && tail->b[0].off < self->b[self->n - 1].off) {
    Py_DECREF(tail);
    PyErr_SetString(PyExc_ValueError, "extended(): rows must sort after the segment's");
    return NULL;
  }
  rbuf_t *all = PyMem_Calloc((size_t)(self->n + tail->n) + 1, sizeof(rbuf_t));
  if (!all) {
    Py_DECREF(tail);
    return PyErr_NoMemory();
  }
  memcpy(all, self->b, (size_t)self->n * sizeof(rbuf_t));
  memcpy(all + self->n, tail->b, (size_t)tail->n * sizeof(rbuf_t));
  PyMem_Free(tail->b);
  tail->b = all;
  tail->n += self->n;
  return (PyObject *)tail;
}

static PyMethodDef RemoteSegment_methods[] = {
    {"extended", (PyCFunction)RemoteSegment_extended, METH_O, "extended(rows) -> a new RemoteSegment with rows appended"},
    {NULL}};

/* The buffer holding [pos, pos+len) whole, or NULL. */
static const rbuf_t *rseg_find(const RemoteSegmentObject *rs, uint64_t pos, uint64_t len) {
  Py_ssize_t lo = 0, hi = rs->n;
  while (lo < hi) { /* first buffer with off > pos */
    Py_ssize_t mid = (lo + hi) / 2;
    if (rs->b[mid].off <= pos)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return NULL;
  const rbuf_t *b = &rs->b[lo - 1];
  if (pos - b->off >= b->len || len > b->len - (pos - b->off)) return NULL;
  return b;
}

static PySequenceMethods RemoteSegment_seq = {.sq_length = (lenfunc)RemoteSegment_len};

static PyTypeObject RemoteSegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.RemoteSegment",
    .tp_basicsize = sizeof(RemoteSegmentObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = RemoteSegment_new,
    .tp_dealloc = (destructor)RemoteSegment_dealloc,
    .tp_as_sequence = &RemoteSegment_seq,
    .tp_methods = RemoteSegment_methods,
    .tp_doc = "RemoteSegment(rows of (offset, addr, length, perm, kind)): a peer segment for the fast path",
};

/* ---- the mouse policy of a route of several rails (slice_scheduler.pick_mouse, in C) -------------
 * A mouse (a request below small_request_threshold) goes whole to one rail. Its choice, per request:
 * among the admitted rails (health weight > 0), round robin among those whose predicted cost
 * (b0 + b1 (A + L) / B) P / weight is within (1 + gamma) of the best; then a rail no sample
 * confirmed for bandwidth_stale_s while it held no work takes it instead (the longest unconfirmed
 * first) unless the pick is stale itself. Every float operation is the Python one's, in its order
 * (C11, so no contraction into fused multiply-adds): both decide alike from the same numbers
 * (tests/test_mouse_policy.py compares them on random rail states). */
#define MOUSE_RR 1
#define MOUSE_STALE 2
#define FAST_MAX_RAILS 16

typedef struct {
  int64_t queued; /* A: in flight + assigned + other processes' load, bytes */
  double bw, penalty, weight;
  int64_t confirmed_ns; /* < 0: never observed */
  int busy;
  int64_t pending, pending_ns;
} mouse_view_t;

typedef struct {
  double b0, b1, gamma, stale_s;
} mouse_policy_t;

/* QoS priority slots (qos.PrioritySlots): `seen` is the PrioritySlots' own list (when each
 * priority was last planned, None: never), noted here as the planner notes it */
typedef struct {
  PyObject *seen;
  int64_t interval_ns, active_ns;
} mouse_qos_t;

#define QOS_PRIOS 3

/* PrioritySlots.note: -1 (an exception set) when the list is not one of QOS_PRIOS entries */
static int qos_note(const mouse_qos_t *q, long prio, int64_t now) {
  if (!PyList_CheckExact(q->seen) || PyList_GET_SIZE(q->seen) != QOS_PRIOS) {
    PyErr_SetString(PyExc_TypeError, "QoS slots: seen must be a list of 3");
    return -1;
  }
  PyObject *t = PyLong_FromLongLong(now);
  if (!t) return -1;
  long k = prio < 0 ? 0 : prio > QOS_PRIOS - 1 ? QOS_PRIOS - 1 : prio;
  PyObject *old = PyList_GET_ITEM(q->seen, k);
  PyList_SET_ITEM(q->seen, k, t);
  Py_XDECREF(old);
  return 0;
}

/* PrioritySlots.contended */
static int qos_contended(const mouse_qos_t *q, long prio, int64_t now) {
  if (q->active_ns == 0) return 1;
  for (long p = 0; p < prio && p < QOS_PRIOS; p++) {
    PyObject *x = PyList_GET_ITEM(q->seen, p);
    if (x == Py_None) continue;
    long long seen = PyLong_AsLongLong(x);
    if (seen == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      continue;
    }
    if (now - seen <= q->active_ns) return 1;
  }
  return 0;
}

/* -1: no rail (every one excluded); -2: an exception is set */
static int mouse_pick(const mouse_view_t *v, int n, int64_t length, uint64_t rr, const mouse_policy_t *p,
                      int64_t now, long prio, const mouse_qos_t *q, int *flags) {
  int cand[FAST_MAX_RAILS], near[FAST_MAX_RAILS], nc = 0, nn = 0;
  double costs[FAST_MAX_RAILS];
  *flags = 0;
  for (int j = 0; j < n && j < FAST_MAX_RAILS; j++)
    if (v[j].weight > 0) cand[nc++] = j;
  if (nc == 0) return -1;
  if (q && nc > 1) {
    if (qos_note(q, prio, now) < 0) return -2;
    if (prio > 0 && n > 1 && qos_contended(q, prio, now)) { /* PrioritySlots.admitted */
      int64_t e = now / q->interval_ns;
      int ok[FAST_MAX_RAILS], nok = 0;
      for (int k = 0; k < nc; k++)
        if ((cand[k] + e) % n >= prio) ok[nok++] = cand[k];
      if (nok) {
        memcpy(cand, ok, sizeof(int) * (size_t)nok);
        nc = nok;
      }
    }
  }
  if (nc == 1) return cand[0];
  double best = 0;
  for (int k = 0; k < nc; k++) {
    const mouse_view_t *x = &v[cand[k]];
    costs[k] = (p->b0 + p->b1 * (double)(x->queued + length) / x->bw) * x->penalty / x->weight;
    if (k == 0 || costs[k] < best) best = costs[k];
  }
  double limit = best * (1.0 + p->gamma);
  for (int k = 0; k < nc; k++)
    if (costs[k] <= limit) near[nn++] = cand[k];
  if (nn == 0) return -1; /* NaN costs (a malformed state): the planner decides */
  int r = near[rr % (uint64_t)nn];
  *flags = MOUSE_RR;
  if (p->stale_s != 0) {
    double best_age = 0.0;
    int stale = -1, r_stale = 0;
    for (int k = 0; k < nc; k++) {
      const mouse_view_t *x = &v[cand[k]];
      if (x->confirmed_ns < 0 || x->busy) continue;
      int64_t last = x->confirmed_ns;
      if (x->pending > 0 && x->pending_ns > last) last = x->pending_ns;
      double age = (double)(now - last) * 1e-9;
      if (!(age > 0.0)) age = 0.0;
      if (age > p->stale_s) {
        if (cand[k] == r) r_stale = 1;
        if (age > best_age) {
          best_age = age;
          stale = cand[k];
        }
      }
    }
    if (stale >= 0 && !r_stale) {
      r = stale;
      *flags |= MOUSE_STALE;
    }
  }
  return r;
}

/* mouse_pick(views, length, rr, (b0, b1, gamma, stale_s), now_ns, priority=0, qos=None) -> (position
 * or -1, flags): the fast path's choice on views given as tuples (slice_scheduler.MouseView's
 * fields), for tests; qos: (seen list, interval_ns, active_ns) of a PrioritySlots, noted in place. */
static PyObject *py_mouse_pick(PyObject *m, PyObject *args) {
  PyObject *views, *qos = Py_None;
  long long length, now;
  long prio = 0;
  unsigned long long rr;
  mouse_policy_t pol;
  mouse_qos_t q;
  if (!PyArg_ParseTuple(args, "OLK(dddd)L|lO", &views, &length, &rr, &pol.b0, &pol.b1, &pol.gamma, &pol.stale_s, &now,
                        &prio, &qos))
    return NULL;
  if (qos != Py_None) {
    long long iv, act;
    if (!PyArg_ParseTuple(qos, "O!LL", &PyList_Type, &q.seen, &iv, &act)) return NULL;
    if (iv <= 0 || act < 0) return PyErr_Format(PyExc_ValueError, "bad QoS slots");
    q.interval_ns = iv;
    q.active_ns = act;
  }
  PyObject *seq = PySequence_Fast(views, "views must be a sequence");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > FAST_MAX_RAILS) {
    Py_DECREF(seq);
    return PyErr_Format(PyExc_ValueError, "at most %d rails", FAST_MAX_RAILS);
  }
  mouse_view_t v[FAST_MAX_RAILS];
  for (Py_ssize_t j = 0; j < n; j++) {
    int busy;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "LdddLpLL", &v[j].queued, &v[j].bw, &v[j].penalty,
                          &v[j].weight, &v[j].confirmed_ns, &busy, &v[j].pending, &v[j].pending_ns)) {
      Py_DECREF(seq);
      return NULL;
    }
    v[j].busy = busy;
  }
  Py_DECREF(seq);
  int flags;
  int r = mouse_pick(v, (int)n, length, rr, &pol, now, prio, qos != Py_None ? &q : NULL, &flags);
  if (r == -2) return NULL;
  return Py_BuildValue("(ii)", r, flags);
}

/* The per-rail state the fast path's mouse choice reads, one row per telemetry slot, published by
 * the engine (FastPath.rail_publish: when a plan is cached, then at each health tick and after
 * each plan over the rail while rail_watched says a cached entry reads it; the weight alone when
 * a slice fails) from the rail's telemetry and health. `added` is what the fast path itself gave the rail
 * since: the health tick folds it into the telemetry's pending bytes (rail_added) and publishes
 * again with it taken off, so no byte is counted twice or lost in between. */
typedef struct {
  uint64_t stat_index; /* the rail holding the slot when it was published (0: never) */
  int64_t base;        /* in flight + other processes' load */
  int64_t pending, pending_ns, confirmed_ns;
  int64_t added, added_ns;
  double bw, penalty, weight;
  int busy;
  uint64_t entry_gen; /* 1 + the generation of the last cached entry naming the rail (0: none) */
} rail_row_t;

/* FastEntry: the cached plan of one class of requests (remote segment, local buffer, op, priority,
 * tag): where the bytes go (one transport, one rail) and how they are cut. Valid while the fast
 * path's generation is the one it was made under. */
typedef struct {
  PyObject_HEAD uint64_t gen;
  PyObject *local;  /* the LocalBuffer (identity is checked; kept alive by the entry) */
  uint64_t laddr, llen;
  RemoteSegmentObject *rseg;
  int32_t rkind;    /* the remote memory kind the plan was made for */
  uint32_t perm;    /* permission bit the op needs */
  uint32_t opcode;
  uint64_t ops, exec, link, slot;
  uint32_t rail;
  uint64_t split;      /* cut requests longer than this into slices of this size (0: never) */
  uint64_t inline_max; /* slices up to this long may run on the caller's thread (0: never) */
  PyObject *route, *decision;
  /* a route of several rails (mice only): the candidates (rail index, stat index), chosen per
   * request by mouse_pick over the FastPath's rail rows; nrails 0: the one rail above */
  int nrails;
  uint32_t rails_idx[FAST_MAX_RAILS];
  uint64_t rails_slot[FAST_MAX_RAILS];
} FastEntryObject;

static PyObject *FastEntry_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"gen", "local", "laddr", "llen", "rseg", "rkind", "perm", "opcode", "ops", "executor",
                           "link", "rail", "slot", "split", "inline_max", "route", "decision", "rails", NULL};
  unsigned long long gen, laddr, llen, ops, exec, link, slot, split, inline_max;
  PyObject *local, *route, *decision, *rails = Py_None;
  RemoteSegmentObject *rseg;
  int rkind;
  unsigned int perm, opcode, rail;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "KOKKO!iIIKKKIKKKOO|O", kwlist, &gen, &local, &laddr, &llen,
                                   &RemoteSegmentType, &rseg, &rkind, &perm, &opcode, &ops, &exec, &link, &rail,
                                   &slot, &split, &inline_max, &route, &decision, &rails))
    return NULL;
  uint32_t ridx[FAST_MAX_RAILS];
  uint64_t rslot[FAST_MAX_RAILS];
  int nrails = 0;
  if (rails != Py_None) {
    PyObject *seq = PySequence_Fast(rails, "rails must be a sequence of (rail index, stat index)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 2 || n > FAST_MAX_RAILS) {
      Py_DECREF(seq);
      return PyErr_Format(PyExc_ValueError, "rails: 2 to %d candidates, got %zd", FAST_MAX_RAILS, n);
    }
    for (Py_ssize_t j = 0; j < n; j++) {
      unsigned int ri;
      unsigned long long si;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "IK", &ri, &si) || si == 0) {
        Py_DECREF(seq);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rails: stat index 0");
        return NULL;
      }
      ridx[j] = ri;
      rslot[j] = si;
    }
    Py_DECREF(seq);
    nrails = (int)n;
  }
  if (opcode != TENT_OP_READ && opcode != TENT_OP_WRITE) {
    PyErr_SetString(PyExc_ValueError, "bad opcode");
    return NULL;
  }
  FastEntryObject *self = (FastEntryObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->gen = gen;
  Py_INCREF(local);
  self->local = local;
  self->laddr = laddr;
  self->llen = llen;
  Py_INCREF(rseg);
  self->rseg = rseg;
  self->rkind = rkind;
  self->perm = perm;
  self->opcode = opcode;
  self->ops = ops;
  self->exec = exec;
  self->link = link;
  self->slot = slot;
  self->rail = rail;
  self->split = split;
  self->inline_max = inline_max;
  Py_INCREF(route);
  self->route = route;
  Py_INCREF(decision);
  self->decision = decision;
  self->nrails = nrails;
  memcpy(self->rails_idx, ridx, sizeof(uint32_t) * (size_t)nrails);
  memcpy(self->rails_slot, rslot, sizeof(uint64_t) * (size_t)nrails);
  return (PyObject *)self;
}

static void FastEntry_dealloc(FastEntryObject *self) {
  Py_XDECREF(self->local);
  Py_XDECREF(self->rseg);
  Py_XDECREF(self->route);
  Py_XDECREF(self->decision);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef FastEntry_members[] = {
    {"route", T_OBJECT, offsetof(FastEntryObject, route), READONLY, NULL},
    {"decision", T_OBJECT, offsetof(FastEntryObject, decision), READONLY, NULL},
    {"local", T_OBJECT, offsetof(FastEntryObject, local), READONLY, NULL},
    {"local_lo", T_ULONGLONG, offsetof(FastEntryObject, laddr), READONLY, "first local address it covers"},
    {"llen", T_ULONGLONG, offsetof(FastEntryObject, llen), READONLY, NULL},
    {"gen", T_ULONGLONG, offsetof(FastEntryObject, gen), READONLY, NULL},
    {"split", T_ULONGLONG, offsetof(FastEntryObject, split), READONLY, NULL},
    {"inline_max", T_ULONGLONG, offsetof(FastEntryObject, inline_max), READONLY, NULL},
    {"nrails", T_INT, offsetof(FastEntryObject, nrails), READONLY, "candidate rails (0: one fixed rail)"},
    {NULL}};

static PyTypeObject FastEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.FastEntry",
    .tp_basicsize = sizeof(FastEntryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = FastEntry_new,
    .tp_dealloc = (destructor)FastEntry_dealloc,
    .tp_members = FastEntry_members,
    .tp_doc = "the cached plan of one class of requests (see FastPath)",
};

#define FAST_KEYS 1024 /* a power of two; a few hundred batches in flight seldom share a slot */

/* FastPath(request_type, handle_type, owner, inflight, default_timeout, size_keyed, max_entries) */
typedef struct {
  PyObject_HEAD uint64_t gen;
  PyObject *cache; /* key tuple -> FastEntry */
  PyTypeObject *request_type, *handle_type;
  PyObject *owner, *inflight;
  double default_timeout;
  uint64_t small_bytes; /* requests up to this long are small: their slices carry TENT_HINT_SMALL */
  int size_keyed; /* policy rules match on size: the request length is part of the key */
  int enabled;
  Py_ssize_t max_entries;
  PyObject *fallback; /* called with (requests, deadline) when the fast path cannot take a batch */
  /* request fields read straight from their slots (offsets of the slotted Request type; 0: use getattr) */
  Py_ssize_t off[8];
  Py_ssize_t off_ordering[3]; /* wait_stream, wait_event, signal_event slots (0: not slotted) */
  /* the last hit: the same class again (one request at a time) skips building the key. The
   * strings are held, so their addresses cannot be reused by other objects while compared. */
  FastEntryObject *last;
  PyObject *last_remote, *last_tag;
  long last_op, last_prio;
  long long last_len;
  /* the in-flight dict's keys of recently tracked batches, by batch address (direct-mapped): a
   * thread's submits reuse its finished batches (BATCH_CACHE of them, the same addresses), so
   * neither one request at a time nor requests queued back to back make an int per request */
  PyObject *keys[FAST_KEYS];
  uintptr_t key_tokens[FAST_KEYS];
  /* counters (tests, diagnostics) */
  unsigned long long hits, misses;
  vectorcallfunc vectorcall;
  /* mice on routes of several rails: the policy's constants, the rows it reads, its round-robin
   * cursor, and how many it placed (of them on stale rails) */
  mouse_policy_t mouse;
  int64_t mouse_theta; /* mice are shorter than this (0: no multi-rail entry serves anything) */
  mouse_qos_t qos;     /* the scheduler's QoS slots (qos.seen NULL: none) */
  rail_row_t *rows;    /* TENT stat slots' rows, allocated on the first publish */
  uint64_t mouse_rr;
  unsigned long long mice, mice_stale;
} FastPathObject;

static PyObject *s_op, *s_local, *s_local_offset, *s_remote, *s_remote_offset, *s_length, *s_priority, *s_tag;
static PyObject *FastPath_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *FastPath_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"request_type", "handle_type", "owner", "inflight", "default_timeout", "size_keyed", "max_entries",
                           "small_bytes", "fallback", NULL};
  PyObject *req_t, *handle_t, *owner, *inflight, *fallback = Py_None;
  double timeout;
  int size_keyed = 0;
  Py_ssize_t max_entries = 4096;
  unsigned long long small_bytes = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OO!d|pnKO", kwlist, &PyType_Type, &req_t, &PyType_Type, &handle_t,
                                   &owner, &PyDict_Type, &inflight, &timeout, &size_keyed, &max_entries, &small_bytes,
                                   &fallback))
    return NULL;
  if (fallback != Py_None && !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "fallback must be callable");
    return NULL;
  }
  if (!PyType_IsSubtype((PyTypeObject *)handle_t, &BatchType)) {
    PyErr_SetString(PyExc_TypeError, "handle_type must subclass _native.Batch");
    return NULL;
  }
  FastPathObject *self = (FastPathObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->cache = PyDict_New();
  if (!self->cache) {
    Py_DECREF(self);
    return NULL;
  }
  Py_INCREF(req_t);
  self->request_type = (PyTypeObject *)req_t;
  Py_INCREF(handle_t);
  self->handle_type = (PyTypeObject *)handle_t;
  Py_INCREF(owner);
  self->owner = owner;
  Py_INCREF(inflight);
  self->inflight = inflight;
  self->default_timeout = timeout;
  self->small_bytes = small_bytes;
  self->size_keyed = size_keyed;
  self->max_entries = max_entries > 0 ? max_entries : 1;
  self->enabled = 1;
  self->gen = 1;
  self->vectorcall = FastPath_vectorcall;
  Py_INCREF(fallback);
  self->fallback = fallback;
  /* requests whose stream-ordering fields are set go to the planner (the Orderer) */
  static const char *ordering_names[3] = {"wait_stream", "wait_event", "signal_event"};
  for (int i = 0; i < 3; i++) {
    PyObject *d = PyDict_GetItemString(((PyTypeObject *)req_t)->tp_dict, ordering_names[i]);
    if (d && Py_TYPE(d) == &PyMemberDescr_Type && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
      self->off_ordering[i] = ((PyMemberDescrObject *)d)->d_member->offset;
  }
  /* a slotted request type: read its fields at their offsets */
  PyObject *names[8] = {s_op, s_local, s_local_offset, s_remote, s_remote_offset, s_length, s_priority, s_tag};
  for (int i = 0; i < 8; i++) {
    PyObject *d = PyDict_GetItemWithError(((PyTypeObject *)req_t)->tp_dict, names[i]);
    if (d && Py_TYPE(d) == &PyMemberDescr_Type && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
      self->off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
  }
  PyErr_Clear();
  for (int i = 0; i < 8; i++)
    if (!self->off[i]) memset(self->off, 0, sizeof self->off); /* all or none */
  return (PyObject *)self;
}

static void fast_forget_last(FastPathObject *self) {
  Py_CLEAR(self->last);
  Py_CLEAR(self->last_remote);
  Py_CLEAR(self->last_tag);
}

static int FastPath_traverse(FastPathObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->cache);
  Py_VISIT(self->owner);
  Py_VISIT(self->inflight);
  Py_VISIT(self->fallback);
  Py_VISIT(self->last);
  Py_VISIT(self->qos.seen);
  return 0;
}

static int FastPath_clear(FastPathObject *self) {
  Py_CLEAR(self->cache);
  Py_CLEAR(self->qos.seen);
  Py_CLEAR(self->owner);
  Py_CLEAR(self->inflight);
  Py_CLEAR(self->fallback);
  for (int i = 0; i < FAST_KEYS; i++) Py_CLEAR(self->keys[i]);
  fast_forget_last(self);
  self->enabled = 0;
  return 0;
}

static void FastPath_dealloc(FastPathObject *self) {
  PyObject_GC_UnTrack(self);
  FastPath_clear(self);
  PyMem_Free(self->rows);
  Py_XDECREF(self->request_type);
  Py_XDECREF(self->handle_type);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The cache key of a request: (remote, id(local), op, priority, tag[, length]); NULL without an
 * exception when the request does not fit the fast path's key (odd types). */
static PyObject *fast_key(FastPathObject *fp, PyObject *remote, PyObject *local, long op, long prio, PyObject *tag,
                          long long length) {
  if (!PyUnicode_CheckExact(remote) || (tag != Py_None && !PyUnicode_CheckExact(tag))) return NULL;
  PyObject *key = PyTuple_New(fp->size_keyed ? 6 : 5);
  if (!key) return NULL;
  PyObject *lid = PyLong_FromVoidPtr(local), *o = PyLong_FromLong(op), *p = PyLong_FromLong(prio);
  PyObject *len = fp->size_keyed ? PyLong_FromLongLong(length) : NULL;
  if (!lid || !o || !p || (fp->size_keyed && !len)) {
    Py_XDECREF(lid);
    Py_XDECREF(o);
    Py_XDECREF(p);
    Py_XDECREF(len);
    Py_DECREF(key);
    return NULL;
  }
  Py_INCREF(remote);
  Py_INCREF(tag);
  PyTuple_SET_ITEM(key, 0, remote);
  PyTuple_SET_ITEM(key, 1, lid);
  PyTuple_SET_ITEM(key, 2, o);
  PyTuple_SET_ITEM(key, 3, p);
  PyTuple_SET_ITEM(key, 4, tag);
  if (len) PyTuple_SET_ITEM(key, 5, len);
  return key;
}

/* One request's fields, as the fast path reads them: borrowed from a slotted request's slots (the
 * caller holds the request, and nothing between the read and the last use runs Python code, except
 * where fast_submit holds its own references), new references when read by getattr (owned). */
typedef struct {
  PyObject *op, *local, *loff, *remote, *roff, *length, *prio, *tag;
  int owned;
} req_fields_t;

static void req_fields_clear(req_fields_t *f) {
  if (!f->owned) return;
  Py_XDECREF(f->op);
  Py_XDECREF(f->local);
  Py_XDECREF(f->loff);
  Py_XDECREF(f->remote);
  Py_XDECREF(f->roff);
  Py_XDECREF(f->length);
  Py_XDECREF(f->prio);
  Py_XDECREF(f->tag);
}

static inline int req_fields_read(const FastPathObject *fp, PyObject *req, req_fields_t *f) {
  f->owned = 0;
  if (fp->off[0] && Py_TYPE(req) == fp->request_type) { /* slots: no attribute lookups */
    for (int i = 0; i < 3; i++) {
      if (!fp->off_ordering[i]) continue;
      PyObject *v = *(PyObject **)((char *)req + fp->off_ordering[i]);
      if (v && v != Py_None) return -1; /* stream-ordered: the planner's */
    }
#define SLOT_(i) (*(PyObject **)((char *)req + fp->off[i]))
    f->op = SLOT_(0); /* borrowed */
    f->local = SLOT_(1);
    f->loff = SLOT_(2);
    f->remote = SLOT_(3);
    f->roff = SLOT_(4);
    f->length = SLOT_(5);
    f->prio = SLOT_(6);
    f->tag = SLOT_(7);
#undef SLOT_
    /* an unset slot */
    return f->op && f->local && f->loff && f->remote && f->roff && f->length && f->prio && f->tag ? 0 : -1;
  }
  memset(f, 0, sizeof *f);
  f->owned = 1;
  if (!(f->op = PyObject_GetAttr(req, s_op)) || !(f->local = PyObject_GetAttr(req, s_local)) ||
      !(f->loff = PyObject_GetAttr(req, s_local_offset)) || !(f->remote = PyObject_GetAttr(req, s_remote)) ||
      !(f->roff = PyObject_GetAttr(req, s_remote_offset)) || !(f->length = PyObject_GetAttr(req, s_length)) ||
      !(f->prio = PyObject_GetAttr(req, s_priority)) || !(f->tag = PyObject_GetAttr(req, s_tag))) {
    PyErr_Clear();
    return -1;
  }
  static const char *ordering_names[3] = {"wait_stream", "wait_event", "signal_event"};
  for (int i = 0; i < 3; i++) {
    PyObject *v = PyObject_GetAttrString(req, ordering_names[i]);
    int set = v && v != Py_None;
    Py_XDECREF(v);
    PyErr_Clear();
    if (set) return -1; /* stream-ordered: the planner's */
  }
  return 0;
}

/* A non-negative int field, or -1 (no exception left) when it is not one. */
static inline long long nonneg(PyObject *o) {
  if (!PyLong_Check(o)) return -1;
#if PY_VERSION_HEX < 0x030C0000
  { /* small non-negative ints (one or two 30-bit digits): read them, no conversion call */
    Py_ssize_t size = Py_SIZE(o);
    const digit *d = ((PyLongObject *)o)->ob_digit;
    if (size == 0) return 0;
    if (size == 1) return (long long)d[0];
    if (size == 2) return (long long)d[0] | ((long long)d[1] << PyLong_SHIFT);
    if (size < 0) return -1;
  }
#endif
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return -1;
  }
  return v;
}

typedef struct {
  tent_slice_t *s;
  uint8_t *inl; /* per slice: may run inline */
  uint32_t n, cap;
  tent_slice_t stack[32];
  uint8_t inl_stack[32];
} slice_buf_t;

static int slices_push(slice_buf_t *sb, const tent_slice_t *s, int inl) {
  if (sb->n == sb->cap) {
    uint32_t cap = sb->cap * 4;
    tent_slice_t *ns = PyMem_Malloc(cap * sizeof *ns);
    uint8_t *ni = PyMem_Malloc(cap);
    if (!ns || !ni) {
      PyMem_Free(ns);
      PyMem_Free(ni);
      return -1;
    }
    memcpy(ns, sb->s, sb->n * sizeof *ns);
    memcpy(ni, sb->inl, sb->n);
    if (sb->s != sb->stack) {
      PyMem_Free(sb->s);
      PyMem_Free(sb->inl);
    }
    sb->s = ns;
    sb->inl = ni;
    sb->cap = cap;
  }
  sb->inl[sb->n] = (uint8_t)inl;
  sb->s[sb->n++] = *s;
  return 0;
}

static void slices_free(slice_buf_t *sb) {
  if (sb->s != sb->stack) {
    PyMem_Free(sb->s);
    PyMem_Free(sb->inl);
  }
}

#define FAST_MAX_ENTRIES_PER_BATCH 8

/* A multi-rail mouse placed by this batch: undone (in reverse order) when the batch goes to the
 * planner after all, so the rows count only what was sent. */
typedef struct {
  rail_row_t *row;
  uint64_t stat_index; /* the rail that held the row then: a later holder's row is left alone */
  int64_t len, added_ns;
} mouse_undo_t;

typedef struct {
  mouse_undo_t *u;
  uint32_t n, cap;
  mouse_undo_t stack[16];
} undo_buf_t;

/* The rail (position among e's candidates) of a mouse of `len` bytes, or -1: not a mouse, a rail
 * not published (or its slot another rail's now), or every rail excluded (the planner decides). */
static int fast_mouse(FastPathObject *fp, FastEntryObject *e, int64_t len, long prio, int64_t now, undo_buf_t *ub) {
  if (!fp->rows || len >= fp->mouse_theta) return -1;
  mouse_view_t v[FAST_MAX_RAILS];
  for (int j = 0; j < e->nrails; j++) {
    const rail_row_t *row = &fp->rows[e->rails_slot[j] & STAT_SLOT_MASK];
    if (row->stat_index != e->rails_slot[j]) return -1;
    v[j].queued = row->base + row->pending + row->added;
    v[j].bw = row->bw;
    v[j].penalty = row->penalty;
    v[j].weight = row->weight;
    v[j].confirmed_ns = row->confirmed_ns;
    v[j].busy = row->busy;
    v[j].pending = row->pending + row->added;
    v[j].pending_ns = row->added > 0 && row->added_ns > row->pending_ns ? row->added_ns : row->pending_ns;
  }
  int flags;
  int r = mouse_pick(v, e->nrails, len, fp->mouse_rr + 1, &fp->mouse, now, prio, fp->qos.seen ? &fp->qos : NULL, &flags);
  if (r == -2) PyErr_Clear(); /* cannot happen with the list mouse_policy checked; the planner decides */
  if (r < 0) return -1;
  if (ub->n == ub->cap) {
    uint32_t cap = ub->cap * 4;
    mouse_undo_t *nu = PyMem_Malloc(cap * sizeof *nu);
    if (!nu) return -1;
    memcpy(nu, ub->u, ub->n * sizeof *nu);
    if (ub->u != ub->stack) PyMem_Free(ub->u);
    ub->u = nu;
    ub->cap = cap;
  }
  rail_row_t *row = &fp->rows[e->rails_slot[r] & STAT_SLOT_MASK];
  ub->u[ub->n++] = (mouse_undo_t){row, row->stat_index, len, row->added_ns};
  row->added += len; /* as the planner's add_pending: the next mouse sees this one's bytes */
  row->added_ns = now;
  if (flags & MOUSE_RR) fp->mouse_rr++;
  fp->mice++;
  if (flags & MOUSE_STALE) fp->mice_stale++;
  return r;
}

static void mouse_undo(FastPathObject *fp, undo_buf_t *ub, uint64_t rr, unsigned long long mice,
                       unsigned long long stale) {
  while (ub->n) {
    mouse_undo_t *x = &ub->u[--ub->n];
    /* a collection run by a later request's key may have let another thread publish the slot
     * for a new rail (its row starts from zero): nothing of this mouse is in it */
    if (x->row->stat_index != x->stat_index) continue;
    x->row->added -= x->len;
    x->row->added_ns = x->added_ns;
  }
  fp->mouse_rr = rr;
  fp->mice = mice;
  fp->mice_stale = stale;
}

/* submit(requests, deadline) -> handle, or None when the planner must run (a miss, a stale entry,
 * or anything it would report as an error). Never raises for a bad request: the planner does. */
/* The fast path proper. `sync` (run(): the caller waits right away): a batch that finished inside
 * this call without an error is not given a handle at all; *finished is then 1 and None returned. */
static PyObject *fast_submit(FastPathObject *fp, PyObject *requests, PyObject *deadline, int sync, int *finished) {
  *finished = 0;
  if (!fp->enabled || !fp->cache) Py_RETURN_NONE;
  PyObject *const *items;
  Py_ssize_t nreq;
  if (Py_TYPE(requests) == fp->request_type) {
    items = &requests;
    nreq = 1;
  } else if (PyList_CheckExact(requests)) {
    items = ((PyListObject *)requests)->ob_item;
    nreq = PyList_GET_SIZE(requests);
  } else if (PyTuple_CheckExact(requests)) {
    items = ((PyTupleObject *)requests)->ob_item;
    nreq = PyTuple_GET_SIZE(requests);
  } else {
    Py_RETURN_NONE;
  }
  if (nreq == 0 || nreq > (1 << 20)) Py_RETURN_NONE;
  double timeout = fp->default_timeout;
  if (deadline != Py_None) {
    timeout = PyFloat_AsDouble(deadline);
    if (timeout == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    if (!(timeout > 0)) Py_RETURN_NONE; /* the planner raises the proper error */
  }

  slice_buf_t sb; /* no initializer: zeroing the inline arrays would cost more than the rest of a submit */
  sb.n = 0;
  sb.cap = 32;
  sb.s = sb.stack;
  sb.inl = sb.inl_stack;
  FastEntryObject *used[FAST_MAX_ENTRIES_PER_BATCH];
  int nused = 0;
  int ok = 1;
  undo_buf_t ub;
  ub.n = 0;
  ub.cap = 16;
  ub.u = ub.stack;
  uint64_t rr0 = fp->mouse_rr;
  unsigned long long mice0 = fp->mice, stale0 = fp->mice_stale;
  int64_t t_mouse = 0; /* the clock of the mouse choices (read at the first) */
  for (Py_ssize_t i = 0; ok && i < nreq; i++) {
    /* a list changed by code run inside a collection (see below): the planner takes it */
    if (items != &requests && PyList_CheckExact(requests) &&
        (PyList_GET_SIZE(requests) != nreq || ((PyListObject *)requests)->ob_item != items)) {
      ok = 0;
      break;
    }
    PyObject *req = items[i];
    ok = 0;
    if (Py_TYPE(req) != fp->request_type) break;
    req_fields_t f;
    if (req_fields_read(fp, req, &f) != 0) {
      req_fields_clear(&f);
      break;
    }
    long long op = nonneg(f.op), loff = nonneg(f.loff), roff = nonneg(f.roff), len = nonneg(f.length),
              prio = nonneg(f.prio);
    FastEntryObject *e = NULL;
    if (op >= 0 && loff >= 0 && roff >= 0 && len > 0 && prio >= 0) {
      FastEntryObject *last = fp->last;
      if (last && last->gen == fp->gen && f.remote == fp->last_remote && f.local == last->local && f.tag == fp->last_tag &&
          op == fp->last_op && prio == fp->last_prio && (!fp->size_keyed || len == fp->last_len)) {
        e = last; /* the class of the previous request: no key to build */
      } else {
        /* the key's allocations may run a collection, and with it finalizers that could rebind the
         * request's fields: hold what the borrowed reads point at until they are last used */
        PyObject *remote = f.remote, *local = f.local, *tag = f.tag;
        Py_INCREF(remote);
        Py_INCREF(local);
        Py_INCREF(tag);
        PyObject *key = fast_key(fp, remote, local, (long)op, (long)prio, tag, len);
        if (key) {
          e = (FastEntryObject *)PyDict_GetItemWithError(fp->cache, key); /* borrowed */
          Py_DECREF(key);
        }
        if (!e) PyErr_Clear();
        else if (e->gen == fp->gen) {
          fast_forget_last(fp); /* decrefs the old entry and strings: nothing of this request */
          Py_INCREF(e);
          fp->last = e;
          Py_INCREF(remote);
          fp->last_remote = remote;
          Py_INCREF(tag);
          fp->last_tag = tag;
          fp->last_op = (long)op;
          fp->last_prio = (long)prio;
          fp->last_len = len;
        }
        /* e (borrowed from the cache) stays alive: the cache holds it, and nothing below the
         * releases runs Python code that could clear the cache */
        int same_local = e && e->local == local;
        Py_DECREF(remote);
        Py_DECREF(local);
        Py_DECREF(tag);
        if (e && !same_local) e = NULL;
      }
    }
    const rbuf_t *rb = NULL;
    if (e && e->gen == fp->gen && e->local == f.local && (uint64_t)op == e->opcode && (uint64_t)loff <= e->llen &&
        (uint64_t)len <= e->llen - (uint64_t)loff)
      rb = rseg_find(e->rseg, (uint64_t)roff, (uint64_t)len);
    req_fields_clear(&f);
    if (!rb || !(rb->perm & e->perm) || rb->kind != e->rkind) break;
    int k = 0;
    while (k < nused && used[k] != e) k++;
    if (k == nused) {
      if (nused == FAST_MAX_ENTRIES_PER_BATCH) break;
      Py_INCREF(e); /* held: a later request's key, or the handle's allocation, may run a collection */
      used[nused++] = e;
    }
    uint32_t rail = e->rail;
    uint64_t slot = e->slot;
    if (e->nrails) { /* a mouse on a route of several rails: its rail is chosen now */
      if (!t_mouse) t_mouse = (int64_t)now_ns();
      int pos = fast_mouse(fp, e, len, (long)prio, t_mouse, &ub);
      if (pos < 0) break;
      rail = e->rails_idx[pos];
      slot = e->rails_slot[pos];
    }
    tent_slice_t s;
    memset(&s, 0, sizeof s);
    s.opcode = e->opcode;
    s.peer = e->link;
    s.rail = rail;
    s.stat_index = (uint32_t)slot;
    s.attempt = (uint64_t)len <= fp->small_bytes ? TENT_HINT_SMALL : 0;
    uint64_t local = e->laddr + (uint64_t)loff, remote = rb->addr + ((uint64_t)roff - rb->off), left = (uint64_t)len;
    uint64_t step = e->split && left > e->split ? e->split : left;
    ok = 1;
    while (left > 0 && ok) {
      s.local_addr = local;
      s.remote_addr = remote;
      s.length = step < left ? step : left;
      ok = slices_push(&sb, &s, s.length <= e->inline_max) == 0;
      local += s.length;
      remote += s.length;
      left -= s.length;
    }
  }
  if (!ok) {
    slices_free(&sb);
    mouse_undo(fp, &ub, rr0, mice0, stale0);
    if (ub.u != ub.stack) PyMem_Free(ub.u);
    for (int k = 0; k < nused; k++) Py_DECREF(used[k]);
    fp->misses++;
    Py_RETURN_NONE;
  }
  if (ub.u != ub.stack) PyMem_Free(ub.u);
  fp->hits++;

  batch_t *b = batch_create((long)sb.n);
  if (!b) {
    slices_free(&sb);
    for (int k = 0; k < nused; k++) Py_DECREF(used[k]);
    return PyErr_NoMemory();
  }
  uint64_t t_submit = now_ns(); /* one clock read: the handle's submitted_at and the slices' submit_ns */
  /* hand the slices over, one executor call per run of slices for the same executor. The handle
   * is made afterwards, still under the GIL: the progress thread, which needs it to look a
   * failure's token up, cannot run before the handle is tracked below. */
  for (uint32_t i = 0; i < sb.n;) {
    uint32_t j = i + 1;
    int inl = sb.inl[i];
    while (j < sb.n && sb.s[j].peer == sb.s[i].peer && sb.s[j].stat_index == sb.s[i].stat_index) {
      inl &= sb.inl[j];
      j++;
    }
    /* slices of one link (one route, whichever of its rails) belong to one executor; find it
     * through their entry */
    FastEntryObject *e = used[0];
    for (int k = 0; k < nused; k++)
      if (used[k]->link == sb.s[i].peer) {
        e = used[k];
        break;
      }
    int rc = exec_submit_gil(e->ops, e->exec, b, &sb.s[i], j - i, inl, t_submit);
    if (rc != 0)
      for (uint32_t k = i; k < j; k++) {
        batch_set_error(b, atomic_load(&b->cancelled) ? TENT_E_CANCELLED : rc);
        batch_finish_one(b);
      }
    i = j;
  }
  slices_free(&sb);
  if (sync && atomic_load(&b->remaining) == 0 && atomic_load(&b->first_error) == 0 && hook_off()) {
    /* done inline, nothing to report: no handle (its only holder would be the caller, at once gone) */
    batch_unref(b);
    for (int k = 0; k < nused; k++) Py_DECREF(used[k]);
    *finished = 1;
    Py_RETURN_NONE;
  }
  BatchObject *h = batch_obj_alloc(fp->handle_type);
  if (!h) goto lost;
  h->b = b; /* the handle's reference */
  h->total = (long)sb.n;
  batch_fields_init(h, t_submit);
  Py_INCREF(fp->owner);
  Py_SETREF(h->engine, fp->owner);
  h->deadline = h->submitted_at + timeout;
  h->num_requests = (long)nreq;
  if (nused == 1) {
    Py_SETREF(h->fast, (PyObject *)used[0]); /* the reference held since the request loop */
    nused = 0;
  } else {
    PyObject *t = PyTuple_New(nused);
    if (!t) goto lost_h;
    for (int k = 0; k < nused; k++) PyTuple_SET_ITEM(t, k, (PyObject *)used[k]);
    nused = 0;
    Py_SETREF(h->fast, t);
  }
  /* Only a batch with work left is tracked (recovery finds retryable failures through it). This
   * thread held the GIL since the slices went out, so the progress thread, which needs it to look a
   * failure's token up, cannot have missed the entry; a batch finished inline is never tracked.
   * The handle keeps the key and the dict, so that a wait which sees the batch finished takes it
   * out again at once (handle_untrack): the dict stays as small as what is in flight, and a
   * handle the application drops after its wait frees its batch for the next submit. */
  if (atomic_load(&b->remaining) != 0) {
    PyObject *token;
    /* Fibonacci hashing of the address: batches are a few hundred bytes apart */
    size_t slot = (size_t)(((uint64_t)(uintptr_t)b * 0x9E3779B97F4A7C15ull) >> 54) & (FAST_KEYS - 1);
    if (fp->keys[slot] && fp->key_tokens[slot] == (uintptr_t)b) {
      token = Py_NewRef(fp->keys[slot]);
    } else if ((token = PyLong_FromVoidPtr(b))) {
      Py_XSETREF(fp->keys[slot], Py_NewRef(token));
      fp->key_tokens[slot] = (uintptr_t)b;
    }
    int rc = token ? PyDict_SetItem(fp->inflight, token, (PyObject *)h) : -1;
    if (rc < 0) {
      Py_XDECREF(token);
      goto lost_h;
    }
    h->tracked_key = token;
    Py_INCREF(fp->inflight);
    h->tracked_in = fp->inflight;
  }
  return (PyObject *)h;
lost_h: /* out of memory with slices in flight: they end cancelled, nothing is retried */
  atomic_store(&b->cancelled, 1);
  for (int k = 0; k < nused; k++) Py_DECREF(used[k]);
  Py_DECREF(h);
  return NULL;
lost:
  atomic_store(&b->cancelled, 1);
  batch_unref(b);
  for (int k = 0; k < nused; k++) Py_DECREF(used[k]);
  return NULL;
}

static PyObject *FastPath_submit(FastPathObject *fp, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "submit(requests, deadline)");
    return NULL;
  }
  int finished;
  return fast_submit(fp, args[0], args[1], 0, &finished);
}

static PyObject *FastPath_key(FastPathObject *fp, PyObject *req) {
  req_fields_t f;
  if (req_fields_read(fp, req, &f) != 0) {
    req_fields_clear(&f);
    Py_RETURN_NONE;
  }
  long long op = nonneg(f.op), prio = nonneg(f.prio), len = nonneg(f.length);
  PyObject *remote = f.remote, *local = f.local, *tag = f.tag; /* held: fast_key allocates */
  Py_INCREF(remote);
  Py_INCREF(local);
  Py_INCREF(tag);
  req_fields_clear(&f);
  PyObject *key = op >= 0 && prio >= 0 && len >= 0 ? fast_key(fp, remote, local, (long)op, (long)prio, tag, len) : NULL;
  Py_DECREF(remote);
  Py_DECREF(local);
  Py_DECREF(tag);
  if (!key) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  return key;
}

static PyObject *FastPath_put(FastPathObject *fp, PyObject *args) {
  PyObject *key;
  FastEntryObject *e;
  if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &key, &FastEntryType, &e)) return NULL;
  if (!fp->enabled || !fp->cache || e->gen != fp->gen) Py_RETURN_FALSE; /* made under an older state: useless */
  if (PyDict_GET_SIZE(fp->cache) >= fp->max_entries && PyDict_Contains(fp->cache, key) == 0) PyDict_Clear(fp->cache);
  if (PyDict_SetItem(fp->cache, key, (PyObject *)e) < 0) return NULL;
  for (int j = 0; j < e->nrails && fp->rows; j++) { /* its rails are watched from now on */
    rail_row_t *row = &fp->rows[e->rails_slot[j] & STAT_SLOT_MASK];
    if (row->stat_index == e->rails_slot[j]) row->entry_gen = fp->gen + 1;
  }
  Py_RETURN_TRUE;
}

static PyObject *FastPath_invalidate(FastPathObject *fp, PyObject *unused) {
  fp->gen++;
  if (fp->cache) PyDict_Clear(fp->cache);
  fast_forget_last(fp);
  Py_RETURN_NONE;
}

static PyObject *FastPath_close(FastPathObject *fp, PyObject *unused) {
  fp->enabled = 0;
  fp->gen++;
  if (fp->cache) PyDict_Clear(fp->cache);
  fast_forget_last(fp);
  Py_INCREF(Py_None);
  Py_XSETREF(fp->owner, Py_None); /* the engine owns us: break the cycle (the fallback stays: */
  Py_RETURN_NONE;                 /* it reports the closed engine) */
}

/* fast(requests, deadline=None): the engine's submit. The fast path, or the fallback (the planner). */
static PyObject *FastPath_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  FastPathObject *fp = (FastPathObject *)self;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject *argv[2] = {NULL, Py_None}, *digest = Py_None;
  if (nargs < 1 || nargs > 2) goto usage;
  argv[0] = args[0];
  if (nargs == 2) argv[1] = args[1];
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    if (!PyUnicode_Check(k)) goto usage;
    if (nargs == 1 && PyUnicode_CompareWithASCIIString(k, "deadline") == 0)
      argv[1] = args[nargs + i];
    else if (PyUnicode_CompareWithASCIIString(k, "digest") == 0)
      digest = args[nargs + i];
    else
      goto usage;
  }
  tent_digest_t *mine[ARM_MAX];
  uint32_t nmine;
  if (parse_digests(digest, mine, &nmine) < 0) return NULL;
  /* armed for this call only (the planner's fallback included): what executors take on this thread */
  tent_digest_t **armed = tl_digests;
  uint32_t narmed = tl_ndigest;
  tl_digests = mine;
  tl_ndigest = nmine;
  PyObject *h = FastPath_submit(fp, argv, 2);
  if (h == Py_None) {
    Py_DECREF(h);
    h = (!fp->fallback || fp->fallback == Py_None) ? Py_NewRef(Py_None)
                                                   : PyObject_CallFunctionObjArgs(fp->fallback, argv[0], argv[1], NULL);
  }
  tl_digests = armed;
  tl_ndigest = narmed;
  return h;
usage:
  PyErr_SetString(PyExc_TypeError, "submit(requests, deadline=None, *, digest=None)");
  return NULL;
}

/* run(requests, deadline=None) -> None: submit and wait (the engine's run()). A batch the fast path
 * finishes inside the call without an error never gets a handle; anything else waits on its handle
 * (wait() raises the typed errors), the planner's included. */
static PyObject *FastPath_run(FastPathObject *fp, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject *requests, *deadline = Py_None;
  if (nargs < 1 || nargs + nkw > 2) goto usage;
  requests = args[0];
  if (nargs == 2) deadline = args[1];
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    if (nargs == 2 || !PyUnicode_Check(k) || PyUnicode_CompareWithASCIIString(k, "deadline") != 0) goto usage;
    deadline = args[nargs + i];
  }
  int finished;
  PyObject *h = fast_submit(fp, requests, deadline, 1, &finished);
  if (!h) return NULL;
  if (h == Py_None) {
    if (finished) return h;
    Py_DECREF(h);
    if (!fp->fallback || fp->fallback == Py_None) {
      PyErr_SetString(PyExc_RuntimeError, "fast path has no planner to fall back to");
      return NULL;
    }
    h = PyObject_CallFunctionObjArgs(fp->fallback, requests, deadline, NULL);
    if (!h) return NULL;
  }
  static PyObject *s_wait = NULL;
  if (!s_wait && !(s_wait = PyUnicode_InternFromString("wait"))) {
    Py_DECREF(h);
    return NULL;
  }
  /* A handle whose `wait` is Batch.wait_handle itself (BatchHandle's, unless a subclass or a patch
   * says otherwise; no instance dict can hide it) is waited on directly: the method lookup and call
   * cost about as many instructions as the rest of the wait on the caller's side */
  PyObject *r;
  if (g_wait_handle && Py_TYPE(h)->tp_dictoffset == 0 && PyObject_TypeCheck(h, &BatchType) &&
      _PyType_Lookup(Py_TYPE(h), s_wait) == g_wait_handle)
    r = Batch_wait_handle((BatchObject *)h, NULL, 0, NULL);
  else
    r = PyObject_CallMethodNoArgs(h, s_wait);
  Py_DECREF(h);
  if (!r) return NULL;
  Py_DECREF(r);
  Py_RETURN_NONE;
usage:
  PyErr_SetString(PyExc_TypeError, "run(requests, deadline=None)");
  return NULL;
}

/* mouse_policy(b0, b1, gamma, stale_s, theta, qos=None): the scheduler's constants (SchedulerConfig)
 * and its QoS slots, (seen list, interval_ns, active_ns) of its PrioritySlots */
static PyObject *FastPath_mouse_policy(FastPathObject *fp, PyObject *args) {
  mouse_policy_t pol;
  long long theta;
  PyObject *qos = Py_None, *seen = NULL;
  long long iv = 1, act = 0;
  if (!PyArg_ParseTuple(args, "ddddL|O", &pol.b0, &pol.b1, &pol.gamma, &pol.stale_s, &theta, &qos)) return NULL;
  if (qos != Py_None) {
    if (!PyArg_ParseTuple(qos, "O!LL", &PyList_Type, &seen, &iv, &act)) return NULL;
    if (PyList_GET_SIZE(seen) != QOS_PRIOS || iv <= 0 || act < 0)
      return PyErr_Format(PyExc_ValueError, "bad QoS slots");
  }
  fp->mouse = pol;
  fp->mouse_theta = theta > 0 ? theta : 0;
  Py_XINCREF(seen);
  Py_XSETREF(fp->qos.seen, seen);
  fp->qos.interval_ns = iv;
  fp->qos.active_ns = act;
  Py_RETURN_NONE;
}

static rail_row_t *fast_row(FastPathObject *fp, unsigned long long stat_index) {
  if (!stat_index) {
    PyErr_SetString(PyExc_ValueError, "stat index 0 names no rail");
    return NULL;
  }
  if (!fp->rows && !(fp->rows = PyMem_Calloc((size_t)STAT_SLOT_MASK + 1, sizeof(rail_row_t)))) {
    PyErr_NoMemory();
    return NULL;
  }
  return &fp->rows[stat_index & STAT_SLOT_MASK];
}

/* rail_publish(stat_index, base, pending, pending_ns, confirmed_ns, busy, bandwidth, penalty,
 * weight, taken): a rail's state as its telemetry and health have it now; `taken` is what the
 * caller folded into its pending bytes from rail_added() since the last publish. */
static PyObject *FastPath_rail_publish(FastPathObject *fp, PyObject *args) {
  unsigned long long si;
  long long base, pending, pending_ns, confirmed_ns, taken;
  int busy;
  double bw, penalty, weight;
  if (!PyArg_ParseTuple(args, "KLLLLpdddL", &si, &base, &pending, &pending_ns, &confirmed_ns, &busy, &bw, &penalty,
                        &weight, &taken))
    return NULL;
  if (!(bw > 0) || !(penalty > 0) || !(weight >= 0)) return PyErr_Format(PyExc_ValueError, "bad rail state");
  rail_row_t *row = fast_row(fp, si);
  if (!row) return NULL;
  if (row->stat_index != si) { /* another rail's row before (or none): nothing of it carries over */
    memset(row, 0, sizeof *row);
    taken = 0;
  }
  row->stat_index = si;
  row->base = base;
  row->pending = pending;
  row->pending_ns = pending_ns;
  row->confirmed_ns = confirmed_ns;
  row->busy = busy;
  row->bw = bw;
  row->penalty = penalty;
  row->weight = weight;
  row->added -= taken;
  Py_RETURN_NONE;
}

/* rail_weight(stat_index, weight): a health change between publishes (a failed slice) */
static PyObject *FastPath_rail_weight(FastPathObject *fp, PyObject *args) {
  unsigned long long si;
  double weight;
  if (!PyArg_ParseTuple(args, "Kd", &si, &weight)) return NULL;
  if (!(weight >= 0)) return PyErr_Format(PyExc_ValueError, "bad weight");
  if (fp->rows && fp->rows[si & STAT_SLOT_MASK].stat_index == si) fp->rows[si & STAT_SLOT_MASK].weight = weight;
  Py_RETURN_NONE;
}

/* rail_watched(stat_index) -> bool: the rail's row matters to the fast path: an entry of the
 * current generation reads it, or it holds assignments not folded yet. Only those are worth a
 * publish at each health tick (a publish costs microseconds, a tick comes every few ms). */
static PyObject *FastPath_rail_watched(FastPathObject *fp, PyObject *arg) {
  unsigned long long si = PyLong_AsUnsignedLongLong(arg);
  if (si == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  const rail_row_t *row = fp->rows ? &fp->rows[si & STAT_SLOT_MASK] : NULL;
  return PyBool_FromLong(row && si && row->stat_index == si && (row->entry_gen == fp->gen + 1 || row->added != 0));
}

/* rail_added(stat_index) -> (bytes, ns): what the fast path gave the rail since the last publish,
 * and when it last did (0, 0 for a rail not published) */
static PyObject *FastPath_rail_added(FastPathObject *fp, PyObject *arg) {
  unsigned long long si = PyLong_AsUnsignedLongLong(arg);
  if (si == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  const rail_row_t *row = fp->rows ? &fp->rows[si & STAT_SLOT_MASK] : NULL;
  if (!row || row->stat_index != si) return Py_BuildValue("(LL)", 0LL, 0LL);
  return Py_BuildValue("(LL)", (long long)row->added, (long long)row->added_ns);
}

static PyObject *FastPath_get_gen(FastPathObject *fp, void *c) { return PyLong_FromUnsignedLongLong(fp->gen); }
static PyObject *FastPath_get_size(FastPathObject *fp, void *c) { return PyLong_FromSsize_t(fp->cache ? PyDict_GET_SIZE(fp->cache) : 0); }
static PyObject *FastPath_get_hits(FastPathObject *fp, void *c) { return PyLong_FromUnsignedLongLong(fp->hits); }
static PyObject *FastPath_get_misses(FastPathObject *fp, void *c) { return PyLong_FromUnsignedLongLong(fp->misses); }
static PyObject *FastPath_get_mice(FastPathObject *fp, void *c) { return PyLong_FromUnsignedLongLong(fp->mice); }
static PyObject *FastPath_get_mice_stale(FastPathObject *fp, void *c) { return PyLong_FromUnsignedLongLong(fp->mice_stale); }

static PyMethodDef FastPath_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))FastPath_submit, METH_FASTCALL,
     "submit(requests, deadline) -> handle, or None: the planner must run"},
    {"run", (PyCFunction)(void (*)(void))FastPath_run, METH_FASTCALL | METH_KEYWORDS,
     "run(requests, deadline=None) -> None: submit and wait; no handle for a batch done inside the call"},
    {"key", (PyCFunction)FastPath_key, METH_O, "key(request) -> the cache key of its class, or None"},
    {"put", (PyCFunction)FastPath_put, METH_VARARGS, "put(key, entry) -> bool: cached (False: stale or closed)"},
    {"mouse_policy", (PyCFunction)FastPath_mouse_policy, METH_VARARGS,
     "mouse_policy(b0, b1, gamma, stale_s, theta, qos=None): the constants of the mouse choice on routes of "
     "several rails, and the scheduler's QoS slots (seen list, interval_ns, active_ns)"},
    {"rail_publish", (PyCFunction)FastPath_rail_publish, METH_VARARGS,
     "rail_publish(stat_index, base, pending, pending_ns, confirmed_ns, busy, bandwidth, penalty, weight, taken)"},
    {"rail_weight", (PyCFunction)FastPath_rail_weight, METH_VARARGS, "rail_weight(stat_index, weight)"},
    {"rail_watched", (PyCFunction)FastPath_rail_watched, METH_O,
     "rail_watched(stat_index) -> bool: a cached entry reads the rail's row, or it holds bytes to fold"},
    {"rail_added", (PyCFunction)FastPath_rail_added, METH_O, "rail_added(stat_index) -> (bytes, ns) given since"},
    {"invalidate", (PyCFunction)FastPath_invalidate, METH_NOARGS, "forget every entry (routes, peers or buffers changed)"},
    {"close", (PyCFunction)FastPath_close, METH_NOARGS, "forget everything and take no request any more"},
    {NULL}};

static PyGetSetDef FastPath_getset[] = {
    {"generation", (getter)FastPath_get_gen, NULL, "entries made under another generation are stale", NULL},
    {"size", (getter)FastPath_get_size, NULL, "entries cached", NULL},
    {"hits", (getter)FastPath_get_hits, NULL, "batches the fast path submitted", NULL},
    {"misses", (getter)FastPath_get_misses, NULL, "batches it handed to the planner", NULL},
    {"mice", (getter)FastPath_get_mice, NULL, "mice it placed on routes of several rails", NULL},
    {"mice_stale", (getter)FastPath_get_mice_stale, NULL, "of them, given to a stale rail", NULL},
    {NULL}};

static PyMemberDef FastPath_members[] = {
    {"enabled", T_INT, offsetof(FastPathObject, enabled), 0, "0: every submit goes to the planner"},
    {NULL}};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.FastPath",
    .tp_basicsize = sizeof(FastPathObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = FastPath_new,
    .tp_dealloc = (destructor)FastPath_dealloc,
    .tp_traverse = (traverseproc)FastPath_traverse,
    .tp_clear = (inquiry)FastPath_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastPathObject, vectorcall),
    .tp_methods = FastPath_methods,
    .tp_getset = FastPath_getset,
    .tp_members = FastPath_members,
    .tp_doc = "the engine's plan cache and its native submit path",
};

/* pop_failures(max) -> (bytes of failure records, count). Record = tent_slice_t + int32 status + pad. */
static PyObject *py_pop_failures(PyObject *m, PyObject *args) {
  Py_ssize_t maxn = 1 << 20;
  if (!PyArg_ParseTuple(args, "|n", &maxn)) return NULL;
  pthread_mutex_lock(&g_fail_mu);
  size_t n = g_fail_len < (size_t)maxn ? g_fail_len : (size_t)maxn;
  PyObject *out = PyBytes_FromStringAndSize((const char *)g_fail, (Py_ssize_t)(n * sizeof(failure_t)));
  if (out && n) {
    memmove(g_fail, g_fail + n, (g_fail_len - n) * sizeof(failure_t));
    g_fail_len -= n;
  }
  pthread_mutex_unlock(&g_fail_mu);
  return out;
}

/* requeue_failures(bytes): give back records this process's engine does not own (e.g. a test
 * harness driving an executor directly pops its own). Does not signal the eventfd. */
static PyObject *py_requeue_failures(PyObject *m, PyObject *arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
  size_t n = (size_t)view.len / sizeof(failure_t);
  pthread_mutex_lock(&g_fail_mu);
  if (g_fail_len + n > g_fail_cap) {
    size_t cap = g_fail_cap ? g_fail_cap : 256;
    while (cap < g_fail_len + n) cap *= 2;
    failure_t *nf = realloc(g_fail, cap * sizeof(failure_t));
    if (!nf) {
      pthread_mutex_unlock(&g_fail_mu);
      PyBuffer_Release(&view);
      return PyErr_NoMemory();
    }
    g_fail = nf;
    g_fail_cap = cap;
  }
  memcpy(g_fail + g_fail_len, view.buf, n * sizeof(failure_t));
  g_fail_len += n;
  pthread_mutex_unlock(&g_fail_mu);
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

/* set_stats(buffer) : telemetry slots live in a Python-owned (possibly shared) buffer. */
static PyObject *g_stats_owner = NULL;
static PyObject *py_set_stats(PyObject *m, PyObject *arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_WRITABLE) < 0) return NULL;
  Py_XINCREF(arg);
  /* the old buffer may still be referenced by in-flight slices: keep it alive (leak by design) */
  g_stats = (int64_t *)view.buf;
  g_stats_slots = (uint32_t)(view.len / (ST_FIELDS * sizeof(int64_t)));
  g_stats_owner = arg;
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

/* stat_claim(slot) -> the generation a new holder of `slot` names in its slices' stat_index, or 0
 * while slices counted on the slot are still in flight (its counters are zeroed when claimed). */
static PyObject *py_stat_claim(PyObject *m, PyObject *arg) {
  long i = PyLong_AsLong(arg);
  if (i == -1 && PyErr_Occurred()) return NULL;
  if (!g_stats || i < 0 || (unsigned long)i >= g_stats_slots || i > (long)STAT_SLOT_MASK) {
    PyErr_SetString(PyExc_IndexError, "stat_claim: no such telemetry slot");
    return NULL;
  }
  int64_t *st = g_stats + (size_t)i * ST_FIELDS;
  if (__atomic_load_n(&st[TENT_STAT_INFLIGHT_SLICES], __ATOMIC_SEQ_CST) > 0) return PyLong_FromLong(0);
  /* retired (stat_retire), nothing counted in flight: every count of earlier holders has landed,
   * and a stale stamp now only passes through the in-flight counters (net zero), left as they are */
  for (int f = 0; f < ST_FIELDS; f++)
    if (f != TENT_STAT_INFLIGHT_BYTES && f != TENT_STAT_INFLIGHT_SLICES && f != TENT_STAT_GENERATION)
      __atomic_store_n(&st[f], 0, __ATOMIC_RELAXED);
  int64_t gen = __atomic_load_n(&st[TENT_STAT_GENERATION], __ATOMIC_SEQ_CST);
  if (gen == 0) { /* never held: the first generation */
    gen = 1;
    __atomic_store_n(&st[TENT_STAT_GENERATION], gen, __ATOMIC_SEQ_CST);
  }
  return PyLong_FromLongLong(gen);
}

/* stat_retire(slot): the slot's holder let it go; slices stamped with its generation from now on
 * count nowhere (those already in flight still finish on the row). */
static PyObject *py_stat_retire(PyObject *m, PyObject *arg) {
  long i = PyLong_AsLong(arg);
  if (i == -1 && PyErr_Occurred()) return NULL;
  if (!g_stats || i < 0 || (unsigned long)i >= g_stats_slots || i > (long)STAT_SLOT_MASK) {
    PyErr_SetString(PyExc_IndexError, "stat_retire: no such telemetry slot");
    return NULL;
  }
  int64_t *st = g_stats + (size_t)i * ST_FIELDS;
  int64_t gen = __atomic_load_n(&st[TENT_STAT_GENERATION], __ATOMIC_SEQ_CST) + 1;
  /* wraps after 2^20 - 2 holders of one slot (all ones would be STAT_NONE at the last slot) */
  if (gen >= ((int64_t)1 << (32 - STAT_SLOT_BITS)) - 1) gen = 1;
  __atomic_store_n(&st[TENT_STAT_GENERATION], gen, __ATOMIC_SEQ_CST);
  Py_RETURN_NONE;
}

/* stat_row(slot) -> the slot's counters as a tuple of ints (each field read once, relaxed, as the
 * completion path writes them): the health tick's snapshot of a rail, without numpy (whose indexing
 * and scalar conversion cost the cold tick tens of microseconds of its ~250, docs/benchmarks.md). */
static PyObject *py_stat_row(PyObject *m, PyObject *arg) {
  long i = PyLong_AsLong(arg);
  if (i == -1 && PyErr_Occurred()) return NULL;
  if (!g_stats || i < 0 || (unsigned long)i >= g_stats_slots || i > (long)STAT_SLOT_MASK) {
    PyErr_SetString(PyExc_IndexError, "stat_row: no such telemetry slot");
    return NULL;
  }
  const int64_t *st = g_stats + (size_t)i * ST_FIELDS;
  PyObject *out = PyTuple_New(ST_FIELDS);
  if (!out) return NULL;
  for (int f = 0; f < ST_FIELDS; f++) {
    PyObject *v = PyLong_FromLongLong(__atomic_load_n(&st[f], __ATOMIC_RELAXED));
    if (!v) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SET_ITEM(out, f, v);
  }
  return out;
}

static PyObject *py_host_api_address(PyObject *m, PyObject *unused) {
  return PyLong_FromUnsignedLongLong((uintptr_t)&g_host);
}
static PyObject *py_failure_fd(PyObject *m, PyObject *unused) { return PyLong_FromLong(g_fail_fd); }
static PyObject *py_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromUnsignedLongLong(now_ns()); }

/* progress_state() -> (state, wakes): the watch state and the submits that woke a sleeping thread */
static PyObject *py_progress_state(PyObject *m, PyObject *unused) {
  return Py_BuildValue("(iK)", __atomic_load_n(&g_progress_state, __ATOMIC_SEQ_CST),
                       (unsigned long long)__atomic_load_n(&g_progress_wakes, __ATOMIC_RELAXED));
}

/* progress_arm() -> bool: the thread starts a quiet period (AWAKE -> ARMED); False if it was not AWAKE */
static PyObject *py_progress_arm(PyObject *m, PyObject *unused) {
  int want = PROGRESS_AWAKE;
  return PyBool_FromLong(__atomic_compare_exchange_n(&g_progress_state, &want, PROGRESS_ARMED, 0,
                                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
}

/* progress_sleep() -> bool: no submit since progress_arm (ARMED -> IDLE): the thread may sleep
 * long, the next submit wakes it. False: a submit came (the state is AWAKE), keep ticking. */
static PyObject *py_progress_sleep(PyObject *m, PyObject *unused) {
  int want = PROGRESS_ARMED;
  return PyBool_FromLong(__atomic_compare_exchange_n(&g_progress_state, &want, PROGRESS_IDLE, 0,
                                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
}

/* One wait of the failure eventfd, without the GIL: 1 when it was signalled, 0 on timeout. */
static int fail_fd_wait(int timeout_ms) {
  struct pollfd p = {.fd = g_fail_fd, .events = POLLIN};
  int n;
  Py_BEGIN_ALLOW_THREADS;
  n = poll(&p, 1, timeout_ms);
  Py_END_ALLOW_THREADS;
  if (n <= 0) return 0;
  uint64_t v;
  ssize_t r = read(g_fail_fd, &v, sizeof v);
  (void)r;
  return 1;
}

/* progress_wait(timeout_s, defer_s=0) -> bool: wait for the failure eventfd (the progress thread's
 * select). True when it was signalled. With defer_s, a signal that brought no failure (a submit
 * waking the sleeping thread: state AWAKE, queue empty) is followed by up to defer_s more of
 * waiting, here without the GIL: the thread comes back at its cadence, not on the GIL that the
 * submitting thread needs while its request completes; a failure meanwhile ends it at once. */
static PyObject *py_progress_wait(PyObject *m, PyObject *args) {
  double timeout_s, defer_s = 0.0;
  if (!PyArg_ParseTuple(args, "d|d", &timeout_s, &defer_s)) return NULL;
  if (!(timeout_s >= 0 && timeout_s <= 3600 && defer_s >= 0 && defer_s <= 3600)) {
    PyErr_SetString(PyExc_ValueError, "progress_wait: timeouts must be within [0, 3600] s");
    return NULL;
  }
  int hit = fail_fd_wait((int)(timeout_s * 1e3 + 0.5));
  if (hit && defer_s > 0) {
    pthread_mutex_lock(&g_fail_mu);
    size_t queued = g_fail_len;
    pthread_mutex_unlock(&g_fail_mu);
    if (!queued) fail_fd_wait((int)(defer_s * 1e3 + 0.5));
  }
  return PyBool_FromLong(hit);
}

/* progress_resume(): the thread itself is back to AWAKE (found something to watch after a sleep) */
static PyObject *py_progress_resume(PyObject *m, PyObject *unused) {
  __atomic_store_n(&g_progress_state, PROGRESS_AWAKE, __ATOMIC_SEQ_CST);
  Py_RETURN_NONE;
}

/* progress_wake(): back to AWAKE, and signal the eventfd if the thread slept (what a submit does) */
static PyObject *py_progress_wake(PyObject *m, PyObject *unused) {
  progress_poke();
  Py_RETURN_NONE;
}

static PyObject *py_set_wait_spin_ns(PyObject *m, PyObject *arg) {
  long long ns = PyLong_AsLongLong(arg);
  if (ns == -1 && PyErr_Occurred()) return NULL;
  if (ns < 0 || ns > 10000000LL) {
    PyErr_SetString(PyExc_ValueError, "wait spin must be between 0 and 10 ms");
    return NULL;
  }
  long long old = atomic_exchange(&g_wait_spin_ns, ns);
  return PyLong_FromLongLong(old);
}

static PyMethodDef methods[] = {
    {"untrack_handles", py_untrack_handles, METH_O, "untrack_handles(type): its instances skip cycle collection"},
    {"handle_freelist", (PyCFunction)(void (*)(void))py_handle_freelist, METH_FASTCALL,
     "handle_freelist(n=None) -> previous bound: released handles kept for reuse (0: none)"},
    {"set_hook_namespace", py_set_hook_namespace, METH_O, "set_hook_namespace(tent_core.batch globals): wait() honours its COMPLETION_HOOK"},
    {"submit", py_submit, METH_VARARGS, "submit(ops, exec, batch, slices, inline=False) -> rc"},
    {"submit_one", (PyCFunction)(void (*)(void))py_submit_one, METH_FASTCALL, "submit one slice"},
    {"mouse_pick", py_mouse_pick, METH_VARARGS,
     "mouse_pick(views, length, rr, (b0, b1, gamma, stale_s), now_ns) -> (position, flags): the fast path's mouse choice"},
    {"executor_inline", py_executor_inline, METH_O, "executor_inline(ops) -> bool: it can run slices on the caller's thread"},
    {"executor_register", py_executor_register, METH_VARARGS, "executor_register(ops, handle): submit may reach it"},
    {"executor_retire", py_executor_retire, METH_VARARGS, "executor_retire(ops, handle) -> bool: no submit reaches it after return"},
    {"pop_failures", py_pop_failures, METH_VARARGS, "take queued retryable failures"},
    {"requeue_failures", py_requeue_failures, METH_O, "put back failure records not ours"},
    {"set_stats", py_set_stats, METH_O, "use this writable buffer for telemetry slots"},
    {"stat_claim", py_stat_claim, METH_O, "zero a telemetry slot for a new holder: its generation, 0 while busy"},
    {"stat_retire", py_stat_retire, METH_O, "a telemetry slot's holder let it go: its generation stops counting"},
    {"stat_row", py_stat_row, METH_O, "a telemetry slot's counters as a tuple of ints"},
    {"host_api_address", py_host_api_address, METH_NOARGS, "address of the tent_host_api_t"},
    {"failure_fd", py_failure_fd, METH_NOARGS, "eventfd signalled when failures are queued"},
    {"now_ns", py_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns"},
    {"progress_state", py_progress_state, METH_NOARGS, "progress_state() -> (0 awake | 1 armed | 2 idle, submits that woke it)"},
    {"progress_arm", py_progress_arm, METH_NOARGS, "progress_arm() -> bool: awake -> armed (a submit disarms it)"},
    {"progress_sleep", py_progress_sleep, METH_NOARGS, "progress_sleep() -> bool: armed -> idle (the next submit signals failure_fd)"},
    {"progress_wait", py_progress_wait, METH_VARARGS,
     "progress_wait(timeout_s, defer_s=0) -> bool: wait for failure_fd (without the GIL); see native.c"},
    {"progress_resume", py_progress_resume, METH_NOARGS, "progress_resume(): awake again, no signal (the thread's own call)"},
    {"progress_wake", py_progress_wake, METH_NOARGS, "progress_wake(): awake again, signalling failure_fd if it slept"},
    {"wait_arm", py_wait_arm, METH_O, "wait_arm(packed tent_wait_t bytes, or None): conditions of this thread's waiting READs"},
    {"digest_arm", py_digest_arm, METH_O, "digest_arm(Digest, list of them, or None): this thread's submits fold their READs into them"},
    {"set_wait_spin_ns", py_set_wait_spin_ns, METH_O, "poll this long in Batch.wait before sleeping; returns the old value"},
    {NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_native", "tent_core compiled hot path", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
  if (PyType_Ready(&BatchType) < 0 || PyType_Ready(&RemoteSegmentType) < 0 || PyType_Ready(&FastEntryType) < 0 ||
      PyType_Ready(&FastPathType) < 0 || PyType_Ready(&DigestType) < 0 || PyType_Ready(&NotifierType) < 0)
    return NULL;
  if (!g_wait_handle) g_wait_handle = PyDict_GetItemString(BatchType.tp_dict, "wait_handle"); /* NULL: run() looks it up */
  if (!s_op) {
    s_op = PyUnicode_InternFromString("op");
    s_local = PyUnicode_InternFromString("local");
    s_local_offset = PyUnicode_InternFromString("local_offset");
    s_remote = PyUnicode_InternFromString("remote");
    s_remote_offset = PyUnicode_InternFromString("remote_offset");
    s_length = PyUnicode_InternFromString("length");
    s_priority = PyUnicode_InternFromString("priority");
    s_tag = PyUnicode_InternFromString("tag");
    if (!s_op || !s_local || !s_local_offset || !s_remote || !s_remote_offset || !s_length || !s_priority || !s_tag)
      return NULL;
  }
  static int key_made = 0;
  if (!key_made) {
    if (pthread_key_create(&g_batch_cache_key, batch_cache_drop) != 0) return PyErr_NoMemory();
    key_made = 1;
  }
  if (g_fail_fd < 0) {
    g_fail_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g_fail_fd < 0) return PyErr_SetFromErrno(PyExc_OSError);
  }
  PyObject *m = PyModule_Create(&moddef);
  if (!m) return NULL;
  Py_INCREF(&BatchType);
  PyModule_AddObject(m, "Batch", (PyObject *)&BatchType);
  Py_INCREF(&RemoteSegmentType);
  PyModule_AddObject(m, "RemoteSegment", (PyObject *)&RemoteSegmentType);
  Py_INCREF(&FastEntryType);
  PyModule_AddObject(m, "FastEntry", (PyObject *)&FastEntryType);
  Py_INCREF(&FastPathType);
  PyModule_AddObject(m, "FastPath", (PyObject *)&FastPathType);
  Py_INCREF(&DigestType);
  PyModule_AddObject(m, "Digest", (PyObject *)&DigestType);
  Py_INCREF(&NotifierType);
  PyModule_AddObject(m, "Notifier", (PyObject *)&NotifierType);
  PyModule_AddIntConstant(m, "WAIT_SIZE", (long)sizeof(tent_wait_t));
  PyModule_AddIntConstant(m, "DIGESTS_PER_SUBMIT", ARM_MAX);
  PyModule_AddIntConstant(m, "EXECUTOR_ABI_VERSION", TENT_EXECUTOR_ABI_VERSION);
  PyModule_AddIntConstant(m, "SLICE_SIZE", sizeof(tent_slice_t));
  PyModule_AddIntConstant(m, "FAILURE_SIZE", sizeof(failure_t));
  PyModule_AddIntConstant(m, "STAT_FIELDS", ST_FIELDS);
  PyModule_AddIntConstant(m, "STAT_SLOT_BITS", STAT_SLOT_BITS);
  PyModule_AddIntConstant(m, "FAST_MAX_RAILS", FAST_MAX_RAILS);
  /* the status list and the telemetry row layout of executor_abi.h, for tent_core.abi */
  PyObject *codes = PyDict_New(), *retry = PyDict_New(), *fields = PyList_New(0), *notes = PyDict_New();
  if (!codes || !retry || !fields || !notes) goto fail;
#define ADD_STATUS_(name, value, retryable)                                              \
  do {                                                                                   \
    PyObject *v_ = PyLong_FromLong(value), *r_ = PyBool_FromLong(retryable);             \
    int e_ = !v_ || !r_ || PyDict_SetItemString(codes, #name, v_) || PyDict_SetItemString(retry, #name, r_); \
    Py_XDECREF(v_);                                                                      \
    Py_XDECREF(r_);                                                                      \
    if (e_) goto fail;                                                                   \
  } while (0);
  TENT_STATUS_LIST(ADD_STATUS_)
#undef ADD_STATUS_
#define ADD_FIELD_(name)                                                                 \
  do {                                                                                   \
    PyObject *n_ = PyUnicode_FromString(#name);                                          \
    int e_ = !n_ || PyList_Append(fields, n_);                                           \
    Py_XDECREF(n_);                                                                      \
    if (e_) goto fail;                                                                   \
  } while (0);
  TENT_STAT_LIST(ADD_FIELD_)
#undef ADD_FIELD_
#define ADD_NOTE_(name, value)                                                           \
  do {                                                                                   \
    PyObject *v_ = PyLong_FromLong(value);                                               \
    int e_ = !v_ || PyDict_SetItemString(notes, #name, v_);                              \
    Py_XDECREF(v_);                                                                      \
    if (e_) goto fail;                                                                   \
  } while (0);
  TENT_NOTE_LIST(ADD_NOTE_)
#undef ADD_NOTE_
  if (PyModule_AddObject(m, "STATUS_CODES", codes) < 0) goto fail;
  codes = NULL;
  if (PyModule_AddObject(m, "STATUS_RETRYABLE", retry) < 0) goto fail;
  retry = NULL;
  if (PyModule_AddObject(m, "STAT_FIELD_NAMES", fields) < 0) goto fail;
  fields = NULL;
  if (PyModule_AddObject(m, "NOTE_EVENTS", notes) < 0) goto fail;
  notes = NULL;
  PyModule_AddIntConstant(m, "FIRST_FINAL_STATUS", TENT_FIRST_FINAL);
  PyModule_AddIntConstant(m, "ATTEMPT_MASK", TENT_ATTEMPT_MASK);
  PyModule_AddIntConstant(m, "HINT_SMALL", TENT_HINT_SMALL);
  return m;
fail:
  Py_XDECREF(codes);
  Py_XDECREF(retry);
  Py_XDECREF(fields);
  Py_XDECREF(notes);
  Py_DECREF(m);
  return NULL;
}
