// Self-test of libfake_ibverbs.so, loaded by path with dlopen as the RDMA transport loads
// libibverbs. It checks the emulation keeps the promises the transport's tests rely on: devices
// and ports as documented, the QP state machine's masks, RDMA writes landing byte for byte,
// completion-channel wakeups, the error completions and flushes, and teardown to zero objects.

#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace {

// The fake's entry points, resolved with dlsym; data-path calls go through context->ops via the
// inline functions of verbs.h.
struct Api {
  void* handle = nullptr;
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_device)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int) = nullptr;
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context*) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel*) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**) = nullptr;
  void (*ack_cq_events)(ibv_cq*, unsigned int) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  int (*get_async_event)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ack_async_event)(ibv_async_event*) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status) = nullptr;
  const char* (*event_type_str)(ibv_event_type) = nullptr;
  int (*fork_init)() = nullptr;
  int (*break_qp)(uint32_t, int) = nullptr;
  uint64_t (*bytes_written)(const char*) = nullptr;
  const char* (*last_error)() = nullptr;
  int (*live_objects)() = nullptr;
};

template <typename F>
void bind(void* handle, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  ASSERT_NE(fn, nullptr) << "missing symbol " << name;
}

const Api& api() {
  static Api a = [] {
    Api x;
    x.handle = dlopen(FAKE_IBVERBS_PATH, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(x.handle, nullptr) << dlerror();
    if (x.handle == nullptr) return x;
    bind(x.handle, x.get_device_list, "ibv_get_device_list");
    bind(x.handle, x.free_device_list, "ibv_free_device_list");
    bind(x.handle, x.get_device_name, "ibv_get_device_name");
    bind(x.handle, x.open_device, "ibv_open_device");
    bind(x.handle, x.close_device, "ibv_close_device");
    bind(x.handle, x.query_device, "ibv_query_device");
    bind(x.handle, x.query_port, "ibv_query_port");
    bind(x.handle, x.query_gid, "ibv_query_gid");
    bind(x.handle, x.alloc_pd, "ibv_alloc_pd");
    bind(x.handle, x.dealloc_pd, "ibv_dealloc_pd");
    bind(x.handle, x.reg_mr, "ibv_reg_mr");
    bind(x.handle, x.reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
    bind(x.handle, x.dereg_mr, "ibv_dereg_mr");
    bind(x.handle, x.create_comp_channel, "ibv_create_comp_channel");
    bind(x.handle, x.destroy_comp_channel, "ibv_destroy_comp_channel");
    bind(x.handle, x.create_cq, "ibv_create_cq");
    bind(x.handle, x.destroy_cq, "ibv_destroy_cq");
    bind(x.handle, x.get_cq_event, "ibv_get_cq_event");
    bind(x.handle, x.ack_cq_events, "ibv_ack_cq_events");
    bind(x.handle, x.create_qp, "ibv_create_qp");
    bind(x.handle, x.modify_qp, "ibv_modify_qp");
    bind(x.handle, x.query_qp, "ibv_query_qp");
    bind(x.handle, x.destroy_qp, "ibv_destroy_qp");
    bind(x.handle, x.get_async_event, "ibv_get_async_event");
    bind(x.handle, x.ack_async_event, "ibv_ack_async_event");
    bind(x.handle, x.wc_status_str, "ibv_wc_status_str");
    bind(x.handle, x.event_type_str, "ibv_event_type_str");
    bind(x.handle, x.fork_init, "ibv_fork_init");
    bind(x.handle, x.break_qp, "fake_ibverbs_break_qp");
    bind(x.handle, x.bytes_written, "fake_ibverbs_bytes_written");
    bind(x.handle, x.last_error, "fake_ibverbs_last_error");
    bind(x.handle, x.live_objects, "fake_ibverbs_live_objects");
    return x;
  }();
  return a;
}

bool fdReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1;
}

// Polls until `want` completions arrived or 10 s passed (a hang is a failure, not a stuck test).
std::vector<ibv_wc> pollFor(ibv_cq* cq, size_t want) {
  std::vector<ibv_wc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < want && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(cq, 16, wc);
    if (n < 0) break;
    out.insert(out.end(), wc, wc + n);
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return out;
}

// One rank's verbs objects on one fake device.
struct Endpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  uint16_t lid = 0;
  uint32_t psn = 0;
};

