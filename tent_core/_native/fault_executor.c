/*
 * A fault-injecting slice executor for orchestrator tests. It speaks the executor ABI and
 * wraps a real executor: slices matching the active rule complete at once with the rule's
 * status (as a broken path would report), the others pass through to the wrapped executor.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent/executor_abi.h"

#define MAX_BATCH 256

typedef struct fault_exec {
  const tent_host_api_t *host;
  const tent_executor_ops_t *inner_ops;
  void *inner;
  pthread_mutex_t mu;
  int active;
  int32_t status;
  uint64_t rail_mask;
  uint64_t skip_first;
  uint32_t permille;
  uint64_t seen, injected;
  uint64_t rng;
} fault_exec_t;

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void *fx_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  unsigned long long ops = 0, inner = 0;
  const char *p = config ? strstr(config, "inner_ops=") : NULL;
  if (p) ops = strtoull(p + 10, NULL, 0);
  p = config ? strstr(config, "inner_handle=") : NULL;
  if (p) inner = strtoull(p + 13, NULL, 0);
  if (!ops || !inner) {
    snprintf(err, errlen, "fault executor needs inner_ops= and inner_handle=");
    return NULL;
  }
  fault_exec_t *fx = calloc(1, sizeof *fx);
  if (!fx) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  fx->host = host;
  fx->inner_ops = (const tent_executor_ops_t *)(uintptr_t)ops;
  fx->inner = (void *)(uintptr_t)inner;
  fx->rail_mask = ~0ull;
  fx->rng = 0x9e3779b97f4a7c15ull;
  pthread_mutex_init(&fx->mu, NULL);
  return fx;
}

static void fx_destroy(void *self) {
  fault_exec_t *fx = self;
  pthread_mutex_destroy(&fx->mu);
  free(fx); /* the wrapped executor belongs to its transport */
}

/* Hand `pass[0..np)` to the wrapped executor. When it refuses them after this call already reported
 * (or handed on) some of its slices, they are reported here with its status: the ABI says a submit
 * either queues all of its slices or reports none of them. Returns the status to give up with (only
 * while nothing was reported yet), else 0. */
static int fx_flush(fault_exec_t *fx, const tent_slice_t *pass, uint32_t np, int reported) {
  if (np == 0) return 0;
  int rc = fx->inner_ops->submit(fx->inner, pass, np);
  if (rc == 0) return 0;
  if (!reported) return rc;
  for (uint32_t i = 0; i < np; i++) fx->host->complete(fx->host->ctx, &pass[i], rc);
  return 0;
}

static int fx_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  fault_exec_t *fx = self;
  tent_slice_t pass[MAX_BATCH];
  uint32_t np = 0;
  int reported = 0; /* some of the n slices were reported or queued already */
  for (uint32_t i = 0; i < n; i++) {
    int fail = 0;
    pthread_mutex_lock(&fx->mu);
    uint64_t k = fx->seen++;
    if (fx->active && slices[i].rail < 64 && ((fx->rail_mask >> slices[i].rail) & 1) && k >= fx->skip_first &&
        (fx->permille >= 1000 || next_rand(&fx->rng) % 1000 < fx->permille)) {
      fail = 1;
      fx->injected++;
    }
    int32_t status = fx->status;
    pthread_mutex_unlock(&fx->mu);
    if (fail) {
      fx->host->complete(fx->host->ctx, &slices[i], status);
      reported = 1;
      continue;
    }
    pass[np++] = slices[i];
    if (np == MAX_BATCH) {
      int rc = fx_flush(fx, pass, np, reported);
      if (rc) return rc;
      reported = 1;
      np = 0;
    }
  }
  return fx_flush(fx, pass, np, reported);
}

static const tent_executor_ops_t ops = {TENT_EXECUTOR_ABI_VERSION, sizeof(tent_executor_ops_t), "fault",
                                        fx_create, fx_destroy, fx_submit};

__attribute__((visibility("default"))) const tent_executor_ops_t *tent_executor_ops(void) { return &ops; }

__attribute__((visibility("default"))) void tent_fault_set(void *self, int active, int32_t status, uint64_t rail_mask,
                                                           uint64_t skip_first, uint32_t permille) {
  fault_exec_t *fx = self;
  pthread_mutex_lock(&fx->mu);
  fx->active = active;
  fx->status = status;
  fx->rail_mask = rail_mask;
  fx->skip_first = fx->seen + skip_first;
  fx->permille = permille;
  pthread_mutex_unlock(&fx->mu);
}

__attribute__((visibility("default"))) uint64_t tent_fault_injected(void *self) {
  fault_exec_t *fx = self;
  pthread_mutex_lock(&fx->mu);
  uint64_t v = fx->injected;
  pthread_mutex_unlock(&fx->mu);
  return v;
}
