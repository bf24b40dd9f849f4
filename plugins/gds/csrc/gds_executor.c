/*
 * tent_gds._executor: file slice executor for tent_core (executor ABI v1).
 *
 * Requests are local memory <-> file. Every peer (an engine on this host, possibly this
 * one) owns a table of registered files: [base, base+len) virtual ranges -> open fds.
 * A slice's file offset is remote_addr - base.  op READ = file -> memory, WRITE = memory -> file.
 *
 * I/O engines (config `engine`):
 *   io_uring  raw syscalls (io_uring_setup / io_uring_enter, mmap'ed rings; no liburing);
 *             every worker owns one ring and keeps up to `queue_depth` I/Os in flight.
 *   pread     synchronous pread/pwrite loops, one I/O per worker.
 *   auto      io_uring when the kernel allows it (setup works and IORING_OP_READ/WRITE are
 *             supported), else pread.
 * Slices are split into `chunk`-sized work items (default 1 MiB) taken by `threads` workers
 * from one FIFO; the last finished chunk reports the slice exactly once (first error wins).
 *
 * Buffered WRITEs where the filesystem cannot write without blocking (pwritev2 with RWF_NOWAIT
 * fails with EOPNOTSUPP: ext4, among others) are written by the io_uring worker itself with
 * pwrite: io_uring would hand each of them to its io-wq kernel thread, one more thread hop per
 * piece, and serialize them per file there anyway (measured: 1 MiB WRITEs 1.4x faster). The
 * first buffered WRITE to a file tries RWF_NOWAIT and remembers the answer for the file.
 *
 * The submitting thread tries first (submit_inline, config nowait=1): the first slice of a call,
 * if it is one piece of host memory without a CUDA event and not for the O_DIRECT fd, is read or
 * written by the caller with preadv2/pwritev2(RWF_NOWAIT), which the kernel completes only when it
 * needs no blocking (a READ out of the page cache; a WRITE where the filesystem takes buffered
 * writes without blocking, not ext4's). A hot 1 MiB READ then costs one syscall and is reported
 * before submit returns: no queue, no worker wake-up (futex wake, a worker thread scheduled just
 * to find the queue empty or to race the waiter), no wake-up of the waiter; that hand-off was
 * the ~30% more CPU per 1 MiB READ than fio. What would block (EAGAIN), the end of file and errors
 * leave the rest of the slice to the path below, which reports them as for any slice. Each
 * file remembers when its filesystem refuses RWF_NOWAIT (EOPNOTSUPP) for reads or writes.
 * A WRITE up to inline_write_bytes (default 1 MiB) to a file that refused it is written by the
 * submitting thread with a plain pwrite, the GIL let go around it (write_blocking): a hand-off
 * to a worker cost more than the copy's own time there (stat inline_writes).
 *
 * Waiters run pieces (submit_inline + progress, executor ABI): slices no longer than the
 * transport's inline size are queued and a worker woken as usual, and the thread that then waits
 * for the batch (without the GIL) takes its batch's pieces still at the head of the queue and runs
 * them itself with pread/pwrite: a request waited for at once costs no worker wake-up and no
 * wake-up of its waiter (tens of microseconds each on small VMs, against ~70 us for a 1 MiB page
 * cache copy). Whatever a worker took first stays the worker's. Only host memory, only batches
 * without a CUDA event to wait for, only when the waiter offers at least WAITER_MIN_BUDGET_NS.
 *
 * One writer per buffered WRITE, where writers do not read their source first (write_warm=0,
 * below): the kernel serializes buffered writes to one file (ext4, XFS,
 * tmpfs and NFS each hold the inode's lock exclusively for the whole write), so a WRITE slice cut
 * into pieces for several workers gains nothing from the second worker: it waits for the lock
 * (spinning on it, then sleeping) while the first copies, and every piece hands the lock over once
 * more. A buffered WRITE slice longer than `chunk` is therefore queued as one piece, which one
 * worker writes in chunk-sized requests in order, leaving the other workers to other slices (other
 * files, READs). Measured on ext4, 64 MiB WRITEs one at a time: 2 workers on 1 MiB pieces used
 * 0.157 CPU s/GB for 6.7 GB/s, one worker 0.119 for 7.7 (docs/benchmarks.md, gds-fio). Not with
 * direct=1 (O_DIRECT overwrites run in parallel) nor while CUDA buffers are registered (cuFile I/O
 * takes its pieces in parallel); config split_writes=1 cuts WRITEs like READs (stat whole_writes).
 *
 * Writers that read their piece's source first (config write_warm, default on; stat
 * warm_pieces): the copy a buffered write makes under the inode's lock reads its source from DRAM,
 * and nothing else on that file can run beside it, but a second writer can read its own next
 * piece's source (one load per cache line) while the first copies, so that its copy under the
 * lock then reads from its own core's cache. With write_warm a buffered WRITE slice longer than
 * `chunk` is cut into pieces for all workers like a READ, and each worker reads a piece's source
 * just before its pwrite. This is what fio's jobs on one file do by accident: each rewrites bytes
 * of its next buffer (scramble_buffers) while another holds the lock. Measured on ext4 (bare loop,
 * tools/write_shapes.c, 1 MiB pieces of 64 MiB): one writer 8.1 GB/s, two plain writers 9.9, two
 * that read their piece first 15.2 (CPU inside pwrite 0.116 -> 0.087 s/GB). A helper thread
 * reading ahead for one writer was tried first: its lines sit in the other core's cache, which
 * helped (+20%) or hurt (-10%) from run to run on a VM whose vCPUs may or may not share a cache.
 * The cost: both workers busy while a large WRITE runs (~0.16 against ~0.11 CPU s/GB, fio's level).
 *
 * O_DIRECT: with config direct=1 the plugin opens a second O_DIRECT fd per file. A chunk
 * whose memory address and file offset are 4096-aligned goes through it for its
 * 4096-multiple prefix; the rest (unaligned chunks, tails, short-read continuations)
 * uses the buffered fd.
 *
 * GPU memory <-> file (cuFile / GPUDirect Storage): nothing CUDA is linked. With config
 * cufile=auto|on the executor dlopen()s libcufile (config cufile_lib, else libcufile.so.0) and
 * libcuda (config cuda_lib, else libcuda.so.1), checks for a device and opens the cuFile driver
 * (reference counted by cuFile, closed in destroy). The plugin registers the engine's CUDA
 * buffers (tent_gds_gpu_add: cuFileBufRegister when it works, else cuFile's bounce buffers); a
 * slice whose local range lies inside one of them runs as cuFileRead/cuFileWrite on the
 * worker thread, with that buffer's CUDA context made current first. Every file gets its
 * cuFile handle on its first GPU I/O (through the O_DIRECT fd when it has one) and loses it
 * with its last reference. Without cuFile, CUDA buffers are never registered here: the core
 * stages GPU <-> file through host memory instead. A file cuFile refuses (cuFileHandleRegister
 * fails: tmpfs, overlayfs, no nvidia-fs without compat mode) is still served: its GPU I/O runs as
 * pread/pwrite through a host bounce buffer and cuMemcpyHtoD/DtoH on the worker (stats
 * bounce_bytes / bounce_ios); retrying cuFile on that file could never succeed.
 *
 * Stream ordering: where libcuda is loaded (cufile on/auto with a device), a batch registered with
 * tent_gds_order_add (token -> the CUevent its request waits for) has each chunk's I/O start only
 * once cuEventQuery reports the event done, polled by the worker with a growing sleep until the
 * entry's deadline (then the slice fails with TENT_E_TIMEOUT). cuFile I/O is driven by host threads,
 * so the wait is the worker's; the submitting thread never blocks.
 *
 * Status mapping: range outside every registered file / EOF before `length` on READ ->
 * TENT_E_BOUNDS; WRITE into a file registered read-only -> TENT_E_PERMISSION; EIO, ENOSPC
 * and other I/O errors -> TENT_E_IO; unknown peer -> TENT_E_CONNECT.
 *
 * Private (non-ABI) exports used by tent_gds.plugin through ctypes:
 *   uint64_t tent_gds_peer_add(void *ex);
 *   int32_t  tent_gds_peer_remove(void *ex, uint64_t peer);
 *   int32_t  tent_gds_file_add(void *ex, uint64_t peer, uint64_t base, uint64_t length,
 *                              int32_t fd, int32_t direct_fd, int32_t writable);   (takes the fds)
 *   int32_t  tent_gds_file_remove(void *ex, uint64_t peer, uint64_t base);
 *   int32_t  tent_gds_engine(void *ex);            0 = pread, 1 = io_uring
 *   int32_t  tent_gds_uring_supported(char *why, uint64_t whylen);
 *   int64_t  tent_gds_fs_magic(const char *path);  statfs f_type or -errno
 *   void     tent_gds_config(void *ex, uint64_t out[4]);  threads, queue_depth, chunk, direct
 *   void     tent_gds_stats(void *ex, uint64_t out[16]);
 *   int32_t  tent_gds_order_add(void *ex, uint64_t token, uint64_t event, uint64_t seq, uint64_t deadline_ns);
 *            -ENOTSUP where libcuda is not loaded
 *   int32_t  tent_gds_order_remove(void *ex, uint64_t token);
 *   uint64_t tent_gds_ordered(void *ex);                  chunks that waited for an event
 *   int32_t  tent_gds_cufile_state(void *ex, char *why, uint64_t whylen);  1 active, 0 not (why)
 *   int32_t  tent_gds_gpu_add(void *ex, uint64_t base, uint64_t length, char *err, uint64_t errlen);
 *   int32_t  tent_gds_gpu_remove(void *ex, uint64_t base);
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pwritev2, RWF_NOWAIT */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tent/chunk_queue.h"
#include "tent/config_kv.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"
#include "tent/order_table.h"

#define EXPORT __attribute__((visibility("default")))

#define MAX_THREADS 64
#define MAX_QD 256
#define DIRECT_ALIGN 4096u
#define ENGINE_PREAD 0
#define ENGINE_URING 1
#define CUFILE_OFF 0
#define CUFILE_AUTO 1
#define CUFILE_ON 2
#ifndef RWF_NOWAIT
#define RWF_NOWAIT 0x00000008
#endif

