/*
 * A stand-in for libcufile + libcuda, for tests on machines without a GPU.
 *
 * It exports the cuFile and CUDA driver entry points the gds executor resolves, with the
 * layouts of cufile.h, and does the I/O with pread/pwrite on host memory posing as device
 * memory. It checks what the real libraries would refuse: a handle registered with the
 * wrong type or a closed fd, I/O from a thread whose current context is not the buffer's,
 * reads outside a registered buffer, double registration, and it counts live handles and
 * buffers so tests can see that nothing leaks. It proves the executor's cuFile plumbing,
 * not GPUDirect Storage itself: that takes scripts/gpu_check.sh on a GPU machine.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define FAKE_CTX ((void *)0xC0FFEE)
#define BASE_ERR 5000
#define MAX_BUFS 64

typedef struct {
  int err, cu_err;
} cf_error_t;
typedef struct {
  int type;
  union {
    int fd;
    void *handle;
  } handle;
  const void *fs_ops;
} cf_descr_t;

static _Thread_local void *current_ctx;
static atomic_llong n_driver_open, n_driver_close, n_handles_live, n_bufs_live, n_reads, n_writes, n_ctx_miss,
    n_buf_miss;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t base;
  size_t len;
} bufs[MAX_BUFS];

/* ---- libcuda */
/* events are host ints: 0 pending, nonzero done (cufile_double_run.py sets them) */
EXPORT int cuEventQuery(void *ev) { return *(volatile int *)ev ? 0 : 600 /* CUDA_ERROR_NOT_READY */; }

EXPORT int cuInit(unsigned flags) { return getenv("CUFILE_DOUBLE_NO_DEVICE") ? 100 /* CUDA_ERROR_NO_DEVICE */ : 0; }
EXPORT int cuDeviceGetCount(int *n) {
  *n = 1;
  return 0;
}
EXPORT int cuPointerGetAttribute(void *data, int attribute, uint64_t ptr) {
  if (attribute != 1 /* CU_POINTER_ATTRIBUTE_CONTEXT */ || ptr == 0) return 1; /* CUDA_ERROR_INVALID_VALUE */
  *(void **)data = FAKE_CTX;
  return 0;
}
EXPORT int cuCtxSetCurrent(void *ctx) {
  current_ctx = ctx;
  return 0;
}
EXPORT int cuCtxGetCurrent(void **ctx) {
  *ctx = current_ctx;
  return 0;
}
/* device <-> host copies (the gds executor's bounce path for files cuFile refuses) */
static atomic_llong n_htod, n_dtoh;
EXPORT int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) {
  if (current_ctx != FAKE_CTX) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  memcpy((void *)(uintptr_t)dst, src, n);
  atomic_fetch_add(&n_htod, 1);
  return 0;
}
EXPORT int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
  if (current_ctx != FAKE_CTX) return 201;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  atomic_fetch_add(&n_dtoh, 1);
  return 0;
}
EXPORT void cufile_double_copies(int64_t out[2]) {
  out[0] = n_htod;
  out[1] = n_dtoh;
}
/* the calling thread's current context, for tests */
EXPORT void *cufile_double_current_ctx(void) { return current_ctx; }

