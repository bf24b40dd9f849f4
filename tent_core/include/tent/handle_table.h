/*
 * tent/handle_table.h: executor-owned objects behind opaque 64-bit handles.
 *
 * A handle is (generation << 32) | (slot + 1). Freed slots are reused, and their generation
 * moves on, so a handle the plugin kept after removing an object never finds the object that
 * took its slot later: a slice naming a forgotten peer fails cleanly instead of reaching a
 * stranger. Handle 0 is never issued. Header-only; not thread-safe: callers hold their own
 * lock around every call.
 */
#ifndef TENT_HANDLE_TABLE_H
#define TENT_HANDLE_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct tent_handle_table {
  void **items;    /* NULL = free slot */
  uint32_t *gens;  /* generation of the handle last issued for each slot */
  size_t cap;
} tent_handle_table_t;

/* Store `item`; its handle, or 0 when out of memory (the table is unchanged then). */
static inline uint64_t tent_ht_insert(tent_handle_table_t *t, void *item) {
  size_t idx = t->cap;
  for (size_t i = 0; i < t->cap; i++)
    if (!t->items[i]) {
      idx = i;
      break;
    }
  if (idx == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    void **items = realloc(t->items, cap * sizeof(void *));
    if (!items) return 0;
    t->items = items;
    uint32_t *gens = realloc(t->gens, cap * sizeof(uint32_t));
    if (!gens) return 0;
    t->gens = gens;
    for (size_t i = t->cap; i < cap; i++) {
      t->items[i] = NULL;
      t->gens[i] = 0;
    }
    t->cap = cap;
  }
  t->gens[idx]++;
  t->items[idx] = item;
  return ((uint64_t)t->gens[idx] << 32) | (uint64_t)(idx + 1);
}

/* The object behind `h`, or NULL if it was never issued or has been taken out. */
static inline void *tent_ht_get(const tent_handle_table_t *t, uint64_t h) {
  uint64_t idx = h & 0xffffffffu;
  if (idx == 0 || idx > t->cap) return NULL;
  idx -= 1;
  return t->gens[idx] == (uint32_t)(h >> 32) ? t->items[idx] : NULL;
}

/* Non-zero if `h` was issued by this table at some point (its object may have been taken out
 * since): lets an executor tell a forgotten peer's slices (a retryable "gone") from garbage. */
static inline int tent_ht_was_issued(const tent_handle_table_t *t, uint64_t h) {
  uint64_t idx = h & 0xffffffffu;
  uint32_t gen = (uint32_t)(h >> 32);
  return idx != 0 && idx <= t->cap && gen != 0 && gen <= t->gens[idx - 1];
}

/* Live objects in the table (O(cap); for statistics and tests). */
static inline size_t tent_ht_count(const tent_handle_table_t *t) {
  size_t n = 0;
  for (size_t i = 0; i < t->cap; i++) n += t->items[i] != NULL;
  return n;
}

/* Remove and return the object behind `h` (NULL if none); the slot is free for reuse. */
static inline void *tent_ht_take(tent_handle_table_t *t, uint64_t h) {
  void *item = tent_ht_get(t, h);
  if (item) t->items[(h & 0xffffffffu) - 1] = NULL;
  return item;
}

/* Free the table's own arrays; the caller has released the objects (walk items[0..cap)). */
static inline void tent_ht_free(tent_handle_table_t *t) {
  free(t->items);
  free(t->gens);
  t->items = NULL;
  t->gens = NULL;
  t->cap = 0;
}

#endif
