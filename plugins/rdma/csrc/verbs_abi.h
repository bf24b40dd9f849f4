/*
 * verbs_abi.h: the part of libibverbs' stable ABI the RDMA executor uses, declared here so the
 * plugin builds without rdma-core's headers and loads libibverbs.so.1 only at run time.
 *
 * Every struct below mirrors <infiniband/verbs.h> (rdma-core, IBVERBS_1.1 symbol versions)
 * field for field, under a tv_ prefix so both can be compiled side by side:
 * tests/test_abi_layout.py checks sizes and offsets against the real header where it is
 * installed. Only the leading fields of the larger objects (context, cq, qp) are declared: the
 * executor reads them and never allocates those structs itself.
 *
 * ibv_post_send, ibv_poll_cq and ibv_req_notify_cq are static inline in verbs.h: they call the
 * provider through context->ops. They are reached the same way here (tv_post_send & co).
 */
#ifndef TENT_RDMA_VERBS_ABI_H
#define TENT_RDMA_VERBS_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum { TV_QPT_RC = 2 };
enum { TV_QPS_RESET = 0, TV_QPS_INIT = 1, TV_QPS_RTR = 2, TV_QPS_RTS = 3, TV_QPS_ERR = 6 };
enum { TV_MTU_256 = 1, TV_MTU_512 = 2, TV_MTU_1024 = 3, TV_MTU_2048 = 4, TV_MTU_4096 = 5 };
enum { TV_PORT_DOWN = 1, TV_PORT_ACTIVE = 4 };
enum { TV_LINK_LAYER_UNSPECIFIED = 0, TV_LINK_LAYER_INFINIBAND = 1, TV_LINK_LAYER_ETHERNET = 2 };
enum { TV_WR_RDMA_WRITE = 0, TV_WR_RDMA_READ = 4 };
enum { TV_SEND_SIGNALED = 1 << 1 };
enum {
  TV_ACCESS_LOCAL_WRITE = 1,
  TV_ACCESS_REMOTE_WRITE = 1 << 1,
  TV_ACCESS_REMOTE_READ = 1 << 2,
};
enum {
  TV_QP_STATE = 1 << 0,
  TV_QP_ACCESS_FLAGS = 1 << 3,
  TV_QP_PKEY_INDEX = 1 << 4,
  TV_QP_PORT = 1 << 5,
  TV_QP_AV = 1 << 7,
  TV_QP_PATH_MTU = 1 << 8,
  TV_QP_TIMEOUT = 1 << 9,
  TV_QP_RETRY_CNT = 1 << 10,
  TV_QP_RNR_RETRY = 1 << 11,
  TV_QP_RQ_PSN = 1 << 12,
  TV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
  TV_QP_MIN_RNR_TIMER = 1 << 15,
  TV_QP_SQ_PSN = 1 << 16,
  TV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
  TV_QP_DEST_QPN = 1 << 20,
};
/* enum ibv_wc_status */
enum {
  TV_WC_SUCCESS = 0,
  TV_WC_LOC_LEN_ERR,
  TV_WC_LOC_QP_OP_ERR,
  TV_WC_LOC_EEC_OP_ERR,
  TV_WC_LOC_PROT_ERR,
  TV_WC_WR_FLUSH_ERR,
  TV_WC_MW_BIND_ERR,
  TV_WC_BAD_RESP_ERR,
  TV_WC_LOC_ACCESS_ERR,
  TV_WC_REM_INV_REQ_ERR,
  TV_WC_REM_ACCESS_ERR,
  TV_WC_REM_OP_ERR,
  TV_WC_RETRY_EXC_ERR,
  TV_WC_RNR_RETRY_EXC_ERR,
  TV_WC_LOC_RDD_VIOL_ERR,
  TV_WC_REM_INV_RD_REQ_ERR,
  TV_WC_REM_ABORT_ERR,
  TV_WC_INV_EECN_ERR,
  TV_WC_INV_EEC_STATE_ERR,
  TV_WC_FATAL_ERR,
  TV_WC_RESP_TIMEOUT_ERR,
  TV_WC_GENERAL_ERR,
  TV_WC_TM_ERR,
  TV_WC_TM_RNDV_INCOMPLETE,
};
/* enum ibv_event_type */
enum {
  TV_EVENT_CQ_ERR = 0,
  TV_EVENT_QP_FATAL,
  TV_EVENT_QP_REQ_ERR,
  TV_EVENT_QP_ACCESS_ERR,
  TV_EVENT_COMM_EST,
  TV_EVENT_SQ_DRAINED,
  TV_EVENT_PATH_MIG,
  TV_EVENT_PATH_MIG_ERR,
  TV_EVENT_DEVICE_FATAL,
  TV_EVENT_PORT_ACTIVE,
  TV_EVENT_PORT_ERR,
  TV_EVENT_LID_CHANGE,
  TV_EVENT_PKEY_CHANGE,
  TV_EVENT_SM_CHANGE,
  TV_EVENT_SRQ_ERR,
  TV_EVENT_SRQ_LIMIT_REACHED,
  TV_EVENT_QP_LAST_WQE_REACHED,
  TV_EVENT_CLIENT_REREGISTER,
  TV_EVENT_GID_CHANGE,
  TV_EVENT_WQ_FATAL,
};

