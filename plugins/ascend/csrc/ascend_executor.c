/*
 * tent_ascend._executor: Ascend NPU slice executor for tent_core (executor ABI v1).
 *
 * Nothing of CANN is linked: create() dlopen()s libascendcl (config `acl_lib`, else the usual
 * soname) and resolves aclrtSetDevice, aclrtMemcpy and aclrtGetRecentErrMsg, so the library loads
 * on machines without CANN and create() fails there with a clear message.
 *
 * Slices move between local memory (host memory, or NPU memory this process registered with
 * tent_asc_local_add) and a peer's registered memory, which the Python side maps into this process
 * (its own buffers as they are; another process's NPU memory imported through ACL IPC) and lists in
 * a per-peer table [rbase, rbase+len) -> (local pointer, device or host, writable). ACL wants the
 * direction of every copy, so each slice's kind (host/device on each side) is worked out from the
 * two tables, and the worker makes the device of the copy current (aclrtSetDevice) first. Worker
 * threads (config `threads`) take chunks (config `chunk`) from one FIFO (tent/chunk_queue.h); the
 * last chunk of a slice reports it, once.
 *
 * Removing a mapping or a peer takes the peer's write lock, so it returns once no copy through it
 * runs any more (the caller may then close the IPC import behind it).
 *
 * Private exports (ctypes):
 *   uint64_t tent_asc_peer_add(void *ex);
 *   int32_t  tent_asc_peer_remove(void *ex, uint64_t peer);
 *   int32_t  tent_asc_map_add(void *ex, uint64_t peer, uint64_t rbase, uint64_t len, uint64_t lptr,
 *                             int32_t device, int32_t writable);      device < 0: host memory
 *   int32_t  tent_asc_map_remove(void *ex, uint64_t peer, uint64_t rbase);
 *   int32_t  tent_asc_local_add(void *ex, uint64_t base, uint64_t len, int32_t device);
 *   int32_t  tent_asc_local_remove(void *ex, uint64_t base);
 *   void     tent_asc_stats(void *ex, uint64_t out[4]);   copies h2d, d2h, d2d, h2h
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent/chunk_queue.h"
#include "tent/config_kv.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_THREADS 64
#define MAX_LOCAL 4096

enum { ACL_H2H = 0, ACL_H2D = 1, ACL_D2H = 2, ACL_D2D = 3 };

typedef struct acl {
  void *dl;
  int (*SetDevice)(int32_t);
  int (*Memcpy)(void *dst, size_t destMax, const void *src, size_t count, int kind);
  const char *(*RecentErrMsg)(void);
} acl_t;

typedef struct region {
  uint64_t rbase, len, lptr;
  int device; /* < 0: host memory */
  int writable;
} region_t;

typedef struct peer {
  pthread_rwlock_t rw; /* readers: copies in flight; writer: table changes */
  region_t *r;
  size_t n, cap;
  int removed;
} peer_t;

typedef struct local {
  uint64_t base, len;
  int device;
} local_t;

typedef tent_job_t job_t;
typedef tent_chunk_t work_t;

typedef struct executor {
  const tent_host_api_t *host;
  acl_t acl;
  uint32_t nthreads;
  uint64_t chunk;
  pthread_t threads[MAX_THREADS];
  uint32_t started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tent_chunk_queue_t q;
  int stop;
  pthread_mutex_t peers_mu;
  tent_handle_table_t peers;
  pthread_rwlock_t local_rw;
  local_t local[MAX_LOCAL]; /* this process's registered NPU memory, sorted by base */
  size_t nlocal;
  atomic_ullong st[4];
} executor_t;

static const region_t *region_find(const peer_t *p, uint64_t addr, uint64_t len) {
  size_t lo = 0, hi = p->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->r[mid].rbase <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return NULL;
  const region_t *r = &p->r[lo - 1];
  if (addr - r->rbase > r->len || len > r->len - (addr - r->rbase)) return NULL;
  return r;
}

/* The device of local NPU memory [addr, addr+len), -1 for host memory, -2 when it straddles. */
static int local_device(executor_t *ex, uint64_t addr, uint64_t len) {
  int dev = -1;
  pthread_rwlock_rdlock(&ex->local_rw);
  size_t lo = 0, hi = ex->nlocal;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ex->local[mid].base <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo > 0) {
    const local_t *l = &ex->local[lo - 1];
    if (addr - l->base < l->len) dev = len <= l->len - (addr - l->base) ? l->device : -2;
  }
  pthread_rwlock_unlock(&ex->local_rw);
  return dev;
}