Endpoint openEndpoint(int device, uint32_t max_send_wr = 64, uint32_t psn = 0x1234) {
  const Api& a = api();
  Endpoint e;
  int n = 0;
  ibv_device** list = a.get_device_list(&n);
  EXPECT_GT(n, device);
  e.ctx = a.open_device(list[device]);
  a.free_device_list(list);
  EXPECT_NE(e.ctx, nullptr);
  ibv_port_attr port{};
  EXPECT_EQ(a.query_port(e.ctx, 1, &port), 0);
  e.lid = port.lid;
  e.psn = psn;
  e.pd = a.alloc_pd(e.ctx);
  e.channel = a.create_comp_channel(e.ctx);
  e.cq = a.create_cq(e.ctx, 256, &e, e.channel, 0);
  EXPECT_NE(e.cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = e.cq;
  init.recv_cq = e.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = max_send_wr;
  init.cap.max_recv_wr = 64;
  init.cap.max_send_sge = 2;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 64;
  e.qp = a.create_qp(e.pd, &init);
  EXPECT_NE(e.qp, nullptr) << a.last_error();
  return e;
}

int toInit(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = 1;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return api().modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int toRtr(ibv_qp* qp, uint32_t remote_qpn, uint16_t remote_lid, uint32_t remote_psn) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_4096;
  attr.dest_qp_num = remote_qpn;
  attr.rq_psn = remote_psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.dlid = remote_lid;
  attr.ah_attr.port_num = 1;
  return api().modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int toRts(ibv_qp* qp, uint32_t psn, uint8_t rnr_retry) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = psn;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = rnr_retry;
  attr.max_rd_atomic = 1;
  return api().modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

// Connects a and b with each other (both to RTS).
void connectPair(Endpoint& a, Endpoint& b, uint8_t rnr_retry = 7) {
  ASSERT_EQ(toInit(a.qp), 0) << api().last_error();
  ASSERT_EQ(toInit(b.qp), 0) << api().last_error();
  ASSERT_EQ(toRtr(a.qp, b.qp->qp_num, b.lid, b.psn), 0) << api().last_error();
  ASSERT_EQ(toRtr(b.qp, a.qp->qp_num, a.lid, a.psn), 0) << api().last_error();
  ASSERT_EQ(toRts(a.qp, a.psn, rnr_retry), 0) << api().last_error();
  ASSERT_EQ(toRts(b.qp, b.psn, rnr_retry), 0) << api().last_error();
}

void closeEndpoint(Endpoint& e) {
  const Api& a = api();
  if (e.qp != nullptr) {
    EXPECT_EQ(a.destroy_qp(e.qp), 0) << a.last_error();
  }
  if (e.cq != nullptr) {
    EXPECT_EQ(a.destroy_cq(e.cq), 0) << a.last_error();
  }
  if (e.channel != nullptr) {
    EXPECT_EQ(a.destroy_comp_channel(e.channel), 0) << a.last_error();
  }
  if (e.pd != nullptr) {
    EXPECT_EQ(a.dealloc_pd(e.pd), 0) << a.last_error();
  }
  if (e.ctx != nullptr) {
    EXPECT_EQ(a.close_device(e.ctx), 0) << a.last_error();
  }
  e = Endpoint{};
}

int postWrite(ibv_qp* qp, uint64_t wr_id, ibv_mr* local, size_t length, uint64_t remote_addr,
              uint32_t rkey, bool with_imm, uint32_t imm, bool signaled = true) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(local->addr), static_cast<uint32_t>(length), local->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.imm_data = imm;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

int postRecv(ibv_qp* qp, uint64_t wr_id) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

ibv_qp_state trueState(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(api().query_qp(qp, &attr, IBV_QP_STATE, &init), 0);
  return attr.qp_state;
}

class FakeIbverbs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(api().handle, nullptr);
    unsetenv("FAKE_IBVERBS_DEVICES");
    unsetenv("FAKE_IBVERBS_PORT_DOWN");
  }
  // Every test tears down everything it made.
  void TearDown() override { EXPECT_EQ(api().live_objects(), 0); }
};

