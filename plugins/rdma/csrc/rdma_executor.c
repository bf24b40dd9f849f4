/*
 * tent_rdma executor: one-sided RDMA READ/WRITE over RC queue pairs, behind the TENT executor ABI.
 *
 * libibverbs.so.1 is loaded at run time (verbs_abi.h declares the ABI subset used), so the
 * library builds and imports on hosts without rdma-core; rdma_library_status() says why not.
 *
 * Layout
 *   device  one opened verbs device (one port): PD, one CQ with a completion channel, a table of
 *           memory regions, one worker thread that posts work requests and polls the CQ, and one
 *           thread reading asynchronous events (port up/down, QP fatal).
 *   peer    a remote engine: its rails and its memory regions (address, length, permission and
 *           one rkey per remote device).
 *   rail    (local device, remote device) of a peer: `qps_per_rail` RC QPs (the active side) and
 *           a FIFO of chunks waiting for a free send slot.
 *   passive QPs the target side of other engines' rails (created by rdma_accept_qp on a
 *           handshake; nothing is posted on them: peers READ/WRITE the memory regions directly,
 *           the NIC checks bounds and access flags against each region's rkey).
 *
 * Data path: submit() resolves lkey/rkey for each slice (bounds against the peer's advertised
 * regions), cuts it into chunks of at most chunk_bytes (and the port's max message size) and
 * queues them on the rail. The device thread gives chunks to the rail's READY QPs round robin,
 * at most max_send_wr outstanding per QP, posts them (one ibv_post_send per QP per round), polls
 * completions and reports each slice once, when its last chunk completes, through host->complete.
 *
 * Failures: a work-completion error is mapped by rdma_map_wc_status() (retryable vs final). A QP
 * that saw an error, a slice outstanding past slice_timeout_ms, an aborted rail or a port that went
 * down is moved to ERR (flushing its other WRs with a retryable status); once it has nothing
 * outstanding it is BROKEN and the plugin's maintenance thread recreates it and re-runs the
 * handshake (rdma_collect_broken / rdma_reset_qp / rdma_connect_qp). A rail with no READY QP, or
 * whose port is down, fails new slices at once with TENT_E_CONNECT, so the engine re-routes them and
 * its rail monitor pauses the rail until heartbeats pass again.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tent/chunk_queue.h"
#include "tent/config_kv.h"
#include "tent/executor_abi.h"
#include "tent/handle_table.h"
#include "verbs_abi.h"

#define EXPORT __attribute__((visibility("default")))

#define MAX_DEVICES 16
#define MAX_REMOTE_COLS 16
#define MAX_QPS_PER_RAIL 16
#define PERM_REMOTE_READ 1u
#define PERM_REMOTE_WRITE 2u
#define CQ_BATCH 64

/* ------------------------------------------------------------------ utils */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static atomic_int g_log_budget = 64; /* stderr stays quiet under error storms */