static int run_work(executor_t *ex, const work_t *w) {
  const tent_slice_t *s = &w->job->s;
  if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE) return TENT_E_PROTOCOL;
  if (s->length == 0) return TENT_OK;
  if (s->remote_addr + s->length < s->remote_addr) return TENT_E_BOUNDS;
  int ldev = local_device(ex, s->local_addr, s->length);
  if (ldev == -2) return TENT_E_BOUNDS;
  pthread_mutex_lock(&ex->peers_mu);
  peer_t *p = tent_ht_get(&ex->peers, s->peer);
  if (p) pthread_rwlock_rdlock(&p->rw); /* taken before the table lock is released: removal waits */
  pthread_mutex_unlock(&ex->peers_mu);
  if (!p) return TENT_E_CONNECT;
  int st = TENT_OK;
  const region_t *r = p->removed ? NULL : region_find(p, s->remote_addr, s->length);
  if (p->removed)
    st = TENT_E_CONNECT;
  else if (!r)
    st = TENT_E_BOUNDS;
  else if (s->opcode == TENT_OP_WRITE && !r->writable)
    st = TENT_E_PERMISSION;
  if (st == TENT_OK) {
    char *remote = (char *)(uintptr_t)(r->lptr + (s->remote_addr - r->rbase) + w->off);
    char *local = (char *)(uintptr_t)(s->local_addr + w->off);
    int rdev = r->device;
    char *dst = s->opcode == TENT_OP_READ ? local : remote;
    char *src = s->opcode == TENT_OP_READ ? remote : local;
    int ddev = s->opcode == TENT_OP_READ ? ldev : rdev, sdev = s->opcode == TENT_OP_READ ? rdev : ldev;
    int kind = ddev >= 0 ? (sdev >= 0 ? ACL_D2D : ACL_H2D) : (sdev >= 0 ? ACL_D2H : ACL_H2H);
    int dev = ddev >= 0 ? ddev : sdev;
    if (dev >= 0 && ex->acl.SetDevice(dev) != 0) {
      st = TENT_E_IO;
    } else if (ex->acl.Memcpy(dst, w->len, src, w->len, kind) != 0) {
      const char *msg = ex->acl.RecentErrMsg ? ex->acl.RecentErrMsg() : NULL;
      fprintf(stderr, "tent_ascend: aclrtMemcpy (kind %d, %llu bytes): %s\n", kind, (unsigned long long)w->len,
              msg ? msg : "error");
      st = TENT_E_IO;
    } else {
      atomic_fetch_add(&ex->st[kind == ACL_H2D ? 0 : kind == ACL_D2H ? 1 : kind == ACL_D2D ? 2 : 3], 1);
    }
  }
  pthread_rwlock_unlock(&p->rw);
  return st;
}

static void finish_work(executor_t *ex, work_t *w, int st) {
  int final;
  if (tent_job_chunk_done(w->job, st, &final)) {
    ex->host->complete(ex->host->ctx, &w->job->s, final);
    free(w->job);
  }
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
    if (more) pthread_cond_signal(&ex->cv);
    int st;
    if (atomic_load(&w.job->status) != TENT_OK)
      st = TENT_OK; /* an earlier chunk failed: keep its status */
    else if (ex->host->is_cancelled(ex->host->ctx, w.job->s.token))
      st = TENT_E_CANCELLED;
    else
      st = run_work(ex, &w);
    finish_work(ex, &w, st);
    pthread_mutex_lock(&ex->mu);
  }
  pthread_mutex_unlock(&ex->mu);
  return NULL;
}

