// Connecting a lane by records (LaneInfo), at start-up, on first use, and again after a failure
// (re-admission): the initiating rank makes a queue pair and sends its record over a working
// link; the other makes its own, connects it to the first (RTR, RTS) and answers with its
// record; the initiator connects too and probes the lane with its first frame, whose
// completion says the path works both ways (messenger_links.cc). A lane is made again only
// once all the failed queue pair's work has completed (every piece that landed on it was taken)
// and its port is active; it gets fresh rings of slots on both sides.
//
// NEVER RUN ON RDMA HARDWARE (docs/rdma.md).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/ibverbs/rdma_lane.h"
#include "transport/links/ibverbs/rdma_work.h"

namespace railshard::transport::links::ibverbs {

namespace {

constexpr size_t kHeaderBytes = sizeof(messaging::FrameHeader);
// RDMA reads outstanding per lane (the rendezvous), at most; the HCA may allow fewer.
constexpr int kMaxReadDepth = 8;
// Rendezvous RDMA writes outstanding per lane, at most (the write rendezvous).
constexpr int kMaxWriteDepth = 8;

RegisteredBuffer allocateRegistered(const VerbsApi& api, ibv_pd* pd, size_t bytes, int access,
                                    const std::string& what) {
  RegisteredBuffer buffer;
  void* memory = nullptr;
  if (::posix_memalign(&memory, 4096, bytes) != 0) {
    throw Error("ibverbs: cannot allocate " + std::to_string(bytes) + " bytes for " + what);
  }
  std::memset(memory, 0, bytes);
  buffer.data = static_cast<uint8_t*>(memory);
  buffer.bytes = bytes;
  buffer.mr = api.reg_mr(pd, memory, bytes, access);
  if (buffer.mr == nullptr) {
    const int err = errno;
    std::free(memory);
    throw Error("ibverbs: ibv_reg_mr of " + std::to_string(bytes) + " bytes for " + what +
                " failed: " + std::strerror(err) +
                (err == ENOMEM ? " (raise the locked-memory limit: ulimit -l unlimited)" : ""));
  }
  return buffer;
}

void freeRegistered(const VerbsApi& api, RegisteredBuffer& buffer) {
  if (buffer.mr != nullptr) api.dereg_mr(buffer.mr);
  std::free(buffer.data);
  buffer = RegisteredBuffer{};
}

}  // namespace

void RdmaLane::destroyQueuePair() {
  if (qp_ == nullptr) return;
  if (const int rc = driver_.api().destroy_qp(qp_); rc != 0) {
    // Left behind (its protection domain and device then cannot be closed either): said, as
    // a resource leak should be.
    RS_LOG_WARN("{}: ibv_destroy_qp of queue pair {} failed: {}", name(), qp_->qp_num,
                std::strerror(rc));
  }
  qp_ = nullptr;
}

void RdmaLane::makeQueuePair(uint32_t generation) {
  Rail& rail = driver_.rail(rail_);
  const VerbsApi& api = driver_.api();
  const RdmaDriver::Options& options = driver_.options();
  ibv_port_attr port{};
  if (api.query_port(rail.context, static_cast<uint8_t>(rail.port.port), &port) != 0 ||
      port.state != IBV_PORT_ACTIVE) {
    throw Error("its port " + rail.port.device + ":" + std::to_string(rail.port.port) +
                " is not active");
  }
  // The old queue pair's work either completed (a failed lane is made again only once it is
  // quiet) or never carried anything (an attempt to connect that was not answered): whatever of
  // it is still queued goes with it, and a completion of it that is left is of an older
  // generation, dropped.
  destroyQueuePair();
  posted_ = 0;
  connected_ = false;
  generation_ = static_cast<uint16_t>(generation);
  send_outstanding_ = 0;
  controls_.clear();
  std::fill(in_flight_.begin(), in_flight_.end(), nullptr);
  if (recv_ring_.data == nullptr) {
    const auto slots = static_cast<uint32_t>(options.rdma.slots);
    recv_ring_ =
        allocateRegistered(api, rail.pd, slots * options.rdma.slot_bytes,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "a receive ring");
    local_.ring_addr = reinterpret_cast<uint64_t>(recv_ring_.data);
    local_.ring_rkey = recv_ring_.mr->rkey;
    local_.slots = slots;
    local_.slot_bytes = static_cast<uint32_t>(options.rdma.slot_bytes);
  }
  recv_.emplace(local_.slots);
  local_.rank = static_cast<uint32_t>(options.rank);
  local_.rail = static_cast<uint16_t>(rail_);
  local_.port = static_cast<uint8_t>(rail.port.port);
  local_.mtu = static_cast<uint8_t>(rail.port.active_mtu);
  local_.link_layer = rail.port.infiniband ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
  local_.gid_index = static_cast<uint8_t>(rail.port.gid_index);
  local_.lid = rail.port.lid;
  local_.rd_atomic = options.want_reads ? rail.rd_atomic : 0;
  local_.gid = rail.port.gid;
  local_.psn = std::random_device{}() & 0xffffffu;
  ibv_qp_init_attr init{};
  init.send_cq = rail.cq;
  init.recv_cq = rail.cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 1;  // every completion frees a staging slot or a send-queue entry
  // Frames are bounded by the peer's ring, credit writes by two in flight (each returns at least
  // half the ring), one-sided moves by their depths; receives by our ring plus the peer's credit
  // writes.
  send_depth_ = options.rdma.slots + 8 + kMaxReadDepth + kMaxWriteDepth;
  init.cap.max_send_wr = static_cast<uint32_t>(send_depth_);
  init.cap.max_recv_wr = static_cast<uint32_t>(options.rdma.slots + 8);
  init.cap.max_send_sge = 2;  // header from the staging slot + payload from GPU memory
  init.cap.max_recv_sge = 1;
  qp_ = api.create_qp(rail.pd, &init);
  if (qp_ == nullptr) throw Error("ibv_create_qp failed: " + std::string(std::strerror(errno)));
  local_.qpn = qp_->qp_num;
  QpTransition t = initTransition(static_cast<uint8_t>(rail.port.port));
  if (const int rc = api.modify_qp(qp_, &t.attr, t.mask); rc != 0) {
    throw Error("RESET->INIT failed: " + std::string(std::strerror(rc)));
  }
  // Receives posted before anyone can learn the queue pair's number: a write with immediate
  // that finds none posted is an RNR error.
  for (int i = 0; i < options.rdma.slots + 8; ++i) {
    ibv_recv_wr wr{};
    wr.wr_id = makeWorkId(id(), WorkKind::kRecv, 0);
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) {
      throw Error("ibv_post_recv failed: " + std::string(std::strerror(rc)));
    }
    ++posted_;
  }
  failed_ = false;
  shut_ = false;
  quiet_reported_ = true;
  pending_failure_.clear();
}