static void rlog(const char *fmt, ...) {
  if (atomic_fetch_sub(&g_log_budget, 1) <= 0) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("[tent_rdma] ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static void seterr(char *err, size_t n, const char *fmt, ...) {
  if (!err || !n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------------ libibverbs */

static tv_api_t g_ibv;
static char g_ibv_err[512];
static int g_ibv_ok;
static pthread_once_t g_ibv_once = PTHREAD_ONCE_INIT;

static void *ibv_sym(void *dl, const char *name, int required, int *missing) {
  void *p = dlvsym(dl, name, "IBVERBS_1.1");
  if (!p) p = dlsym(dl, name);
  if (!p && required) {
    if (!*missing) snprintf(g_ibv_err, sizeof g_ibv_err, "libibverbs.so.1 lacks %s", name);
    *missing = 1;
  }
  return p;
}

static void load_ibv(void) {
  const char *path = getenv("TENT_RDMA_LIBIBVERBS");
  if (!path || !*path) path = "libibverbs.so.1";
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *e = dlerror();
    snprintf(g_ibv_err, sizeof g_ibv_err, "cannot load %s (install rdma-core's libibverbs1): %s", path, e ? e : "?");
    return;
  }
  int missing = 0;
  tv_api_t *a = &g_ibv;
  a->dl = dl;
#define REQ(field, name) *(void **)&a->field = ibv_sym(dl, name, 1, &missing)
  REQ(get_device_list, "ibv_get_device_list");
  REQ(free_device_list, "ibv_free_device_list");
  REQ(get_device_name, "ibv_get_device_name");
  REQ(open_device, "ibv_open_device");
  REQ(close_device, "ibv_close_device");
  REQ(query_device, "ibv_query_device");
  REQ(query_port, "ibv_query_port");
  REQ(query_gid, "ibv_query_gid");
  REQ(alloc_pd, "ibv_alloc_pd");
  REQ(dealloc_pd, "ibv_dealloc_pd");
  REQ(reg_mr, "ibv_reg_mr");
  REQ(dereg_mr, "ibv_dereg_mr");
  REQ(create_comp_channel, "ibv_create_comp_channel");
  REQ(destroy_comp_channel, "ibv_destroy_comp_channel");
  REQ(create_cq, "ibv_create_cq");
  REQ(destroy_cq, "ibv_destroy_cq");
  REQ(get_cq_event, "ibv_get_cq_event");
  REQ(ack_cq_events, "ibv_ack_cq_events");
  REQ(create_qp, "ibv_create_qp");
  REQ(modify_qp, "ibv_modify_qp");
  REQ(destroy_qp, "ibv_destroy_qp");
  REQ(get_async_event, "ibv_get_async_event");
  REQ(ack_async_event, "ibv_ack_async_event");
  REQ(wc_status_str, "ibv_wc_status_str");
#undef REQ
  *(void **)&a->reg_dmabuf_mr = dlsym(dl, "ibv_reg_dmabuf_mr"); /* optional (rdma-core >= 34) */
  *(void **)&a->fork_init = dlsym(dl, "ibv_fork_init");
  if (missing) {
    dlclose(dl);
    memset(a, 0, sizeof *a);
    return;
  }
  g_ibv_ok = 1;
}

static int ibv_ready(char *err, size_t n) {
  pthread_once(&g_ibv_once, load_ibv);
  if (!g_ibv_ok) seterr(err, n, "%s", g_ibv_err);
  return g_ibv_ok;
}

/* 0 when libibverbs is usable; otherwise -1 and the reason in err. */
EXPORT int rdma_library_status(char *err, size_t n) { return ibv_ready(err, n) ? 0 : -1; }

/* 1 when the library exports ibv_reg_dmabuf_mr (GPU memory through dma-buf). */
EXPORT int rdma_has_dmabuf(void) { return ibv_ready(NULL, 0) && g_ibv.reg_dmabuf_mr != NULL; }

/* One line per (device, port):
 *   name port state active_mtu link_layer max_msg_sz gid_tbl_len lid max_qp_wr max_sge
 *   max_qp_rd_atom max_qp_init_rd_atom max_mr_size phys_port_cnt
 * Returns the number of lines, or -1 (library missing; reason in out). */
EXPORT int rdma_probe(char *out, size_t n) {
  if (!ibv_ready(out, n)) return -1;
  int num = 0, lines = 0;
  size_t used = 0;
  out[0] = 0;
  struct tv_device **list = g_ibv.get_device_list(&num);
  if (!list) {
    seterr(out, n, "ibv_get_device_list: %s (no RDMA device, or no ib_uverbs in this kernel)", strerror(errno));
    return -1;
  }
  for (int i = 0; i < num; i++) {
    const char *name = g_ibv.get_device_name(list[i]);
    struct tv_context *ctx = g_ibv.open_device(list[i]);
    if (!ctx) continue;
    struct tv_device_attr da;
    memset(&da, 0, sizeof da);
    if (g_ibv.query_device(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; p++) {
        struct tv_port_attr pa;
        memset(&pa, 0, sizeof pa);
        if (g_ibv.query_port(ctx, (uint8_t)p, &pa) != 0) continue;
        int w = snprintf(out + used, n - used, "%s %d %d %d %d %u %d %u %d %d %d %d %llu %d\n", name, p, pa.state,
                         pa.active_mtu, pa.link_layer, pa.max_msg_sz, pa.gid_tbl_len, pa.lid, da.max_qp_wr, da.max_sge,
                         da.max_qp_rd_atom, da.max_qp_init_rd_atom, (unsigned long long)da.max_mr_size, da.phys_port_cnt);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
        lines++;
      }
    }
    g_ibv.close_device(ctx);
  }
  g_ibv.free_device_list(list);
  return lines;
}

/* ------------------------------------------------------------------ pure policies (unit-tested) */

/* A work completion's status -> executor ABI status. `permitted`: the advertised region allows the
 * op (so a remote access error means the range, not the permission, was refused). Retryable codes
 * mean "the path failed"; final ones mean retrying elsewhere cannot help. */
EXPORT int rdma_map_wc_status(int wc_status, int permitted) {
  switch (wc_status) {
    case TV_WC_SUCCESS:
      return TENT_OK;
    case TV_WC_REM_ACCESS_ERR: /* the target NIC refused the rkey/range/access */
      return permitted ? TENT_E_BOUNDS : TENT_E_PERMISSION;
    case TV_WC_REM_INV_REQ_ERR: /* the responder found the request itself invalid */
    case TV_WC_REM_INV_RD_REQ_ERR:
      return TENT_E_PROTOCOL;
    case TV_WC_LOC_LEN_ERR: /* our own work request or local memory was wrong: a bug, not a path */
    case TV_WC_LOC_QP_OP_ERR:
    case TV_WC_LOC_PROT_ERR:
    case TV_WC_LOC_ACCESS_ERR:
    case TV_WC_MW_BIND_ERR:
      return TENT_E_INTERNAL;
    case TV_WC_RETRY_EXC_ERR: /* no ACK after retry_cnt x timeout: the path or the peer is gone */
    case TV_WC_RNR_RETRY_EXC_ERR:
    case TV_WC_RESP_TIMEOUT_ERR:
      return TENT_E_TIMEOUT;
    case TV_WC_WR_FLUSH_ERR: /* collateral of another error on the QP (callers substitute theirs) */
    case TV_WC_REM_OP_ERR:
    case TV_WC_REM_ABORT_ERR:
    case TV_WC_BAD_RESP_ERR:
    case TV_WC_FATAL_ERR:
    case TV_WC_GENERAL_ERR:
    default:
      return TENT_E_IO;
  }
}

/* Chunk size for a slice: at most `chunk` bytes (0 = no preference), never above the port's max
 * message size, a work request's 32-bit length, or 1 GiB. Returns the number of chunks (1 for an
 * empty slice) and writes the chunk size. */
EXPORT uint64_t rdma_plan_chunks(uint64_t len, uint64_t chunk, uint64_t max_msg, uint64_t *per) {
  uint64_t cap = 1ull << 30;
  if (max_msg && max_msg < cap) cap = max_msg;
  if (chunk && chunk < cap) cap = chunk;
  if (cap == 0) cap = 1;
  *per = len < cap ? len : cap;
  if (len == 0) return 1;
  return (len + cap - 1) / cap;
}

/* ------------------------------------------------------------------ types */

/* QP states. READY/ERROR belong to the device worker; BROKEN -> RECONNECTING is claimed by the
 * maintenance thread (rdma_collect_broken) and given back as READY or BROKEN; DEAD is final (the
 * worker retires the QPs of a removed rail, never while one is RECONNECTING). */
enum { QP_INIT = 0, QP_READY = 1, QP_ERROR = 2, QP_BROKEN = 3, QP_RECONNECTING = 4, QP_DEAD = 5 };

struct qpx;
struct rail;
struct peer;
struct rdma_exec;

typedef struct rjob {
  tent_job_t base; /* first: chunk queues hold &base */
  struct peer *peer;
  struct rail *rail;
  uint32_t lkey, rkey;
  int permitted;
} rjob_t;

typedef struct wrec {
  rjob_t *job;
  struct qpx *qp;
  uint64_t len;
  uint64_t post_ns;
} wrec_t;

typedef struct qpx {
  struct tv_qp *qp;
  struct rail *rail;
  int k;
  _Atomic int state;
  uint32_t qpn, psn;
  /* device thread only */
  wrec_t *ring;
  uint32_t ring_size, head, outstanding;
  uint64_t progress_ns; /* last completion, or the post that made it busy */
  int flushing;    /* we moved it to ERR and wait for the flush */
  int flush_status;/* what flushed WRs report */
  atomic_uint reconnects;
  /* Chunks that failed on this QP, held until the maintenance thread has destroyed the QP and the
   * peer's end of it (rdma_release_deferred): only then can none of their packets still land, so
   * only then may the engine retry them elsewhere. Worker appends; maintenance drains (BROKEN). */
  struct deferred *deferred;
  size_t ndeferred, cap_deferred;
} qpx_t;

typedef struct deferred {
  rjob_t *job;
  int status;
} deferred_t;

typedef struct mr_entry {
  uint64_t addr, len;
  struct tv_mr *mr;
} mr_entry_t;

typedef struct device {
  struct rdma_exec *ex;
  int index;
  char name[64];
  int port, gid_index;
  union tv_gid gid;
  uint16_t lid;
  int link_layer, active_mtu;
  uint32_t max_msg_sz;
  int max_qp_wr, max_qp_rd_atom, max_qp_init_rd_atom;
  struct tv_context *ctx;
  struct tv_pd *pd;
  struct tv_comp_channel *ch;
  struct tv_cq *cq;
  int cq_size;
  _Atomic int port_active;
  _Atomic int port_epoch; /* bumps on every PORT_ERR: the worker flushes the device's QPs */
  int seen_epoch;         /* worker only */
  int wake_fd;
  pthread_t worker, async_thread;
  int worker_started, async_started;
  pthread_mutex_t mu; /* rails list and their chunk queues */
  struct rail **rails;
  int nrails, cap_rails;
  pthread_rwlock_t mr_lock;
  mr_entry_t *mrs;
  size_t nmrs, cap_mrs;
  unsigned unacked_events;
} device_t;

typedef struct rail {
  struct peer *peer;
  device_t *dev;
  int index;
  int remote_col;
  int nqps;
  qpx_t qps[MAX_QPS_PER_RAIL];
  unsigned rr;
  tent_chunk_queue_t q; /* under dev->mu */
  _Atomic int flush_request;
  _Atomic int removed;
  atomic_ullong bytes, slices, errors, wc_errors;
} rail_t;

typedef struct region {
  uint64_t addr, len;
  uint32_t perm;
  uint32_t rkeys[MAX_REMOTE_COLS];
} region_t;

typedef struct peer {
  uint64_t handle;
  int nrails, ncols;
  rail_t *rails;
  pthread_rwlock_t regions_lock;
  region_t *regions;
  size_t nregions;
  atomic_int refs; /* the table's + one per live job + one per rail registered with a device */
  _Atomic int removed;
} peer_t;

typedef struct passive {
  device_t *dev;
  struct tv_qp *qp;
} passive_t;

typedef struct rdma_exec {
  const tent_host_api_t *host;
  int ndev;
  device_t devs[MAX_DEVICES];
  /* knobs */
  int qps_per_rail, max_send_wr, slice_timeout_ms, qp_timeout, retry_cnt, rnr_retry, spin_us, cq_depth;
  int max_rd_atomic, traffic_class, service_level, max_passive;
  uint64_t chunk_bytes;
  _Atomic int stop;
  pthread_rwlock_t peers_lock;
  tent_handle_table_t peers;
  pthread_mutex_t passive_mu;
  tent_handle_table_t passive;
  int npassive;
  pthread_mutex_t rand_mu;
  unsigned rand_state;
} rdma_exec_t;

/* ------------------------------------------------------------------ helpers */

static uint32_t new_psn(rdma_exec_t *ex) {
  pthread_mutex_lock(&ex->rand_mu);
  uint32_t v = (uint32_t)rand_r(&ex->rand_state) ^ ((uint32_t)rand_r(&ex->rand_state) << 12);
  pthread_mutex_unlock(&ex->rand_mu);
  return v & 0xffffffu;
}

static void wake(device_t *d) {
  uint64_t one = 1;
  ssize_t r = write(d->wake_fd, &one, sizeof one);
  (void)r;
}

static void peer_unref(peer_t *p) {
  if (atomic_fetch_sub(&p->refs, 1) != 1) return;
  for (int r = 0; r < p->nrails; r++) tent_cq_free(&p->rails[r].q);
  free(p->rails);
  free(p->regions);
  pthread_rwlock_destroy(&p->regions_lock);
  free(p);
}

/* report one slice (its last chunk finished) */
static void finish_job(rdma_exec_t *ex, rjob_t *j, int status) {
  rail_t *r = j->rail;
  if (status == TENT_OK) {
    atomic_fetch_add(&r->bytes, j->base.s.length);
    atomic_fetch_add(&r->slices, 1);
  } else {
    atomic_fetch_add(&r->errors, 1);
  }
  ex->host->complete(ex->host->ctx, &j->base.s, status);
  peer_t *p = j->peer;
  free(j);
  peer_unref(p);
}

static void chunk_done(rdma_exec_t *ex, rjob_t *j, int status) {
  int final;
  if (tent_job_chunk_done(&j->base, status, &final)) finish_job(ex, j, final);
}

/* A chunk whose WR failed on q: held (see qpx_t.deferred), or reported at once if memory runs out. */
static void defer_chunk(rdma_exec_t *ex, struct qpx *q, rjob_t *j, int status);

/* Report every held chunk of q with its status. */
static void drain_deferred(rdma_exec_t *ex, struct qpx *q);

static struct tv_qp *create_rc_qp(device_t *d, uint32_t send_wr) {
  struct tv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = d->cq;
  ia.recv_cq = d->cq;
  ia.cap.max_send_wr = send_wr;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.qp_type = TV_QPT_RC;
  ia.sq_sig_all = 0;
  return g_ibv.create_qp(d->pd, &ia);
}

static int qp_to_init(device_t *d, struct tv_qp *qp) {
  struct tv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = TV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = (uint8_t)d->port;
  /* what remote peers may do through this QP; each memory region's own flags narrow it */
  a.qp_access_flags = TV_ACCESS_LOCAL_WRITE | TV_ACCESS_REMOTE_READ | TV_ACCESS_REMOTE_WRITE;
  return g_ibv.modify_qp(qp, &a, TV_QP_STATE | TV_QP_PKEY_INDEX | TV_QP_PORT | TV_QP_ACCESS_FLAGS);
}

static int qp_to_rts(rdma_exec_t *ex, device_t *d, struct tv_qp *qp, uint32_t local_psn, uint32_t remote_qpn,
                     uint32_t remote_psn, const uint8_t *gid, uint16_t lid, int mtu, int remote_rd_atom) {
  struct tv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = TV_QPS_RTR;
  a.path_mtu = mtu < d->active_mtu ? mtu : d->active_mtu;
  if (a.path_mtu < TV_MTU_256) a.path_mtu = TV_MTU_1024;
  a.dest_qp_num = remote_qpn;
  a.rq_psn = remote_psn;
  a.max_dest_rd_atomic = (uint8_t)(d->max_qp_rd_atom > 0 ? (d->max_qp_rd_atom > 255 ? 255 : d->max_qp_rd_atom) : 1);
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = (uint8_t)d->port;
  a.ah_attr.sl = (uint8_t)ex->service_level;
  a.ah_attr.dlid = lid;
  if (d->link_layer != TV_LINK_LAYER_INFINIBAND || lid == 0) { /* RoCE always routes by GID */
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = (uint8_t)ex->traffic_class;
  }
  int rc = g_ibv.modify_qp(qp, &a,
                           TV_QP_STATE | TV_QP_AV | TV_QP_PATH_MTU | TV_QP_DEST_QPN | TV_QP_RQ_PSN |
                               TV_QP_MAX_DEST_RD_ATOMIC | TV_QP_MIN_RNR_TIMER);
  if (rc) return rc;
  memset(&a, 0, sizeof a);
  a.qp_state = TV_QPS_RTS;
  a.timeout = (uint8_t)ex->qp_timeout;
  a.retry_cnt = (uint8_t)ex->retry_cnt;
  a.rnr_retry = (uint8_t)ex->rnr_retry;
  a.sq_psn = local_psn;
  int rd = ex->max_rd_atomic > 0 ? ex->max_rd_atomic : d->max_qp_init_rd_atom;
  if (rd > d->max_qp_init_rd_atom && d->max_qp_init_rd_atom > 0) rd = d->max_qp_init_rd_atom;
  if (remote_rd_atom > 0 && rd > remote_rd_atom) rd = remote_rd_atom; /* the responder's limit */
  a.max_rd_atomic = (uint8_t)(rd < 1 ? 1 : (rd > 255 ? 255 : rd));
  return g_ibv.modify_qp(qp, &a,
                         TV_QP_STATE | TV_QP_TIMEOUT | TV_QP_RETRY_CNT | TV_QP_RNR_RETRY | TV_QP_SQ_PSN |
                             TV_QP_MAX_QP_RD_ATOMIC);
}

static int qp_to_err(struct tv_qp *qp) {
  struct tv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = TV_QPS_ERR;
  return g_ibv.modify_qp(qp, &a, TV_QP_STATE);
}

/* the MR covering [addr, addr+len) on device d; 0 when none (caller holds mr_lock) */
static int find_mr(device_t *d, uint64_t addr, uint64_t len, uint32_t *lkey) {
  size_t lo = 0, hi = d->nmrs;
  while (lo < hi) { /* first entry with addr > target */
    size_t mid = (lo + hi) / 2;
    if (d->mrs[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = lo; i-- > 0;) {
    mr_entry_t *m = &d->mrs[i];
    if (addr >= m->addr && addr + len <= m->addr + m->len) {
      *lkey = m->mr->lkey;
      return 1;
    }
  }
  return 0;
}

/* the region covering [addr, addr+len) of peer p (caller holds regions_lock) */
static region_t *find_region(peer_t *p, uint64_t addr, uint64_t len) {
  size_t lo = 0, hi = p->nregions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->regions[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = lo; i-- > 0;) {
    region_t *r = &p->regions[i];
    if (addr >= r->addr && addr + len <= r->addr + r->len) return r;
  }
  return NULL;
}

static int rail_ready_qps(rail_t *r) {
  int n = 0;
  for (int k = 0; k < r->nqps; k++) n += atomic_load(&r->qps[k].state) == QP_READY;
  return n;
}

static void defer_chunk(rdma_exec_t *ex, qpx_t *q, rjob_t *j, int status) {
  if (q->ndeferred == q->cap_deferred) {
    size_t cap = q->cap_deferred ? q->cap_deferred * 2 : 64;
    deferred_t *d = realloc(q->deferred, cap * sizeof *d);
    if (!d) {
      chunk_done(ex, j, status);
      return;
    }
    q->deferred = d;
    q->cap_deferred = cap;
  }
  q->deferred[q->ndeferred++] = (deferred_t){j, status};
}

static void drain_deferred(rdma_exec_t *ex, qpx_t *q) {
  size_t n = q->ndeferred;
  q->ndeferred = 0;
  for (size_t i = 0; i < n; i++) chunk_done(ex, q->deferred[i].job, q->deferred[i].status);
}

/* ------------------------------------------------------------------ device worker */

/* Fail everything queued on rail r with `status` (caller holds dev->mu; completes after unlock). */
static size_t take_queue(rail_t *r, tent_chunk_t **out, size_t *cap) {
  size_t n = r->q.len;
  if (n == 0) return 0;
  if (*cap < n) {
    tent_chunk_t *p = realloc(*out, n * sizeof *p);
    if (!p) return 0;
    *out = p;
    *cap = n;
  }
  for (size_t i = 0; i < n; i++) tent_cq_pop(&r->q, &(*out)[i]);
  return n;
}

static void flush_qp(qpx_t *q, int status) {
  int st = atomic_load(&q->state);
  if (st != QP_READY && st != QP_ERROR) return;
  if (!q->flushing) {
    q->flush_status = status;
    if (q->qp) qp_to_err(q->qp);
    q->flushing = 1;
  }
  atomic_store(&q->state, QP_ERROR);
}

typedef struct post_batch {
  struct tv_send_wr *wrs;
  struct tv_sge *sges;
  size_t cap;
} post_batch_t;

static void *device_worker(void *arg) {
  device_t *d = arg;
  rdma_exec_t *ex = d->ex;
  struct tv_wc wcs[CQ_BATCH];
  post_batch_t pb = {0};
  uint64_t timeout_ns = (uint64_t)ex->slice_timeout_ms * 1000000ull;
  uint64_t spin_ns = (uint64_t)ex->spin_us * 1000ull;
  uint64_t idle_since = 0, stop_since = 0;
  int armed = 0;

  for (;;) {
    int stopping = atomic_load(&ex->stop);
    int did = 0;
    int port_ok = atomic_load(&d->port_active);
    int epoch = atomic_load(&d->port_epoch);
    int port_flush = epoch != d->seen_epoch;
    d->seen_epoch = epoch;
    uint64_t now = now_ns();

    /* 1. pair queued chunks with QP send slots; fail what cannot go anywhere. Slices complete
     * under d->mu: the core's complete() only counts or queues, it never calls back into us. */
    pthread_mutex_lock(&d->mu);
    for (int ri = 0; ri < d->nrails; ri++) {
      rail_t *r = d->rails[ri];
      int gone = stopping || atomic_load(&r->removed);
      if (port_flush || gone || !port_ok)
        for (int k = 0; k < r->nqps; k++) flush_qp(&r->qps[k], gone ? TENT_E_CANCELLED : TENT_E_CONNECT);
      if (atomic_exchange(&r->flush_request, 0))
        for (int k = 0; k < r->nqps; k++) flush_qp(&r->qps[k], TENT_E_CONNECT);
      /* timeouts: a busy QP that completed nothing for the slice timeout is flushed (progress, not
       * age: a deep queue on a slow link is fine as long as completions keep coming) */
      for (int k = 0; k < r->nqps; k++) {
        qpx_t *q = &r->qps[k];
        if (q->outstanding && !q->flushing && timeout_ns && now > q->progress_ns + timeout_ns) {
          rlog("%s: QP %u: no completion for %d ms, flushing it", d->name, q->qpn, ex->slice_timeout_ms);
          flush_qp(q, TENT_E_TIMEOUT);
        }
      }
      if (r->q.len == 0) continue;
      if (gone || !port_ok || rail_ready_qps(r) == 0) {
        tent_chunk_t c;
        while (tent_cq_pop(&r->q, &c) == 0) chunk_done(ex, (rjob_t *)c.job, gone ? TENT_E_CANCELLED : TENT_E_CONNECT);
        did = 1;
        continue;
      }
      /* build one WR chain per QP */
      for (int kk = 0; kk < r->nqps && r->q.len; kk++) {
        qpx_t *q = &r->qps[(r->rr + (unsigned)kk) % (unsigned)r->nqps];
        if (atomic_load(&q->state) != QP_READY) continue;
        uint32_t room = q->ring_size - q->outstanding;
        if (room == 0) continue;
        if (pb.cap < room) {
          struct tv_send_wr *w = realloc(pb.wrs, room * sizeof *w);
          if (w) pb.wrs = w;
          struct tv_sge *s = w ? realloc(pb.sges, room * sizeof *s) : NULL;
          if (s) pb.sges = s;
          if (!w || !s) break;
          pb.cap = room;
        }
        uint32_t n = 0;
        tent_chunk_t c;
        while (n < room && tent_cq_pop(&r->q, &c) == 0) {
          rjob_t *j = (rjob_t *)c.job;
          if (ex->host->is_cancelled(ex->host->ctx, j->base.s.token)) {
            chunk_done(ex, j, TENT_E_CANCELLED);
            continue;
          }
          wrec_t *rec = &q->ring[(q->head + q->outstanding) % q->ring_size];
          rec->job = j;
          rec->qp = q;
          rec->len = c.len;
          rec->post_ns = now;
          if (q->outstanding == 0) q->progress_ns = now;
          q->outstanding++;
          struct tv_send_wr *w = &pb.wrs[n];
          struct tv_sge *s = &pb.sges[n];
          memset(w, 0, sizeof *w);
          s->addr = j->base.s.local_addr + c.off;
          s->length = (uint32_t)c.len;
          s->lkey = j->lkey;
          w->wr_id = (uint64_t)(uintptr_t)rec;
          w->sg_list = s;
          w->num_sge = 1;
          w->opcode = j->base.s.opcode == TENT_OP_READ ? TV_WR_RDMA_READ : TV_WR_RDMA_WRITE;
          w->send_flags = TV_SEND_SIGNALED;
          w->wr.rdma.remote_addr = j->base.s.remote_addr + c.off;
          w->wr.rdma.rkey = j->rkey;
          if (n) pb.wrs[n - 1].next = w;
          n++;
        }
        if (n == 0) continue;
        struct tv_send_wr *bad = NULL;
        int rc = tv_post_send(q->qp, pb.wrs, &bad);
        did = 1;
        if (rc) {
          /* WRs from `bad` on were not posted: they fail here (retryable) and the QP is recycled */
          rlog("%s: ibv_post_send failed (%s); recycling QP %u", d->name, strerror(rc), q->qpn);
          uint32_t first_bad = bad ? (uint32_t)(bad - pb.wrs) : 0;
          for (uint32_t i = first_bad; i < n; i++) {
            wrec_t *rec = &q->ring[(q->head + q->outstanding - 1) % q->ring_size];
            q->outstanding--;
            chunk_done(ex, rec->job, TENT_E_IO);
          }
          atomic_fetch_add(&r->wc_errors, 1);
          flush_qp(q, TENT_E_IO);
        }
      }
      r->rr++;
    }
    pthread_mutex_unlock(&d->mu);

    /* 2. completions */
    int got;
    while ((got = tv_poll_cq(d->cq, CQ_BATCH, wcs)) > 0) {
      did = 1;
      for (int i = 0; i < got; i++) {
        wrec_t *rec = (wrec_t *)(uintptr_t)wcs[i].wr_id;
        qpx_t *q = rec->qp;
        rjob_t *j = rec->job;
        if (rec != &q->ring[q->head]) rlog("%s: completion out of order on QP %u", d->name, q->qpn);
        q->head = (q->head + 1) % q->ring_size;
        q->outstanding--;
        q->progress_ns = now_ns();
        int st;
        if (wcs[i].status == TV_WC_SUCCESS) {
          chunk_done(ex, j, TENT_OK);
          continue;
        } else if (wcs[i].status == TV_WC_WR_FLUSH_ERR && q->flushing) {
          st = q->flush_status;
        } else {
          st = rdma_map_wc_status(wcs[i].status, j->permitted);
          if (wcs[i].status != TV_WC_WR_FLUSH_ERR) {
            atomic_fetch_add(&q->rail->wc_errors, 1);
            rlog("%s: QP %u: %s (%s of %llu bytes at %#llx), status %d", d->name, q->qpn,
                 g_ibv.wc_status_str(wcs[i].status), j->base.s.opcode == TENT_OP_READ ? "READ" : "WRITE",
                 (unsigned long long)rec->len, (unsigned long long)j->base.s.remote_addr, st);
          }
          /* the QP is in ERR now; what else it holds flushes with a retryable status */
          if (!q->flushing) {
            q->flushing = 1;
            q->flush_status = TENT_E_IO;
          }
          atomic_store(&q->state, QP_ERROR);
        }
        defer_chunk(ex, q, j, st);
      }
    }
    if (got < 0) rlog("%s: ibv_poll_cq failed", d->name);

    /* 3. QPs that finished flushing are handed to the maintenance thread */
    pthread_mutex_lock(&d->mu);
    for (int ri = 0; ri < d->nrails; ri++) {
      rail_t *r = d->rails[ri];
      for (int k = 0; k < r->nqps; k++) {
        qpx_t *q = &r->qps[k];
        if (atomic_load(&q->state) == QP_ERROR && q->outstanding == 0) {
          q->flushing = 0;
          atomic_store(&q->state, QP_BROKEN);
        }
      }
    }
    /* rails of removed peers leave once their QPs drained and none is being reconnected */
    for (int ri = 0; ri < d->nrails;) {
      rail_t *r = d->rails[ri];
      int busy = 0;
      for (int k = 0; k < r->nqps; k++) busy |= r->qps[k].outstanding != 0;
      if (atomic_load(&r->removed) && !busy && r->q.len == 0)
        for (int k = 0; k < r->nqps; k++) {
          int st = atomic_load(&r->qps[k].state);
          while (st != QP_DEAD && st != QP_RECONNECTING && !atomic_compare_exchange_weak(&r->qps[k].state, &st, QP_DEAD))
            ;
          busy |= st == QP_RECONNECTING;
        }
      if (atomic_load(&r->removed) && !busy && r->q.len == 0) {
        for (int k = 0; k < r->nqps; k++) {
          if (r->qps[k].qp) g_ibv.destroy_qp(r->qps[k].qp);
          r->qps[k].qp = NULL;
          drain_deferred(ex, &r->qps[k]); /* the peer is forgotten: nothing retries on this QP */
          free(r->qps[k].deferred);
          r->qps[k].deferred = NULL;
          free(r->qps[k].ring);
          r->qps[k].ring = NULL;
        }
        d->rails[ri] = d->rails[--d->nrails];
        pthread_mutex_unlock(&d->mu);
        peer_unref(r->peer);
        pthread_mutex_lock(&d->mu);
        did = 1;
        continue;
      }
      ri++;
    }
    int pending = 0;
    for (int ri = 0; ri < d->nrails; ri++) {
      rail_t *r = d->rails[ri];
      if (r->q.len) pending = 1;
      for (int k = 0; k < r->nqps; k++) pending |= r->qps[k].outstanding != 0;
    }
    int nrails = d->nrails;
    pthread_mutex_unlock(&d->mu);

    if (stopping && !stop_since) stop_since = now_ns();
    if (stopping && (nrails == 0 || !pending)) break;
    if (stopping && now_ns() - stop_since > 2000000000ull) { /* flushes that never come: give up */
      rlog("%s: WRs still outstanding 2 s after stop; abandoning them", d->name);
      break;
    }
    if (did) {
      idle_since = 0;
      continue;
    }
    /* 4. idle: spin briefly, then sleep on the completion channel / wake fd */
    now = now_ns();
    if (!idle_since) idle_since = now;
    if (now - idle_since < spin_ns) continue;
    if (!armed) {
      tv_req_notify_cq(d->cq, 0);
      armed = 1;
      continue; /* poll once more: a completion may have landed before arming */
    }
    struct pollfd pfd[2] = {{.fd = d->ch->fd, .events = POLLIN}, {.fd = d->wake_fd, .events = POLLIN}};
    int wait_ms = 50;
    if (pending && timeout_ns) wait_ms = 20; /* look at timeouts often while work is out */
    int pr = poll(pfd, 2, stopping ? 10 : wait_ms);
    if (pr > 0 && (pfd[0].revents & POLLIN)) {
      struct tv_cq *cq;
      void *cctx;
      if (g_ibv.get_cq_event(d->ch, &cq, &cctx) == 0) {
        d->unacked_events++;
        if (d->unacked_events >= 64) {
          g_ibv.ack_cq_events(d->cq, d->unacked_events);
          d->unacked_events = 0;
        }
      }
      armed = 0;
    }
    if (pr > 0 && (pfd[1].revents & POLLIN)) {
      uint64_t v;
      ssize_t rr = read(d->wake_fd, &v, sizeof v);
      (void)rr;
    }
    idle_since = 0;
  }
  free(pb.wrs);
  free(pb.sges);
  return NULL;
}

/* ------------------------------------------------------------------ async events */

static void refresh_port(device_t *d) {
  struct tv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  if (g_ibv.query_port(d->ctx, (uint8_t)d->port, &pa) != 0) return;
  int active = pa.state == TV_PORT_ACTIVE;
  if (active) d->active_mtu = pa.active_mtu;
  int was = atomic_exchange(&d->port_active, active);
  if (was && !active) {
    atomic_fetch_add(&d->port_epoch, 1);
    wake(d);
  }
}

static void *async_worker(void *arg) {
  device_t *d = arg;
  rdma_exec_t *ex = d->ex;
  uint64_t last_query = now_ns();
  while (!atomic_load(&ex->stop)) {
    struct pollfd pfd = {.fd = d->ctx->async_fd, .events = POLLIN};
    int pr = poll(&pfd, 1, 100);
    if (pr > 0) {
      struct tv_async_event ev;
      while (g_ibv.get_async_event(d->ctx, &ev) == 0) {
        switch (ev.event_type) {
          case TV_EVENT_PORT_ERR:
            rlog("%s: port %d down", d->name, d->port);
            atomic_store(&d->port_active, 0);
            atomic_fetch_add(&d->port_epoch, 1);
            wake(d);
            break;
          case TV_EVENT_PORT_ACTIVE:
            refresh_port(d);
            break;
          case TV_EVENT_DEVICE_FATAL:
            rlog("%s: device fatal error", d->name);
            atomic_store(&d->port_active, 0);
            atomic_fetch_add(&d->port_epoch, 1);
            wake(d);
            break;
          default: /* QP errors surface as error completions on the QP's own work */
            break;
        }
        g_ibv.ack_async_event(&ev);
      }
    }
    uint64_t now = now_ns();
    if (now - last_query > 500000000ull) { /* events can be missed across resets: look, too */
      last_query = now;
      refresh_port(d);
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------ create / destroy */

static int parse_list(const char *v, char items[][64], int max) {
  int n = 0;
  const char *p = v;
  while (*p && n < max) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len > 0 && len < 64) {
      memcpy(items[n], p, len);
      items[n][len] = 0;
      n++;
    }
    if (!e) break;
    p = e + 1;
  }
  return n;
}

static void close_device(device_t *d) {
  if (d->mrs) {
    for (size_t i = 0; i < d->nmrs; i++) g_ibv.dereg_mr(d->mrs[i].mr);
    free(d->mrs);
    d->mrs = NULL;
  }
  if (d->cq) {
    if (d->unacked_events) g_ibv.ack_cq_events(d->cq, d->unacked_events);
    g_ibv.destroy_cq(d->cq);
  }
  if (d->ch) g_ibv.destroy_comp_channel(d->ch);
  if (d->pd) g_ibv.dealloc_pd(d->pd);
  if (d->ctx) g_ibv.close_device(d->ctx);
  if (d->wake_fd >= 0) close(d->wake_fd);
  free(d->rails);
  pthread_mutex_destroy(&d->mu);
  pthread_rwlock_destroy(&d->mr_lock);
}

static int open_device(rdma_exec_t *ex, device_t *d, const char *name, int port, int gid_index, char *err, size_t n) {
  memset(d, 0, sizeof *d);
  d->ex = ex;
  d->wake_fd = -1;
  pthread_mutex_init(&d->mu, NULL);
  pthread_rwlock_init(&d->mr_lock, NULL);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->port = port > 0 ? port : 1;
  d->gid_index = gid_index >= 0 ? gid_index : 0;
  int num = 0;
  struct tv_device **list = g_ibv.get_device_list(&num);
  if (!list) {
    seterr(err, n, "ibv_get_device_list: %s", strerror(errno));
    return -1;
  }
  for (int i = 0; i < num && !d->ctx; i++)
    if (strcmp(g_ibv.get_device_name(list[i]), name) == 0) d->ctx = g_ibv.open_device(list[i]);
  g_ibv.free_device_list(list);
  if (!d->ctx) {
    seterr(err, n, "RDMA device %s not found or cannot be opened", name);
    return -1;
  }
  struct tv_device_attr da;
  memset(&da, 0, sizeof da);
  struct tv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  if (g_ibv.query_device(d->ctx, &da) || g_ibv.query_port(d->ctx, (uint8_t)d->port, &pa)) {
    seterr(err, n, "%s: cannot query device/port %d", name, d->port);
    return -1;
  }
  d->max_qp_wr = da.max_qp_wr;
  d->max_qp_rd_atom = da.max_qp_rd_atom;
  d->max_qp_init_rd_atom = da.max_qp_init_rd_atom;
  d->max_msg_sz = pa.max_msg_sz;
  d->link_layer = pa.link_layer;
  d->active_mtu = pa.active_mtu;
  d->lid = pa.lid;
  atomic_store(&d->port_active, pa.state == TV_PORT_ACTIVE);
  if (g_ibv.query_gid(d->ctx, (uint8_t)d->port, d->gid_index, &d->gid)) {
    seterr(err, n, "%s: cannot read GID %d of port %d", name, d->gid_index, d->port);
    return -1;
  }
  d->pd = g_ibv.alloc_pd(d->ctx);
  d->ch = d->pd ? g_ibv.create_comp_channel(d->ctx) : NULL;
  int cqe = ex->cq_depth;
  if (da.max_cqe > 0 && cqe > da.max_cqe) cqe = da.max_cqe;
  d->cq = d->ch ? g_ibv.create_cq(d->ctx, cqe, d, d->ch, 0) : NULL;
  if (!d->cq) {
    seterr(err, n, "%s: cannot allocate PD/CQ: %s", name, strerror(errno));
    return -1;
  }
  d->cq_size = cqe;
  int fl = fcntl(d->ch->fd, F_GETFL);
  fcntl(d->ch->fd, F_SETFL, fl | O_NONBLOCK);
  fl = fcntl(d->ctx->async_fd, F_GETFL);
  fcntl(d->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->wake_fd < 0) {
    seterr(err, n, "eventfd: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static void ex_destroy(void *self);

static void *ex_create(const tent_host_api_t *host, const char *config, char *err, size_t errlen) {
  if (!ibv_ready(err, errlen)) return NULL;
  if (!host || host->abi_version != TENT_EXECUTOR_ABI_VERSION || host->struct_size < sizeof(tent_host_api_t)) {
    seterr(err, errlen, "host API mismatch");
    return NULL;
  }
  rdma_exec_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    seterr(err, errlen, "out of memory");
    return NULL;
  }
  ex->host = host;
  ex->qps_per_rail = 2;
  ex->max_send_wr = 64;
  ex->chunk_bytes = 1 << 20;
  ex->slice_timeout_ms = 10000;
  ex->qp_timeout = 14; /* 4.096 us * 2^14 = 67 ms per try */
  ex->retry_cnt = 7;
  ex->rnr_retry = 7;
  ex->spin_us = 20;
  ex->cq_depth = 4096;
  ex->max_passive = 4096;
  ex->rand_state = (unsigned)(now_ns() ^ (uint64_t)getpid() << 16);
  pthread_rwlock_init(&ex->peers_lock, NULL);
  pthread_mutex_init(&ex->passive_mu, NULL);
  pthread_mutex_init(&ex->rand_mu, NULL);
  char names[MAX_DEVICES][64], ports[MAX_DEVICES][64], gids[MAX_DEVICES][64];
  int nnames = 0, nports = 0, ngids = 0;
  char key[64], val[1024];
  const char *cur = config;
  while (tent_config_next(&cur, key, sizeof key, val, sizeof val)) {
    long v = strtol(val, NULL, 10);
    if (!strcmp(key, "devices"))
      nnames = parse_list(val, names, MAX_DEVICES);
    else if (!strcmp(key, "ports"))
      nports = parse_list(val, ports, MAX_DEVICES);
    else if (!strcmp(key, "gid_indexes"))
      ngids = parse_list(val, gids, MAX_DEVICES);
    else if (!strcmp(key, "qps_per_rail"))
      ex->qps_per_rail = v < 1 ? 1 : (v > MAX_QPS_PER_RAIL ? MAX_QPS_PER_RAIL : (int)v);
    else if (!strcmp(key, "max_send_wr"))
      ex->max_send_wr = v < 1 ? 1 : (int)v;
    else if (!strcmp(key, "chunk_bytes"))
      ex->chunk_bytes = v < 4096 ? 4096 : (uint64_t)v;
    else if (!strcmp(key, "slice_timeout_ms"))
      ex->slice_timeout_ms = v < 0 ? 0 : (int)v;
    else if (!strcmp(key, "qp_timeout"))
      ex->qp_timeout = v < 1 ? 1 : (v > 31 ? 31 : (int)v);
    else if (!strcmp(key, "retry_cnt"))
      ex->retry_cnt = v < 0 ? 0 : (v > 7 ? 7 : (int)v);
    else if (!strcmp(key, "rnr_retry"))
      ex->rnr_retry = v < 0 ? 0 : (v > 7 ? 7 : (int)v);
    else if (!strcmp(key, "spin_us"))
      ex->spin_us = v < 0 ? 0 : (int)v;
    else if (!strcmp(key, "cq_depth"))
      ex->cq_depth = v < 64 ? 64 : (int)v;
    else if (!strcmp(key, "max_rd_atomic"))
      ex->max_rd_atomic = v < 0 ? 0 : (int)v;
    else if (!strcmp(key, "traffic_class"))
      ex->traffic_class = (int)(v & 0xff);
    else if (!strcmp(key, "service_level"))
      ex->service_level = (int)(v & 0xf);
    else if (!strcmp(key, "max_passive_qps"))
      ex->max_passive = v < 1 ? 1 : (int)v;
  }
  if (nnames == 0) {
    seterr(err, errlen, "no RDMA devices configured (devices=...)");
    ex_destroy(ex);
    return NULL;
  }
  for (int i = 0; i < nnames; i++) {
    int port = i < nports ? atoi(ports[i]) : 1;
    int gid = i < ngids ? atoi(gids[i]) : 0;
    if (open_device(ex, &ex->devs[i], names[i], port, gid, err, errlen) != 0) {
      ex->ndev = i + 1;
      ex_destroy(ex);
      return NULL;
    }
    ex->devs[i].index = i;
    ex->ndev = i + 1;
    if (ex->devs[i].max_qp_wr > 0 && ex->max_send_wr > ex->devs[i].max_qp_wr) ex->max_send_wr = ex->devs[i].max_qp_wr;
  }
  for (int i = 0; i < ex->ndev; i++) {
    device_t *d = &ex->devs[i];
    if (pthread_create(&d->worker, NULL, device_worker, d) == 0) d->worker_started = 1;
    if (pthread_create(&d->async_thread, NULL, async_worker, d) == 0) d->async_started = 1;
    if (!d->worker_started || !d->async_started) {
      seterr(err, errlen, "cannot start threads");
      ex_destroy(ex);
      return NULL;
    }
  }
  return ex;
}

static void ex_destroy(void *self) {
  rdma_exec_t *ex = self;
  if (!ex) return;
  /* forget every peer: its rails drain (queued slices are cancelled, in-flight ones flushed) */
  pthread_rwlock_wrlock(&ex->peers_lock);
  for (size_t i = 0; i < ex->peers.cap; i++) {
    peer_t *p = ex->peers.items[i];
    if (!p) continue;
    ex->peers.items[i] = NULL;
    atomic_store(&p->removed, 1);
    for (int r = 0; r < p->nrails; r++) atomic_store(&p->rails[r].removed, 1);
    peer_unref(p);
  }
  pthread_rwlock_unlock(&ex->peers_lock);
  atomic_store(&ex->stop, 1);
  for (int i = 0; i < ex->ndev; i++) {
    device_t *d = &ex->devs[i];
    if (d->wake_fd >= 0) wake(d);
    if (d->worker_started) pthread_join(d->worker, NULL);
    if (d->async_started) pthread_join(d->async_thread, NULL);
  }
  /* rails a worker left behind (their flushes never came): report their slices, free their QPs */
  for (int i = 0; i < ex->ndev; i++) {
    device_t *d = &ex->devs[i];
    for (int ri = 0; ri < d->nrails; ri++) {
      rail_t *r = d->rails[ri];
      tent_chunk_t c;
      while (tent_cq_pop(&r->q, &c) == 0) chunk_done(ex, (rjob_t *)c.job, TENT_E_CANCELLED);
      for (int k = 0; k < r->nqps; k++) {
        qpx_t *q = &r->qps[k];
        for (; q->outstanding; q->outstanding--, q->head = (q->head + 1) % q->ring_size)
          chunk_done(ex, q->ring[q->head].job, TENT_E_CANCELLED);
        if (q->qp) g_ibv.destroy_qp(q->qp);
        drain_deferred(ex, q);
        free(q->deferred);
        q->deferred = NULL;
        q->qp = NULL;
        free(q->ring);
        q->ring = NULL;
      }
    }
    for (int ri = 0; ri < d->nrails; ri++) peer_unref(d->rails[ri]->peer);
    d->nrails = 0;
  }
  pthread_mutex_lock(&ex->passive_mu);
  for (size_t i = 0; i < ex->passive.cap; i++) {
    passive_t *p = ex->passive.items[i];
    if (!p) continue;
    g_ibv.destroy_qp(p->qp);
    free(p);
  }
  tent_ht_free(&ex->passive);
  pthread_mutex_unlock(&ex->passive_mu);
  for (int i = 0; i < ex->ndev; i++) close_device(&ex->devs[i]);
  tent_ht_free(&ex->peers);
  pthread_rwlock_destroy(&ex->peers_lock);
  pthread_mutex_destroy(&ex->passive_mu);
  pthread_mutex_destroy(&ex->rand_mu);
  free(ex);
}

/* ------------------------------------------------------------------ submit */

static int ex_submit(void *self, const tent_slice_t *slices, uint32_t n) {
  rdma_exec_t *ex = self;
  if (atomic_load(&ex->stop)) return TENT_E_INTERNAL;
  for (uint32_t i = 0; i < n; i++) {
    const tent_slice_t *s = &slices[i];
    int status = TENT_OK;
    peer_t *p = NULL;
    pthread_rwlock_rdlock(&ex->peers_lock);
    p = tent_ht_get(&ex->peers, s->peer);
    if (p) atomic_fetch_add(&p->refs, 1);
    pthread_rwlock_unlock(&ex->peers_lock);
    if (!p) {
      ex->host->complete(ex->host->ctx, s, TENT_E_CONNECT);
      continue;
    }
    if (s->rail >= (uint32_t)p->nrails || s->opcode > TENT_OP_WRITE) {
      peer_unref(p);
      ex->host->complete(ex->host->ctx, s, TENT_E_INTERNAL);
      continue;
    }
    rail_t *r = &p->rails[s->rail];
    device_t *d = r->dev;
    if (s->length == 0) { /* nothing to move; the range still has to exist */
      peer_unref(p);
      ex->host->complete(ex->host->ctx, s, TENT_OK);
      continue;
    }
    uint32_t lkey = 0, rkey = 0;
    int permitted = 0;
    pthread_rwlock_rdlock(&d->mr_lock);
    int local_ok = find_mr(d, s->local_addr, s->length, &lkey);
    pthread_rwlock_unlock(&d->mr_lock);
    pthread_rwlock_rdlock(&p->regions_lock);
    region_t *reg = find_region(p, s->remote_addr, s->length);
    if (reg) {
      rkey = reg->rkeys[r->remote_col];
      permitted = (reg->perm & (s->opcode == TENT_OP_READ ? PERM_REMOTE_READ : PERM_REMOTE_WRITE)) != 0;
    }
    pthread_rwlock_unlock(&p->regions_lock);
    if (!local_ok)
      status = TENT_E_INTERNAL; /* the engine registers every local buffer it hands us */
    else if (!reg)
      status = TENT_E_BOUNDS;
    else if (!atomic_load(&d->port_active) || rail_ready_qps(r) == 0)
      status = TENT_E_CONNECT; /* fail fast: the engine re-routes and its monitor pauses the rail */
    else if (ex->host->is_cancelled(ex->host->ctx, s->token))
      status = TENT_E_CANCELLED;
    if (status != TENT_OK) {
      if (status == TENT_E_INTERNAL)
        rlog("slice at %#llx (%llu bytes) is not inside memory registered with %s", (unsigned long long)s->local_addr,
             (unsigned long long)s->length, d->name);
      atomic_fetch_add(&r->errors, 1);
      peer_unref(p);
      ex->host->complete(ex->host->ctx, s, status);
      continue;
    }
    uint64_t per;
    uint64_t parts = rdma_plan_chunks(s->length, ex->chunk_bytes, d->max_msg_sz, &per);
    rjob_t *j = malloc(sizeof *j);
    if (!j) {
      peer_unref(p);
      ex->host->complete(ex->host->ctx, s, TENT_E_INTERNAL);
      continue;
    }
    j->base.s = *s;
    atomic_init(&j->base.remaining, (unsigned)parts);
    atomic_init(&j->base.status, TENT_OK);
    j->peer = p; /* the reference taken above lives until the slice is reported */
    j->rail = r;
    j->lkey = lkey;
    j->rkey = rkey;
    j->permitted = permitted;
    pthread_mutex_lock(&d->mu);
    int rc = tent_cq_reserve(&r->q, parts);
    if (rc == 0) tent_cq_push_job(&r->q, &j->base, parts, per);
    pthread_mutex_unlock(&d->mu);
    if (rc != 0) {
      free(j);
      peer_unref(p);
      ex->host->complete(ex->host->ctx, s, TENT_E_INTERNAL);
      continue;
    }
    wake(d);
  }
  return TENT_OK;
}

/* ------------------------------------------------------------------ control (plugin's Python side) */

static rdma_exec_t *live(void *self) {
  rdma_exec_t *ex = self;
  return ex && !atomic_load(&ex->stop) ? ex : NULL;
}

static device_t *dev_at(rdma_exec_t *ex, int i) { return i >= 0 && i < ex->ndev ? &ex->devs[i] : NULL; }

/* Device facts: out[0..7] = port_active, active_mtu, link_layer, lid, max_msg_sz, max_qp_wr,
 * max_qp_rd_atom, gid_index; gid receives the 16-byte GID in use. */
EXPORT int rdma_device_info(void *self, int dev, uint64_t *out, uint8_t *gid) {
  rdma_exec_t *ex = live(self);
  device_t *d = ex ? dev_at(ex, dev) : NULL;
  if (!d) return -EINVAL;
  out[0] = (uint64_t)atomic_load(&d->port_active);
  out[1] = (uint64_t)d->active_mtu;
  out[2] = (uint64_t)d->link_layer;
  out[3] = d->lid;
  out[4] = d->max_msg_sz;
  out[5] = (uint64_t)d->max_qp_wr;
  out[6] = (uint64_t)d->max_qp_rd_atom;
  out[7] = (uint64_t)d->gid_index;
  memcpy(gid, d->gid.raw, 16);
  return 0;
}

static int insert_mr(device_t *d, uint64_t addr, uint64_t len, struct tv_mr *mr) {
  pthread_rwlock_wrlock(&d->mr_lock);
  if (d->nmrs == d->cap_mrs) {
    size_t cap = d->cap_mrs ? d->cap_mrs * 2 : 16;
    mr_entry_t *m = realloc(d->mrs, cap * sizeof *m);
    if (!m) {
      pthread_rwlock_unlock(&d->mr_lock);
      return -ENOMEM;
    }
    d->mrs = m;
    d->cap_mrs = cap;
  }
  size_t pos = d->nmrs;
  while (pos > 0 && d->mrs[pos - 1].addr > addr) pos--;
  memmove(&d->mrs[pos + 1], &d->mrs[pos], (d->nmrs - pos) * sizeof *d->mrs);
  d->mrs[pos] = (mr_entry_t){addr, len, mr};
  d->nmrs++;
  pthread_rwlock_unlock(&d->mr_lock);
  return 0;
}

static struct tv_mr *remove_mr(device_t *d, uint64_t addr, uint64_t len) {
  struct tv_mr *mr = NULL;
  pthread_rwlock_wrlock(&d->mr_lock);
  for (size_t i = d->nmrs; i-- > 0;)
    if (d->mrs[i].addr == addr && d->mrs[i].len == len) {
      mr = d->mrs[i].mr;
      memmove(&d->mrs[i], &d->mrs[i + 1], (d->nmrs - i - 1) * sizeof *d->mrs);
      d->nmrs--;
      break;
    }
  pthread_rwlock_unlock(&d->mr_lock);
  return mr;
}

static int access_for(uint32_t perm) {
  int acc = TV_ACCESS_LOCAL_WRITE; /* READs land in it locally */
  if (perm & PERM_REMOTE_READ) acc |= TV_ACCESS_REMOTE_READ;
  if (perm & PERM_REMOTE_WRITE) acc |= TV_ACCESS_REMOTE_WRITE;
  return acc;
}

/* Register [addr, addr+len) on every device with the access `perm` grants remote peers.
 * rkeys[i] receives device i's rkey. 0, or -errno (nothing stays registered then). */
EXPORT int rdma_register(void *self, uint64_t addr, uint64_t len, uint32_t perm, uint32_t *rkeys) {
  rdma_exec_t *ex = live(self);
  if (!ex || len == 0) return -EINVAL;
  int i;
  for (i = 0; i < ex->ndev; i++) {
    device_t *d = &ex->devs[i];
    struct tv_mr *mr = g_ibv.reg_mr(d->pd, (void *)(uintptr_t)addr, len, access_for(perm));
    int rc = mr ? insert_mr(d, addr, len, mr) : -(errno ? errno : EINVAL);
    if (rc) {
      if (mr) g_ibv.dereg_mr(mr);
      for (int k = 0; k < i; k++) {
        struct tv_mr *m = remove_mr(&ex->devs[k], addr, len);
        if (m) g_ibv.dereg_mr(m);
      }
      return rc;
    }
    rkeys[i] = mr->rkey;
  }
  return 0;
}

/* GPU memory exported as a dma-buf: register (fd, offset, len) at virtual address iova. */
EXPORT int rdma_register_dmabuf(void *self, int fd, uint64_t offset, uint64_t len, uint64_t iova, uint32_t perm,
                                uint32_t *rkeys) {
  rdma_exec_t *ex = live(self);
  if (!ex || len == 0) return -EINVAL;
  if (!g_ibv.reg_dmabuf_mr) return -ENOSYS;
  for (int i = 0; i < ex->ndev; i++) {
    device_t *d = &ex->devs[i];
    struct tv_mr *mr = g_ibv.reg_dmabuf_mr(d->pd, offset, len, iova, fd, access_for(perm));
    int rc = mr ? insert_mr(d, iova, len, mr) : -(errno ? errno : EINVAL);
    if (rc) {
      if (mr) g_ibv.dereg_mr(mr);
      for (int k = 0; k < i; k++) {
        struct tv_mr *m = remove_mr(&ex->devs[k], iova, len);
        if (m) g_ibv.dereg_mr(m);
      }
      return rc;
    }
    rkeys[i] = mr->rkey;
  }
  return 0;
}

/* After return the NIC refuses every access through the region's keys. 0, or -ENOENT. */
EXPORT int rdma_unregister(void *self, uint64_t addr, uint64_t len) {
  rdma_exec_t *ex = live(self);
  if (!ex) return -EINVAL;
  int found = 0;
  for (int i = 0; i < ex->ndev; i++) {
    struct tv_mr *mr = remove_mr(&ex->devs[i], addr, len);
    if (mr) {
      g_ibv.dereg_mr(mr);
      found = 1;
    }
  }
  return found ? 0 : -ENOENT;
}

/* A peer with nrails rails; rail r runs from local device local_dev[r] to the peer's device
 * column remote_col[r] (the index of its rkey in each region). Its QPs are created (state INIT,
 * read their numbers with rdma_qp_info) and connected by rdma_connect_qp. Returns a handle > 0
 * or -errno. */
EXPORT int64_t rdma_add_peer(void *self, int nrails, const int *local_dev, const int *remote_col, int ncols) {
  rdma_exec_t *ex = live(self);
  if (!ex || nrails <= 0 || ncols <= 0 || ncols > MAX_REMOTE_COLS) return -EINVAL;
  for (int r = 0; r < nrails; r++)
    if (!dev_at(ex, local_dev[r]) || remote_col[r] < 0 || remote_col[r] >= ncols) return -EINVAL;
  peer_t *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  p->rails = calloc((size_t)nrails, sizeof *p->rails);
  if (!p->rails) {
    free(p);
    return -ENOMEM;
  }
  pthread_rwlock_init(&p->regions_lock, NULL);
  p->nrails = nrails;
  p->ncols = ncols;
  atomic_init(&p->refs, 1);
  int err = 0;
  for (int r = 0; r < nrails && !err; r++) {
    rail_t *rl = &p->rails[r];
    rl->peer = p;
    rl->index = r;
    rl->dev = &ex->devs[local_dev[r]];
    rl->remote_col = remote_col[r];
    rl->nqps = ex->qps_per_rail;
    for (int k = 0; k < rl->nqps; k++) {
      qpx_t *q = &rl->qps[k];
      q->rail = rl;
      q->k = k;
      q->ring_size = (uint32_t)ex->max_send_wr;
      q->ring = calloc(q->ring_size, sizeof *q->ring);
      q->qp = q->ring ? create_rc_qp(rl->dev, q->ring_size) : NULL;
      if (!q->qp || qp_to_init(rl->dev, q->qp)) {
        err = errno ? -errno : -ENOMEM;
        break;
      }
      q->qpn = q->qp->qp_num;
      q->psn = new_psn(ex);
      atomic_store(&q->state, QP_INIT);
    }
  }
  if (err) {
    for (int r = 0; r < nrails; r++)
      for (int k = 0; k < p->rails[r].nqps; k++) {
        if (p->rails[r].qps[k].qp) g_ibv.destroy_qp(p->rails[r].qps[k].qp);
        free(p->rails[r].qps[k].ring);
      }
    free(p->rails);
    pthread_rwlock_destroy(&p->regions_lock);
    free(p);
    return err;
  }
  /* each rail joins its device's worker (one peer reference per rail) */
  for (int r = 0; r < nrails; r++) {
    device_t *d = p->rails[r].dev;
    pthread_mutex_lock(&d->mu);
    if (d->nrails == d->cap_rails) {
      int cap = d->cap_rails ? d->cap_rails * 2 : 8;
      rail_t **rs = realloc(d->rails, (size_t)cap * sizeof *rs);
      if (rs) {
        d->rails = rs;
        d->cap_rails = cap;
      }
    }
    if (d->nrails < d->cap_rails) {
      d->rails[d->nrails++] = &p->rails[r];
      atomic_fetch_add(&p->refs, 1);
    } else {
      err = -ENOMEM;
    }
    pthread_mutex_unlock(&d->mu);
  }
  pthread_rwlock_wrlock(&ex->peers_lock);
  uint64_t h = err ? 0 : tent_ht_insert(&ex->peers, p);
  if (h) p->handle = h;
  pthread_rwlock_unlock(&ex->peers_lock);
  if (!h) { /* retire what joined the workers; they free it */
    for (int r = 0; r < nrails; r++) atomic_store(&p->rails[r].removed, 1);
    for (int r = 0; r < nrails; r++) wake(p->rails[r].dev);
    peer_unref(p);
    return err ? err : -ENOMEM;
  }
  return (int64_t)h;
}

/* QP k of a rail, with a reference on its peer held for the caller (*pp; peer_unref when done). */
static qpx_t *peer_qp(rdma_exec_t *ex, int64_t peer, int rail, int k, peer_t **pp) {
  pthread_rwlock_rdlock(&ex->peers_lock);
  peer_t *p = tent_ht_get(&ex->peers, (uint64_t)peer);
  if (p) atomic_fetch_add(&p->refs, 1);
  pthread_rwlock_unlock(&ex->peers_lock);
  if (!p) return NULL;
  if (rail < 0 || rail >= p->nrails || k < 0 || k >= p->rails[rail].nqps) {
    peer_unref(p);
    return NULL;
  }
  *pp = p;
  return &p->rails[rail].qps[k];
}

/* Shape of a peer: out[0] = rails, out[1] = QPs per rail. */
EXPORT int rdma_peer_shape(void *self, int64_t peer, int *out) {
  rdma_exec_t *ex = live(self);
  if (!ex) return -EINVAL;
  pthread_rwlock_rdlock(&ex->peers_lock);
  peer_t *p = tent_ht_get(&ex->peers, (uint64_t)peer);
  if (p) {
    out[0] = p->nrails;
    out[1] = p->nrails ? p->rails[0].nqps : 0;
  }
  pthread_rwlock_unlock(&ex->peers_lock);
  return p ? 0 : -ENOENT;
}

/* The local QP number and starting PSN of QP k of a rail (for the handshake). */
EXPORT int rdma_qp_info(void *self, int64_t peer, int rail, int k, uint32_t *qpn, uint32_t *psn, int *state) {
  rdma_exec_t *ex = live(self);
  peer_t *p = NULL;
  qpx_t *q = ex ? peer_qp(ex, peer, rail, k, &p) : NULL;
  if (!q) return -ENOENT;
  *qpn = q->qpn;
  *psn = q->psn;
  *state = atomic_load(&q->state);
  peer_unref(p);
  return 0;
}

/* Move QP k of a rail (INIT or RECONNECTING) to RTS towards the remote QP; it is READY after. */
EXPORT int rdma_connect_qp(void *self, int64_t peer, int rail, int k, uint32_t remote_qpn, uint32_t remote_psn,
                           const uint8_t *gid, uint32_t lid, int mtu, int remote_rd_atom) {
  rdma_exec_t *ex = live(self);
  peer_t *p = NULL;
  qpx_t *q = ex ? peer_qp(ex, peer, rail, k, &p) : NULL;
  if (!q) return -ENOENT;
  int st = atomic_load(&q->state);
  int rc = st != QP_INIT && st != QP_RECONNECTING ? -EBUSY : 0;
  if (!rc) rc = qp_to_rts(ex, q->rail->dev, q->qp, q->psn, remote_qpn, remote_psn, gid, (uint16_t)lid, mtu, remote_rd_atom);
  if (rc > 0) rc = -rc;
  if (!rc) {
    atomic_store(&q->state, QP_READY);
    wake(q->rail->dev);
  }
  peer_unref(p);
  return rc;
}

/* QPs that failed and finished flushing: (peer, rail, k) triples, each claimed (RECONNECTING)
 * by this call; the caller re-runs the handshake (rdma_reset_qp + rdma_connect_qp) or gives it
 * back with rdma_release_claim. Returns how many were written. */
EXPORT int rdma_collect_broken(void *self, int64_t *peers, int *rails, int *ks, int max) {
  rdma_exec_t *ex = live(self);
  if (!ex) return 0;
  int n = 0;
  pthread_rwlock_rdlock(&ex->peers_lock);
  for (size_t i = 0; i < ex->peers.cap && n < max; i++) {
    peer_t *p = ex->peers.items[i];
    if (!p) continue;
    for (int r = 0; r < p->nrails && n < max; r++)
      for (int k = 0; k < p->rails[r].nqps && n < max; k++) {
        int want = QP_BROKEN;
        if (atomic_compare_exchange_strong(&p->rails[r].qps[k].state, &want, QP_RECONNECTING)) {
          peers[n] = (int64_t)p->handle;
          rails[n] = r;
          ks[n] = k;
          n++;
        }
      }
  }
  pthread_rwlock_unlock(&ex->peers_lock);
  return n;
}

/* Give a claimed QP back (the handshake failed; it is collected again later). */
EXPORT int rdma_release_claim(void *self, int64_t peer, int rail, int k) {
  rdma_exec_t *ex = live(self);
  peer_t *p = NULL;
  qpx_t *q = ex ? peer_qp(ex, peer, rail, k, &p) : NULL;
  if (!q) return -ENOENT;
  int want = QP_RECONNECTING;
  int rc = atomic_compare_exchange_strong(&q->state, &want, QP_BROKEN) ? 0 : -EBUSY;
  peer_unref(p);
  return rc;
}

static int reset_claimed(rdma_exec_t *ex, qpx_t *q, uint32_t *qpn, uint32_t *psn);

/* Replace a claimed QP by a fresh one (new QP number and PSN, state INIT for the handshake). */
EXPORT int rdma_reset_qp(void *self, int64_t peer, int rail, int k, uint32_t *qpn, uint32_t *psn) {
  rdma_exec_t *ex = live(self);
  peer_t *p = NULL;
  qpx_t *q = ex ? peer_qp(ex, peer, rail, k, &p) : NULL;
  if (!q) return -ENOENT;
  int rc = atomic_load(&q->state) != QP_RECONNECTING ? -EBUSY : 0;
  if (!rc) rc = reset_claimed(ex, q, qpn, psn);
  peer_unref(p);
  return rc;
}

static int reset_claimed(rdma_exec_t *ex, qpx_t *q, uint32_t *qpn, uint32_t *psn) {
  device_t *d = q->rail->dev;
  /* the worker does not touch a RECONNECTING QP with nothing outstanding */
  if (q->qp) g_ibv.destroy_qp(q->qp);
  q->qp = create_rc_qp(d, q->ring_size);
  if (!q->qp || qp_to_init(d, q->qp)) {
    int e = errno ? errno : ENOMEM;
    if (q->qp) g_ibv.destroy_qp(q->qp);
    q->qp = NULL;
    return -e;
  }
  q->head = 0;
  q->outstanding = 0;
  q->flushing = 0;
  q->qpn = q->qp->qp_num;
  q->psn = new_psn(ex);
  atomic_fetch_add(&q->reconnects, 1);
  *qpn = q->qpn;
  *psn = q->psn;
  return 0;
}

/* Report the chunks held for a claimed (RECONNECTING) QP: call after rdma_reset_qp destroyed our
 * end and the peer dropped its end, so none of their packets can still land. Returns how many. */
EXPORT int rdma_release_deferred(void *self, int64_t peer, int rail, int k) {
  rdma_exec_t *ex = live(self);
  peer_t *p = NULL;
  qpx_t *q = ex ? peer_qp(ex, peer, rail, k, &p) : NULL;
  if (!q) return -ENOENT;
  int n = -EBUSY;
  if (atomic_load(&q->state) == QP_RECONNECTING) {
    n = (int)q->ndeferred;
    drain_deferred(ex, q);
  }
  peer_unref(p);
  return n;
}

/* The peer's memory regions, replacing the previous table: n entries, rkeys row-major [n][ncols]. */
EXPORT int rdma_set_regions(void *self, int64_t peer, int n, const uint64_t *addrs, const uint64_t *lens,
                            const uint32_t *perms, const uint32_t *rkeys) {
  rdma_exec_t *ex = live(self);
  if (!ex || n < 0) return -EINVAL;
  pthread_rwlock_rdlock(&ex->peers_lock);
  peer_t *p = tent_ht_get(&ex->peers, (uint64_t)peer);
  if (p) atomic_fetch_add(&p->refs, 1);
  pthread_rwlock_unlock(&ex->peers_lock);
  if (!p) return -ENOENT;
  region_t *regs = n ? calloc((size_t)n, sizeof *regs) : NULL;
  if (n && !regs) {
    peer_unref(p);
    return -ENOMEM;
  }
  for (int i = 0; i < n; i++) {
    regs[i].addr = addrs[i];
    regs[i].len = lens[i];
    regs[i].perm = perms[i];
    for (int c = 0; c < p->ncols; c++) regs[i].rkeys[c] = rkeys[(size_t)i * (size_t)p->ncols + (size_t)c];
  }
  /* sorted by address for the lookups (insertion sort: tables are small and mostly sorted) */
  for (int i = 1; i < n; i++) {
    region_t t = regs[i];
    int j = i;
    while (j > 0 && regs[j - 1].addr > t.addr) {
      regs[j] = regs[j - 1];
      j--;
    }
    regs[j] = t;
  }
  pthread_rwlock_wrlock(&p->regions_lock);
  region_t *old = p->regions;
  p->regions = regs;
  p->nregions = (size_t)n;
  pthread_rwlock_unlock(&p->regions_lock);
  free(old);
  peer_unref(p);
  return 0;
}

/* Forget a peer: queued slices are cancelled, in-flight ones flushed; its QPs are destroyed by
 * the device workers once drained. */
EXPORT void rdma_remove_peer(void *self, int64_t peer) {
  rdma_exec_t *ex = live(self);
  if (!ex) return;
  pthread_rwlock_wrlock(&ex->peers_lock);
  peer_t *p = tent_ht_take(&ex->peers, (uint64_t)peer);
  pthread_rwlock_unlock(&ex->peers_lock);
  if (!p) return;
  atomic_store(&p->removed, 1);
  for (int r = 0; r < p->nrails; r++) {
    atomic_store(&p->rails[r].removed, 1);
    wake(p->rails[r].dev);
  }
  peer_unref(p);
}

/* The engine paused this rail: fail its queued slices now (TENT_E_CONNECT, retryable) and flush
 * what is in flight. Returns how many queued slices were handed back. */
EXPORT int rdma_abort_rail(void *self, int64_t peer, int rail) {
  rdma_exec_t *ex = live(self);
  if (!ex) return 0;
  pthread_rwlock_rdlock(&ex->peers_lock);
  peer_t *p = tent_ht_get(&ex->peers, (uint64_t)peer);
  if (p) atomic_fetch_add(&p->refs, 1);
  pthread_rwlock_unlock(&ex->peers_lock);
  if (!p) return 0;
  if (rail < 0 || rail >= p->nrails) {
    peer_unref(p);
    return 0;
  }
  rail_t *r = &p->rails[rail];
  device_t *d = r->dev;
  tent_chunk_t *taken = NULL;
  size_t cap = 0;
  pthread_mutex_lock(&d->mu);
  size_t got = take_queue(r, &taken, &cap);
  pthread_mutex_unlock(&d->mu);
  int slices = 0;
  for (size_t i = 0; i < got; i++) {
    rjob_t *j = (rjob_t *)taken[i].job;
    if (atomic_load(&j->base.remaining) == 1) slices++;
    chunk_done(ex, j, TENT_E_CONNECT);
  }
  free(taken);
  atomic_store(&r->flush_request, 1);
  wake(d);
  peer_unref(p);
  return slices;
}

/* out = [bytes_ok, slices_ok, errors, wc_errors, ready_qps, reconnects] */
EXPORT int rdma_rail_counters(void *self, int64_t peer, int rail, uint64_t *out, int nout) {
  rdma_exec_t *ex = live(self);
  if (!ex) return -EINVAL;
  pthread_rwlock_rdlock(&ex->peers_lock);
  peer_t *p = tent_ht_get(&ex->peers, (uint64_t)peer);
  int rc = -ENOENT;
  if (p && rail >= 0 && rail < p->nrails) {
    rail_t *r = &p->rails[rail];
    uint64_t reconnects = 0;
    for (int k = 0; k < r->nqps; k++) reconnects += atomic_load(&r->qps[k].reconnects);
    uint64_t v[6] = {atomic_load(&r->bytes), atomic_load(&r->slices), atomic_load(&r->errors),
                     atomic_load(&r->wc_errors), (uint64_t)rail_ready_qps(r), reconnects};
    for (int i = 0; i < nout && i < 6; i++) out[i] = v[i];
    rc = 0;
  }
  pthread_rwlock_unlock(&ex->peers_lock);
  return rc;
}

EXPORT int rdma_port_active(void *self, int dev) {
  rdma_exec_t *ex = live(self);
  device_t *d = ex ? dev_at(ex, dev) : NULL;
  return d ? atomic_load(&d->port_active) : -EINVAL;
}

/* Target side of a handshake: a QP on device `dev` connected to the initiator's (qpn, psn, gid,
 * lid, mtu). Writes our QP number and PSN; returns a handle > 0 for rdma_release_qp, or -errno
 * (-ENOSPC: max_passive_qps reached). */
EXPORT int64_t rdma_accept_qp(void *self, int dev, uint32_t remote_qpn, uint32_t remote_psn, const uint8_t *gid,
                              uint32_t lid, int mtu, uint32_t *qpn, uint32_t *psn) {
  rdma_exec_t *ex = live(self);
  device_t *d = ex ? dev_at(ex, dev) : NULL;
  if (!d) return -EINVAL;
  pthread_mutex_lock(&ex->passive_mu);
  int full = ex->npassive >= ex->max_passive;
  if (!full) ex->npassive++;
  pthread_mutex_unlock(&ex->passive_mu);
  if (full) return -ENOSPC;
  passive_t *pq = calloc(1, sizeof *pq);
  struct tv_qp *qp = pq ? create_rc_qp(d, 1) : NULL;
  uint32_t my_psn = new_psn(ex);
  int rc = qp ? qp_to_init(d, qp) : -1;
  if (rc == 0) rc = qp_to_rts(ex, d, qp, my_psn, remote_qpn, remote_psn, gid, (uint16_t)lid, mtu, 0);
  if (!qp || rc) {
    int e = rc > 0 ? rc : (errno ? errno : ENOMEM);
    if (qp) g_ibv.destroy_qp(qp);
    free(pq);
    pthread_mutex_lock(&ex->passive_mu);
    ex->npassive--;
    pthread_mutex_unlock(&ex->passive_mu);
    return -e;
  }
  pq->dev = d;
  pq->qp = qp;
  pthread_mutex_lock(&ex->passive_mu);
  uint64_t h = tent_ht_insert(&ex->passive, pq);
  if (!h) ex->npassive--;
  pthread_mutex_unlock(&ex->passive_mu);
  if (!h) {
    g_ibv.destroy_qp(qp);
    free(pq);
    return -ENOMEM;
  }
  *qpn = qp->qp_num;
  *psn = my_psn;
  return (int64_t)h;
}

EXPORT int rdma_release_qp(void *self, int64_t handle) {
  rdma_exec_t *ex = live(self);
  if (!ex) return -EINVAL;
  pthread_mutex_lock(&ex->passive_mu);
  passive_t *pq = tent_ht_take(&ex->passive, (uint64_t)handle);
  if (pq) ex->npassive--;
  pthread_mutex_unlock(&ex->passive_mu);
  if (!pq) return -ENOENT;
  g_ibv.destroy_qp(pq->qp);
  free(pq);
  return 0;
}

EXPORT int rdma_passive_count(void *self) {
  rdma_exec_t *ex = live(self);
  if (!ex) return 0;
  pthread_mutex_lock(&ex->passive_mu);
  int n = ex->npassive;
  pthread_mutex_unlock(&ex->passive_mu);
  return n;
}

static const tent_executor_ops_t g_ops = {
    .abi_version = TENT_EXECUTOR_ABI_VERSION,
    .struct_size = sizeof(tent_executor_ops_t),
    .name = "rdma",
    .create = ex_create,
    .destroy = ex_destroy,
    .submit = ex_submit,
};

EXPORT const tent_executor_ops_t *tent_executor_ops(void) { return &g_ops; }