/* ---------------------------------------------------------------- cuFile (runtime-loaded) */
/* The few declarations of cufile.h / cuda.h used here (layouts as in cuFile 1.x, CUDA 11-13). */
typedef struct cf_error {
  int err;    /* CUfileOpError: 0 or 5000 + n */
  int cu_err; /* CUresult when err == CU_FILE_CUDA_DRIVER_ERROR */
} cf_error_t;
typedef struct cf_descr {
  int type; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD */
  union {
    int fd;
    void *handle;
  } handle;
  const void *fs_ops;
} cf_descr_t;
#define CF_HANDLE_TYPE_OPAQUE_FD 1
#define CF_BASE_ERR 5000
#define CF_PERMISSION_DENIED (CF_BASE_ERR + 25)
#define CU_POINTER_ATTRIBUTE_CONTEXT 1

typedef struct cufile_api {
  int loaded;
  char why[256]; /* why it is not loaded */
  cf_error_t (*DriverOpen)(void);
  cf_error_t (*DriverClose)(void);
  cf_error_t (*HandleRegister)(void **fh, cf_descr_t *descr);
  void (*HandleDeregister)(void *fh);
  cf_error_t (*BufRegister)(const void *base, size_t length, int flags);
  cf_error_t (*BufDeregister)(const void *base);
  ssize_t (*Read)(void *fh, void *base, size_t size, off_t file_offset, off_t buf_offset);
  ssize_t (*Write)(void *fh, const void *base, size_t size, off_t file_offset, off_t buf_offset);
  int (*cuInit)(unsigned flags);
  int (*cuDeviceGetCount)(int *count);
  int (*cuPointerGetAttribute)(void *data, int attribute, uint64_t ptr);
  int (*cuCtxSetCurrent)(void *ctx);
  int (*cuCtxGetCurrent)(void **ctx);
  int (*cuEventQuery)(void *event); /* optional: stream ordering */
  int (*cuMemcpyHtoD)(uint64_t dst, const void *src, size_t n); /* optional: bounce path */
  int (*cuMemcpyDtoH)(void *dst, uint64_t src, size_t n);
} cufile_api_t;

/* One per process: cuFile's driver state is process-wide, and libraries stay loaded. */
static cufile_api_t g_cf;
static pthread_mutex_t g_cf_mu = PTHREAD_MUTEX_INITIALIZER;

/* Load libcufile + libcuda; 0 or -1 with g_cf.why set. */
static int cufile_load(const char *cufile_lib, const char *cuda_lib) {
  pthread_mutex_lock(&g_cf_mu);
  if (g_cf.loaded) { /* the first libraries that worked serve the whole process */
    pthread_mutex_unlock(&g_cf_mu);
    return 0;
  }
  g_cf.why[0] = 0; /* failures are not cached: a later engine may name other paths */
  /* a configured path is the only candidate; otherwise the loader path */
  const char *cf_default[] = {"libcufile.so.0", "libcufile.so", NULL}, *cf_given[] = {cufile_lib, NULL};
  const char **cf_names = cufile_lib && *cufile_lib ? cf_given : cf_default;
  void *cf = NULL;
  for (size_t i = 0; cf_names[i] && !cf; i++) cf = dlopen(cf_names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cf) {
    snprintf(g_cf.why, sizeof g_cf.why, "libcufile not found: %s", dlerror());
    pthread_mutex_unlock(&g_cf_mu);
    return -1;
  }
  const char *cu_default[] = {"libcuda.so.1", "libcuda.so", NULL}, *cu_given[] = {cuda_lib, NULL};
  const char **cu_names = cuda_lib && *cuda_lib ? cu_given : cu_default;
  void *cu = NULL;
  for (size_t i = 0; cu_names[i] && !cu; i++) cu = dlopen(cu_names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cu) {
    snprintf(g_cf.why, sizeof g_cf.why, "no CUDA driver: %s", dlerror());
    pthread_mutex_unlock(&g_cf_mu);
    return -1;
  }
#define CF_SYM(lib, libname, field, name)                                      \
  do {                                                                         \
    *(void **)(&g_cf.field) = dlsym(lib, name);                                \
    if (!g_cf.field) {                                                         \
      snprintf(g_cf.why, sizeof g_cf.why, "%s lacks %s", libname, name);       \
      pthread_mutex_unlock(&g_cf_mu);                                          \
      return -1;                                                               \
    }                                                                          \
  } while (0)
  CF_SYM(cf, "libcufile", DriverOpen, "cuFileDriverOpen");
  *(void **)(&g_cf.DriverClose) = dlsym(cf, "cuFileDriverClose_v2"); /* cufile.h maps Close to _v2 */
  if (!g_cf.DriverClose) CF_SYM(cf, "libcufile", DriverClose, "cuFileDriverClose");
  CF_SYM(cf, "libcufile", HandleRegister, "cuFileHandleRegister");
  CF_SYM(cf, "libcufile", HandleDeregister, "cuFileHandleDeregister");
  CF_SYM(cf, "libcufile", BufRegister, "cuFileBufRegister");
  CF_SYM(cf, "libcufile", BufDeregister, "cuFileBufDeregister");
  CF_SYM(cf, "libcufile", Read, "cuFileRead");
  CF_SYM(cf, "libcufile", Write, "cuFileWrite");
  CF_SYM(cu, "libcuda", cuInit, "cuInit");
  CF_SYM(cu, "libcuda", cuDeviceGetCount, "cuDeviceGetCount");
  CF_SYM(cu, "libcuda", cuPointerGetAttribute, "cuPointerGetAttribute");
  CF_SYM(cu, "libcuda", cuCtxSetCurrent, "cuCtxSetCurrent");
  CF_SYM(cu, "libcuda", cuCtxGetCurrent, "cuCtxGetCurrent");
  *(void **)(&g_cf.cuEventQuery) = dlsym(cu, "cuEventQuery");
  *(void **)(&g_cf.cuMemcpyHtoD) = dlsym(cu, "cuMemcpyHtoD_v2");
  *(void **)(&g_cf.cuMemcpyDtoH) = dlsym(cu, "cuMemcpyDtoH_v2");
#undef CF_SYM
  int n = 0, rc = g_cf.cuInit(0);
  if (rc == 0) rc = g_cf.cuDeviceGetCount(&n);
  if (rc != 0 || n <= 0) {
    snprintf(g_cf.why, sizeof g_cf.why, rc != 0 ? "cuInit failed (CUresult %d): no usable CUDA device" : "no CUDA device",
             rc);
    pthread_mutex_unlock(&g_cf_mu);
    return -1;
  }
  g_cf.loaded = 1;
  pthread_mutex_unlock(&g_cf_mu);
  return 0;
}

/* What a negative cuFileRead/Write result or a cf_error means for a slice. */
static int cufile_status(int64_t res) {
  int64_t e = res < 0 ? -res : res;
  if (e == CF_PERMISSION_DENIED) return TENT_E_PERMISSION;
  if (e > CF_BASE_ERR + 11 && e <= CF_BASE_ERR + 17) return TENT_E_INTERNAL; /* bad local pointer / context */
  return TENT_E_IO;
}

/* A registered CUDA allocation of this engine. */
typedef struct gbuf {
  atomic_int refs;
  uint64_t base, len;
  void *ctx;           /* its CUDA context, made current before I/O */
  int buf_registered; /* cuFileBufRegister succeeded (else cuFile uses bounce buffers) */
} gbuf_t;

static void gbuf_unref(gbuf_t *b) {
  if (atomic_fetch_sub(&b->refs, 1) == 1) {
    if (b->buf_registered) {
      cf_error_t e = g_cf.BufDeregister((const void *)(uintptr_t)b->base);
      if (e.err != 0) fprintf(stderr, "tent_gds: cuFileBufDeregister(%#llx): error %d\n", (unsigned long long)b->base, e.err);
    }
    free(b);
  }
}

/* ---------------------------------------------------------------- files and peers */
typedef struct gfile {
  atomic_int refs;
  uint64_t base, len;
  int fd, dfd; /* dfd: O_DIRECT fd or -1 */
  int writable;
  /* buffered writes without blocking (RWF_NOWAIT): -1 not known yet, 0 refused by the filesystem
   * (the worker writes itself), 1 supported (through the ring, which completes them inline) */
  atomic_int nowait_write;
  /* buffered reads without blocking (RWF_NOWAIT, the submitting thread's try): -1 not known yet,
   * 0 refused by the filesystem, 1 supported */
  atomic_int nowait_read;
  pthread_mutex_t cf_mu;
  void *cfh; /* cuFile handle, made on the first GPU I/O */
  int cf_err; /* cuFileHandleRegister's error, once it failed (not retried) */
} gfile_t;

static void file_unref(gfile_t *f) {
  if (atomic_fetch_sub(&f->refs, 1) == 1) {
    if (f->cfh) g_cf.HandleDeregister(f->cfh);
    pthread_mutex_destroy(&f->cf_mu);
    if (f->fd >= 0) close(f->fd);
    if (f->dfd >= 0) close(f->dfd);
    free(f);
  }
}

typedef struct peer {
  uint64_t handle;
  gfile_t **files; /* sorted by base, non-overlapping */
  size_t nfiles, cap;
} peer_t;

/* ---------------------------------------------------------------- work */
typedef tent_job_t job_t;
typedef tent_chunk_t work_t;

/* one I/O in flight (a work item after lookup) */
typedef struct io {
  job_t *job;
  gfile_t *file;
  gbuf_t *gpu;       /* the CUDA buffer holding the local range, or NULL for host memory */
  uint64_t pos, end; /* offsets within the slice */
  int direct_ok;     /* the file has an O_DIRECT fd and direct I/O may be tried */
  int used_direct;   /* the last request went to dfd */
  int uring_slot;    /* index in the worker's io array */
} io_t;

