/*
 * tent_nvlink._executor: same-host GPU slice executor for tent_core (executor ABI v1).
 *
 * The library never links CUDA: create() dlopen()s libcudart (config `cudart`, else the
 * usual sonames) and resolves the handful of runtime calls it needs, so the .so loads on
 * machines without CUDA and create() fails there with a clear message.
 *
 * Remote buffers are translated through a per-peer table [rbase, rbase+len) -> local
 * pointer that the Python side fills after cudaIpcOpenMemHandle (or identity for buffers of
 * this very process). A submit thread takes slices from a FIFO and issues
 * cudaMemcpyAsync(cudaMemcpyDefault) on `streams` non-blocking streams per device (round
 * robin), records a blocking-sync event after each slice and hands (slice, event) to the
 * completion thread, which waits with cudaEventSynchronize (the thread sleeps in the driver,
 * no spinning) and reports through host->complete exactly once.
 *
 * Teardown drains: every slice translated through the table gets a ticket (in submit order,
 * which is also completion order: one FIFO), and map_remove / peer_remove return only once every
 * ticket issued before the mapping left the table has completed. The caller may then close the
 * IPC handle behind the mapping: no copy can still be reading or writing it.
 *
 * Stream ordering: a batch registered with tent_nvl_order_add (token -> the cudaEvent_t the request
 * waits for) has each of its copies issued after cudaStreamWaitEvent(stream, event) on the stream
 * the copy goes to: the GPU holds the copy until the caller's kernel recorded the event; no host
 * thread waits.
 *
 * Private exports (ctypes):
 *   uint64_t tent_nvl_peer_add(void *ex);
 *   int32_t  tent_nvl_peer_remove(void *ex, uint64_t peer);
 *   int32_t  tent_nvl_map_add(void *ex, uint64_t peer, uint64_t rbase, uint64_t len, uint64_t lptr,
 *                             int32_t device, int32_t writable);
 *   int32_t  tent_nvl_map_remove(void *ex, uint64_t peer, uint64_t rbase);
 *   void     tent_nvl_stats(void *ex, uint64_t out[4]);   copies issued, ok, failed, bytes
 *   int32_t  tent_nvl_order_add(void *ex, uint64_t token, uint64_t event, uint64_t seq, uint64_t deadline_ns);
 *   int32_t  tent_nvl_order_remove(void *ex, uint64_t token);
 *   uint64_t tent_nvl_ordered(void *ex);                 copies issued behind a stream wait
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent/config_kv.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"
#include "tent/order_table.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 32
#define MAX_STREAMS 16

typedef int cuerr_t;
typedef void *custream_t;
typedef void *cuevent_t;

typedef struct cudart {
  void *dl;
  cuerr_t (*SetDevice)(int);
  cuerr_t (*StreamCreateWithFlags)(custream_t *, unsigned);
  cuerr_t (*StreamDestroy)(custream_t);
  cuerr_t (*EventCreateWithFlags)(cuevent_t *, unsigned);
  cuerr_t (*EventRecord)(cuevent_t, custream_t);
  cuerr_t (*EventSynchronize)(cuevent_t);
  cuerr_t (*EventDestroy)(cuevent_t);
  cuerr_t (*MemcpyAsync)(void *, const void *, size_t, int, custream_t);
  cuerr_t (*StreamWaitEvent)(custream_t, cuevent_t, unsigned);
  const char *(*GetErrorString)(cuerr_t);
} cudart_t;

#define CUDA_STREAM_NON_BLOCKING 1u
#define CUDA_EVENT_BLOCKING_SYNC 1u
#define CUDA_EVENT_DISABLE_TIMING 2u
#define CUDA_MEMCPY_DEFAULT 4

typedef struct region {
  uint64_t rbase, len, lptr;
  int device, writable;
} region_t;

typedef struct peer {
  uint64_t handle;
  region_t *r;
  size_t n, cap;
} peer_t;

typedef struct pending {
  tent_slice_t s;
  cuevent_t ev; /* NULL: already failed/finished with `status` */
  int status;
  uint64_t ticket; /* > 0: translated through the table (teardown waits for it) */
} pending_t;