/* ---- libcufile */
EXPORT cf_error_t cuFileDriverOpen(void) {
  atomic_fetch_add(&n_driver_open, 1);
  return (cf_error_t){0, 0};
}
EXPORT cf_error_t cuFileDriverClose_v2(void) {
  atomic_fetch_add(&n_driver_close, 1);
  return (cf_error_t){0, 0};
}
EXPORT cf_error_t cuFileHandleRegister(void **fh, cf_descr_t *d) {
  if (d->type != 1) return (cf_error_t){BASE_ERR + 18, 0}; /* CU_FILE_INVALID_FILE_TYPE */
  /* what a real H200 machine answered for a file on its tmpfs/overlay /tmp */
  if (getenv("CUFILE_DOUBLE_REFUSE_HANDLES")) return (cf_error_t){BASE_ERR + 27, 0}; /* CU_FILE_HANDLE_NOT_REGISTERED */
  int flags = fcntl(d->handle.fd, F_GETFL);
  if (flags < 0) return (cf_error_t){BASE_ERR + 22, 0};
  /* cuFile moves unaligned pieces of O_DIRECT files through its bounce buffers; here a
   * buffered fd of the same file stands in for them */
  char proc[64];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", d->handle.fd);
  int fd = open(proc, (flags & O_ACCMODE) | O_CLOEXEC);
  if (fd < 0) return (cf_error_t){BASE_ERR + 25, 0};
  int *h = malloc(sizeof *h);
  *h = fd;
  *fh = h;
  atomic_fetch_add(&n_handles_live, 1);
  return (cf_error_t){0, 0};
}
EXPORT void cuFileHandleDeregister(void *fh) {
  close(*(int *)fh);
  free(fh);
  atomic_fetch_sub(&n_handles_live, 1);
}
EXPORT cf_error_t cuFileBufRegister(const void *base, size_t len, int flags) {
  pthread_mutex_lock(&mu);
  int free_slot = -1;
  for (int i = 0; i < MAX_BUFS; i++) {
    if (bufs[i].base == (uintptr_t)base) {
      pthread_mutex_unlock(&mu);
      return (cf_error_t){BASE_ERR + 23, 0}; /* CU_FILE_MEMORY_ALREADY_REGISTERED */
    }
    if (!bufs[i].base && free_slot < 0) free_slot = i;
  }
  if (free_slot >= 0) {
    bufs[free_slot].base = (uintptr_t)base;
    bufs[free_slot].len = len;
    atomic_fetch_add(&n_bufs_live, 1);
  }
  pthread_mutex_unlock(&mu);
  return (cf_error_t){free_slot >= 0 ? 0 : BASE_ERR + 36, 0};
}
EXPORT cf_error_t cuFileBufDeregister(const void *base) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_BUFS; i++)
    if (bufs[i].base == (uintptr_t)base) {
      bufs[i].base = 0;
      atomic_fetch_sub(&n_bufs_live, 1);
      pthread_mutex_unlock(&mu);
      return (cf_error_t){0, 0};
    }
  pthread_mutex_unlock(&mu);
  return (cf_error_t){BASE_ERR + 24, 0}; /* CU_FILE_MEMORY_NOT_REGISTERED */
}

/* The I/O must stay inside the registered buffer that starts at `base`. */
static int check(const void *base, size_t size, off_t boff) {
  if (current_ctx != FAKE_CTX) {
    atomic_fetch_add(&n_ctx_miss, 1);
    return -(BASE_ERR + 15); /* CU_FILE_CUDA_CONTEXT_MISMATCH */
  }
  int ok = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_BUFS; i++)
    if (bufs[i].base == (uintptr_t)base && boff >= 0 && (size_t)boff + size <= bufs[i].len) ok = 1;
  pthread_mutex_unlock(&mu);
  if (!ok) {
    atomic_fetch_add(&n_buf_miss, 1);
    return -(BASE_ERR + 14); /* CU_FILE_CUDA_POINTER_RANGE_ERROR */
  }
  return 0;
}

EXPORT ssize_t cuFileRead(void *fh, void *base, size_t size, off_t foff, off_t boff) {
  int rc = check(base, size, boff);
  if (rc) return rc;
  atomic_fetch_add(&n_reads, 1);
  return pread(*(int *)fh, (char *)base + boff, size, foff);
}
EXPORT ssize_t cuFileWrite(void *fh, const void *base, size_t size, off_t foff, off_t boff) {
  int rc = check(base, size, boff);
  if (rc) return rc;
  atomic_fetch_add(&n_writes, 1);
  return pwrite(*(int *)fh, (const char *)base + boff, size, foff);
}

/* driver opens, closes, live handles, live buffers, reads, writes, context misses, range misses */
EXPORT void cufile_double_counters(int64_t out[8]) {
  out[0] = n_driver_open;
  out[1] = n_driver_close;
  out[2] = n_handles_live;
  out[3] = n_bufs_live;
  out[4] = n_reads;
  out[5] = n_writes;
  out[6] = n_ctx_miss;
  out[7] = n_buf_miss;
}
