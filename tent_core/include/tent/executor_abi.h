/*
 * tent_core <-> transport plugin: the slice-executor C ABI.
 *
 * A transport plugin ships a plain shared library that exports
 *
 *     const tent_executor_ops_t *tent_executor_ops(void);
 *
 * The core loads it with dlopen (ctypes), checks `abi_version` and `struct_size`
 * before touching anything else, creates one executor per engine and hands it
 * slices in batches. The executor owns its threads and connections; it reports
 * every slice exactly once through `host->complete`, from any thread.
 *
 * Bump TENT_EXECUTOR_ABI_VERSION on any incompatible change to these structs.
 */
#ifndef TENT_EXECUTOR_ABI_H
#define TENT_EXECUTOR_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TENT_EXECUTOR_ABI_VERSION 1u

enum tent_opcode { TENT_OP_READ = 0, TENT_OP_WRITE = 1 };

/* Slice status codes reported through host->complete. Negative = failure.
 *
 * This list is the one definition of the statuses: tent_core._native exports it (STATUS_CODES) and
 * tent_core.abi.Status is checked against it at import. Columns: name, value, retryable. */
#define TENT_STATUS_LIST(X)                                                                    \
  X(OK, 0, 0)                                                                                  \
  /* retryable: the path failed, another rail or transport may succeed */                     \
  X(E_CONNECT, -1, 1)    /* could not reach the peer on this rail */                           \
  X(E_IO, -2, 1)         /* connection broke mid-slice */                                      \
  X(E_TIMEOUT, -3, 1)    /* no progress within the slice progress timeout */                   \
  X(E_CONGESTED, -4, 1)  /* the rail is saturated / back-pressured */                          \
  X(E_REROUTED, -5, 1)   /* not attempted: handed back untouched (rail aborted, peer removed) */ \
  /* final: the remote refused the request itself, retrying cannot help */                    \
  X(E_BOUNDS, -10, 0)    /* remote range not inside a registered region */                     \
  X(E_PERMISSION, -11, 0) /* remote region registered without that permission */               \
  X(E_PROTOCOL, -12, 0)  /* malformed exchange */                                              \
  X(E_CANCELLED, -13, 0) /* the batch was cancelled before this slice ran */                   \
  X(E_INTERNAL, -14, 0)  /* the executor itself failed (out of memory, bad handle...) */     \
  X(E_NOT_READY, -15, 0) /* a waiting READ (tent_wait_t): its word did not reach the range in     \
                            time, or left it (the bytes are not there, or no longer will be)  */

enum tent_status {
#define TENT_STATUS_ENUM_(name, value, retryable) TENT_##name = value,
  TENT_STATUS_LIST(TENT_STATUS_ENUM_)
#undef TENT_STATUS_ENUM_
};

/* Statuses in (TENT_FIRST_FINAL, 0) are retryable on another rail or transport. */
#define TENT_FIRST_FINAL (-10)
static inline int tent_status_retryable(int status) { return status < 0 && status > TENT_FIRST_FINAL; }

/* The core's per-rail telemetry row (int64 counters that the host's complete() and note() update;
 * `stat_index` of a slice names the row). Executors never touch it directly; it lives here so C and Python share one
 * layout (tent_core.abi.StatField is checked against it). */
#define TENT_STAT_LIST(X)                                                                      \
  X(INFLIGHT_BYTES)                                                                            \
  X(INFLIGHT_SLICES)                                                                           \
  X(BYTES_DONE)                                                                                \
  X(SLICES_DONE)                                                                               \
  X(ERRORS)                                                                                    \
  X(LATENCY_NS_SUM)                                                                            \
  X(LAST_LATENCY_NS)                                                                           \
  X(LAST_COMPLETE_NS) /* CLOCK_MONOTONIC ns */                                                 \
  /* service telemetry, from host->note (stays 0 for executors that do not report it): */    \
  X(SERVING)          /* pieces of slices in service now (started, not yet stopped) */        \
  X(PROGRESS_NS)      /* CLOCK_MONOTONIC ns of the last service start or byte moved */        \
  X(BYTES_MOVED)      /* bytes moved, counted as they move (not at completion) */             \
  X(CONGESTION)       /* congestion events: the fabric pushed back without failing a slice */     \
  /* the core's own (tent_core/rails.py): the generation of the slot's holder, which the high bits   \
   * of a slice's stat_index must name for the slice to count on the row */                       \
  X(GENERATION)

enum tent_stat_field {
#define TENT_STAT_ENUM_(name) TENT_STAT_##name,
  TENT_STAT_LIST(TENT_STAT_ENUM_)
#undef TENT_STAT_ENUM_
  TENT_STAT_FIELDS
};

/* One unit of work. 64 bytes, passed by value in arrays; the executor copies
 * what it needs during submit(), the array may be reused afterwards. */
