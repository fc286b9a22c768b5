#pragma once

#include <infiniband/verbs.h>

#include <string>

// verbs.h turns these into inline wrappers that call versioned symbols; this file resolves the
// exported functions by name with dlsym instead, so the macros must not rename our members.
#undef ibv_query_port
#undef ibv_reg_mr

namespace railshard::transport::links::ibverbs {

// libibverbs, loaded with dlopen at run time: one railshard binary serves machines with and
// without RDMA. The library (RAILSHARD_IBVERBS_LIBRARY, default "libibverbs.so.1") is opened
// once per process; the table below holds the exported functions the transport uses. The
// data-path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are inline in
// verbs.h and go through the provider's `context->ops`, so they need no symbol.
struct VerbsApi {
  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  // The exported symbol takes the compatibility struct, a prefix of ibv_port_attr; the caller
  // passes a zeroed full ibv_port_attr, as verbs.h's own wrapper does.
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  // Optional (rdma-core >= 34): registers GPU memory exported as a dmabuf.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int count) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*get_async_event)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ack_async_event)(ibv_async_event* event) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;
  const char* (*event_type_str)(ibv_event_type type) = nullptr;
  int (*fork_init)() = nullptr;

  std::string path;  // what was opened

  // The process's table, loading the library on first use. Null when it cannot be loaded or
  // lacks a required symbol; unavailableReason() then says why.
  static const VerbsApi* get();
  static std::string unavailableReason();

  // "retry counter exceeded (12)": the library's text when loaded, else the number.
  std::string statusText(ibv_wc_status status) const;
};

}  // namespace railshard::transport::links::ibverbs
