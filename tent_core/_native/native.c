/*
 * tent_core._native: the core's compiled hot path.
 *
 *  - Batch: atomic completion counting; waiters block on a condition variable
 *    with the GIL released (no spinning: on two cores a spin collapses throughput).
 *  - host API handed to every executor: complete() updates per-rail telemetry
 *    slots and the batch; retryable failures go to a process-wide queue whose
 *    eventfd wakes the engine's progress thread (which re-schedules them).
 *  - submit()/submit_one(): stamp slices and call the executor's submit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tent/executor_abi.h"

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

static inline int64_t *slot(uint32_t i) {
  if (!g_stats || i >= g_stats_slots) return NULL;
  return g_stats + (size_t)i * ST_FIELDS;
}

/* ---- batch ---- */
typedef struct batch {
  atomic_int refs;
  atomic_long remaining;
  atomic_int cancelled;
  atomic_int first_error;
  atomic_long bytes_done;
  atomic_long retries;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} batch_t;

static void batch_unref(batch_t *b) {
  if (atomic_fetch_sub(&b->refs, 1) == 1) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
  }
}

static void batch_finish_one(batch_t *b) {
  if (atomic_fetch_sub(&b->remaining, 1) == 1) {
    pthread_mutex_lock(&b->mu);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
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

static void host_complete(void *ctx, const tent_slice_t *s, int32_t status) {
  (void)ctx;
  batch_t *b = (batch_t *)(uintptr_t)s->token;
  uint64_t t = now_ns();
  int64_t *st = slot(s->stat_index);
  if (st) {
    __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_BYTES], (int64_t)s->length, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&st[TENT_STAT_INFLIGHT_SLICES], 1, __ATOMIC_RELAXED);
    if (status == TENT_OK) {
      int64_t lat = (int64_t)(t - s->submit_ns);
      __atomic_fetch_add(&st[TENT_STAT_BYTES_DONE], (int64_t)s->length, __ATOMIC_RELAXED);
      __atomic_fetch_add(&st[TENT_STAT_SLICES_DONE], 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&st[TENT_STAT_LATENCY_NS_SUM], lat, __ATOMIC_RELAXED);
      __atomic_store_n(&st[TENT_STAT_LAST_LATENCY_NS], lat, __ATOMIC_RELAXED);
      __atomic_store_n(&st[TENT_STAT_LAST_COMPLETE_NS], (int64_t)t, __ATOMIC_RELAXED);
    } else if (status != TENT_E_CANCELLED && status != TENT_E_REROUTED) {
      /* a slice handed back untouched (rerouted) or cancelled did not fail on this rail */
      __atomic_fetch_add(&st[TENT_STAT_ERRORS], 1, __ATOMIC_RELAXED);
    }
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
  int64_t *st = slot(s->stat_index);
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

static tent_host_api_t g_host = {TENT_EXECUTOR_ABI_VERSION, sizeof(tent_host_api_t), NULL, host_complete,
                                 host_is_cancelled, host_note};

/* ---- Python Batch type ---- */
typedef struct {
  PyObject_HEAD batch_t *b;
  long total;
} BatchObject;

static PyObject *Batch_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  long total = 0;
  static char *kwlist[] = {"total", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "l", kwlist, &total)) return NULL;
  if (total < 0) {
    PyErr_SetString(PyExc_ValueError, "total must be >= 0");
    return NULL;
  }
  BatchObject *self = (BatchObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  batch_t *b = calloc(1, sizeof(batch_t));
  if (!b) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  pthread_mutex_init(&b->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_store(&b->remaining, total);
  atomic_store(&b->refs, total > 0 ? 2 : 1);
  self->b = b;
  self->total = total;
  return (PyObject *)self;
}

static void Batch_dealloc(BatchObject *self) {
  if (self->b) batch_unref(self->b);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* How long wait() polls the counter before it sleeps on the condition variable. Waking a
 * sleeping thread costs tens of microseconds on small VMs, longer than a small transfer
 * itself; a short poll catches those completions first. Set from the engine config. */
static atomic_llong g_wait_spin_ns = 0;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static PyObject *Batch_wait(BatchObject *self, PyObject *args) {
  double timeout = -1.0;
  if (!PyArg_ParseTuple(args, "|d", &timeout)) return NULL;
  batch_t *b = self->b;
  if (atomic_load(&b->remaining) == 0) Py_RETURN_TRUE;
  int done;
  Py_BEGIN_ALLOW_THREADS;
  long long spin = atomic_load_explicit(&g_wait_spin_ns, memory_order_relaxed);
  if (spin > 0) {
    if (timeout >= 0 && spin > (long long)(timeout * 1e9)) spin = (long long)(timeout * 1e9);
    uint64_t until = now_ns() + (uint64_t)spin;
    while (atomic_load(&b->remaining) > 0 && now_ns() < until) cpu_relax();
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
  while (atomic_load(&b->remaining) > 0) {
    if (timeout < 0) {
      pthread_cond_wait(&b->cv, &b->mu);
    } else if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT) {
      break;
    }
  }
  done = atomic_load(&b->remaining) == 0;
  pthread_mutex_unlock(&b->mu);
  Py_END_ALLOW_THREADS;
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

static PyMethodDef Batch_methods[] = {
    {"wait", (PyCFunction)Batch_wait, METH_VARARGS, "wait(timeout=-1) -> bool: True when every slice finished"},
    {"cancel", (PyCFunction)Batch_cancel, METH_NOARGS, "mark cancelled; queued slices complete as cancelled"},
    {"fail_slice", (PyCFunction)Batch_fail_slice, METH_VARARGS, "finalize one outstanding slice with an error"},
    {"complete_slice", (PyCFunction)Batch_complete_slice, METH_VARARGS, "finalize one outstanding slice as done"},
    {"note_retry", (PyCFunction)Batch_note_retry, METH_NOARGS, "count one retry"},
    {NULL}};

static PyGetSetDef Batch_getset[] = {
    {"remaining", (getter)Batch_get_remaining, NULL, NULL, NULL},
    {"error", (getter)Batch_get_error, NULL, NULL, NULL},
    {"bytes_done", (getter)Batch_get_bytes, NULL, NULL, NULL},
    {"retries", (getter)Batch_get_retries, NULL, NULL, NULL},
    {"cancelled", (getter)Batch_get_cancelled, NULL, NULL, NULL},
    {"token", (getter)Batch_get_token, NULL, NULL, NULL},
    {"total", (getter)Batch_get_total, NULL, NULL, NULL},
    {NULL}};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tent_core._native.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Batch_new,
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

/* ---- submit ---- */
static int stamp_and_account(tent_slice_t *s, uint64_t token, uint64_t t) {
  s->token = token;
  s->submit_ns = t;
  int64_t *st = slot(s->stat_index);
  if (st) {
    __atomic_fetch_add(&st[TENT_STAT_INFLIGHT_BYTES], (int64_t)s->length, __ATOMIC_RELAXED);
    __atomic_fetch_add(&st[TENT_STAT_INFLIGHT_SLICES], 1, __ATOMIC_RELAXED);
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

static pthread_rwlock_t g_live_mu = PTHREAD_RWLOCK_INITIALIZER;
static live_exec_t *g_live = NULL;
static size_t g_live_len = 0, g_live_cap = 0;

static int live_find(uint64_t ops, uint64_t handle) { /* read lock held */
  for (size_t i = 0; i < g_live_len; i++)
    if (g_live[i].handle == handle && g_live[i].ops == ops) return 1;
  return 0;
}

/* Lock the executor for one submit; 0 when it is not live (nothing locked then). */
static int exec_enter(uint64_t ops, uint64_t handle) {
  if (!ops || !handle) return 0;
  pthread_rwlock_rdlock(&g_live_mu);
  if (live_find(ops, handle)) return 1;
  pthread_rwlock_unlock(&g_live_mu);
  return 0;
}

static void exec_leave(void) { pthread_rwlock_unlock(&g_live_mu); }

static PyObject *py_executor_register(PyObject *m, PyObject *args) {
  unsigned long long ops_p, exec_p;
  if (!PyArg_ParseTuple(args, "KK", &ops_p, &exec_p)) return NULL;
  if (!ops_p || !exec_p) {
    PyErr_SetString(PyExc_ValueError, "executor ops and handle must be non-zero");
    return NULL;
  }
  const tent_executor_ops_t *ops = (const tent_executor_ops_t *)(uintptr_t)ops_p;
  if (ops->abi_version != TENT_EXECUTOR_ABI_VERSION || ops->struct_size < sizeof(tent_executor_ops_t) || !ops->submit) {
    PyErr_SetString(PyExc_ValueError, "executor ops table has the wrong ABI version or size");
    return NULL;
  }
  int rc = 0;
  Py_BEGIN_ALLOW_THREADS;
  pthread_rwlock_wrlock(&g_live_mu);
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
  pthread_rwlock_unlock(&g_live_mu);
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
  pthread_rwlock_wrlock(&g_live_mu);
  for (size_t i = 0; i < g_live_len; i++)
    if (g_live[i].handle == exec_p && g_live[i].ops == ops_p) {
      g_live[i] = g_live[--g_live_len];
      found = 1;
      break;
    }
  pthread_rwlock_unlock(&g_live_mu);
  Py_END_ALLOW_THREADS;
  return PyBool_FromLong(found);
}

/* submit(ops, exec, batch, slices_buffer) -> 0 or negative status. The buffer holds
 * n tent_slice_t; token and submit_ns are filled in here. TENT_E_INTERNAL (nothing submitted)
 * when (ops, exec) is not a live executor. */
static PyObject *py_submit(PyObject *m, PyObject *args) {
  unsigned long long ops_p, exec_p;
  BatchObject *bo;
  Py_buffer view;
  if (!PyArg_ParseTuple(args, "KKO!w*", &ops_p, &exec_p, &BatchType, &bo, &view)) return NULL;
  if (view.len % sizeof(tent_slice_t)) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "slice buffer size is not a multiple of sizeof(tent_slice_t)");
    return NULL;
  }
  if (!exec_enter(ops_p, exec_p)) {
    PyBuffer_Release(&view);
    return PyLong_FromLong(TENT_E_INTERNAL);
  }
  const tent_executor_ops_t *ops = (const tent_executor_ops_t *)(uintptr_t)ops_p;
  uint32_t n = (uint32_t)(view.len / sizeof(tent_slice_t));
  tent_slice_t *s = (tent_slice_t *)view.buf;
  uint64_t t = now_ns(), token = (uintptr_t)bo->b;
  for (uint32_t i = 0; i < n; i++) stamp_and_account(&s[i], token, t);
  int rc = ops->submit((void *)(uintptr_t)exec_p, s, n);
  exec_leave();
  if (rc != 0)
    for (uint32_t i = 0; i < n; i++) unaccount(&s[i]);
  PyBuffer_Release(&view);
  return PyLong_FromLong(rc);
}

/* submit_one(ops, exec, batch, opcode, local, remote, length, peer, rail, stat_index, attempt) */
static PyObject *py_submit_one(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 11 || !PyObject_TypeCheck(args[2], &BatchType)) {
    PyErr_SetString(PyExc_TypeError, "submit_one(ops, exec, batch, opcode, local, remote, length, peer, rail, stat, attempt)");
    return NULL;
  }
  tent_slice_t s;
  unsigned long long v[11];
  for (int i = 0; i < 11; i++) {
    if (i == 2) continue;
    v[i] = PyLong_AsUnsignedLongLong(args[i]);
    if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  const tent_executor_ops_t *ops = (const tent_executor_ops_t *)(uintptr_t)v[0];
  s.opcode = (uint32_t)v[3];
  s.local_addr = v[4];
  s.remote_addr = v[5];
  s.length = v[6];
  s.peer = v[7];
  s.rail = (uint32_t)v[8];
  s.stat_index = (uint32_t)v[9];
  s.attempt = (uint32_t)v[10];
  if (!exec_enter(v[0], v[1])) return PyLong_FromLong(TENT_E_INTERNAL);
  stamp_and_account(&s, (uintptr_t)((BatchObject *)args[2])->b, now_ns());
  int rc = ops->submit((void *)(uintptr_t)v[1], &s, 1);
  exec_leave();
  if (rc != 0) unaccount(&s);
  return PyLong_FromLong(rc);
}

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

static PyObject *py_host_api_address(PyObject *m, PyObject *unused) {
  return PyLong_FromUnsignedLongLong((uintptr_t)&g_host);
}
static PyObject *py_failure_fd(PyObject *m, PyObject *unused) { return PyLong_FromLong(g_fail_fd); }
static PyObject *py_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromUnsignedLongLong(now_ns()); }

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
    {"submit", py_submit, METH_VARARGS, "submit(ops, exec, batch, slices) -> rc"},
    {"submit_one", (PyCFunction)(void (*)(void))py_submit_one, METH_FASTCALL, "submit one slice"},
    {"executor_register", py_executor_register, METH_VARARGS, "executor_register(ops, handle): submit may reach it"},
    {"executor_retire", py_executor_retire, METH_VARARGS, "executor_retire(ops, handle) -> bool: no submit reaches it after return"},
    {"pop_failures", py_pop_failures, METH_VARARGS, "take queued retryable failures"},
    {"requeue_failures", py_requeue_failures, METH_O, "put back failure records not ours"},
    {"set_stats", py_set_stats, METH_O, "use this writable buffer for telemetry slots"},
    {"host_api_address", py_host_api_address, METH_NOARGS, "address of the tent_host_api_t"},
    {"failure_fd", py_failure_fd, METH_NOARGS, "eventfd signalled when failures are queued"},
    {"now_ns", py_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns"},
    {"set_wait_spin_ns", py_set_wait_spin_ns, METH_O, "poll this long in Batch.wait before sleeping; returns the old value"},
    {NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_native", "tent_core compiled hot path", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
  if (PyType_Ready(&BatchType) < 0) return NULL;
  if (g_fail_fd < 0) {
    g_fail_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g_fail_fd < 0) return PyErr_SetFromErrno(PyExc_OSError);
  }
  PyObject *m = PyModule_Create(&moddef);
  if (!m) return NULL;
  Py_INCREF(&BatchType);
  PyModule_AddObject(m, "Batch", (PyObject *)&BatchType);
  PyModule_AddIntConstant(m, "EXECUTOR_ABI_VERSION", TENT_EXECUTOR_ABI_VERSION);
  PyModule_AddIntConstant(m, "SLICE_SIZE", sizeof(tent_slice_t));
  PyModule_AddIntConstant(m, "FAILURE_SIZE", sizeof(failure_t));
  PyModule_AddIntConstant(m, "STAT_FIELDS", ST_FIELDS);
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
  return m;
fail:
  Py_XDECREF(codes);
  Py_XDECREF(retry);
  Py_XDECREF(fields);
  Py_XDECREF(notes);
  Py_DECREF(m);
  return NULL;
}