typedef struct uring {
  int fd;
  unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, sq_entries;
  struct io_uring_sqe *sqes;
  unsigned *cq_head, *cq_tail, *cq_mask;
  struct io_uring_cqe *cqes;
  void *sq_ptr, *cq_ptr;
  size_t sq_sz, cq_sz, sqes_sz;
  unsigned pending; /* sqes queued, not yet submitted */
} uring_t;

typedef struct executor executor_t;

typedef struct worker {
  executor_t *ex;
  pthread_t thread;
  uring_t ring;
  int has_ring;
  io_t *ios;
  int *free_slots;
  unsigned nfree, inflight;
} worker_t;

struct executor {
  const tent_host_api_t *host;
  uint32_t nthreads, qd;
  uint64_t chunk;
  int direct, engine;
  worker_t workers[MAX_THREADS];
  uint32_t started;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  tent_chunk_queue_t q;
  int stop;

  pthread_rwlock_t tab; /* peers and their file tables, the CUDA buffers */
  gbuf_t **gbufs;       /* sorted by base, non-overlapping */
  size_t ngbufs, gcap;
  int cufile_mode, cufile_open;
  char cufile_lib[256], cuda_lib[256], cufile_why[256];
  tent_handle_table_t peers;
  tent_order_table_t order; /* batches whose I/O waits for a CUDA event */
  atomic_ullong st_ordered;

  atomic_ullong st_direct_bytes, st_buffered_bytes, st_uring_ios, st_sync_ios, st_ok, st_failed;
  atomic_ullong st_gpu_bytes, st_gpu_ios, st_bounce_bytes, st_bounce_ios;
  atomic_ullong st_waiter_pieces; /* pieces run by a waiting thread (progress) */
  int nowait;                     /* the submitting thread tries its slice without blocking */
  atomic_ullong st_nowait_ios, st_nowait_slices; /* that thread's I/Os, slices it finished */
  int split_writes;                              /* buffered WRITEs cut into chunks like READs */
  atomic_ullong st_whole_writes;                 /* buffered WRITE slices kept in one piece */
  uint64_t inline_write; /* WRITEs up to this the submitting thread pwrites where RWF_NOWAIT is refused */
  atomic_ullong st_inline_writes; /* slices it wrote so */
  int write_warm;                 /* writers read a WRITE piece's source before its pwrite */
  atomic_ullong st_warm_pieces;   /* pieces they read so */
};

/* ---------------------------------------------------------------- io_uring (raw syscalls) */
static int sys_uring_setup(unsigned entries, struct io_uring_params *p) {
  return (int)syscall(__NR_io_uring_setup, entries, p);
}
static int sys_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, 0);
}
static int sys_uring_register(int fd, unsigned op, void *arg, unsigned nr) {
  return (int)syscall(__NR_io_uring_register, fd, op, arg, nr);
}

static void uring_close(uring_t *r) {
  if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_sz);
  if (r->cq_ptr && r->cq_ptr != MAP_FAILED && r->cq_ptr != r->sq_ptr) munmap(r->cq_ptr, r->cq_sz);
  if (r->sq_ptr && r->sq_ptr != MAP_FAILED) munmap(r->sq_ptr, r->sq_sz);
  if (r->fd >= 0) close(r->fd);
  memset(r, 0, sizeof *r);
  r->fd = -1;
}

/* 0 or -errno */
static int uring_init(uring_t *r, unsigned entries) {
  memset(r, 0, sizeof *r);
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  r->fd = sys_uring_setup(entries, &p);
  if (r->fd < 0) {
    int e = errno;
    r->fd = -1;
    return -e;
  }
  r->sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  r->cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
  if (single) {
    if (r->cq_sz > r->sq_sz) r->sq_sz = r->cq_sz;
    r->cq_sz = r->sq_sz;
  }
  r->sq_ptr = mmap(NULL, r->sq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
  if (r->sq_ptr == MAP_FAILED) goto fail;
  if (single) {
    r->cq_ptr = r->sq_ptr;
  } else {
    r->cq_ptr = mmap(NULL, r->cq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_CQ_RING);
    if (r->cq_ptr == MAP_FAILED) goto fail;
  }
  r->sqes_sz = p.sq_entries * sizeof(struct io_uring_sqe);
  r->sqes = mmap(NULL, r->sqes_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
  if (r->sqes == MAP_FAILED) goto fail;
  char *sq = r->sq_ptr, *cq = r->cq_ptr;
  r->sq_head = (unsigned *)(sq + p.sq_off.head);
  r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned *)(sq + p.sq_off.array);
  r->sq_entries = p.sq_entries;
  r->cq_head = (unsigned *)(cq + p.cq_off.head);
  r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
  r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
  return 0;
fail : {
  int e = errno;
  uring_close(r);
  return -e;
}
}

static struct io_uring_sqe *uring_get_sqe(uring_t *r) {
  unsigned head = __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
  unsigned tail = *r->sq_tail;
  if (tail - head >= r->sq_entries) return NULL;
  unsigned idx = tail & *r->sq_mask;
  struct io_uring_sqe *sqe = &r->sqes[idx];
  memset(sqe, 0, sizeof *sqe);
  r->sq_array[idx] = idx;
  __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
  r->pending++;
  return sqe;
}

/* Submit what is queued and, if wait, block for at least one completion. 0 or -errno. */
static int uring_submit(uring_t *r, int wait) {
  for (;;) {
    int n = sys_uring_enter(r->fd, r->pending, wait ? 1 : 0, wait ? IORING_ENTER_GETEVENTS : 0);
    if (n >= 0) {
      r->pending -= (unsigned)n <= r->pending ? (unsigned)n : r->pending;
      if (r->pending == 0 || wait) return 0;
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EBUSY) { /* completions must be reaped first */
      if (!wait) return 0;
      n = sys_uring_enter(r->fd, 0, 1, IORING_ENTER_GETEVENTS);
      if (n >= 0 || errno == EINTR) return 0;
    }
    return -errno;
  }
}

/* ---------------------------------------------------------------- lookup */
static peer_t *peer_lookup(executor_t *ex, uint64_t h) { /* tab lock held */
  return tent_ht_get(&ex->peers, h);
}

static size_t file_pos(const peer_t *p, uint64_t base) { /* first file with f->base >= base */
  size_t lo = 0, hi = p->nfiles;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->files[mid]->base < base)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The file holding [addr, addr+len) of `peer`, referenced; or NULL with *st set. */
static gfile_t *file_get(executor_t *ex, uint64_t peer, uint64_t addr, uint64_t len, int *st) {
  gfile_t *f = NULL;
  pthread_rwlock_rdlock(&ex->tab);
  peer_t *p = peer_lookup(ex, peer);
  if (!p) {
    *st = TENT_E_CONNECT;
  } else {
    size_t i = file_pos(p, addr + 1); /* files with base <= addr are before i */
    gfile_t *c = i > 0 ? p->files[i - 1] : NULL;
    if (!c || addr - c->base > c->len || len > c->len - (addr - c->base)) {
      *st = TENT_E_BOUNDS;
    } else {
      f = c;
      atomic_fetch_add(&f->refs, 1);
    }
  }
  pthread_rwlock_unlock(&ex->tab);
  return f;
}

/* The CUDA buffer holding [addr, addr+len), referenced; NULL if the range is host memory.
 * *partial is set when the range starts inside a CUDA buffer but runs past its end. */
static gbuf_t *gbuf_get(executor_t *ex, uint64_t addr, uint64_t len, int *partial) {
  gbuf_t *b = NULL;
  *partial = 0;
  pthread_rwlock_rdlock(&ex->tab);
  if (ex->ngbufs) {
    size_t lo = 0, hi = ex->ngbufs; /* first buffer with base > addr */
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (ex->gbufs[mid]->base <= addr)
        lo = mid + 1;
      else
        hi = mid;
    }
    gbuf_t *c = lo > 0 ? ex->gbufs[lo - 1] : NULL;
    if (c && addr - c->base < c->len) {
      if (len > c->len - (addr - c->base)) {
        *partial = 1;
      } else {
        b = c;
        atomic_fetch_add(&b->refs, 1);
      }
    }
  }
  pthread_rwlock_unlock(&ex->tab);
  return b;
}

/* ---------------------------------------------------------------- completion */
static int errno_status(int e) {
  switch (e) {
    case EFBIG:
    case EINVAL: /* offset beyond what the fs allows */
    case ENXIO:
      return TENT_E_BOUNDS;
    case EBADF:
    case EACCES:
    case EPERM:
    case EROFS:
      return TENT_E_PERMISSION;
    case EFAULT:
      return TENT_E_INTERNAL; /* bad local address */
    default:
      return TENT_E_IO; /* EIO, ENOSPC, EDQUOT, ... */
  }
}

static void finish_work(executor_t *ex, job_t *j, int st) {
  int final;
  if (tent_job_chunk_done(j, st, &final)) {
    atomic_fetch_add(final == TENT_OK ? &ex->st_ok : &ex->st_failed, 1);
    ex->host->complete(ex->host->ctx, &j->s, final);
    free(j);
  }
}

/* Read [p, p + len) (one load per cache line) on this thread just before writing it: see the
 * header, write_warm. Only pieces of buffered WRITE slices cut for several writers: alone, a
 * writer would read the source twice in a row for nothing. */
static void warm_source(executor_t *ex, const io_t *io, const char *p, uint64_t len) {
  const tent_slice_t *s = &io->job->s;
  if (!ex->write_warm || s->opcode != TENT_OP_WRITE || io->used_direct || !ex->chunk || s->length <= ex->chunk)
    return;
  unsigned long sink = 0;
  for (uint64_t i = 0; i < len; i += 64) sink += *(const volatile unsigned char *)(p + i);
  __asm__ volatile("" : : "r"(sink));
  atomic_fetch_add(&ex->st_warm_pieces, 1);
}

