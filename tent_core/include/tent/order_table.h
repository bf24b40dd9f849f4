/*
 * tent/order_table.h: which batches must wait for a device event before their slices run.
 *
 * A request may name a stream or event to wait on (stream ordering). When every slice of its
 * batch goes to transports whose executors can order copies against device events themselves,
 * the core registers (batch token -> event) with each of them before submitting, and removes the
 * entry once the batch is final. The executor looks a slice's token up here and makes the copy
 * wait for the event on the device (a CUDA stream wait, a worker that waits before its I/O)
 * instead of the core blocking a thread on the host.
 *
 * The table is small and fixed (an executor refuses more entries: the core then waits on the host
 * instead). `event` is opaque (a cudaEvent_t, a simulated event); `seq` is the record the waiter
 * must see (runtimes whose events carry sequence numbers), `deadline_ns` a CLOCK_MONOTONIC limit
 * after which the waiting slice fails with TENT_E_TIMEOUT. Header-only; thread-safe.
 */
#ifndef TENT_ORDER_TABLE_H
#define TENT_ORDER_TABLE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#define TENT_ORDER_SLOTS 256

typedef struct tent_order {
  uint64_t token; /* 0: free */
  uint64_t event;
  uint64_t seq;
  uint64_t deadline_ns;
} tent_order_t;

typedef struct tent_order_table {
  pthread_mutex_t mu;
  uint32_t used;
  tent_order_t e[TENT_ORDER_SLOTS];
} tent_order_table_t;

static inline void tent_ot_init(tent_order_table_t *t) {
  pthread_mutex_init(&t->mu, NULL);
  t->used = 0;
  for (int i = 0; i < TENT_ORDER_SLOTS; i++) t->e[i].token = 0;
}

static inline void tent_ot_destroy(tent_order_table_t *t) { pthread_mutex_destroy(&t->mu); }

/* 0, -EINVAL (token 0 or event 0), -EEXIST (token present), -ENOSPC (table full). */
static inline int tent_ot_add(tent_order_table_t *t, uint64_t token, uint64_t event, uint64_t seq, uint64_t deadline_ns) {
  if (!token || !event) return -EINVAL;
  int rc = -ENOSPC, free_at = -1;
  pthread_mutex_lock(&t->mu);
  for (int i = 0; i < TENT_ORDER_SLOTS; i++) {
    if (t->e[i].token == token) {
      free_at = -2;
      break;
    }
    if (!t->e[i].token && free_at == -1) free_at = i;
  }
  if (free_at == -2) {
    rc = -EEXIST;
  } else if (free_at >= 0) {
    t->e[free_at] = (tent_order_t){token, event, seq, deadline_ns};
    __atomic_add_fetch(&t->used, 1, __ATOMIC_RELEASE);
    rc = 0;
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

/* 1 and the entry when `token` must wait, 0 otherwise. Cheap when the table is empty. */
static inline int tent_ot_get(tent_order_table_t *t, uint64_t token, tent_order_t *out) {
  if (__atomic_load_n(&t->used, __ATOMIC_ACQUIRE) == 0) return 0;
  int found = 0;
  pthread_mutex_lock(&t->mu);
  for (int i = 0; i < TENT_ORDER_SLOTS; i++)
    if (t->e[i].token == token) {
      *out = t->e[i];
      found = 1;
      break;
    }
  pthread_mutex_unlock(&t->mu);
  return found;
}

/* 0, or -ENOENT. */
static inline int tent_ot_remove(tent_order_table_t *t, uint64_t token) {
  int rc = -ENOENT;
  pthread_mutex_lock(&t->mu);
  for (int i = 0; i < TENT_ORDER_SLOTS; i++)
    if (token && t->e[i].token == token) {
      t->e[i].token = 0;
      __atomic_sub_fetch(&t->used, 1, __ATOMIC_RELEASE);
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

#endif