struct tv_device; /* opaque */
struct tv_pd;     /* opaque */
struct tv_srq;    /* opaque */

union tv_gid {
  uint8_t raw[16];
  struct {
    uint64_t subnet_prefix;
    uint64_t interface_id;
  } global;
};

struct tv_device_attr {
  char fw_ver[64];
  uint64_t node_guid;
  uint64_t sys_image_guid;
  uint64_t max_mr_size;
  uint64_t page_size_cap;
  uint32_t vendor_id;
  uint32_t vendor_part_id;
  uint32_t hw_ver;
  int max_qp;
  int max_qp_wr;
  unsigned int device_cap_flags;
  int max_sge;
  int max_sge_rd;
  int max_cq;
  int max_cqe;
  int max_mr;
  int max_pd;
  int max_qp_rd_atom;
  int max_ee_rd_atom;
  int max_res_rd_atom;
  int max_qp_init_rd_atom;
  int max_ee_init_rd_atom;
  int atomic_cap;
  int max_ee;
  int max_rdd;
  int max_mw;
  int max_raw_ipv6_qp;
  int max_raw_ethy_qp;
  int max_mcast_grp;
  int max_mcast_qp_attach;
  int max_total_mcast_qp_attach;
  int max_ah;
  int max_fmr;
  int max_map_per_fmr;
  int max_srq;
  int max_srq_wr;
  int max_srq_sge;
  uint16_t max_pkeys;
  uint8_t local_ca_ack_delay;
  uint8_t phys_port_cnt;
};

/* ibv_query_port@IBVERBS_1.1 fills this prefix of struct ibv_port_attr (its compat layout). */
struct tv_port_attr {
  int state;
  int max_mtu;
  int active_mtu;
  int gid_tbl_len;
  uint32_t port_cap_flags;
  uint32_t max_msg_sz;
  uint32_t bad_pkey_cntr;
  uint32_t qkey_viol_cntr;
  uint16_t pkey_tbl_len;
  uint16_t lid;
  uint16_t sm_lid;
  uint8_t lmc;
  uint8_t max_vl_num;
  uint8_t sm_sl;
  uint8_t subnet_timeout;
  uint8_t init_type_reply;
  uint8_t active_width;
  uint8_t active_speed;
  uint8_t phys_state;
  uint8_t link_layer;
  uint8_t flags;
  uint16_t port_cap_flags2;
  uint8_t reserved[64]; /* room for fields newer libraries append */
};

struct tv_wc {
  uint64_t wr_id;
  int status;
  int opcode;
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_data;
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned int wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};

struct tv_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct tv_mw_bind_info {
  void *mr;
  uint64_t addr;
  uint64_t length;
  unsigned int mw_access_flags;
};