/* Stream ordering: wait until the batch's CUDA event is done (or its deadline, or a cancel). */
static int wait_event(executor_t *ex, const tent_order_t *ord, uint64_t token) {
  atomic_fetch_add(&ex->st_ordered, 1);
  long sleep_ns = 20000;
  for (;;) {
    int rc = g_cf.cuEventQuery((void *)(uintptr_t)ord->event);
    if (rc == 0) return TENT_OK;
    if (rc != 600) { /* CUDA_ERROR_NOT_READY is the only "not yet" */
      fprintf(stderr, "tent_gds: cuEventQuery: CUresult %d\n", rc);
      return TENT_E_IO;
    }
    if (ex->host->is_cancelled(ex->host->ctx, token)) return TENT_E_CANCELLED;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t t = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    if (ord->deadline_ns && t >= ord->deadline_ns) return TENT_E_TIMEOUT;
    struct timespec d = {0, sleep_ns};
    nanosleep(&d, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
}

/* Validate a work item and turn it into an io. Returns TENT_OK, or a status (item is done). */
static int io_prepare(executor_t *ex, const work_t *w, io_t *io) {
  job_t *j = w->job;
  const tent_slice_t *s = &j->s;
  if (atomic_load(&j->status) != TENT_OK) return 1; /* an earlier chunk failed: skip */
  if (ex->host->is_cancelled(ex->host->ctx, s->token)) return TENT_E_CANCELLED;
  tent_order_t ord;
  if (tent_ot_get(&ex->order, s->token, &ord)) {
    int st = wait_event(ex, &ord, s->token);
    if (st != TENT_OK) return st;
  }
  if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE) return TENT_E_PROTOCOL;
  if (s->remote_addr + s->length < s->remote_addr) return TENT_E_BOUNDS;
  if (w->len == 0) {
    int st = TENT_OK;
    if (s->length == 0) { /* a zero-length slice must still name a registered file */
      gfile_t *f = file_get(ex, s->peer, s->remote_addr, 0, &st);
      if (f) file_unref(f);
    }
    return st;
  }
  int st = TENT_OK;
  gfile_t *f = file_get(ex, s->peer, s->remote_addr, s->length, &st);
  if (!f) return st;
  if (s->opcode == TENT_OP_WRITE && !f->writable) {
    file_unref(f);
    return TENT_E_PERMISSION;
  }
  int partial = 0;
  /* the unlocked count only spares host-only executors the lookup; gbuf_get locks */
  io->gpu = __atomic_load_n(&ex->ngbufs, __ATOMIC_RELAXED) ? gbuf_get(ex, s->local_addr, s->length, &partial) : NULL;
  if (partial) { /* local range straddles the end of a CUDA buffer */
    file_unref(f);
    return TENT_E_BOUNDS;
  }
  io->job = j;
  io->file = f;
  io->pos = w->off;
  io->end = w->off + w->len;
  io->direct_ok = ex->direct && f->dfd >= 0;
  io->used_direct = 0;
  return -1000; /* "go" */
}

/* Where the next request of `io` goes: fd, memory pointer, file offset, length. */
static void io_next(executor_t *ex, io_t *io, int *fd, char **mem, uint64_t *foff, uint64_t *len) {
  const tent_slice_t *s = &io->job->s;
  uint64_t left = io->end - io->pos;
  uint64_t local = s->local_addr + io->pos;
  uint64_t off = s->remote_addr - io->file->base + io->pos;
  *mem = (char *)(uintptr_t)local;
  *foff = off;
  io->used_direct = 0;
  if (io->direct_ok && left >= DIRECT_ALIGN && (local % DIRECT_ALIGN) == 0 && (off % DIRECT_ALIGN) == 0) {
    *fd = io->file->dfd;
    *len = left & ~(uint64_t)(DIRECT_ALIGN - 1);
    io->used_direct = 1;
  } else {
    *fd = io->file->fd;
    *len = left;
  }
  if (*len > (1u << 30)) *len = 1u << 30; /* one request moves at most 1 GiB */
  /* a WRITE kept whole (whole_write) still goes to the file in chunk-sized requests: each holds the
   * file's inode lock for one chunk, not for the whole slice */
  if (!io->used_direct && io->job->s.opcode == TENT_OP_WRITE && ex->chunk && *len > ex->chunk) *len = ex->chunk;
}

/* Account the result of one request. Returns 1 if the io needs another request, 0 when done
 * (with *st the status). */
static int io_advance(executor_t *ex, io_t *io, int64_t res, int *st) {
  uint32_t op = io->job->s.opcode;
  if (res < 0) {
    int e = (int)-res;
    if (e == EINTR || e == EAGAIN) return 1;
    if (io->used_direct && e == EINVAL) { /* the fs refused this direct request: go buffered */
      io->direct_ok = 0;
      return 1;
    }
    *st = errno_status(e);
    return 0;
  }
  if (res == 0) {
    /* READ: end of file before the registered length -> never hand back garbage */
    *st = op == TENT_OP_READ ? TENT_E_BOUNDS : TENT_E_IO;
    return 0;
  }
  atomic_fetch_add(io->used_direct ? &ex->st_direct_bytes : &ex->st_buffered_bytes, (unsigned long long)res);
  io->pos += (uint64_t)res;
  if (io->pos < io->end) {
    if (io->used_direct && (res % DIRECT_ALIGN) != 0) io->direct_ok = 0; /* short direct read: EOF near */
    return 1;
  }
  *st = TENT_OK;
  return 0;
}

static void io_done(executor_t *ex, io_t *io, int st) {
  file_unref(io->file);
  io->file = NULL;
  if (io->gpu) gbuf_unref(io->gpu);
  io->gpu = NULL;
  finish_work(ex, io->job, st);
}

/* ---------------------------------------------------------------- queue */
/* Pop one work item; blocks if `block`. Returns 0 if got one, -1 if none / stopping. */
static int queue_pop(executor_t *ex, work_t *out, int block) {
  pthread_mutex_lock(&ex->mu);
  while (block && !ex->stop && ex->q.len == 0) pthread_cond_wait(&ex->cv, &ex->mu);
  if (ex->stop || tent_cq_pop(&ex->q, out) != 0) {
    pthread_mutex_unlock(&ex->mu);
    return -1;
  }
  int more = ex->q.len > 0;
  pthread_mutex_unlock(&ex->mu);
  if (more && block) pthread_cond_signal(&ex->cv); /* hand the rest to an idle worker */
  return 0;
}

/* ---------------------------------------------------------------- cuFile engine */
/* The file's cuFile handle, registered on first use; NULL with *st set if cuFile refuses it. */
static void *file_cufile_handle(gfile_t *f, int *st) {
  pthread_mutex_lock(&f->cf_mu);
  if (!f->cfh && !f->cf_err) {
    cf_descr_t d;
    memset(&d, 0, sizeof d);
    d.type = CF_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = f->dfd >= 0 ? f->dfd : f->fd; /* GPUDirect wants O_DIRECT; compat mode takes either */
    void *fh = NULL;
    cf_error_t e = g_cf.HandleRegister(&fh, &d);
    if (e.err == 0 && fh)
      f->cfh = fh;
    else {
      f->cf_err = e.err ? e.err : CF_BASE_ERR + 30;
      fprintf(stderr, "tent_gds: cuFileHandleRegister(fd %d): error %d (cuda %d)%s\n", d.handle.fd, e.err, e.cu_err,
              g_cf.cuMemcpyHtoD && g_cf.cuMemcpyDtoH ? "; GPU I/O on this file goes through a host bounce buffer" : "");
    }
  }
  void *fh = f->cfh;
  int err = f->cf_err;
  pthread_mutex_unlock(&f->cf_mu);
  if (!fh) *st = cufile_status(err);
  return fh;
}

#define BOUNCE_MAX (8u << 20)

/* A GPU <-> file io for a file cuFile refused: pread/pwrite on the buffered fd through a host
 * bounce buffer, cuMemcpy to/from the device (the buffer's context is current). */
static int run_gpu_bounce(executor_t *ex, io_t *io) {
  const tent_slice_t *s = &io->job->s;
  uint64_t buf_off0 = s->local_addr - io->gpu->base, file_off0 = s->remote_addr - io->file->base;
  uint64_t cap = io->end - io->pos < BOUNCE_MAX ? io->end - io->pos : BOUNCE_MAX;
  char *bounce = malloc(cap ? cap : 1);
  if (!bounce) return TENT_E_IO;
  int fd = io->file->fd >= 0 ? io->file->fd : io->file->dfd, st = TENT_OK;
  while (st == TENT_OK && io->pos < io->end) {
    uint64_t len = io->end - io->pos < cap ? io->end - io->pos : cap;
    uint64_t dev = io->gpu->base + buf_off0 + io->pos;
    off_t foff = (off_t)(file_off0 + io->pos);
    if (s->opcode == TENT_OP_READ) {
      uint64_t got = 0;
      while (got < len) {
        ssize_t n = pread(fd, bounce + got, len - got, foff + (off_t)got);
        if (n == -1 && errno == EINTR) continue;
        if (n < 0) {
          st = errno_status(errno);
          break;
        }
        if (n == 0) {
          st = TENT_E_BOUNDS; /* EOF before the registered length */
          break;
        }
        got += (uint64_t)n;
      }
      if (st == TENT_OK && g_cf.cuMemcpyHtoD(dev, bounce, len) != 0) st = TENT_E_INTERNAL;
    } else {
      if (g_cf.cuMemcpyDtoH(bounce, dev, len) != 0) {
        st = TENT_E_INTERNAL;
        break;
      }
      uint64_t put = 0;
      while (put < len) {
        ssize_t n = pwrite(fd, bounce + put, len - put, foff + (off_t)put);
        if (n == -1 && errno == EINTR) continue;
        if (n <= 0) {
          st = n < 0 ? errno_status(errno) : TENT_E_IO;
          break;
        }
        put += (uint64_t)n;
      }
    }
    atomic_fetch_add(&ex->st_bounce_ios, 1);
    if (st == TENT_OK) {
      atomic_fetch_add(&ex->st_bounce_bytes, len);
      io->pos += len;
    }
  }
  free(bounce);
  return st;
}

/* Run a GPU <-> file io to the end with cuFileRead/cuFileWrite on this thread. */
static int run_gpu(executor_t *ex, io_t *io) {
  const tent_slice_t *s = &io->job->s;
  int st = TENT_OK;
  if (io->gpu->ctx && g_cf.cuCtxSetCurrent(io->gpu->ctx) != 0) return TENT_E_INTERNAL;
  void *fh = file_cufile_handle(io->file, &st);
  if (!fh) {
    if (g_cf.cuMemcpyHtoD && g_cf.cuMemcpyDtoH) return run_gpu_bounce(ex, io);
    return TENT_E_INTERNAL; /* final: cuFile keeps refusing this file, retrying cannot help */
  }
  void *base = (void *)(uintptr_t)io->gpu->base;
  uint64_t buf_off0 = s->local_addr - io->gpu->base;
  uint64_t file_off0 = s->remote_addr - io->file->base;
  while (io->pos < io->end) {
    uint64_t len = io->end - io->pos;
    if (len > (1u << 30)) len = 1u << 30;
    off_t foff = (off_t)(file_off0 + io->pos), boff = (off_t)(buf_off0 + io->pos);
    ssize_t n = s->opcode == TENT_OP_READ ? g_cf.Read(fh, base, len, foff, boff) : g_cf.Write(fh, base, len, foff, boff);
    atomic_fetch_add(&ex->st_gpu_ios, 1);
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) return errno_status(errno);
    if (n < 0) return cufile_status(n);
    if (n == 0) return s->opcode == TENT_OP_READ ? TENT_E_BOUNDS : TENT_E_IO; /* EOF before the registered length */
    atomic_fetch_add(&ex->st_gpu_bytes, (unsigned long long)n);
    io->pos += (uint64_t)n;
  }
  return TENT_OK;
}

