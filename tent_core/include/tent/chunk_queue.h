/*
 * tent/chunk_queue.h: slices cut into chunks for an executor's worker threads.
 *
 * A tent_job_t holds one slice and counts its unfinished chunks; the chunk that finishes
 * last reports the slice exactly once, with the first error any chunk saw. The FIFO of
 * chunks is a growable ring; the tent_cq_* calls are not thread-safe (callers hold their
 * queue lock), except tent_cq_submit, which takes it. Header-only.
 */
#ifndef TENT_CHUNK_QUEUE_H
#define TENT_CHUNK_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tent/executor_abi.h"

typedef struct tent_job {
  tent_slice_t s;
  atomic_uint remaining; /* chunks not yet finished */
  atomic_int status;     /* first error, TENT_OK while none */
} tent_job_t;

typedef struct tent_chunk {
  tent_job_t *job;
  uint64_t off, len; /* the piece [off, off+len) of the job's slice */
} tent_chunk_t;

typedef struct tent_chunk_queue {
  tent_chunk_t *items;
  size_t cap, head, len;
} tent_chunk_queue_t;

/* A job for `s` that will be cut into `chunks` pieces; NULL when out of memory. */
static inline tent_job_t *tent_job_new(const tent_slice_t *s, uint32_t chunks) {
  tent_job_t *j = malloc(sizeof *j);
  if (!j) return NULL;
  j->s = *s;
  atomic_init(&j->remaining, chunks);
  atomic_init(&j->status, TENT_OK);
  return j;
}

/* Account one finished chunk. Returns 1 when it was the job's last: the caller then reports
 * j->s with *final and frees the job. */
static inline int tent_job_chunk_done(tent_job_t *j, int status, int *final) {
  if (status != TENT_OK) {
    int expected = TENT_OK;
    atomic_compare_exchange_strong(&j->status, &expected, status);
  }
  if (atomic_fetch_sub(&j->remaining, 1) != 1) return 0;
  *final = atomic_load(&j->status);
  return 1;
}

/* Room for `extra` more chunks. 0, or -1 when out of memory (the queue is unchanged). */
static inline int tent_cq_reserve(tent_chunk_queue_t *q, size_t extra) {
  if (q->len + extra <= q->cap) return 0;
  size_t cap = q->cap ? q->cap : 256;
  while (cap < q->len + extra) cap *= 2;
  tent_chunk_t *items = malloc(cap * sizeof *items);
  if (!items) return -1;
  for (size_t i = 0; i < q->len; i++) items[i] = q->items[(q->head + i) % q->cap];
  free(q->items);
  q->items = items;
  q->cap = cap;
  q->head = 0;
  return 0;
}

/* Append the job's `parts` chunks of `per` bytes (the last one shorter); room reserved. */
static inline void tent_cq_push_job(tent_chunk_queue_t *q, tent_job_t *j, uint64_t parts, uint64_t per) {
  uint64_t len = j->s.length, off = 0;
  for (uint64_t k = 0; k < parts; k++) {
    uint64_t n = off >= len ? 0 : (len - off < per ? len - off : per);
    tent_chunk_t *c = &q->items[(q->head + q->len) % q->cap];
    c->job = j;
    c->off = off;
    c->len = n;
    q->len++;
    off += n;
  }
}

/* Take the oldest chunk. 0, or -1 when the queue is empty. */
static inline int tent_cq_pop(tent_chunk_queue_t *q, tent_chunk_t *out) {
  if (q->len == 0) return -1;
  *out = q->items[q->head];
  q->head = (q->head + 1) % q->cap;
  q->len--;
  return 0;
}

/* Chunks of `chunk` bytes at most (0: whole slices), at most `max_parts` per slice, evened
 * out and rounded up to 4096 so pieces stay page- and O_DIRECT-aligned. */
