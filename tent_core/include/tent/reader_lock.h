/*
 * tent/reader_lock.h: a readers-writer lock for hot paths whose writers are rare.
 *
 * A reader pays two locked instructions (a count up, a count down; a pthread rwlock pair is
 * about four and ~130 instructions). A writer raises a flag, which holds new readers back, and
 * waits (yielding) for the count to drain, so writers never starve; they are meant for rare
 * changes (an executor registered or retired, a peer or a mapping added or removed). Readers
 * must not nest, and a thread holding the read side must never take the write side: both would
 * wait for themselves. Header-only.
 */
#ifndef TENT_READER_LOCK_H
#define TENT_READER_LOCK_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

typedef struct tent_reader_lock {
  atomic_long readers;
  atomic_int writer;
  pthread_mutex_t wmu; /* writers among themselves */
} tent_reader_lock_t;

#define TENT_READER_LOCK_INIT {0, 0, PTHREAD_MUTEX_INITIALIZER}

static inline void tent_rl_init(tent_reader_lock_t *l) {
  atomic_init(&l->readers, 0);
  atomic_init(&l->writer, 0);
  pthread_mutex_init(&l->wmu, NULL);
}

static inline void tent_rl_destroy(tent_reader_lock_t *l) { pthread_mutex_destroy(&l->wmu); }

static inline void tent_rl_read_lock(tent_reader_lock_t *l) {
  for (;;) {
    atomic_fetch_add(&l->readers, 1); /* seq_cst, then the flag: Dekker with the writer */
    if (!atomic_load(&l->writer)) return;
    atomic_fetch_sub(&l->readers, 1);
    while (atomic_load_explicit(&l->writer, memory_order_relaxed)) sched_yield();
  }
}

static inline void tent_rl_read_unlock(tent_reader_lock_t *l) {
  atomic_fetch_sub_explicit(&l->readers, 1, memory_order_release);
}

static inline void tent_rl_write_lock(tent_reader_lock_t *l) {
  pthread_mutex_lock(&l->wmu);
  atomic_store(&l->writer, 1); /* seq_cst, then the count */
  while (atomic_load(&l->readers) > 0) sched_yield();
}

static inline void tent_rl_write_unlock(tent_reader_lock_t *l) {
  atomic_store(&l->writer, 0);
  pthread_mutex_unlock(&l->wmu);
}

#endif