typedef struct tent_slice {
  uint64_t local_addr;   /* initiator-side virtual address */
  uint64_t remote_addr;  /* target-side virtual address (as advertised by the peer) */
  uint64_t length;       /* bytes; may be 0 */
  uint64_t peer;         /* executor-defined peer handle (from the plugin's connect) */
  uint64_t token;        /* opaque to the executor: the core's batch */
  uint64_t submit_ns;    /* CLOCK_MONOTONIC stamp set by the core */
  uint32_t opcode;       /* enum tent_opcode */
  uint32_t rail;         /* plugin-defined rail index within `peer` */
  uint32_t stat_index;   /* core telemetry slot; opaque to the executor */
  uint32_t attempt;      /* bits 0-15: retry count, for the executor's logs only;
                          * bits 16-23: TENT_HINT_* flags set by the core (may be ignored);
                          * bits 24-31: the core's own (echo the whole field untouched) */
} tent_slice_t;

/* Service telemetry an executor reports through host->note while it works on a slice. A slice
 * may be served in pieces (chunks); each piece in service is bracketed by START and STOP.
 * The core measures a rail's progress timeout from these: time without progress while being
 * served, never time spent waiting in a queue. Columns: name, value. */
#define TENT_NOTE_LIST(X)                                                                      \
  X(START, 0)     /* a piece of the slice entered service (value: its length) */             \
  X(PROGRESS, 1)  /* value bytes of it moved */                                              \
  X(STOP, 2)      /* the piece left service (before it is reported through complete) */     \
  X(CONGESTED, 3) /* the fabric pushed back for a while (TCP: send buffer full, not draining; \
                     RDMA: RNR / retry exceeded): a soft signal, the slice goes on */

enum tent_note {
#define TENT_NOTE_ENUM_(name, value) TENT_NOTE_##name = value,
  TENT_NOTE_LIST(TENT_NOTE_ENUM_)
#undef TENT_NOTE_ENUM_
};

/* Hints in bits 16-23 of tent_slice_t.attempt. An executor may use them to order its work;
 * one that ignores them stays correct (they were zero before hints existed). */
#define TENT_ATTEMPT_MASK 0xffffu
#define TENT_HINT_MASK 0x00ff0000u
/* The slice belongs to a small, latency-sensitive request (the engine config's
 * small_request_bytes): serve it before bulk work, it may travel on its own connection or be
 * pipelined with others. Slices of large requests never carry it, however short they are. */
#define TENT_HINT_SMALL (1u << 16)

/* A waiting READ (optional capability: Transport.wait_read). The target answers such a READ only once
 * an aligned u64 word in its registered memory (one the target's own process advances as the bytes
 * land, e.g. a replica's progress word) satisfies lo <= word <= hi; while floor <= word < lo it waits
 * (at most wait_ms, capped by the executor); otherwise, or at that deadline, it answers
 * TENT_E_NOT_READY without the bytes. The word is checked like any READ (bounds, read permission).
 * So a reader may post READs of bytes its source does not hold yet: they cost no link bytes until
 * the bytes land, and then leave at once (push-like). The caller arms conditions for the READs it
 * submits on one thread (engine.submit_when); an executor asks per slice through tent_host_wait(),
 * on the submitting thread, inside submit (never from a worker), and keeps a copy. An executor that
 * does not declare the capability never asks, and the core never arms conditions for its routes. */
typedef struct tent_wait {
  uint64_t local_start, local_end; /* it applies to the READ slices whose destination lies in here */
  uint64_t word_addr;              /* target-side address of the word (8-byte aligned) */
  uint64_t floor, lo, hi;
  uint32_t wait_ms;
  uint32_t reserved; /* 0 */
} tent_wait_t;

typedef struct tent_host_api {
  uint32_t abi_version;
  uint32_t struct_size;
  void *ctx;
  /* Report one slice. `slice` points at the executor's copy; read only during the call. */
  void (*complete)(void *ctx, const tent_slice_t *slice, int32_t status);
  /* Non-zero if the batch behind `token` was cancelled; executors check it before running a slice. */
  int (*is_cancelled)(void *ctx, uint64_t token);
  /* Service telemetry (enum tent_note) about a slice the executor holds; any thread, cheap (a few
   * atomics). Appended after ABI 1 shipped: call it through tent_host_note(), which checks that the
   * host's struct_size covers it. Executors that never call it still work (no stall detection
   * on their rails beyond their own timeouts). */
  void (*note)(void *ctx, const tent_slice_t *slice, int32_t event, uint64_t value);
  /* The running digest (a tent_digest_t, tent/digest.h) the caller armed for what it submits on
   * this thread, or NULL. Appended after `note`: call it through tent_host_digest(). Only an
   * executor copying a READ slice itself inside submit_inline, on the submitting thread, asks; it
   * folds the bytes it copies into that digest when the slice continues the digest's stream
   * (tent_digest_copy). Never from a worker thread, never for slices of other batches the caller
   * helps with. An executor that never asks is correct: the caller folds what was not folded. */
  void *(*digest)(void *ctx, const tent_slice_t *slice);
  /* The wait condition (tent_wait_t) the caller armed for this READ slice, or NULL: asked on the
   * submitting thread inside submit/submit_inline only. Appended after `digest`: call it through
   * tent_host_wait(). */
  const tent_wait_t *(*wait)(void *ctx, const tent_slice_t *slice);
  /* Around work inside submit_inline that may sleep (a buffered file write waiting on the inode's
   * lock or dirty-page throttling): block_begin lets go of what the submitting thread holds that
   * other threads need (the Python GIL when this thread holds it) and returns a token, NULL when it
   * let go of nothing; block_end(token) takes it back. Submitting thread only, always paired, no
   * host call in between. Appended after `wait`: call them through tent_host_block_begin/end. */
  void *(*block_begin)(void *ctx);
  void (*block_end)(void *ctx, void *token);
} tent_host_api_t;