/* ---------------------------------------------------------------- pread engine */
static void run_sync(executor_t *ex, const work_t *w) {
  io_t io;
  int st = io_prepare(ex, w, &io);
  if (st != -1000) {
    finish_work(ex, w->job, st == 1 ? TENT_OK : st);
    return;
  }
  if (io.gpu) {
    io_done(ex, &io, run_gpu(ex, &io));
    return;
  }
  for (;;) {
    int fd;
    char *mem;
    uint64_t off, len;
    io_next(ex, &io, &fd, &mem, &off, &len);
    if (io.job->s.opcode == TENT_OP_WRITE) warm_source(ex, &io, mem, len);
    ssize_t n = io.job->s.opcode == TENT_OP_READ ? pread(fd, mem, len, (off_t)off) : pwrite(fd, mem, len, (off_t)off);
    atomic_fetch_add(&ex->st_sync_ios, 1);
    int64_t res = n < 0 ? -(int64_t)errno : (int64_t)n;
    if (!io_advance(ex, &io, res, &st)) break;
  }
  io_done(ex, &io, st);
}

static void *worker_sync(void *arg) {
  worker_t *wk = arg;
  executor_t *ex = wk->ex;
  work_t w;
  while (queue_pop(ex, &w, 1) == 0) run_sync(ex, &w);
  return NULL;
}

/* ---------------------------------------------------------------- io_uring engine */
/* A buffered WRITE the filesystem cannot do without blocking is written here, on the worker, with
 * pwrite (see the header: io_uring would run it on its io-wq thread). The file's first buffered
 * WRITE tries RWF_NOWAIT to learn which kind it is. Returns 1 when the io is done (*st set), 0
 * when it goes through the ring (the filesystem writes without blocking; part of it may be done). */
static int write_on_worker(executor_t *ex, io_t *io, int *st) {
  gfile_t *f = io->file;
  int kind = atomic_load_explicit(&f->nowait_write, memory_order_relaxed);
  if (io->job->s.opcode != TENT_OP_WRITE || io->direct_ok || kind == 1) return 0;
  for (;;) {
    int fd;
    char *mem;
    uint64_t off, len;
    io_next(ex, io, &fd, &mem, &off, &len);
    if (kind == 0) warm_source(ex, io, mem, len); /* not before the RWF_NOWAIT try: it may go to the ring */
    ssize_t n;
    if (kind < 0) {
      struct iovec v = {mem, len};
      n = pwritev2(fd, &v, 1, (off_t)off, RWF_NOWAIT);
      if (n < 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) { /* ext4's buffered writes, or an old kernel */
        atomic_store(&f->nowait_write, 0);
        kind = 0;
        continue;
      }
      if (n < 0 && errno == EAGAIN) { /* supported; this one would block: the ring takes it */
        atomic_store(&f->nowait_write, 1);
        return 0;
      }
      if (n >= 0) {
        atomic_store(&f->nowait_write, 1);
        kind = 1;
      }
    } else {
      n = pwrite(fd, mem, len, (off_t)off);
    }
    atomic_fetch_add(&ex->st_sync_ios, 1);
    int64_t res = n < 0 ? -(int64_t)errno : (int64_t)n;
    if (!io_advance(ex, io, res, st)) return 1;
    if (kind == 1) return 0; /* the rest through the ring */
  }
}

static int uring_queue(worker_t *wk, io_t *io) {
  int fd;
  char *mem;
  uint64_t off, len;
  io_next(wk->ex, io, &fd, &mem, &off, &len);
  if (len > 0x7ffff000u) len = 0x7ffff000u; /* sqe len is 32 bits; the kernel caps rw at this */
  struct io_uring_sqe *sqe = uring_get_sqe(&wk->ring);
  if (!sqe) return -EBUSY;
  sqe->opcode = io->job->s.opcode == TENT_OP_READ ? IORING_OP_READ : IORING_OP_WRITE;
  sqe->fd = fd;
  sqe->addr = (uint64_t)(uintptr_t)mem;
  sqe->len = (uint32_t)len;
  sqe->off = off;
  sqe->user_data = (uint64_t)io->uring_slot;
  atomic_fetch_add(&wk->ex->st_uring_ios, 1);
  return 0;
}

/* Account every completion the ring holds (never waits); a short transfer's rest is queued again. */
static void uring_reap(worker_t *wk) {
  executor_t *ex = wk->ex;
  uring_t *r = &wk->ring;
  unsigned head = *r->cq_head;
  unsigned tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
  while (head != tail) {
    struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
    int slot = (int)cqe->user_data;
    int64_t res = cqe->res;
    head++;
    io_t *io = &wk->ios[slot];
    int st = TENT_OK;
    if (io_advance(ex, io, res, &st) && uring_queue(wk, io) == 0) continue; /* still in flight */
    if (st == TENT_OK && io->pos < io->end) st = TENT_E_INTERNAL;
    wk->inflight--;
    wk->free_slots[wk->nfree++] = slot;
    io_done(ex, io, st);
  }
  __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
}

static void *worker_uring(void *arg) {
  worker_t *wk = arg;
  executor_t *ex = wk->ex;
  uring_t *r = &wk->ring;
  for (;;) {
    /* fill: take work while there is room; block only when nothing is in flight */
    while (wk->inflight < ex->qd) {
      work_t w;
      if (queue_pop(ex, &w, wk->inflight == 0) != 0) break;
      io_t *io = &wk->ios[wk->free_slots[wk->nfree - 1]];
      int st = io_prepare(ex, &w, io);
      if (st != -1000) {
        finish_work(ex, w.job, st == 1 ? TENT_OK : st);
        continue;
      }
      if (io->gpu) { /* cuFile calls block: run them here, between ring submissions */
        io_done(ex, io, run_gpu(ex, io));
        continue;
      }
      int wst = TENT_OK;
      if (write_on_worker(ex, io, &wst)) {
        io_done(ex, io, wst);
        continue;
      }
      wk->nfree--;
      if (uring_queue(wk, io) != 0) { /* cannot happen: ring entries >= qd */
        wk->free_slots[wk->nfree++] = io->uring_slot;
        io_done(ex, io, TENT_E_INTERNAL);
        continue;
      }
      wk->inflight++;
      /* Submit each piece as it is taken, not the whole fill at once: a READ out of the page cache
       * completes inside this call, so the worker takes its next piece only after copying this one
       * and a request's pieces spread over the workers one at a time. Filling the ring first made
       * each worker commit to queue_depth pieces (16 MiB) before copying any; a worker that got
       * less of the CPU (another thread on its core) then held the request's last pieces while the
       * other sat idle. I/O that does block (not cached, O_DIRECT) still fills the ring. */
      if (uring_submit(r, 0) == 0) uring_reap(wk);
    }
    if (wk->inflight == 0) {
      pthread_mutex_lock(&ex->mu);
      int stop = ex->stop;
      pthread_mutex_unlock(&ex->mu);
      if (stop) break;
      continue;
    }
    int rc = uring_submit(r, 1);
    if (rc < 0) {
      /* the ring is broken: fail what is in flight once it drains is impossible; fail fast */
      fprintf(stderr, "tent_gds: io_uring_enter failed: %s\n", strerror(-rc));
    }
    uring_reap(wk);
    if (rc < 0 && r->pending == 0 && wk->inflight > 0) {
      /* nothing will complete: wait for the kernel without spinning */
      usleep(1000);
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------- config */
static int parse_config(executor_t *ex, const char *cfg, char *err, size_t errlen) {
  ex->nthreads = 2;
  ex->qd = 16;
  ex->chunk = 1u << 20;
  ex->direct = 0;
  ex->engine = -1; /* auto */
  ex->cufile_mode = CUFILE_AUTO;
  ex->nowait = 1;
  ex->inline_write = 1u << 20;
  ex->write_warm = 1;
  char k[64], v[256];
  for (const char *c = cfg; tent_config_next(&c, k, sizeof k, v, sizeof v);) {
    if (!strcmp(k, "threads")) {
      long t = strtol(v, NULL, 10);
      ex->nthreads = t < 1 ? 1 : (t > MAX_THREADS ? MAX_THREADS : (uint32_t)t);
    } else if (!strcmp(k, "queue_depth")) {
      long t = strtol(v, NULL, 10);
      ex->qd = t < 1 ? 1 : (t > MAX_QD ? MAX_QD : (uint32_t)t);
    } else if (!strcmp(k, "chunk")) {
      ex->chunk = strtoull(v, NULL, 10);
      if (ex->chunk && ex->chunk < DIRECT_ALIGN) ex->chunk = DIRECT_ALIGN;
      ex->chunk &= ~(uint64_t)(DIRECT_ALIGN - 1);
      if (ex->chunk > (1u << 30)) ex->chunk = 1u << 30;
    } else if (!strcmp(k, "direct")) {
      ex->direct = !strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "True");
    } else if (!strcmp(k, "split_writes")) {
      ex->split_writes = !strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "True");
    } else if (!strcmp(k, "write_warm")) {
      ex->write_warm = !strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "True");
    } else if (!strcmp(k, "inline_write_bytes")) {
      ex->inline_write = strtoull(v, NULL, 10);
    } else if (!strcmp(k, "nowait")) {
      ex->nowait = !strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "True");
    } else if (!strcmp(k, "cufile")) {
      if (!strcmp(v, "auto"))
        ex->cufile_mode = CUFILE_AUTO;
      else if (!strcmp(v, "on"))
        ex->cufile_mode = CUFILE_ON;
      else if (!strcmp(v, "off"))
        ex->cufile_mode = CUFILE_OFF;
      else {
        snprintf(err, errlen, "tent_gds: cufile must be auto, on or off, got %s", v);
        return -1;
      }
    } else if (!strcmp(k, "cufile_lib")) {
      snprintf(ex->cufile_lib, sizeof ex->cufile_lib, "%s", v);
    } else if (!strcmp(k, "cuda_lib")) {
      snprintf(ex->cuda_lib, sizeof ex->cuda_lib, "%s", v);
    } else if (!strcmp(k, "engine")) {
      if (!strcmp(v, "auto"))
        ex->engine = -1;
      else if (!strcmp(v, "io_uring"))
        ex->engine = ENGINE_URING;
      else if (!strcmp(v, "pread"))
        ex->engine = ENGINE_PREAD;
      else {
        snprintf(err, errlen, "tent_gds: engine must be auto, io_uring or pread, got %s", v);
        return -1;
      }
    }
  }
  return 0;
}