#define TENT_CQ_ALIGN 4096u
static inline uint64_t tent_cq_parts(uint64_t len, uint64_t chunk, uint32_t max_parts, uint64_t *per) {
  uint64_t parts = chunk > 0 && len > chunk ? (len + chunk - 1) / chunk : 1;
  if (parts > max_parts) parts = max_parts ? max_parts : 1;
  *per = len;
  if (parts > 1) {
    *per = (len + parts - 1) / parts;
    *per = (*per + TENT_CQ_ALIGN - 1) & ~(uint64_t)(TENT_CQ_ALIGN - 1);
  }
  return parts;
}

/* The executor ABI's submit for chunk-queue executors: queue n slices as jobs under `mu` and
 * wake workers on `cv` (every worker when there is more than one chunk, unless `wake_one`: then a
 * single one, for callers that work through the queue themselves and workers that wake the next
 * while work is left). TENT_OK, or TENT_E_INTERNAL with nothing queued (out of memory, or *stop
 * already set). */
/* tent_cq_submit_ex with a chunk size per slice: slice i is cut into pieces of chunks[i] bytes
 * (0: one piece) when `chunks` is not NULL, else of `chunk` bytes like tent_cq_submit_ex. */
static inline int tent_cq_submit_each(tent_chunk_queue_t *q, pthread_mutex_t *mu, pthread_cond_t *cv, const int *stop,
                                      const tent_slice_t *slices, uint32_t n, uint64_t chunk, const uint64_t *chunks,
                                      uint32_t max_parts, int wake_one) {
  if (n == 0) return TENT_OK;
  tent_job_t **jobs = malloc(n * sizeof *jobs); /* made outside the lock */
  uint64_t *plan = malloc(2 * (size_t)n * sizeof *plan); /* parts, per */
  size_t total = 0;
  uint32_t made = 0;
  int rc = jobs && plan ? TENT_OK : TENT_E_INTERNAL;
  for (; rc == TENT_OK && made < n; made++) {
    plan[2 * made] = tent_cq_parts(slices[made].length, chunks ? chunks[made] : chunk, max_parts, &plan[2 * made + 1]);
    total += plan[2 * made];
    jobs[made] = tent_job_new(&slices[made], (uint32_t)plan[2 * made]);
    if (!jobs[made]) rc = TENT_E_INTERNAL;
  }
  if (rc == TENT_OK) {
    pthread_mutex_lock(mu);
    if (*stop || tent_cq_reserve(q, total) != 0) {
      rc = TENT_E_INTERNAL;
    } else {
      for (uint32_t i = 0; i < n; i++) tent_cq_push_job(q, jobs[i], plan[2 * i], plan[2 * i + 1]);
      if (total > 1 && !wake_one)
        pthread_cond_broadcast(cv);
      else
        pthread_cond_signal(cv);
    }
    pthread_mutex_unlock(mu);
  }
  if (rc != TENT_OK && jobs)
    for (uint32_t i = 0; i < made; i++) free(jobs[i]);
  free(jobs);
  free(plan);
  return rc;
}

static inline int tent_cq_submit_ex(tent_chunk_queue_t *q, pthread_mutex_t *mu, pthread_cond_t *cv, const int *stop,
                                    const tent_slice_t *slices, uint32_t n, uint64_t chunk, uint32_t max_parts,
                                    int wake_one) {
  return tent_cq_submit_each(q, mu, cv, stop, slices, n, chunk, NULL, max_parts, wake_one);
}

static inline int tent_cq_submit(tent_chunk_queue_t *q, pthread_mutex_t *mu, pthread_cond_t *cv, const int *stop,
                                 const tent_slice_t *slices, uint32_t n, uint64_t chunk, uint32_t max_parts) {
  return tent_cq_submit_ex(q, mu, cv, stop, slices, n, chunk, max_parts, 0);
}

static inline void tent_cq_free(tent_chunk_queue_t *q) {
  free(q->items);
  q->items = NULL;
  q->cap = q->head = q->len = 0;
}

#endif