typedef struct fifo {
  pending_t *a;
  size_t cap, head, len;
} fifo_t;

typedef struct executor {
  const tent_host_api_t *host;
  cudart_t rt;
  uint32_t nstreams;
  custream_t streams[MAX_DEV][MAX_STREAMS];
  uint32_t rr[MAX_DEV];

  pthread_mutex_t mu;
  pthread_cond_t cv_submit, cv_done, cv_drain;
  fifo_t inq, doneq; /* doneq has room for every slice accepted: pushing to it never fails */
  atomic_ullong issued_ticket; /* last ticket handed out (by the submit thread, under tab read lock) */
  uint64_t done_ticket;        /* every ticket up to this one has completed; under mu */
  cuevent_t *evfree;
  size_t nevfree, evcap;
  int stop, submit_exited;
  pthread_t submit_thr, done_thr;
  int started;

  pthread_rwlock_t tab;
  tent_handle_table_t peers;
  tent_order_table_t order; /* batches whose copies wait for a device event */

  atomic_ullong st_issued, st_ok, st_failed, st_bytes, st_ordered;
} executor_t;

static int fifo_push(fifo_t *f, const pending_t *p) {
  if (f->len == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 256;
    pending_t *n = malloc(cap * sizeof *n);
    if (!n) return -1;
    for (size_t i = 0; i < f->len; i++) n[i] = f->a[(f->head + i) % f->cap];
    free(f->a);
    f->a = n;
    f->cap = cap;
    f->head = 0;
  }
  f->a[(f->head + f->len) % f->cap] = *p;
  f->len++;
  return 0;
}

static int fifo_reserve(fifo_t *f, size_t total) {
  if (total <= f->cap) return 0;
  size_t cap = f->cap ? f->cap : 256;
  while (cap < total) cap *= 2;
  pending_t *n = malloc(cap * sizeof *n);
  if (!n) return -1;
  for (size_t i = 0; i < f->len; i++) n[i] = f->a[(f->head + i) % f->cap];
  free(f->a);
  f->a = n;
  f->cap = cap;
  f->head = 0;
  return 0;
}

static pending_t fifo_pop(fifo_t *f) {
  pending_t p = f->a[f->head];
  f->head = (f->head + 1) % f->cap;
  f->len--;
  return p;
}

static void report(executor_t *ex, const tent_slice_t *s, int st) {
  atomic_fetch_add(st == TENT_OK ? &ex->st_ok : &ex->st_failed, 1);
  if (st == TENT_OK) atomic_fetch_add(&ex->st_bytes, s->length);
  ex->host->complete(ex->host->ctx, s, st);
}

/* ------------------------------------------------------------------ table */
static peer_t *peer_lookup(executor_t *ex, uint64_t h) { return tent_ht_get(&ex->peers, h); }

/* translate; tab read lock held by caller */
static int translate(executor_t *ex, const tent_slice_t *s, uint64_t *lptr, int *dev) {
  peer_t *p = peer_lookup(ex, s->peer);
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
  *lptr = r->lptr + off;
  *dev = r->device;
  return TENT_OK;
}

/* ------------------------------------------------------------------ threads */
static custream_t get_stream(executor_t *ex, int dev, int *st) {
  if (dev < 0 || dev >= MAX_DEV) dev = 0;
  uint32_t k = ex->rr[dev]++ % ex->nstreams;
  if (!ex->streams[dev][k]) {
    cuerr_t e = ex->rt.StreamCreateWithFlags(&ex->streams[dev][k], CUDA_STREAM_NON_BLOCKING);
    if (e) {
      ex->streams[dev][k] = NULL;
      *st = TENT_E_IO;
      return NULL;
    }
  }
  return ex->streams[dev][k];
}

