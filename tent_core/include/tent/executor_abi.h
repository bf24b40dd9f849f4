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

/* Slice status codes reported through host->complete. Negative = failure. */
enum tent_status {
  TENT_OK = 0,
  /* retryable: the path failed, another rail or transport may succeed */
  TENT_E_CONNECT = -1,    /* could not reach the peer on this rail */
  TENT_E_IO = -2,         /* connection broke mid-slice */
  TENT_E_TIMEOUT = -3,    /* no progress within the slice progress timeout */
  TENT_E_CONGESTED = -4,  /* the rail is saturated / back-pressured */
  /* final: the remote refused the request itself, retrying cannot help */
  TENT_E_BOUNDS = -10,    /* remote range not inside a registered region */
  TENT_E_PERMISSION = -11,/* remote region registered without that permission */
  TENT_E_PROTOCOL = -12,  /* malformed exchange */
  TENT_E_CANCELLED = -13, /* the batch was cancelled before this slice ran */
  TENT_E_INTERNAL = -14
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
  uint32_t attempt;      /* retry count, for the executor's logs only */
} tent_slice_t;

typedef struct tent_host_api {
  uint32_t abi_version;
  uint32_t struct_size;
  void *ctx;
  /* Report one slice. `slice` points at the executor's copy; read only during the call. */
  void (*complete)(void *ctx, const tent_slice_t *slice, int32_t status);
  /* Non-zero if the batch behind `token` was cancelled; executors check it before running a slice. */
  int (*is_cancelled)(void *ctx, uint64_t token);
} tent_host_api_t;

typedef struct tent_executor_ops {
  uint32_t abi_version;  /* must equal TENT_EXECUTOR_ABI_VERSION */
  uint32_t struct_size;  /* sizeof(tent_executor_ops_t) */
  const char *name;
  /* Create an executor. `config` is a JSON-free "key=value;key=value" string.
   * On failure returns NULL and writes a message into err. */
  void *(*create)(const tent_host_api_t *host, const char *config, char *err, size_t errlen);
  void (*destroy)(void *self);
  /* Queue n slices. Returns 0, or a negative tent_status if nothing was queued. */
  int (*submit)(void *self, const tent_slice_t *slices, uint32_t n);
} tent_executor_ops_t;

typedef const tent_executor_ops_t *(*tent_executor_ops_fn)(void);

#ifdef __cplusplus
}
#endif
#endif