TEST_F(FakeIbverbs, DevicesPortsAndGids) {
  const Api& a = api();
  int n = -1;
  ibv_device** list = a.get_device_list(&n);
  ASSERT_EQ(n, 2);
  EXPECT_STREQ(a.get_device_name(list[0]), "fake0");
  EXPECT_STREQ(a.get_device_name(list[1]), "fake1");
  EXPECT_EQ(list[2], nullptr);

  ibv_context* ctx = a.open_device(list[1]);
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(ctx->num_comp_vectors, 1);
  EXPECT_GE(ctx->async_fd, 0);
  ibv_device_attr dev{};
  ASSERT_EQ(a.query_device(ctx, &dev), 0);
  EXPECT_EQ(dev.max_qp_wr, 4096);
  EXPECT_EQ(dev.max_sge, 4);
  EXPECT_EQ(dev.max_cqe, 65536);
  EXPECT_EQ(dev.phys_port_cnt, 1);
  EXPECT_STREQ(dev.fw_ver, "fake");

  ibv_port_attr port{};
  ASSERT_EQ(a.query_port(ctx, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(port.lid, 2);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_EQ(port.active_width, 2);
  EXPECT_EQ(port.active_speed, 32);
  EXPECT_EQ(port.gid_tbl_len, 1);
  EXPECT_EQ(a.query_port(ctx, 2, &port), EINVAL);
  setenv("FAKE_IBVERBS_PORT_DOWN", "fake1", 1);
  ASSERT_EQ(a.query_port(ctx, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  unsetenv("FAKE_IBVERBS_PORT_DOWN");

  ibv_gid gid{};
  ASSERT_EQ(a.query_gid(ctx, 1, 0, &gid), 0);
  EXPECT_EQ(gid.raw[0], 0xfe);
  EXPECT_EQ(gid.raw[1], 0x80);
  EXPECT_EQ(gid.raw[15], 2);
  EXPECT_EQ(a.query_gid(ctx, 1, 1, &gid), EINVAL);

  ibv_pd* pd = a.alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  errno = 0;
  EXPECT_EQ(a.reg_mr(pd, nullptr, 64, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(a.reg_dmabuf_mr(pd, 0, 64, 0, 3, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  std::vector<char> buf(64);
  ibv_mr* mr = a.reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_NE(mr->lkey, mr->rkey);
  EXPECT_EQ(a.dealloc_pd(pd), EBUSY);  // the MR still uses it
  EXPECT_EQ(a.dereg_mr(mr), 0);
  EXPECT_EQ(a.dealloc_pd(pd), 0);
  EXPECT_EQ(a.close_device(ctx), 0);
  a.free_device_list(list);

  setenv("FAKE_IBVERBS_DEVICES", "0", 1);
  list = a.get_device_list(&n);
  EXPECT_EQ(n, 0);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(list[0], nullptr);
  a.free_device_list(list);
  EXPECT_EQ(a.fork_init(), 0);
  EXPECT_STREQ(a.wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  EXPECT_STREQ(a.event_type_str(IBV_EVENT_QP_FATAL), "local work queue catastrophic error");
}

TEST_F(FakeIbverbs, WriteWithImmediateOfOneMiBBetweenTwoThreads) {
  const Api& a = api();
  constexpr size_t kBytes = 1 << 20;
  const uint32_t imm = htonl(0xabcdef01);
  const uint64_t written_before = a.bytes_written("fake0");

  struct Info {
    uint32_t qpn;
    uint16_t lid;
    uint32_t psn;
    uint64_t addr;
    uint32_t rkey;
  };
  std::promise<Info> info0, info1;
  std::promise<void> receiver_ready;

  std::thread sender([&] {
    Endpoint e = openEndpoint(0, 64, 0x111);
    std::vector<unsigned char> src(kBytes);
    for (size_t i = 0; i < kBytes; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    ibv_mr* mr = a.reg_mr(e.pd, src.data(), kBytes, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    info0.set_value({e.qp->qp_num, e.lid, e.psn, 0, 0});
    const Info peer = info1.get_future().get();
    ASSERT_EQ(toInit(e.qp), 0) << a.last_error();
    ASSERT_EQ(toRtr(e.qp, peer.qpn, peer.lid, peer.psn), 0) << a.last_error();
    ASSERT_EQ(toRts(e.qp, e.psn, 7), 0) << a.last_error();
    receiver_ready.get_future().wait();
    ASSERT_EQ(ibv_req_notify_cq(e.cq, 0), 0);
    ASSERT_EQ(postWrite(e.qp, 42, mr, kBytes, peer.addr, peer.rkey, true, imm), 0);
    // The completion arrives asynchronously and wakes the channel.
    ASSERT_TRUE(fdReadable(e.channel->fd, 10000));
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    ASSERT_EQ(a.get_cq_event(e.channel, &cq, &cq_context), 0);
    EXPECT_EQ(cq, e.cq);
    EXPECT_EQ(cq_context, static_cast<void*>(&e));
    a.ack_cq_events(cq, 1);
    const auto wcs = pollFor(e.cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wcs[0].wr_id, 42u);
    EXPECT_EQ(wcs[0].qp_num, e.qp->qp_num);
    EXPECT_EQ(a.dereg_mr(mr), 0);
    closeEndpoint(e);
  });

  std::thread receiver([&] {
    Endpoint e = openEndpoint(1, 64, 0x222);
    std::vector<unsigned char> dst(kBytes, 0);
    ibv_mr* mr =
        a.reg_mr(e.pd, dst.data(), kBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr, nullptr);
    info1.set_value(
        {e.qp->qp_num, e.lid, e.psn, reinterpret_cast<uintptr_t>(dst.data()), mr->rkey});
    const Info peer = info0.get_future().get();
    ASSERT_EQ(toInit(e.qp), 0) << a.last_error();
    ASSERT_EQ(postRecv(e.qp, 77), 0);
    ASSERT_EQ(toRtr(e.qp, peer.qpn, peer.lid, peer.psn), 0) << a.last_error();
    ASSERT_EQ(toRts(e.qp, e.psn, 7), 0) << a.last_error();
    ASSERT_EQ(ibv_req_notify_cq(e.cq, 0), 0);
    receiver_ready.set_value();
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    ASSERT_TRUE(fdReadable(e.channel->fd, 10000));
    ASSERT_EQ(a.get_cq_event(e.channel, &cq, &cq_context), 0);
    a.ack_cq_events(cq, 1);
    const auto wcs = pollFor(e.cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_TRUE(wcs[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(wcs[0].imm_data, imm);
    EXPECT_EQ(wcs[0].byte_len, kBytes);
    EXPECT_EQ(wcs[0].wr_id, 77u);
    EXPECT_EQ(wcs[0].qp_num, e.qp->qp_num);
    size_t mismatches = 0;
    for (size_t i = 0; i < kBytes; ++i) {
      mismatches += dst[i] != static_cast<unsigned char>(i * 131 + 7);
    }
    EXPECT_EQ(mismatches, 0u);
    // One event per arm: no second wakeup without re-arming.
    EXPECT_FALSE(fdReadable(e.channel->fd, 0));
    EXPECT_EQ(a.dereg_mr(mr), 0);
    closeEndpoint(e);
  });
  sender.join();
  receiver.join();
  EXPECT_EQ(a.bytes_written("fake0") - written_before, kBytes);
}

TEST_F(FakeIbverbs, ModifyQpRejectsWrongMasksTransitionsAndAddresses) {
  const Api& a = api();
  Endpoint e0 = openEndpoint(0);
  Endpoint e1 = openEndpoint(1);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  // RESET->INIT without IBV_QP_ACCESS_FLAGS.
  EXPECT_EQ(a.modify_qp(e0.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  EXPECT_NE(std::string(a.last_error()).find("lacks required"), std::string::npos)
      << a.last_error();
  // RESET->INIT with a bit that transition does not take.
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  EXPECT_EQ(a.modify_qp(e0.qp, &attr,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                            IBV_QP_SQ_PSN),
            EINVAL);
  // Port 2 does not exist.
  attr.port_num = 2;
  EXPECT_EQ(a.modify_qp(e0.qp, &attr,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
            EINVAL);
  // RESET->RTR skips INIT.
  EXPECT_EQ(toRtr(e0.qp, e1.qp->qp_num, e1.lid, e1.psn), EINVAL);
  ASSERT_EQ(toInit(e0.qp), 0);
  // INIT->RTS skips RTR.
  EXPECT_EQ(toRts(e0.qp, 1, 7), EINVAL);
  // The wrong LID for the destination QP, then a QP number that does not exist.
  EXPECT_EQ(toRtr(e0.qp, e1.qp->qp_num, e0.lid, e1.psn), EINVAL);
  EXPECT_NE(std::string(a.last_error()).find("dlid"), std::string::npos) << a.last_error();
  EXPECT_EQ(toRtr(e0.qp, 0xfffff, e1.lid, e1.psn), EINVAL);
  // Sending before RTS is refused with bad_wr set.
  std::vector<char> buf(64);
  ibv_mr* mr = a.reg_mr(e0.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(e0.qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  ASSERT_EQ(toRtr(e0.qp, e1.qp->qp_num, e1.lid, e1.psn), 0) << a.last_error();
  // Any state may go to ERR, and ERR only to RESET.
  attr.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(a.modify_qp(e0.qp, &attr, IBV_QP_STATE), 0);
  EXPECT_EQ(toRts(e0.qp, 1, 7), EINVAL);
  attr.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(a.modify_qp(e0.qp, &attr, IBV_QP_STATE), 0);
  EXPECT_EQ(toInit(e0.qp), 0);
  EXPECT_EQ(a.dereg_mr(mr), 0);
  closeEndpoint(e0);
  closeEndpoint(e1);
}

// Sender and receiver with one registered buffer each.
struct Pair {
  Endpoint s, r;
  std::vector<char> src = std::vector<char>(4096, 's');
  std::vector<char> dst = std::vector<char>(4096, 'd');
  ibv_mr* src_mr = nullptr;
  ibv_mr* dst_mr = nullptr;

  explicit Pair(uint8_t rnr_retry = 7, uint32_t max_send_wr = 64) {
    s = openEndpoint(0, max_send_wr);
    r = openEndpoint(1);
    connectPair(s, r, rnr_retry);
    src_mr = api().reg_mr(s.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    dst_mr = api().reg_mr(r.pd, dst.data(), dst.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  }
  uint64_t remote() const { return reinterpret_cast<uintptr_t>(dst.data()); }
  ~Pair() {
    EXPECT_EQ(api().dereg_mr(src_mr), 0);
    EXPECT_EQ(api().dereg_mr(dst_mr), 0);
    closeEndpoint(s);
    closeEndpoint(r);
  }
};

TEST_F(FakeIbverbs, RkeyMismatchFailsWithRemoteAccessErrorThenFlushes) {
  Pair p;
  ASSERT_EQ(postWrite(p.s.qp, 1, p.src_mr, 64, p.remote(), p.dst_mr->rkey + 100, false, 0), 0);
  ASSERT_EQ(postWrite(p.s.qp, 2, p.src_mr, 64, p.remote(), p.dst_mr->rkey, false, 0), 0);
  const auto wcs = pollFor(p.s.cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(trueState(p.s.qp), IBV_QPS_ERR);
  EXPECT_EQ(trueState(p.r.qp), IBV_QPS_RTS);
  EXPECT_EQ(p.dst[0], 'd');  // nothing was written
  EXPECT_NE(std::string(api().last_error()).find("rkey"), std::string::npos);
}

TEST_F(FakeIbverbs, OutOfRangeRemoteAndBadLkeyAreRejected) {
  {
    Pair p;
    ASSERT_EQ(postWrite(p.s.qp, 1, p.src_mr, 64, p.remote() + 4096 - 32, p.dst_mr->rkey, false, 0),
              0);
    const auto wcs = pollFor(p.s.cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  }
  {
    Pair p;
    ibv_sge sge{reinterpret_cast<uintptr_t>(p.src.data()), 64, p.src_mr->rkey};  // rkey as lkey
    ibv_send_wr wr{};
    wr.wr_id = 9;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = p.remote();
    wr.wr.rdma.rkey = p.dst_mr->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(p.s.qp, &wr, &bad), 0);  // unsignaled, yet errors always complete
    const auto wcs = pollFor(p.s.cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].wr_id, 9u);
    EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
  }
}

TEST_F(FakeIbverbs, BreakQpFailsTheNextSendFlushesAndRaisesAsyncEvent) {
  const Api& a = api();
  Pair p;
  ASSERT_EQ(postRecv(p.r.qp, 100), 0);
  ASSERT_EQ(postRecv(p.r.qp, 101), 0);
  ASSERT_EQ(a.break_qp(p.s.qp->qp_num, IBV_WC_RETRY_EXC_ERR), 0);
  EXPECT_EQ(a.break_qp(0xfffff, IBV_WC_RETRY_EXC_ERR), ENOENT);

  ASSERT_TRUE(fdReadable(p.s.ctx->async_fd, 10000));
  ibv_async_event event{};
  ASSERT_EQ(a.get_async_event(p.s.ctx, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(event.element.qp, p.s.qp);
  EXPECT_EQ(a.destroy_qp(p.s.qp), EBUSY);  // the event is not acknowledged yet
  a.ack_async_event(&event);
  EXPECT_FALSE(fdReadable(p.s.ctx->async_fd, 0));

  // The peer noticed: its receives flush.
  auto recvs = pollFor(p.r.cq, 2);
  ASSERT_EQ(recvs.size(), 2u);
  EXPECT_EQ(recvs[0].wr_id, 100u);
  EXPECT_EQ(recvs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(recvs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(trueState(p.r.qp), IBV_QPS_ERR);

  // The next send reports the break, the one after flushes.
  ASSERT_EQ(postWrite(p.s.qp, 1, p.src_mr, 64, p.remote(), p.dst_mr->rkey, true, 5), 0);
  ASSERT_EQ(postWrite(p.s.qp, 2, p.src_mr, 64, p.remote(), p.dst_mr->rkey, false, 0, false), 0);
  auto sends = pollFor(p.s.cq, 2);
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[0].wr_id, 1u);
  EXPECT_EQ(sends[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(sends[1].wr_id, 2u);
  EXPECT_EQ(sends[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(FakeIbverbs, WriteWithImmediateWithoutReceive) {
  // A finite rnr_retry fails at once and takes both QPs down.
  {
    Pair p(/*rnr_retry=*/3);
    ASSERT_EQ(postWrite(p.s.qp, 1, p.src_mr, 64, p.remote(), p.dst_mr->rkey, true, 5), 0);
    const auto wcs = pollFor(p.s.cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
    EXPECT_EQ(trueState(p.r.qp), IBV_QPS_ERR);
  }
  // rnr_retry 7 waits until the receive is posted.
  {
    Pair p(/*rnr_retry=*/7);
    ASSERT_EQ(postWrite(p.s.qp, 1, p.src_mr, 64, p.remote(), p.dst_mr->rkey, true, 5), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ibv_wc wc{};
    EXPECT_EQ(ibv_poll_cq(p.s.cq, 1, &wc), 0);
    ASSERT_EQ(postRecv(p.r.qp, 7), 0);
    const auto sends = pollFor(p.s.cq, 1);
    ASSERT_EQ(sends.size(), 1u);
    EXPECT_EQ(sends[0].status, IBV_WC_SUCCESS);
    const auto recvs = pollFor(p.r.cq, 1);
    ASSERT_EQ(recvs.size(), 1u);
    EXPECT_EQ(recvs[0].wr_id, 7u);
    EXPECT_EQ(p.dst[0], 's');
  }
}

TEST_F(FakeIbverbs, SendQueueSlotsFreeOnlyWhenASignaledCompletionIsPolled) {
  Pair p(7, /*max_send_wr=*/4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(postWrite(p.s.qp, i, p.src_mr, 8, p.remote(), p.dst_mr->rkey, false, 0, false), 0);
  }
  ASSERT_EQ(postWrite(p.s.qp, 3, p.src_mr, 8, p.remote(), p.dst_mr->rkey, false, 0, true), 0);
  EXPECT_EQ(postWrite(p.s.qp, 4, p.src_mr, 8, p.remote(), p.dst_mr->rkey, false, 0, true), ENOMEM);
  const auto wcs = pollFor(p.s.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 3u);
  EXPECT_EQ(postWrite(p.s.qp, 4, p.src_mr, 8, p.remote(), p.dst_mr->rkey, false, 0, true), 0);
  EXPECT_EQ(pollFor(p.s.cq, 1).size(), 1u);
}

TEST_F(FakeIbverbs, CompletionBeforeArmingDoesNotWake) {
  Pair p;
  ASSERT_EQ(postRecv(p.r.qp, 1), 0);
  ASSERT_EQ(postWrite(p.s.qp, 2, p.src_mr, 8, p.remote(), p.dst_mr->rkey, true, 0), 0);
  // The wire queues the receiver's and the sender's completions in one step, so once the
  // receiver has its completion the sender's is in its CQ; arming now raises no event.
  ASSERT_EQ(pollFor(p.r.cq, 1).size(), 1u);
  ASSERT_EQ(ibv_req_notify_cq(p.s.cq, 0), 0);
  EXPECT_FALSE(fdReadable(p.s.channel->fd, 50));
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(p.s.cq, 1, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 2u);
}

TEST_F(FakeIbverbs, BreakQpFailsAnOutstandingSend) {
  const Api& a = api();
  Pair p(/*rnr_retry=*/7);
  // No receive posted: the write with immediate waits at the head of the send queue.
  ASSERT_EQ(postWrite(p.s.qp, 1, p.src_mr, 64, p.remote(), p.dst_mr->rkey, true, 5), 0);
  ASSERT_EQ(postWrite(p.s.qp, 2, p.src_mr, 64, p.remote(), p.dst_mr->rkey, false, 0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(a.break_qp(p.s.qp->qp_num, IBV_WC_RETRY_EXC_ERR), 0);
  const auto sends = pollFor(p.s.cq, 2);
  ASSERT_EQ(sends.size(), 2u);
  EXPECT_EQ(sends[0].wr_id, 1u);
  EXPECT_EQ(sends[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(sends[1].status, IBV_WC_WR_FLUSH_ERR);
  ibv_async_event event{};
  ASSERT_EQ(a.get_async_event(p.s.ctx, &event), 0);
  a.ack_async_event(&event);
}

TEST_F(FakeIbverbs, CqOverflowRaisesAsyncCqError) {
  const Api& a = api();
  Pair p;
  ibv_cq* small = a.create_cq(p.s.ctx, 2, nullptr, nullptr, 0);
  ASSERT_NE(small, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = small;
  init.recv_cq = small;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 8;
  init.cap.max_send_sge = 1;
  ibv_qp* qp = a.create_qp(p.s.pd, &init);
  ASSERT_NE(qp, nullptr);
  // Loopback: the QP writes into the receiver buffer through its own connection to itself.
  ibv_mr* dst = a.reg_mr(p.s.pd, p.dst.data(), p.dst.size(),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(toInit(qp), 0);
  ASSERT_EQ(toRtr(qp, qp->qp_num, p.s.lid, 5), 0) << a.last_error();
  ASSERT_EQ(toRts(qp, 5, 7), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(postWrite(qp, i, p.src_mr, 8, p.remote(), dst->rkey, false, 0), 0);
  }
  ASSERT_TRUE(fdReadable(p.s.ctx->async_fd, 10000));
  ibv_async_event event{};
  ASSERT_EQ(a.get_async_event(p.s.ctx, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(event.element.cq, small);
  a.ack_async_event(&event);
  EXPECT_EQ(pollFor(small, 2).size(), 2u);
  EXPECT_EQ(a.destroy_cq(small), EBUSY);  // the QP still uses it
  EXPECT_EQ(a.destroy_qp(qp), 0);
  EXPECT_EQ(a.destroy_cq(small), 0);
  EXPECT_EQ(a.dereg_mr(dst), 0);
}

TEST_F(FakeIbverbs, ForkedChildGetsItsOwnWire) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
  {
    Pair warm;  // the parent's wire thread is running before the fork
    ASSERT_EQ(postWrite(warm.s.qp, 1, warm.src_mr, 8, warm.remote(), warm.dst_mr->rkey, false, 0),
              0);
    ASSERT_EQ(pollFor(warm.s.cq, 1).size(), 1u);
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    {
      Pair p;
      if (postWrite(p.s.qp, 1, p.src_mr, 8, p.remote(), p.dst_mr->rkey, false, 0) != 0) code = 2;
      const auto wcs = pollFor(p.s.cq, 1);
      if (wcs.size() != 1 || wcs[0].status != IBV_WC_SUCCESS || p.dst[0] != 's') code = 3;
    }
    if (api().live_objects() != 0) code = 4;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