static int load_acl(acl_t *a, const char *path, char *err, size_t errlen) {
  const char *names[] = {path, "libascendcl.so", NULL};
  for (int i = 0; names[i] && !a->dl; i++)
    if (names[i][0]) a->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!a->dl) {
    snprintf(err, errlen, "tent_ascend: cannot dlopen libascendcl: %s", dlerror());
    return -1;
  }
  *(void **)(&a->SetDevice) = dlsym(a->dl, "aclrtSetDevice");
  *(void **)(&a->Memcpy) = dlsym(a->dl, "aclrtMemcpy");
  *(void **)(&a->RecentErrMsg) = dlsym(a->dl, "aclGetRecentErrMsg");
  if (!a->SetDevice || !a->Memcpy) {
    snprintf(err, errlen, "tent_ascend: libascendcl lacks aclrtSetDevice/aclrtMemcpy");
    return -1;
  }
  return 0;
}

static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    snprintf(err, errlen, "tent_ascend: host API version mismatch");
    return NULL;
  }
  executor_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    snprintf(err, errlen, "tent_ascend: out of memory");
    return NULL;
  }
  ex->host = host;
  ex->nthreads = 2;
  ex->chunk = 8u << 20;
  char lib[400] = "", k[64], v[400];
  for (const char *c = config; c && tent_config_next(&c, k, sizeof k, v, sizeof v);) {
    if (!strcmp(k, "threads")) {
      long t = strtol(v, NULL, 10);
      ex->nthreads = t < 1 ? 1 : (t > MAX_THREADS ? MAX_THREADS : (uint32_t)t);
    } else if (!strcmp(k, "chunk")) {
      ex->chunk = strtoull(v, NULL, 10);
    } else if (!strcmp(k, "acl_lib")) {
      snprintf(lib, sizeof lib, "%s", v);
    }
  }
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->cv, NULL);
  pthread_mutex_init(&ex->peers_mu, NULL);
  pthread_rwlock_init(&ex->local_rw, NULL);
  if (load_acl(&ex->acl, lib, err, errlen) != 0) {
    ex_destroy(ex);
    return NULL;
  }
  for (uint32_t i = 0; i < ex->nthreads; i++) {
    int rc = pthread_create(&ex->threads[i], NULL, worker_main, ex);
    if (rc) {
      snprintf(err, errlen, "tent_ascend: pthread_create: %s", strerror(rc));
      ex_destroy(ex);
      return NULL;
    }
    ex->started++;
  }
  return ex;
}

static void peer_free(peer_t *p) {
  pthread_rwlock_destroy(&p->rw);
  free(p->r);
  free(p);
}

static void ex_destroy(void *self) {
  executor_t *ex = self;
  if (!ex) return;
  pthread_mutex_lock(&ex->mu);
  ex->stop = 1;
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  for (uint32_t i = 0; i < ex->started; i++) pthread_join(ex->threads[i], NULL);
  work_t w;
  while (tent_cq_pop(&ex->q, &w) == 0) finish_work(ex, &w, TENT_E_CANCELLED); /* each reported once */
  tent_cq_free(&ex->q);
  for (size_t i = 0; i < ex->peers.cap; i++)
    if (ex->peers.items[i]) peer_free(ex->peers.items[i]);
  tent_ht_free(&ex->peers);
  /* libascendcl stays loaded: the process's ACL state outlives executors */
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv);
  pthread_mutex_destroy(&ex->peers_mu);
  pthread_rwlock_destroy(&ex->local_rw);
  free(ex);
}

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  return tent_cq_submit(&ex->q, &ex->mu, &ex->cv, &ex->stop, slices, n, ex->nthreads > 1 ? ex->chunk : 0, 65536);
}

static const tent_executor_ops_t g_ops = {
    TENT_EXECUTOR_ABI_VERSION, sizeof(tent_executor_ops_t), "ascend", ex_create, ex_destroy, ex_submit,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }

EXPORT uint64_t tent_asc_peer_add(void *self) {
  executor_t *ex = self;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return 0;
  pthread_rwlock_init(&p->rw, NULL);
  pthread_mutex_lock(&ex->peers_mu);
  uint64_t h = tent_ht_insert(&ex->peers, p);
  pthread_mutex_unlock(&ex->peers_mu);
  if (!h) peer_free(p);
  return h;
}

/* Returns once no copy through the peer's mappings runs any more. */
EXPORT int32_t tent_asc_peer_remove(void *self, uint64_t h) {
  executor_t *ex = self;
  pthread_mutex_lock(&ex->peers_mu);
  peer_t *p = tent_ht_take(&ex->peers, h);
  pthread_mutex_unlock(&ex->peers_mu);
  if (!p) return -ENOENT;
  pthread_rwlock_wrlock(&p->rw); /* drains copies in flight */
  p->removed = 1;
  pthread_rwlock_unlock(&p->rw);
  peer_free(p);
  return 0;
}