static inline void tent_host_note(const tent_host_api_t *host, const tent_slice_t *slice, int32_t event,
                                  uint64_t value) {
  if (host->struct_size >= offsetof(tent_host_api_t, note) + sizeof host->note && host->note)
    host->note(host->ctx, slice, event, value);
}

static inline void *tent_host_digest(const tent_host_api_t *host, const tent_slice_t *slice) {
  if (slice->opcode == TENT_OP_READ && host->struct_size >= offsetof(tent_host_api_t, digest) + sizeof host->digest &&
      host->digest)
    return host->digest(host->ctx, slice);
  return NULL;
}

static inline const tent_wait_t *tent_host_wait(const tent_host_api_t *host, const tent_slice_t *slice) {
  if (slice->opcode == TENT_OP_READ && host->struct_size >= offsetof(tent_host_api_t, wait) + sizeof host->wait &&
      host->wait)
    return host->wait(host->ctx, slice);
  return NULL;
}

static inline void *tent_host_block_begin(const tent_host_api_t *host) {
  if (host->struct_size >= offsetof(tent_host_api_t, block_end) + sizeof host->block_end && host->block_begin &&
      host->block_end)
    return host->block_begin(host->ctx);
  return NULL;
}

static inline void tent_host_block_end(const tent_host_api_t *host, void *token) {
  if (token) host->block_end(host->ctx, token);
}

typedef struct tent_executor_ops {
  uint32_t abi_version;  /* must equal TENT_EXECUTOR_ABI_VERSION */
  uint32_t struct_size;  /* sizeof(tent_executor_ops_t) */
  const char *name;
  /* Create an executor. `config` is a JSON-free "key=value;key=value" string.
   * On failure returns NULL and writes a message into err. */
  void *(*create)(const tent_host_api_t *host, const char *config, char *err, size_t errlen);
  void (*destroy)(void *self);
  /* Queue n slices, all or nothing. 0: each of the n slices will be reported exactly once through
   * host->complete (possibly before submit returns). Negative tent_status: none was queued and none
   * was or will be reported; the caller finalizes them. An executor that has already reported some
   * of the n must return 0 and report the rest itself. */
  int (*submit)(void *self, const tent_slice_t *slices, uint32_t n);
  /* Optional, additive (the core uses it only when struct_size covers it and it is non-NULL; an
   * executor built against the first layout simply lacks it). Same contract as submit(), but the
   * calling thread may do the work itself before returning: a small same-host copy completes
   * inside the call (no hand-off to a worker, no wake-up), a small network request leaves on the
   * caller's thread. The core calls it only with slices no longer than the transport's declared
   * inline size; the executor may still queue some or all of them (it decides how much of the
   * caller's time to take). The caller may hold the Python GIL: never wait on other engine work. */
  int (*submit_inline)(void *self, const tent_slice_t *slices, uint32_t n);
  /* Optional, additive (present when struct_size covers it and non-NULL). Work that submit_inline
   * left half done for the batch `token` (a request sent on the caller's thread whose answer is
   * still to be read) may be finished by a thread waiting for that batch. budget_ns >= 0: the
   * core's waiter offers its thread for up to that long; the executor may block that long for
   * the answer (as a bare blocking exchange would) and completes what arrives. Returns 1 when it
   * completed something (the core calls again while the batch is unfinished), 0 when nothing of
   * that batch is left to the waiter or the budget passed. budget_ns < 0, the hand-off: the
   * caller stops; whatever of that batch is still pending must now go on without it (a worker
   * takes it). The core hands off when its waiter gives up, on a non-blocking poll of the handle,
   * and from its progress thread for every batch still running (every 0.2 s at most), so such
   * work always completes. Executors without progress() must not leave work to waiters. */
  int (*progress)(void *self, uint64_t token, int64_t budget_ns);
} tent_executor_ops_t;

/* struct_size of the first layout (every ops table has at least this much) */
#define TENT_EXECUTOR_OPS_BASE_SIZE (offsetof(tent_executor_ops_t, submit_inline))
/* struct_size of an ops table that has submit_inline / progress */
#define TENT_EXECUTOR_OPS_INLINE_SIZE (offsetof(tent_executor_ops_t, submit_inline) + sizeof(void *))
#define TENT_EXECUTOR_OPS_PROGRESS_SIZE (offsetof(tent_executor_ops_t, progress) + sizeof(void *))

typedef const tent_executor_ops_t *(*tent_executor_ops_fn)(void);

#ifdef __cplusplus
}
#endif
#endif