static cuevent_t get_event(executor_t *ex) { /* mu held */
  if (ex->nevfree) return ex->evfree[--ex->nevfree];
  cuevent_t ev = NULL;
  if (ex->rt.EventCreateWithFlags(&ev, CUDA_EVENT_BLOCKING_SYNC | CUDA_EVENT_DISABLE_TIMING)) return NULL;
  return ev;
}

static void put_event(executor_t *ex, cuevent_t ev) { /* mu held */
  if (ex->nevfree == ex->evcap) {
    size_t cap = ex->evcap ? ex->evcap * 2 : 64;
    cuevent_t *n = realloc(ex->evfree, cap * sizeof *n);
    if (!n) {
      ex->rt.EventDestroy(ev);
      return;
    }
    ex->evfree = n;
    ex->evcap = cap;
  }
  ex->evfree[ex->nevfree++] = ev;
}

static void *submit_main(void *arg) {
  executor_t *ex = arg;
  int cur_dev = -1;
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    while (!ex->stop && ex->inq.len == 0) pthread_cond_wait(&ex->cv_submit, &ex->mu);
    if (ex->stop && ex->inq.len == 0) break;
    pending_t p = fifo_pop(&ex->inq);
    pthread_mutex_unlock(&ex->mu);
    const tent_slice_t *s = &p.s;
    int st = TENT_OK;
    if (ex->host->is_cancelled(ex->host->ctx, s->token))
      st = TENT_E_CANCELLED;
    else if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE)
      st = TENT_E_PROTOCOL;
    else if (s->remote_addr + s->length < s->remote_addr)
      st = TENT_E_BOUNDS;
    uint64_t rptr = 0;
    int dev = 0;
    p.ticket = 0;
    if (st == TENT_OK) {
      pthread_rwlock_rdlock(&ex->tab);
      st = translate(ex, s, &rptr, &dev);
      /* the ticket is taken while the mapping is still in the table: a remover that gets the
       * write lock after this sees it and waits for the copy below */
      if (st == TENT_OK) p.ticket = atomic_fetch_add(&ex->issued_ticket, 1) + 1;
      pthread_rwlock_unlock(&ex->tab);
    }
    p.ev = NULL;
    if (st == TENT_OK && s->length > 0) {
      if (dev != cur_dev && ex->rt.SetDevice(dev) == 0) cur_dev = dev;
      custream_t stream = get_stream(ex, dev, &st);
      pthread_mutex_lock(&ex->mu);
      cuevent_t ev = st == TENT_OK ? get_event(ex) : NULL;
      pthread_mutex_unlock(&ex->mu);
      if (st == TENT_OK && !ev) st = TENT_E_IO;
      tent_order_t ord;
      if (st == TENT_OK && tent_ot_get(&ex->order, s->token, &ord)) {
        /* stream ordering: this copy runs after the caller's event, on the GPU */
        cuerr_t e = ex->rt.StreamWaitEvent(stream, (cuevent_t)(uintptr_t)ord.event, 0);
        if (e) {
          fprintf(stderr, "tent_nvlink: cudaStreamWaitEvent: %s\n", ex->rt.GetErrorString(e));
          st = TENT_E_IO;
          pthread_mutex_lock(&ex->mu);
          put_event(ex, ev);
          pthread_mutex_unlock(&ex->mu);
          ev = NULL;
        } else {
          atomic_fetch_add(&ex->st_ordered, 1);
        }
      }
      if (st == TENT_OK) {
        void *dst = (void *)(uintptr_t)(s->opcode == TENT_OP_READ ? s->local_addr : rptr);
        const void *src = (const void *)(uintptr_t)(s->opcode == TENT_OP_READ ? rptr : s->local_addr);
        cuerr_t e = ex->rt.MemcpyAsync(dst, src, (size_t)s->length, CUDA_MEMCPY_DEFAULT, stream);
        if (!e) e = ex->rt.EventRecord(ev, stream);
        atomic_fetch_add(&ex->st_issued, 1);
        if (e) {
          fprintf(stderr, "tent_nvlink: cudaMemcpyAsync: %s\n", ex->rt.GetErrorString(e));
          st = TENT_E_IO;
          pthread_mutex_lock(&ex->mu);
          put_event(ex, ev);
          pthread_mutex_unlock(&ex->mu);
        } else {
          p.ev = ev;
        }
      }
    }
    p.status = st;
    pthread_mutex_lock(&ex->mu);
    fifo_push(&ex->doneq, &p); /* room reserved by ex_submit */
    pthread_cond_signal(&ex->cv_done);
  }
  pthread_mutex_unlock(&ex->mu);
  return NULL;
}