void RdmaLane::connectTo(const std::string& record) {
  const LaneInfo remote = LaneInfo::decode(std::vector<uint8_t>(record.begin(), record.end()));
  if (remote.rank != static_cast<uint32_t>(peer_) || remote.rail != static_cast<uint16_t>(rail_)) {
    throw ProtocolError("a connection record for rank " + std::to_string(remote.rank) + " rail " +
                        std::to_string(remote.rail) + " on the lane to rank " +
                        std::to_string(peer_) + " rail " + std::to_string(rail_));
  }
  // The staging ring is sized for the peer's ring once; a later record must match it.
  if (send_ring_.data != nullptr &&
      (remote.slots != remote_.slots || remote.slot_bytes != remote_.slot_bytes)) {
    throw ProtocolError("a connection record for another ring");
  }
  remote_ = remote;
  prepareSendSide();
  const QpTiming timing = driver_.options().timing();
  const VerbsApi& api = driver_.api();
  QpTransition rtr = rtrTransition(local_, remote_, timing);
  if (const int rc = api.modify_qp(qp_, &rtr.attr, rtr.mask); rc != 0) {
    throw Error("INIT->RTR failed: " + std::string(std::strerror(rc)) + " (remote qpn " +
                std::to_string(remote_.qpn) + ", lid " + std::to_string(remote_.lid) + ", mtu " +
                std::to_string(static_cast<int>(rtr.attr.path_mtu)) + ")");
  }
  QpTransition rts = rtsTransition(local_, remote_, timing);
  if (const int rc = api.modify_qp(qp_, &rts.attr, rts.mask); rc != 0) {
    throw Error("RTR->RTS failed: " + std::string(std::strerror(rc)));
  }
  attributes_.remote = "qpn " + std::to_string(remote_.qpn);
  attributes_.max_payload = remote_.slot_bytes - kHeaderBytes;
  attributes_.reads = !reads_.empty();
  connected_ = true;
}

void RdmaLane::prepareSendSide() {
  if (send_ring_.data == nullptr) {
    Rail& rail = driver_.rail(rail_);
    send_ring_ =
        allocateRegistered(driver_.api(), rail.pd, size_t{remote_.slots} * remote_.slot_bytes,
                           IBV_ACCESS_LOCAL_WRITE, "a send staging ring");
    in_flight_.assign(remote_.slots, nullptr);
  }
  send_.emplace(remote_.slots);
  reads_.assign(static_cast<size_t>(std::min(kMaxReadDepth, readDepth(local_, remote_))), {});
  writes_.assign(kMaxWriteDepth, {});
}

std::string RdmaLane::connectRecord(uint32_t generation) {
  makeQueuePair(generation);
  const std::vector<uint8_t> bytes = local_.encode();
  return std::string(bytes.begin(), bytes.end());
}

std::string RdmaLane::acceptRecord(uint32_t generation, const std::string& record) {
  makeQueuePair(generation);
  connectTo(record);
  const std::vector<uint8_t> bytes = local_.encode();
  return std::string(bytes.begin(), bytes.end());
}

void RdmaLane::completeRecord(uint32_t generation, const std::string& record) {
  if (generation != generation_ || qp_ == nullptr) {
    throw Error("an answer for generation " + std::to_string(generation) + ", the lane is at " +
                std::to_string(generation_));
  }
  connectTo(record);
}

void RdmaLane::teardownLocked() {
  const VerbsApi& api = driver_.api();
  destroyQueuePair();
  connected_ = false;
  failed_ = true;
  shut_ = true;
  // User memory registered for moves still pending (a failure, a close with requests
  // outstanding): before the protection domain goes.
  for (ibv_mr* mr : registrations_) api.dereg_mr(mr);
  registrations_.clear();
  freeRegistered(api, recv_ring_);
  freeRegistered(api, send_ring_);
  std::fill(in_flight_.begin(), in_flight_.end(), nullptr);
}

}  // namespace railshard::transport::links::ibverbs