EXPORT int32_t tent_gds_uring_supported(char *why, uint64_t whylen) {
  uring_t r;
  int rc = uring_init(&r, 4);
  if (rc < 0) {
    if (why) snprintf(why, whylen, "io_uring_setup: %s", strerror(-rc));
    return 0;
  }
  size_t sz = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
  struct io_uring_probe *pr = calloc(1, sz);
  int ok = 0;
  if (!pr) {
    if (why) snprintf(why, whylen, "out of memory");
  } else if (sys_uring_register(r.fd, IORING_REGISTER_PROBE, pr, 256) < 0) {
    if (why) snprintf(why, whylen, "IORING_REGISTER_PROBE: %s", strerror(errno));
  } else if (pr->last_op < IORING_OP_WRITE || !(pr->ops[IORING_OP_READ].flags & IO_URING_OP_SUPPORTED) ||
             !(pr->ops[IORING_OP_WRITE].flags & IO_URING_OP_SUPPORTED)) {
    if (why) snprintf(why, whylen, "kernel lacks IORING_OP_READ/WRITE");
  } else {
    ok = 1;
    if (why && whylen) why[0] = 0;
  }
  free(pr);
  uring_close(&r);
  return ok;
}

/* ---------------------------------------------------------------- ABI */
static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    snprintf(err, errlen, "tent_gds: host API version mismatch");
    return NULL;
  }
  executor_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    snprintf(err, errlen, "tent_gds: out of memory");
    return NULL;
  }
  ex->host = host;
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->cv, NULL);
  pthread_rwlock_init(&ex->tab, NULL);
  tent_ot_init(&ex->order);
  if (parse_config(ex, config, err, errlen) != 0) {
    ex_destroy(ex);
    return NULL;
  }
  char why[160] = "";
  int uring_ok = ex->engine == ENGINE_PREAD ? 0 : tent_gds_uring_supported(why, sizeof why);
  if (ex->engine == ENGINE_URING && !uring_ok) {
    snprintf(err, errlen, "tent_gds: engine=io_uring requested but unusable: %s", why);
    ex_destroy(ex);
    return NULL;
  }
  ex->engine = uring_ok ? ENGINE_URING : ENGINE_PREAD;
  if (ex->cufile_mode == CUFILE_OFF) {
    snprintf(ex->cufile_why, sizeof ex->cufile_why, "disabled by config (cufile=off)");
  } else if (cufile_load(ex->cufile_lib, ex->cuda_lib) != 0) {
    snprintf(ex->cufile_why, sizeof ex->cufile_why, "%s", g_cf.why);
  } else {
    cf_error_t e = g_cf.DriverOpen();
    if (e.err != 0)
      snprintf(ex->cufile_why, sizeof ex->cufile_why, "cuFileDriverOpen: error %d (cuda %d)", e.err, e.cu_err);
    else
      ex->cufile_open = 1;
  }
  if (ex->cufile_mode == CUFILE_ON && !ex->cufile_open) {
    snprintf(err, errlen, "tent_gds: cufile=on but cuFile is unusable: %s", ex->cufile_why);
    ex_destroy(ex);
    return NULL;
  }
  for (uint32_t i = 0; i < ex->nthreads; i++) {
    worker_t *wk = &ex->workers[i];
    wk->ex = ex;
    wk->ring.fd = -1;
    if (ex->engine == ENGINE_URING) {
      unsigned entries = 1;
      while (entries < ex->qd) entries <<= 1;
      int rc = uring_init(&wk->ring, entries);
      wk->ios = calloc(ex->qd, sizeof(io_t));
      wk->free_slots = calloc(ex->qd, sizeof(int));
      if (rc < 0 || !wk->ios || !wk->free_slots) {
        snprintf(err, errlen, "tent_gds: io_uring ring for worker %u: %s", i, rc < 0 ? strerror(-rc) : "out of memory");
        if (rc == 0) uring_close(&wk->ring);
        free(wk->ios);
        free(wk->free_slots);
        wk->ios = NULL;
        wk->free_slots = NULL;
        ex_destroy(ex);
        return NULL;
      }
      wk->has_ring = 1;
      for (uint32_t k = 0; k < ex->qd; k++) {
        wk->ios[k].uring_slot = (int)k;
        wk->free_slots[k] = (int)(ex->qd - 1 - k);
      }
      wk->nfree = ex->qd;
    }
    int rc = pthread_create(&wk->thread, NULL, ex->engine == ENGINE_URING ? worker_uring : worker_sync, wk);
    if (rc) {
      snprintf(err, errlen, "tent_gds: pthread_create: %s", strerror(rc));
      if (wk->has_ring) {
        uring_close(&wk->ring);
        wk->has_ring = 0;
      }
      ex_destroy(ex);
      return NULL;
    }
    ex->started++;
  }
  return ex;
}

static void ex_destroy(void *self) {
  executor_t *ex = self;
  if (!ex) return;
  pthread_mutex_lock(&ex->mu);
  ex->stop = 1;
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
  /* uring workers drain their in-flight I/O before they see stop */
  for (uint32_t i = 0; i < ex->started; i++) pthread_join(ex->workers[i].thread, NULL);
  for (uint32_t i = 0; i < MAX_THREADS; i++) {
    worker_t *wk = &ex->workers[i];
    if (wk->has_ring) uring_close(&wk->ring);
    free(wk->ios);
    free(wk->free_slots);
  }
  work_t w;
  while (tent_cq_pop(&ex->q, &w) == 0) finish_work(ex, w.job, TENT_E_CANCELLED); /* reported exactly once */
  tent_cq_free(&ex->q);
  for (size_t i = 0; i < ex->peers.cap; i++) {
    peer_t *p = ex->peers.items[i];
    if (!p) continue;
    for (size_t k = 0; k < p->nfiles; k++) file_unref(p->files[k]);
    free(p->files);
    free(p);
  }
  tent_ht_free(&ex->peers);
  for (size_t i = 0; i < ex->ngbufs; i++) gbuf_unref(ex->gbufs[i]);
  free(ex->gbufs);
  if (ex->cufile_open) g_cf.DriverClose();
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv);
  pthread_rwlock_destroy(&ex->tab);
  tent_ot_destroy(&ex->order);
  free(ex);
}

/* Is slice `s` a buffered WRITE that one worker writes whole (see the header, "One writer per
 * buffered WRITE")? Decided from the executor's config alone: no file lookup on the submit path. */
static int whole_write(const executor_t *ex, const tent_slice_t *s) {
  return !ex->split_writes && !ex->write_warm && s->opcode == TENT_OP_WRITE && !ex->direct && ex->chunk && s->length > ex->chunk &&
         !__atomic_load_n(&ex->ngbufs, __ATOMIC_RELAXED);
}

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  uint32_t whole = 0;
  for (uint32_t i = 0; i < n; i++) whole += (uint32_t)whole_write(ex, &slices[i]);
  if (!whole) return tent_cq_submit(&ex->q, &ex->mu, &ex->cv, &ex->stop, slices, n, ex->chunk, UINT32_MAX);
  uint64_t small[64], *chunks = n <= 64 ? small : malloc(n * sizeof *chunks);
  if (!chunks) return TENT_E_INTERNAL;
  for (uint32_t i = 0; i < n; i++) chunks[i] = whole_write(ex, &slices[i]) ? 0 : ex->chunk;
  int rc = tent_cq_submit_each(&ex->q, &ex->mu, &ex->cv, &ex->stop, slices, n, ex->chunk, chunks, UINT32_MAX, 0);
  if (chunks != small) free(chunks);
  if (rc == TENT_OK) atomic_fetch_add(&ex->st_whole_writes, whole);
  return rc;
}

/* ---------------------------------------------------------------- the submitting thread's try */
/* The file of slice `s` when the submitting thread may try it itself (see the header: one piece,
 * host memory, no CUDA event, buffered, the filesystem not known to refuse RWF_NOWAIT for the op),
 * referenced; else NULL and the slice is queued as usual (any error is reported from there). */