static void *done_main(void *arg) {
  executor_t *ex = arg;
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    while (!ex->submit_exited && ex->doneq.len == 0) pthread_cond_wait(&ex->cv_done, &ex->mu);
    if (ex->doneq.len == 0 && ex->submit_exited) break;
    pending_t p = fifo_pop(&ex->doneq);
    pthread_mutex_unlock(&ex->mu);
    int st = p.status;
    if (p.ev) {
      cuerr_t e = ex->rt.EventSynchronize(p.ev); /* sleeps in the driver (blocking-sync event) */
      if (e) {
        fprintf(stderr, "tent_nvlink: copy failed: %s\n", ex->rt.GetErrorString(e));
        st = TENT_E_IO;
      }
    }
    report(ex, &p.s, st);
    pthread_mutex_lock(&ex->mu);
    if (p.ev) put_event(ex, p.ev);
    if (p.ticket) { /* FIFO: every earlier ticket is done too */
      ex->done_ticket = p.ticket;
      pthread_cond_broadcast(&ex->cv_drain);
    }
  }
  pthread_mutex_unlock(&ex->mu);
  return NULL;
}

/* ------------------------------------------------------------------ ABI */
static int load_cudart(cudart_t *rt, const char *path, char *err, size_t errlen) {
  const char *names[] = {path, "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", NULL};
  for (int i = 0; names[i]; i++) {
    if (!names[i][0]) continue;
    rt->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (rt->dl) break;
  }
  if (!rt->dl) {
    snprintf(err, errlen, "tent_nvlink: cannot dlopen libcudart: %s", dlerror());
    return -1;
  }
#define SYM(field, name)                                                          \
  do {                                                                            \
    *(void **)(&rt->field) = dlsym(rt->dl, name);                                 \
    if (!rt->field) {                                                             \
      snprintf(err, errlen, "tent_nvlink: libcudart lacks %s", name);             \
      return -1;                                                                  \
    }                                                                             \
  } while (0)
  SYM(SetDevice, "cudaSetDevice");
  SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
  SYM(StreamDestroy, "cudaStreamDestroy");
  SYM(EventCreateWithFlags, "cudaEventCreateWithFlags");
  SYM(EventRecord, "cudaEventRecord");
  SYM(EventSynchronize, "cudaEventSynchronize");
  SYM(EventDestroy, "cudaEventDestroy");
  SYM(MemcpyAsync, "cudaMemcpyAsync");
  SYM(StreamWaitEvent, "cudaStreamWaitEvent");
  SYM(GetErrorString, "cudaGetErrorString");
#undef SYM
  return 0;
}

static void parse_config(executor_t *ex, const char *cfg, char *lib, size_t liblen) {
  ex->nstreams = 4;
  lib[0] = 0;
  char k[64], v[256];
  for (const char *c = cfg; tent_config_next(&c, k, sizeof k, v, sizeof v);) {
    if (!strcmp(k, "streams")) {
      long t = strtol(v, NULL, 10);
      ex->nstreams = t < 1 ? 1 : (t > MAX_STREAMS ? MAX_STREAMS : (uint32_t)t);
    } else if (!strcmp(k, "cudart")) {
      snprintf(lib, liblen, "%s", v);
    }
  }
}