struct tv_send_wr {
  uint64_t wr_id;
  struct tv_send_wr *next;
  struct tv_sge *sg_list;
  int num_sge;
  int opcode;
  unsigned int send_flags;
  uint32_t imm_data;
  union {
    struct {
      uint64_t remote_addr;
      uint32_t rkey;
    } rdma;
    struct {
      uint64_t remote_addr;
      uint64_t compare_add;
      uint64_t swap;
      uint32_t rkey;
    } atomic;
    struct {
      void *ah;
      uint32_t remote_qpn;
      uint32_t remote_qkey;
    } ud;
  } wr;
  union {
    struct {
      uint32_t remote_srqn;
    } xrc;
  } qp_type;
  union {
    struct {
      void *mw;
      uint32_t rkey;
      struct tv_mw_bind_info bind_info;
    } bind_mw;
    struct {
      void *hdr;
      uint16_t hdr_sz;
      uint16_t mss;
    } tso;
  };
};

struct tv_qp_cap {
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
};

struct tv_global_route {
  union tv_gid dgid;
  uint32_t flow_label;
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
};

struct tv_ah_attr {
  struct tv_global_route grh;
  uint16_t dlid;
  uint8_t sl;
  uint8_t src_path_bits;
  uint8_t static_rate;
  uint8_t is_global;
  uint8_t port_num;
};

struct tv_qp_attr {
  int qp_state;
  int cur_qp_state;
  int path_mtu;
  int path_mig_state;
  uint32_t qkey;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint32_t dest_qp_num;
  unsigned int qp_access_flags;
  struct tv_qp_cap cap;
  struct tv_ah_attr ah_attr;
  struct tv_ah_attr alt_ah_attr;
  uint16_t pkey_index;
  uint16_t alt_pkey_index;
  uint8_t en_sqd_async_notify;
  uint8_t sq_draining;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer;
  uint8_t port_num;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t alt_port_num;
  uint8_t alt_timeout;
  uint32_t rate_limit;
};

struct tv_cq;
struct tv_qp;

struct tv_qp_init_attr {
  void *qp_context;
  struct tv_cq *send_cq;
  struct tv_cq *recv_cq;
  struct tv_srq *srq;
  struct tv_qp_cap cap;
  int qp_type;
  int sq_sig_all;
};

struct tv_context;

/* struct ibv_context_ops: 37 function pointers; the executor calls three of them. */
struct tv_context_ops {
  void *_compat_query_device;
  void *_compat_query_port;
  void *_compat_alloc_pd;
  void *_compat_dealloc_pd;
  void *_compat_reg_mr;
  void *_compat_rereg_mr;
  void *_compat_dereg_mr;
  void *alloc_mw;
  void *bind_mw;
  void *dealloc_mw;
  void *_compat_create_cq;
  int (*poll_cq)(struct tv_cq *cq, int num_entries, struct tv_wc *wc);
  int (*req_notify_cq)(struct tv_cq *cq, int solicited_only);
  void *_compat_cq_event;
  void *_compat_resize_cq;
  void *_compat_destroy_cq;
  void *_compat_create_srq;
  void *_compat_modify_srq;
  void *_compat_query_srq;
  void *_compat_destroy_srq;
  void *post_srq_recv;
  void *_compat_create_qp;
  void *_compat_query_qp;
  void *_compat_modify_qp;
  void *_compat_destroy_qp;
  int (*post_send)(struct tv_qp *qp, struct tv_send_wr *wr, struct tv_send_wr **bad_wr);
  void *post_recv;
  void *_compat_create_ah;
  void *_compat_destroy_ah;
  void *_compat_attach_mcast;
  void *_compat_detach_mcast;
  void *_compat_async_event;
};

struct tv_context {
  struct tv_device *device;
  struct tv_context_ops ops;
  int cmd_fd;
  int async_fd;
  int num_comp_vectors;
  /* pthread_mutex_t mutex; void *abi_compat; ... (not used) */
};