static gfile_t *nowait_file(executor_t *ex, const tent_slice_t *s) {
  if (!ex->nowait || s->length == 0 || (ex->chunk && s->length > ex->chunk)) return NULL;
  if (s->opcode != TENT_OP_READ && s->opcode != TENT_OP_WRITE) return NULL;
  if (s->remote_addr + s->length < s->remote_addr) return NULL;
  if (ex->host->is_cancelled(ex->host->ctx, s->token)) return NULL; /* the worker reports E_CANCELLED */
  tent_order_t ord;
  if (__atomic_load_n(&ex->ngbufs, __ATOMIC_RELAXED) || tent_ot_get(&ex->order, s->token, &ord)) return NULL;
  int st = TENT_OK;
  gfile_t *f = file_get(ex, s->peer, s->remote_addr, s->length, &st);
  if (!f) return NULL;
  int kind = atomic_load_explicit(s->opcode == TENT_OP_READ ? &f->nowait_read : &f->nowait_write, memory_order_relaxed);
  int refused = kind == 0 && !(s->opcode == TENT_OP_WRITE && s->length <= ex->inline_write); /* see nowait_run */
  if ((ex->direct && f->dfd >= 0) || refused || (s->opcode == TENT_OP_WRITE && !f->writable)) {
    file_unref(f);
    return NULL;
  }
  return f;
}

/* A WRITE up to inline_write_bytes to a file whose filesystem refuses RWF_NOWAIT for buffered
 * writes (ext4): the submitting thread pwrites it itself, without the GIL (host block_begin/end).
 * Queued instead, it cost a worker wake-up while the waiter raced that worker for the piece (and
 * the waiter's wake-up whenever the worker won): ~7 futex calls per 1 MiB request, ~50% more CPU
 * per GB than fio's psync loop. A page-cache write can sleep (the inode's lock, dirty-page
 * throttling): the caller waits as a bare pwrite's would, other Python threads run meanwhile.
 * Returns the bytes written, a prefix; it stops at the first error (ENOSPC, EIO, ...), whose
 * rest the workers then meet again and report as for any slice. */
static uint64_t write_blocking(executor_t *ex, gfile_t *f, const char *mem, uint64_t off, uint64_t len) {
  uint64_t pos = 0;
  void *tok = tent_host_block_begin(ex->host);
  while (pos < len) {
    uint64_t l = len - pos;
    if (l > 0x7ffff000u) l = 0x7ffff000u;
    ssize_t n = pwrite(f->fd, mem + pos, l, (off_t)(off + pos));
    if (n > 0) {
      atomic_fetch_add(&ex->st_nowait_ios, 1);
      atomic_fetch_add(&ex->st_buffered_bytes, (unsigned long long)n);
      pos += (uint64_t)n;
    } else if (!(n < 0 && errno == EINTR)) {
      break;
    }
  }
  tent_host_block_end(ex->host, tok);
  if (pos == len) atomic_fetch_add(&ex->st_inline_writes, 1);
  return pos;
}

/* Move what of slice `s` the kernel can without blocking (preadv2/pwritev2 with RWF_NOWAIT: a
 * READ out of the page cache, a WRITE into it where the filesystem allows that); returns the
 * bytes done, a prefix of the slice. It stops at the first EAGAIN (data not cached, a lock
 * held, dirty-page throttling), at end of file and at any error: the rest then goes to the
 * workers, whose blocking I/O reports the error or the EOF (E_BOUNDS) as for any slice. */