EXPORT int32_t tent_asc_map_add(void *self, uint64_t h, uint64_t rbase, uint64_t len, uint64_t lptr, int32_t device,
                                int32_t writable) {
  executor_t *ex = self;
  if (rbase + len < rbase || !lptr) return -EINVAL;
  pthread_mutex_lock(&ex->peers_mu);
  peer_t *p = tent_ht_get(&ex->peers, h);
  if (p) pthread_rwlock_wrlock(&p->rw);
  pthread_mutex_unlock(&ex->peers_mu);
  if (!p) return -ENOENT;
  int rc = 0;
  size_t pos = 0;
  while (pos < p->n && p->r[pos].rbase < rbase) pos++;
  region_t nr = {rbase, len, lptr, device, writable != 0};
  if (pos < p->n && p->r[pos].rbase == rbase) {
    p->r[pos] = nr;
  } else if ((pos > 0 && p->r[pos - 1].rbase + p->r[pos - 1].len > rbase) || (pos < p->n && rbase + len > p->r[pos].rbase)) {
    rc = -EEXIST;
  } else {
    if (p->n == p->cap) {
      size_t cap = p->cap ? p->cap * 2 : 8;
      region_t *nn = realloc(p->r, cap * sizeof *nn);
      if (!nn) rc = -ENOMEM;
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
  pthread_rwlock_unlock(&p->rw);
  return rc;
}

/* Returns once no copy through the mapping runs any more. */
EXPORT int32_t tent_asc_map_remove(void *self, uint64_t h, uint64_t rbase) {
  executor_t *ex = self;
  pthread_mutex_lock(&ex->peers_mu);
  peer_t *p = tent_ht_get(&ex->peers, h);
  if (p) pthread_rwlock_wrlock(&p->rw);
  pthread_mutex_unlock(&ex->peers_mu);
  if (!p) return -ENOENT;
  int rc = -ENOENT;
  for (size_t i = 0; i < p->n; i++)
    if (p->r[i].rbase == rbase) {
      memmove(&p->r[i], &p->r[i + 1], (p->n - i - 1) * sizeof(region_t));
      p->n--;
      rc = 0;
      break;
    }
  pthread_rwlock_unlock(&p->rw);
  return rc;
}

EXPORT int32_t tent_asc_local_add(void *self, uint64_t base, uint64_t len, int32_t device) {
  executor_t *ex = self;
  if (base + len < base || device < 0) return -EINVAL;
  int rc = 0;
  pthread_rwlock_wrlock(&ex->local_rw);
  size_t pos = 0;
  while (pos < ex->nlocal && ex->local[pos].base < base) pos++;
  if (ex->nlocal == MAX_LOCAL)
    rc = -ENOSPC;
  else if ((pos > 0 && ex->local[pos - 1].base + ex->local[pos - 1].len > base) ||
           (pos < ex->nlocal && base + len > ex->local[pos].base))
    rc = -EEXIST;
  else {
    memmove(&ex->local[pos + 1], &ex->local[pos], (ex->nlocal - pos) * sizeof(local_t));
    ex->local[pos] = (local_t){base, len, device};
    ex->nlocal++;
  }
  pthread_rwlock_unlock(&ex->local_rw);
  return rc;
}

EXPORT int32_t tent_asc_local_remove(void *self, uint64_t base) {
  executor_t *ex = self;
  int rc = -ENOENT;
  pthread_rwlock_wrlock(&ex->local_rw);
  for (size_t i = 0; i < ex->nlocal; i++)
    if (ex->local[i].base == base) {
      memmove(&ex->local[i], &ex->local[i + 1], (ex->nlocal - i - 1) * sizeof(local_t));
      ex->nlocal--;
      rc = 0;
      break;
    }
  pthread_rwlock_unlock(&ex->local_rw);
  return rc;
}

EXPORT void tent_asc_stats(void *self, uint64_t out[4]) {
  executor_t *ex = self;
  for (int i = 0; i < 4; i++) out[i] = atomic_load(&ex->st[i]);
}