static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    snprintf(err, errlen, "tent_nvlink: host API version mismatch");
    return NULL;
  }
  executor_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    snprintf(err, errlen, "tent_nvlink: out of memory");
    return NULL;
  }
  ex->host = host;
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->cv_submit, NULL);
  pthread_cond_init(&ex->cv_done, NULL);
  pthread_cond_init(&ex->cv_drain, NULL);
  pthread_rwlock_init(&ex->tab, NULL);
  tent_ot_init(&ex->order);
  char lib[400];
  parse_config(ex, config, lib, sizeof lib);
  if (load_cudart(&ex->rt, lib, err, errlen) != 0) {
    ex_destroy(ex);
    return NULL;
  }
  if (pthread_create(&ex->submit_thr, NULL, submit_main, ex) != 0) {
    snprintf(err, errlen, "tent_nvlink: pthread_create failed");
    ex_destroy(ex);
    return NULL;
  }
  if (pthread_create(&ex->done_thr, NULL, done_main, ex) != 0) {
    snprintf(err, errlen, "tent_nvlink: pthread_create failed");
    pthread_mutex_lock(&ex->mu);
    ex->stop = 1;
    pthread_cond_broadcast(&ex->cv_submit);
    pthread_mutex_unlock(&ex->mu);
    pthread_join(ex->submit_thr, NULL);
    ex_destroy(ex);
    return NULL;
  }
  ex->started = 1;
  return ex;
}

static void ex_destroy(void *self) {
  executor_t *ex = self;
  if (!ex) return;
  if (ex->started) {
    /* the submit thread issues what is queued (cancelled batches fail fast), the
     * completion thread reports everything: each slice exactly once */
    pthread_mutex_lock(&ex->mu);
    ex->stop = 1;
    pthread_cond_broadcast(&ex->cv_submit);
    pthread_mutex_unlock(&ex->mu);
    pthread_join(ex->submit_thr, NULL);
    pthread_mutex_lock(&ex->mu);
    ex->submit_exited = 1;
    pthread_cond_broadcast(&ex->cv_done);
    pthread_mutex_unlock(&ex->mu);
    pthread_join(ex->done_thr, NULL);
  }
  if (ex->rt.dl) {
    for (size_t i = 0; i < ex->nevfree; i++) ex->rt.EventDestroy(ex->evfree[i]);
    for (int d = 0; d < MAX_DEV; d++)
      for (int k = 0; k < MAX_STREAMS; k++)
        if (ex->streams[d][k]) ex->rt.StreamDestroy(ex->streams[d][k]);
    /* libcudart stays loaded: unloading a CUDA runtime mid-process is not safe */
  }
  free(ex->evfree);
  free(ex->inq.a);
  free(ex->doneq.a);
  for (size_t i = 0; i < ex->peers.cap; i++) {
    peer_t *p = ex->peers.items[i];
    if (p) {
      free(p->r);
      free(p);
    }
  }
  tent_ht_free(&ex->peers);
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv_submit);
  pthread_cond_destroy(&ex->cv_done);
  pthread_cond_destroy(&ex->cv_drain);
  pthread_rwlock_destroy(&ex->tab);
  tent_ot_destroy(&ex->order);
  free(ex);
}

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  pthread_mutex_lock(&ex->mu);
  if (ex->stop) {
    pthread_mutex_unlock(&ex->mu);
    return TENT_E_INTERNAL;
  }
  /* room for every accepted slice in both FIFOs now, so nothing fails later: all or nothing */
  size_t total = ex->inq.len + ex->doneq.len + n + 1; /* +1: the one the submit thread holds */
  if (fifo_reserve(&ex->inq, ex->inq.len + n) != 0 || fifo_reserve(&ex->doneq, total) != 0) {
    pthread_mutex_unlock(&ex->mu);
    return TENT_E_INTERNAL;
  }
  for (uint32_t i = 0; i < n; i++) {
    pending_t p = {slices[i], NULL, 0, 0};
    fifo_push(&ex->inq, &p);
  }
  pthread_cond_signal(&ex->cv_submit);
  pthread_mutex_unlock(&ex->mu);
  return TENT_OK;
}

static const tent_executor_ops_t g_ops = {
    TENT_EXECUTOR_ABI_VERSION, sizeof(tent_executor_ops_t), "nvlink", ex_create, ex_destroy, ex_submit,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }

/* ------------------------------------------------------------------ private API */

/* Wait until every copy translated before now has completed (the caller has just taken a
 * mapping or peer out of the table, under the write lock, and released it). */
static void drain_issued(executor_t *ex) {
  uint64_t t = atomic_load(&ex->issued_ticket);
  pthread_mutex_lock(&ex->mu);
  while (ex->done_ticket < t) pthread_cond_wait(&ex->cv_drain, &ex->mu);
  pthread_mutex_unlock(&ex->mu);
}
EXPORT uint64_t tent_nvl_peer_add(void *self) {
  executor_t *ex = self;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return 0;
  pthread_rwlock_wrlock(&ex->tab);
  uint64_t h = tent_ht_insert(&ex->peers, p);
  p->handle = h;
  pthread_rwlock_unlock(&ex->tab);
  if (!h) free(p);
  return h;
}

/* Forget a peer. Returns once no copy through its mappings runs any more: the caller may close
 * the IPC handles behind them. */
EXPORT int32_t tent_nvl_peer_remove(void *self, uint64_t h) {
  executor_t *ex = self;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = tent_ht_take(&ex->peers, h);
  pthread_rwlock_unlock(&ex->tab);
  if (!p) return -ENOENT;
  free(p->r);
  free(p);
  drain_issued(ex);
  return 0;
}

EXPORT int32_t tent_nvl_map_add(void *self, uint64_t h, uint64_t rbase, uint64_t len, uint64_t lptr, int32_t dev,
                                int32_t writable) {
  executor_t *ex = self;
  if (rbase + len < rbase) return -EINVAL;
  int rc = 0;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = peer_lookup(ex, h);
  if (!p) {
    rc = -ENOENT;
  } else {
    size_t pos = 0;
    while (pos < p->n && p->r[pos].rbase < rbase) pos++;
    region_t nr = {rbase, len, lptr, dev, writable != 0};
    if (pos < p->n && p->r[pos].rbase == rbase) {
      p->r[pos] = nr;
    } else if ((pos > 0 && p->r[pos - 1].rbase + p->r[pos - 1].len > rbase) || (pos < p->n && rbase + len > p->r[pos].rbase)) {
      rc = -EEXIST;
    } else {
      if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        region_t *n = realloc(p->r, cap * sizeof *n);
        if (!n)
          rc = -ENOMEM;
        else {
          p->r = n;
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

/* Remove the mapping at rbase. Returns once no copy through it runs any more. */
EXPORT int32_t tent_nvl_map_remove(void *self, uint64_t h, uint64_t rbase) {
  executor_t *ex = self;
  int rc = -ENOENT;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = peer_lookup(ex, h);
  for (size_t i = 0; p && i < p->n; i++)
    if (p->r[i].rbase == rbase) {
      memmove(&p->r[i], &p->r[i + 1], (p->n - i - 1) * sizeof(region_t));
      p->n--;
      rc = 0;
      break;
    }
  pthread_rwlock_unlock(&ex->tab);
  if (rc == 0) drain_issued(ex);
  return rc;
}

EXPORT void tent_nvl_stats(void *self, uint64_t out[4]) {
  executor_t *ex = self;
  out[0] = atomic_load(&ex->st_issued);
  out[1] = atomic_load(&ex->st_ok);
  out[2] = atomic_load(&ex->st_failed);
  out[3] = atomic_load(&ex->st_bytes);
}

/* Copies of batch `token` issued from now on wait for `event` (a cudaEvent_t) on their stream. */
EXPORT int32_t tent_nvl_order_add(void *self, uint64_t token, uint64_t event, uint64_t seq, uint64_t deadline_ns) {
  return tent_ot_add(&((executor_t *)self)->order, token, event, seq, deadline_ns);
}

EXPORT int32_t tent_nvl_order_remove(void *self, uint64_t token) { return tent_ot_remove(&((executor_t *)self)->order, token); }

EXPORT uint64_t tent_nvl_ordered(void *self) { return atomic_load(&((executor_t *)self)->st_ordered); }