struct tv_comp_channel {
  struct tv_context *context;
  int fd;
  int refcnt;
};

struct tv_cq {
  struct tv_context *context;
  struct tv_comp_channel *channel;
  void *cq_context;
  uint32_t handle;
  int cqe;
  /* mutex, cond, event counters follow */
};

struct tv_qp {
  struct tv_context *context;
  void *qp_context;
  struct tv_pd *pd;
  struct tv_cq *send_cq;
  struct tv_cq *recv_cq;
  struct tv_srq *srq;
  uint32_t handle;
  uint32_t qp_num;
  int state;
  int qp_type;
  /* mutex, cond, events_completed follow */
};

struct tv_mr {
  struct tv_context *context;
  struct tv_pd *pd;
  void *addr;
  size_t length;
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
};

struct tv_async_event {
  union {
    struct tv_cq *cq;
    struct tv_qp *qp;
    struct tv_srq *srq;
    void *wq;
    int port_num;
  } element;
  int event_type;
};

/* The exported functions, resolved with dlvsym(..., "IBVERBS_1.1") (dlsym as a fallback). */
typedef struct tv_api {
  void *dl;
  struct tv_device **(*get_device_list)(int *num);
  void (*free_device_list)(struct tv_device **list);
  const char *(*get_device_name)(struct tv_device *dev);
  struct tv_context *(*open_device)(struct tv_device *dev);
  int (*close_device)(struct tv_context *ctx);
  int (*query_device)(struct tv_context *ctx, struct tv_device_attr *attr);
  int (*query_port)(struct tv_context *ctx, uint8_t port, struct tv_port_attr *attr);
  int (*query_gid)(struct tv_context *ctx, uint8_t port, int index, union tv_gid *gid);
  struct tv_pd *(*alloc_pd)(struct tv_context *ctx);
  int (*dealloc_pd)(struct tv_pd *pd);
  struct tv_mr *(*reg_mr)(struct tv_pd *pd, void *addr, size_t length, int access);
  struct tv_mr *(*reg_dmabuf_mr)(struct tv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                 int access); /* NULL before rdma-core 34 */
  int (*dereg_mr)(struct tv_mr *mr);
  struct tv_comp_channel *(*create_comp_channel)(struct tv_context *ctx);
  int (*destroy_comp_channel)(struct tv_comp_channel *ch);
  struct tv_cq *(*create_cq)(struct tv_context *ctx, int cqe, void *cq_context, struct tv_comp_channel *ch,
                             int comp_vector);
  int (*destroy_cq)(struct tv_cq *cq);
  int (*get_cq_event)(struct tv_comp_channel *ch, struct tv_cq **cq, void **cq_context);
  void (*ack_cq_events)(struct tv_cq *cq, unsigned int nevents);
  struct tv_qp *(*create_qp)(struct tv_pd *pd, struct tv_qp_init_attr *attr);
  int (*modify_qp)(struct tv_qp *qp, struct tv_qp_attr *attr, int mask);
  int (*destroy_qp)(struct tv_qp *qp);
  int (*get_async_event)(struct tv_context *ctx, struct tv_async_event *ev);
  void (*ack_async_event)(struct tv_async_event *ev);
  const char *(*wc_status_str)(int status);
  int (*fork_init)(void);
} tv_api_t;

/* The inline verbs, through the provider's ops table (as verbs.h does). */
static inline int tv_post_send(struct tv_qp *qp, struct tv_send_wr *wr, struct tv_send_wr **bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
static inline int tv_poll_cq(struct tv_cq *cq, int n, struct tv_wc *wc) { return cq->context->ops.poll_cq(cq, n, wc); }
static inline int tv_req_notify_cq(struct tv_cq *cq, int solicited_only) {
  return cq->context->ops.req_notify_cq(cq, solicited_only);
}

/* IB MTU enum <-> bytes */
static inline int tv_mtu_bytes(int mtu) { return mtu >= TV_MTU_256 && mtu <= TV_MTU_4096 ? 128 << mtu : 0; }

#endif