static uint64_t nowait_run(executor_t *ex, const tent_slice_t *s, gfile_t *f) {
  int rd = s->opcode == TENT_OP_READ;
  atomic_int *kind = rd ? &f->nowait_read : &f->nowait_write;
  char *mem = (char *)(uintptr_t)s->local_addr;
  uint64_t off = s->remote_addr - f->base, pos = 0;
  if (!rd && atomic_load_explicit(kind, memory_order_relaxed) == 0) /* refused before: nowait_file checked the size */
    return write_blocking(ex, f, mem, off, s->length);
  while (pos < s->length) {
    uint64_t len = s->length - pos;
    if (len > 0x7ffff000u) len = 0x7ffff000u; /* the kernel's cap for one read/write */
    struct iovec v = {mem + pos, len};
    ssize_t n = rd ? preadv2(f->fd, &v, 1, (off_t)(off + pos), RWF_NOWAIT)
                   : pwritev2(f->fd, &v, 1, (off_t)(off + pos), RWF_NOWAIT);
    if (n > 0) {
      if (atomic_load_explicit(kind, memory_order_relaxed) != 1) /* no store per request: a shared line */
        atomic_store_explicit(kind, 1, memory_order_relaxed);
      atomic_fetch_add(&ex->st_nowait_ios, 1);
      atomic_fetch_add(&ex->st_buffered_bytes, (unsigned long long)n);
      pos += (uint64_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) { /* this filesystem, or an old kernel */
      atomic_store_explicit(kind, 0, memory_order_relaxed);
      if (!rd && s->length <= ex->inline_write) return pos + write_blocking(ex, f, mem + pos, off + pos, s->length - pos);
    } else if (n < 0 && errno == EAGAIN)
      atomic_store_explicit(kind, 1, memory_order_relaxed); /* supported; this one would block */
    break;
  }
  return pos;
}

/* Queue [off, length) of slice `s` as one piece for the workers (and the waiter, ex_progress). */
static int queue_rest(executor_t *ex, const tent_slice_t *s, uint64_t off) {
  job_t *j = tent_job_new(s, 1);
  if (!j) return TENT_E_INTERNAL;
  int rc = TENT_OK;
  pthread_mutex_lock(&ex->mu);
  if (ex->stop || tent_cq_reserve(&ex->q, 1) != 0) {
    rc = TENT_E_INTERNAL;
  } else {
    work_t *c = &ex->q.items[(ex->q.head + ex->q.len) % ex->q.cap];
    c->job = j;
    c->off = off;
    c->len = s->length - off;
    ex->q.len++;
    pthread_cond_signal(&ex->cv);
  }
  pthread_mutex_unlock(&ex->mu);
  if (rc != TENT_OK) free(j);
  return rc;
}

/* The first slice is tried by the calling thread without blocking (nowait_file/nowait_run): a
 * 1 MiB READ out of the page cache is done and reported before this returns, with no queue, no
 * worker wake-up and no wake-up of its waiter. The other slices are queued first (workers start on
 * them meanwhile), so the caller copies at most one slice, at most inline_bytes, per call.
 * Whatever is left (EAGAIN: not cached; an error) is queued and a worker woken exactly as submit
 * does, and the batch's waiter may run it (ex_progress). Never blocks on I/O. */
static int ex_submit_inline(void *self, const tent_slice_t *slices, uint32_t n) {
  executor_t *ex = self;
  gfile_t *f = n > 0 ? nowait_file(ex, &slices[0]) : NULL;
  if (!f) return ex_submit(self, slices, n);
  if (n > 1) {
    int rc = ex_submit(self, slices + 1, n - 1);
    if (rc != TENT_OK) {
      file_unref(f);
      return rc; /* nothing queued, nothing reported */
    }
  }
  const tent_slice_t *s = &slices[0];
  uint64_t done = nowait_run(ex, s, f);
  file_unref(f);
  if (done == s->length) {
    atomic_fetch_add(&ex->st_nowait_slices, 1);
    atomic_fetch_add(&ex->st_ok, 1);
    ex->host->complete(ex->host->ctx, s, TENT_OK);
    return TENT_OK;
  }
  int rc = queue_rest(ex, s, done);
  if (rc != TENT_OK) {
    if (n == 1 && done == 0) return rc; /* nothing queued, nothing reported */
    atomic_fetch_add(&ex->st_failed, 1);
    ex->host->complete(ex->host->ctx, s, rc);
  }
  return TENT_OK;
}

/* A waiter offering less than this (a poll with a short timeout) takes no piece: one piece of
 * I/O must not make its wait overrun by much. */
#define WAITER_MIN_BUDGET_NS 1000000ll /* 1 ms */

/* The waiter of batch `token` runs the batch's pieces that no worker has taken yet, one at a time,
 * from the head of the queue (a piece behind another batch's is left to the workers). 1 when it
 * ran one (the core calls again while the batch is unfinished), 0 when none is left to it. A
 * hand-off (budget_ns < 0) has nothing to hand: every piece is queued for the workers already. */
static int ex_progress(void *self, uint64_t token, int64_t budget_ns) {
  executor_t *ex = self;
  if (budget_ns < WAITER_MIN_BUDGET_NS) return 0;
  /* GPU pieces run cuFile with their buffer's CUDA context made current, and ordered batches wait
   * for a CUDA event: neither belongs on the caller's thread */
  tent_order_t ord;
  if (__atomic_load_n(&ex->ngbufs, __ATOMIC_RELAXED) || tent_ot_get(&ex->order, token, &ord)) return 0;
  work_t w;
  pthread_mutex_lock(&ex->mu);
  int mine = !ex->stop && ex->q.len > 0 && ex->q.items[ex->q.head].job->s.token == token && tent_cq_pop(&ex->q, &w) == 0;
  pthread_mutex_unlock(&ex->mu);
  if (!mine) return 0;
  atomic_fetch_add(&ex->st_waiter_pieces, 1);
  run_sync(ex, &w);
  return 1;
}

static const tent_executor_ops_t g_ops = {
    TENT_EXECUTOR_ABI_VERSION, sizeof(tent_executor_ops_t), "gds", ex_create, ex_destroy, ex_submit, ex_submit_inline,
    ex_progress,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }

/* ---------------------------------------------------------------- private API */
EXPORT uint64_t tent_gds_peer_add(void *self) {
  executor_t *ex = self;
  if (!ex) return 0;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return 0;
  pthread_rwlock_wrlock(&ex->tab);
  uint64_t h = tent_ht_insert(&ex->peers, p);
  p->handle = h;
  pthread_rwlock_unlock(&ex->tab);
  if (!h) free(p);
  return h;
}

/* Forget a peer and its files; I/O in flight keeps its file alive until it completes. */
EXPORT int32_t tent_gds_peer_remove(void *self, uint64_t h) {
  executor_t *ex = self;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = tent_ht_take(&ex->peers, h);
  pthread_rwlock_unlock(&ex->tab);
  if (!p) return -ENOENT;
  for (size_t k = 0; k < p->nfiles; k++) file_unref(p->files[k]);
  free(p->files);
  free(p);
  return 0;
}

/* Register [base, base+len) -> fd (and O_DIRECT dfd or -1). The executor owns the fds from
 * here on, also on failure. A file at the same base is replaced. 0 or -errno. */
EXPORT int32_t tent_gds_file_add(void *self, uint64_t h, uint64_t base, uint64_t len, int32_t fd, int32_t dfd,
                                 int32_t writable) {
  executor_t *ex = self;
  gfile_t *f = calloc(1, sizeof *f);
  if (!f || base + len < base || fd < 0) {
    if (fd >= 0) close(fd);
    if (dfd >= 0) close(dfd);
    free(f);
    return f ? -EINVAL : -ENOMEM;
  }
  atomic_init(&f->refs, 1);
  atomic_init(&f->nowait_write, -1);
  atomic_init(&f->nowait_read, -1);
  pthread_mutex_init(&f->cf_mu, NULL);
  f->base = base;
  f->len = len;
  f->fd = fd;
  f->dfd = dfd;
  f->writable = writable != 0;
  int rc = 0;
  gfile_t *old = NULL;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = peer_lookup(ex, h);
  if (!p) {
    rc = -ENOENT;
  } else {
    size_t pos = file_pos(p, base);
    if (pos < p->nfiles && p->files[pos]->base == base) {
      old = p->files[pos];
      uint64_t nb = pos + 1 < p->nfiles ? p->files[pos + 1]->base : UINT64_MAX;
      if (len > nb - base) {
        rc = -EEXIST;
        old = NULL;
      } else {
        p->files[pos] = f;
      }
    } else if ((pos > 0 && p->files[pos - 1]->base + p->files[pos - 1]->len > base) ||
               (pos < p->nfiles && base + len > p->files[pos]->base)) {
      rc = -EEXIST; /* overlaps another file */
    } else {
      if (p->nfiles == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        gfile_t **nf = realloc(p->files, cap * sizeof(gfile_t *));
        if (!nf)
          rc = -ENOMEM;
        else {
          p->files = nf;
          p->cap = cap;
        }
      }
      if (rc == 0) {
        memmove(&p->files[pos + 1], &p->files[pos], (p->nfiles - pos) * sizeof(gfile_t *));
        p->files[pos] = f;
        p->nfiles++;
      }
    }
  }
  pthread_rwlock_unlock(&ex->tab);
  if (old) file_unref(old);
  if (rc != 0) file_unref(f);
  return rc;
}

EXPORT int32_t tent_gds_file_remove(void *self, uint64_t h, uint64_t base) {
  executor_t *ex = self;
  gfile_t *f = NULL;
  pthread_rwlock_wrlock(&ex->tab);
  peer_t *p = peer_lookup(ex, h);
  if (p) {
    size_t pos = file_pos(p, base);
    if (pos < p->nfiles && p->files[pos]->base == base) {
      f = p->files[pos];
      memmove(&p->files[pos], &p->files[pos + 1], (p->nfiles - pos - 1) * sizeof(gfile_t *));
      p->nfiles--;
    }
  }
  pthread_rwlock_unlock(&ex->tab);
  if (!p) return -ENOENT;
  if (!f) return -ENOENT;
  file_unref(f);
  return 0;
}

EXPORT int32_t tent_gds_engine(void *self) { return ((executor_t *)self)->engine; }

EXPORT int64_t tent_gds_fs_magic(const char *path) {
  struct statfs s;
  if (statfs(path, &s) != 0) return -(int64_t)errno;
  return (int64_t)(uint64_t)(unsigned long)s.f_type;
}

EXPORT void tent_gds_config(void *self, uint64_t out[4]) {
  executor_t *ex = self;
  out[0] = ex->nthreads;
  out[1] = ex->qd;
  out[2] = ex->chunk;
  out[3] = (uint64_t)ex->direct;
}

EXPORT int32_t tent_gds_cufile_state(void *self, char *why, uint64_t whylen) {
  executor_t *ex = self;
  if (why && whylen) snprintf(why, whylen, "%s", ex->cufile_open ? "" : ex->cufile_why);
  return ex->cufile_open;
}

/* Register a CUDA allocation for cuFile I/O. 0 or -errno (message in err). */
EXPORT int32_t tent_gds_gpu_add(void *self, uint64_t base, uint64_t len, char *err, uint64_t errlen) {
  executor_t *ex = self;
  if (!ex->cufile_open) {
    snprintf(err, errlen, "cuFile is not active: %s", ex->cufile_why);
    return -ENOTSUP;
  }
  if (base == 0 || len == 0 || base + len < base) {
    snprintf(err, errlen, "bad CUDA range %#llx+%llu", (unsigned long long)base, (unsigned long long)len);
    return -EINVAL;
  }
  void *ctx = NULL;
  int cr = g_cf.cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, base);
  if (cr != 0) {
    snprintf(err, errlen, "cuPointerGetAttribute(%#llx): CUresult %d (not device memory?)", (unsigned long long)base, cr);
    return -EINVAL;
  }
  gbuf_t *b = calloc(1, sizeof *b);
  if (!b) return -ENOMEM;
  atomic_init(&b->refs, 1);
  b->base = base;
  b->len = len;
  b->ctx = ctx;
  void *caller_ctx = NULL; /* registration runs in the buffer's context; the caller keeps its own */
  g_cf.cuCtxGetCurrent(&caller_ctx);
  if (ctx) g_cf.cuCtxSetCurrent(ctx);
  cf_error_t e = g_cf.BufRegister((const void *)(uintptr_t)base, len, 0);
  if (ctx && ctx != caller_ctx) g_cf.cuCtxSetCurrent(caller_ctx);
  b->buf_registered = e.err == 0;
  if (!b->buf_registered) /* still usable: cuFile stages through its own bounce buffers */
    fprintf(stderr, "tent_gds: cuFileBufRegister(%#llx+%llu): error %d; using cuFile bounce buffers\n",
            (unsigned long long)base, (unsigned long long)len, e.err);
  int rc = 0;
  pthread_rwlock_wrlock(&ex->tab);
  size_t pos = 0;
  while (pos < ex->ngbufs && ex->gbufs[pos]->base < base) pos++;
  if ((pos > 0 && ex->gbufs[pos - 1]->base + ex->gbufs[pos - 1]->len > base) ||
      (pos < ex->ngbufs && base + len > ex->gbufs[pos]->base)) {
    rc = -EEXIST;
  } else if (ex->ngbufs == ex->gcap) {
    size_t cap = ex->gcap ? ex->gcap * 2 : 8;
    gbuf_t **nb = realloc(ex->gbufs, cap * sizeof(gbuf_t *));
    if (!nb)
      rc = -ENOMEM;
    else {
      ex->gbufs = nb;
      ex->gcap = cap;
    }
  }
  if (rc == 0) {
    memmove(&ex->gbufs[pos + 1], &ex->gbufs[pos], (ex->ngbufs - pos) * sizeof(gbuf_t *));
    ex->gbufs[pos] = b;
    __atomic_fetch_add(&ex->ngbufs, 1, __ATOMIC_RELAXED);
  }
  pthread_rwlock_unlock(&ex->tab);
  if (rc != 0) {
    snprintf(err, errlen, "CUDA range %#llx+%llu overlaps a registered one", (unsigned long long)base,
             (unsigned long long)len);
    gbuf_unref(b);
  }
  return rc;
}

/* Forget a CUDA buffer; I/O in flight keeps it (and its cuFile registration) until it completes. */
EXPORT int32_t tent_gds_gpu_remove(void *self, uint64_t base) {
  executor_t *ex = self;
  gbuf_t *b = NULL;
  pthread_rwlock_wrlock(&ex->tab);
  for (size_t i = 0; i < ex->ngbufs; i++)
    if (ex->gbufs[i]->base == base) {
      b = ex->gbufs[i];
      memmove(&ex->gbufs[i], &ex->gbufs[i + 1], (ex->ngbufs - i - 1) * sizeof(gbuf_t *));
      __atomic_fetch_sub(&ex->ngbufs, 1, __ATOMIC_RELAXED);
      break;
    }
  pthread_rwlock_unlock(&ex->tab);
  if (!b) return -ENOENT;
  gbuf_unref(b);
  return 0;
}

EXPORT void tent_gds_stats(void *self, uint64_t out[16]) {
  executor_t *ex = self;
  out[0] = atomic_load(&ex->st_direct_bytes);
  out[1] = atomic_load(&ex->st_buffered_bytes);
  out[2] = atomic_load(&ex->st_uring_ios);
  out[3] = atomic_load(&ex->st_sync_ios);
  out[4] = atomic_load(&ex->st_ok);
  out[5] = atomic_load(&ex->st_failed);
  out[6] = atomic_load(&ex->st_gpu_bytes);
  out[7] = atomic_load(&ex->st_gpu_ios);
  out[8] = atomic_load(&ex->st_bounce_bytes);
  out[9] = atomic_load(&ex->st_bounce_ios);
  out[10] = atomic_load(&ex->st_waiter_pieces);
  out[11] = atomic_load(&ex->st_nowait_ios);
  out[12] = atomic_load(&ex->st_nowait_slices);
  out[13] = atomic_load(&ex->st_whole_writes);
  out[14] = atomic_load(&ex->st_inline_writes);
  out[15] = atomic_load(&ex->st_warm_pieces);
}

/* I/O of batch `token` submitted from now on waits for CUevent `event` (see "Stream ordering"). */
EXPORT int32_t tent_gds_order_add(void *self, uint64_t token, uint64_t event, uint64_t seq, uint64_t deadline_ns) {
  if (!g_cf.loaded || !g_cf.cuEventQuery) return -ENOTSUP;
  return tent_ot_add(&((executor_t *)self)->order, token, event, seq, deadline_ns);
}

EXPORT int32_t tent_gds_order_remove(void *self, uint64_t token) { return tent_ot_remove(&((executor_t *)self)->order, token); }

EXPORT uint64_t tent_gds_ordered(void *self) { return atomic_load(&((executor_t *)self)->st_ordered); }
