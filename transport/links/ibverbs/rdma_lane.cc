// A lane's data path: frames through staging slots into the peer's ring, credits, one-sided
// moves, and what its completions say (rdma_lane.h).
#include "transport/links/ibverbs/rdma_lane.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/ibverbs/device_registration.h"
#include "transport/links/ibverbs/rdma_work.h"

namespace railshard::transport::links::ibverbs {

namespace {

constexpr size_t kHeaderBytes = sizeof(messaging::FrameHeader);
// GPU registrations kept per rail (idle ones beyond this are deregistered, oldest first).
constexpr size_t kDeviceCacheBytes = size_t{8} << 30;

}  // namespace

RdmaLane::RdmaLane(RdmaDriver& driver, uint32_t index, int peer, int rail,
                   LinkAttributes attributes)
    : driver_(driver),
      index_(index),
      peer_(peer),
      rail_(rail),
      attributes_(std::move(attributes)) {}

RdmaLane::~RdmaLane() = default;

std::string RdmaLane::name() const {
  const Rail& r = driver_.rail(rail_);
  return "RDMA rail " + r.port.device + ":" + std::to_string(r.port.port) + " to rank " +
         std::to_string(peer_);
}

int RdmaLane::postSendLocked(ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, &wr, &bad);
  if (rc == 0) {
    ++posted_;
    ++send_outstanding_;
  }
  return rc;
}

bool RdmaLane::canPost() const {
  return connected_ && !failed_ && !shut_ && controls_.empty() && send_outstanding_ < send_depth_ &&
         send_ && send_->available();
}

bool RdmaLane::post(const messaging::OutFramePtr& frame) {
  writeFrame(frame->header, frame->data, frame->device, frame);
  return false;  // complete when the peer's HCA acknowledges the write
}

void RdmaLane::postControl(const messaging::FrameHeader& header, const std::string& payload) {
  if (!connected_ || failed_ || shut_) return;
  if (payload.size() + kHeaderBytes > remote_.slot_bytes) {
    RS_LOG_WARN("rank {}: {}: a {}-byte control frame does not fit a slot; dropped",
                driver_.options().rank, name(), payload.size());
    return;
  }
  controls_.push_back(Control{header, payload});
  postControlsLocked();
}

void RdmaLane::postControlsLocked() {
  while (!controls_.empty() && connected_ && !failed_ && !shut_ &&
         send_outstanding_ < send_depth_ && send_->available()) {
    Control control = std::move(controls_.front());
    controls_.pop_front();
    if (!writeFrame(control.header, reinterpret_cast<const uint8_t*>(control.payload.data()), false,
                    nullptr)) {
      return;
    }
  }
}

bool RdmaLane::writeFrame(const messaging::FrameHeader& header, const uint8_t* payload, bool device,
                          const messaging::OutFramePtr& frame) {
  const std::optional<uint32_t> acquired = send_->acquire();
  if (!acquired) return false;  // canPost() said there was room: not reached
  const uint32_t slot = *acquired;
  uint8_t* base = send_ring_.data + size_t{slot} * remote_.slot_bytes;
  std::memcpy(base, &header, kHeaderBytes);
  ibv_sge sge[2]{};
  sge[0].addr = reinterpret_cast<uint64_t>(base);
  sge[0].lkey = send_ring_.mr->lkey;
  sge[0].length = static_cast<uint32_t>(kHeaderBytes + header.length);
  int num_sge = 1;
  if (device && header.length > 0) {
    Rail& rail = driver_.rail(rail_);
    RegistrationCache::Lease lease;
    if (driver_.cuda() != nullptr) {
      try {
        if (!rail.device_cache) {
          ibv_pd* pd = rail.pd;
          const VerbsApi* api = &driver_.api();
          const CudaDriver* cuda = driver_.cuda();
          const int rank = driver_.options().rank;
          rail.device_cache = std::make_unique<RegistrationCache>(
              [api, cuda, pd, rank](uintptr_t start, size_t length) {
                std::string method;
                Registration r = registerDeviceMemory(*api, *cuda, pd, start, length, method);
                RS_LOG_DEBUG("rank {}: GPU memory registered for RDMA by {}", rank, method);
                return r;
              },
              [api](const Registration& r) { api->dereg_mr(static_cast<ibv_mr*>(r.handle)); },
              kDeviceCacheBytes);
        }
        lease = rail.device_cache->acquire(payload, header.length);
      } catch (const Error& e) {
        RS_LOG_DEBUG("rank {}: {}: GPUDirect RDMA unavailable, staging through host memory: {}",
                     driver_.options().rank, name(), e.what());
      }
    }
    if (lease) {
      // GPUDirect RDMA: the HCA reads the payload from GPU memory; only the header is staged.
      sge[0].length = static_cast<uint32_t>(kHeaderBytes);
      sge[1].addr = reinterpret_cast<uint64_t>(payload);
      sge[1].length = static_cast<uint32_t>(header.length);
      sge[1].lkey = lease->lkey;
      num_sge = 2;
    } else {
      std::string why;
      if (driver_.cuda() == nullptr ||
          !driver_.cuda()->copyToHost(base + kHeaderBytes, payload, header.length, why)) {
        failLocked("copying a GPU send buffer to host memory failed: " + why);
        return false;
      }
    }
  } else if (header.length > 0) {
    std::memcpy(base + kHeaderBytes, payload, header.length);
  }
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(id(), WorkKind::kData, slot);
  wr.sg_list = sge;
  wr.num_sge = num_sge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(encodeImmediate(Immediate{ImmKind::kData, slot}));
  wr.wr.rdma.remote_addr = remote_.ring_addr + uint64_t{slot} * remote_.slot_bytes;
  wr.wr.rdma.rkey = remote_.ring_rkey;
  if (const int rc = postSendLocked(wr); rc != 0) {
    failLocked(std::string("ibv_post_send failed: ") + std::strerror(rc));
    return false;
  }
  in_flight_[slot] = frame;
  return true;
}

void RdmaLane::returnCreditsLocked(bool force) {
  if (!connected_ || failed_ || shut_ || send_outstanding_ >= send_depth_) return;
  const uint32_t batch = std::max<uint32_t>(1, local_.slots / 2);
  const uint32_t count = recv_->takeCredits(batch, force);
  if (count == 0) return;
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(id(), WorkKind::kCredit, count);
  wr.num_sge = 0;  // a zero-length write: only the immediate matters
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(encodeImmediate(Immediate{ImmKind::kCredit, count}));
  wr.wr.rdma.remote_addr = remote_.ring_addr;
  wr.wr.rdma.rkey = remote_.ring_rkey;
  if (const int rc = postSendLocked(wr); rc != 0) {
    failLocked(std::string("ibv_post_send of credits failed: ") + std::strerror(rc));
  }
}

void RdmaLane::failLocked(const std::string& why) {
  if (failed_ || shut_) return;
  failed_ = true;
  // Stopped before its work moves: a read still running on it could otherwise land in a buffer
  // after the same bytes were read again elsewhere and the caller reused it.
  if (qp_ != nullptr) {
    ibv_qp_attr error{};
    error.qp_state = IBV_QPS_ERR;
    (void)driver_.api().modify_qp(qp_, &error, IBV_QP_STATE);
  }
  // Reported from the driver's thread (the messenger may be calling in now).
  pending_failure_ = name() + ": " + why;
  driver_.wake();
}

void RdmaLane::reportLocked() {
  if (!pending_failure_.empty()) {
    const std::string why = std::move(pending_failure_);
    pending_failure_.clear();
    messenger().linkFailedLocked(index(), why, false);
  }
  if (!shut_ || quiet_reported_ || posted_ > 0) return;
  quiet_reported_ = true;
  connected_ = false;
  messenger().quiescedLocked(index());
}

void RdmaLane::shutdown() {
  if (shut_) return;
  shut_ = true;
  failed_ = true;
  if (qp_ != nullptr) {
    ibv_qp_attr error{};
    error.qp_state = IBV_QPS_ERR;
    (void)driver_.api().modify_qp(qp_, &error, IBV_QP_STATE);
  }
  // What was posted on it is the messenger's to re-send; its completions (flushed) are only
  // counted from now on.
  std::fill(in_flight_.begin(), in_flight_.end(), nullptr);
  controls_.clear();
  for (auto* table : {&reads_, &writes_}) {
    for (auto& entry : *table) entry = OneSided{};
  }
  quiet_reported_ = false;
  driver_.wake();
}

void RdmaLane::detach() {
  // Staged frames are copies already; the one-sided moves' registrations are the messenger's
  // to drop (and dropped at once).
}

bool RdmaLane::idleLocked() const {
  return qp_ == nullptr || failed_ || shut_ || send_outstanding_ == 0;
}

bool RdmaLane::canPostOneSided(bool write) const {
  if (!connected_ || failed_ || shut_ || send_outstanding_ >= send_depth_) return false;
  const auto& table = write ? writes_ : reads_;
  return std::any_of(table.begin(), table.end(), [](const OneSided& s) { return !s.busy; });
}

bool RdmaLane::postOneSided(bool write, uint8_t* local, const MemoryKey& local_key, uint64_t remote,
                            uint64_t remote_key, size_t bytes, uint64_t cookie) {
  auto& table = write ? writes_ : reads_;
  const auto free_slot =
      std::find_if(table.begin(), table.end(), [](const OneSided& s) { return !s.busy; });
  const auto slot = static_cast<uint32_t>(free_slot - table.begin());
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(local);
  sge.length = static_cast<uint32_t>(bytes);
  sge.lkey = local_key.local_key;
  ibv_send_wr wr{};
  wr.wr_id = makeWorkId(id(), write ? WorkKind::kWrite : WorkKind::kRead, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = static_cast<uint32_t>(remote_key);
  if (const int rc = postSendLocked(wr); rc != 0) {
    failLocked(std::string("ibv_post_send of a ") + (write ? "rendezvous write" : "read") +
               " failed: " + std::strerror(rc));
    return false;
  }
  *free_slot = OneSided{true, cookie};
  return false;
}

MemoryKey RdmaLane::registerMemory(void* address, size_t bytes, int access) {
  int flags = 0;
  if (access & kLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* mr = driver_.api().reg_mr(driver_.rail(rail_).pd, address, bytes, flags);
  if (mr == nullptr) {
    throw Error("ibv_reg_mr of " + std::to_string(bytes) + " bytes failed: " +
                std::strerror(errno) + " (raise `ulimit -l`, or set RAILSHARD_IB_RENDEZVOUS=0)");
  }
  registrations_.insert(mr);
  return MemoryKey{mr->rkey, mr->lkey, mr};
}

void RdmaLane::deregister(MemoryKey& key) {
  auto* mr = static_cast<ibv_mr*>(key.handle);
  key = {};
  if (mr == nullptr || registrations_.erase(mr) == 0) return;  // gone with the driver already
  driver_.api().dereg_mr(mr);
}

void RdmaLane::asyncFailureLocked(bool of_qp, uint32_t qp_num, const std::string& why) {
  if (qp_ == nullptr || (of_qp && qp_->qp_num != qp_num)) return;
  failLocked(why);
  reportLocked();
}

void RdmaLane::completionLocked(const ibv_wc& wc) {
  // A queue pair made again only once the old one's work had all completed: a completion of
  // another generation cannot occur; dropped should a provider produce one.
  if ((workLane(wc.wr_id) >> 16) != generation_) return;
  --posted_;
  const WorkKind kind = workKind(wc.wr_id);
  if (kind != WorkKind::kRecv && send_outstanding_ > 0) --send_outstanding_;
  if ((shut_ || failed_) && kind == WorkKind::kRecv && wc.status == IBV_WC_SUCCESS) {
    lateFrameLocked(wc);
    if (shut_) reportLocked();
    return;
  }
  if (shut_) {
    reportLocked();
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    if (failed_) return;  // the flushes after the first error
    const char* what = kind == WorkKind::kRecv    ? "a receive"
                       : kind == WorkKind::kData  ? "an RDMA write"
                       : kind == WorkKind::kRead  ? "an RDMA read"
                       : kind == WorkKind::kWrite ? "a rendezvous write"
                                                  : "a credit write";
    std::string hint;
    if (wc.status == IBV_WC_RETRY_EXC_ERR) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%.1f",
                    retryExhaustedSeconds(driver_.options().timing()));
      hint = " (no acknowledgement within the retry budget, about " + std::string(seconds) +
             " s from RAILSHARD_IB_TIMEOUT and RAILSHARD_IB_RETRY_CNT: the peer died or the "
             "link is down)";
    } else if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR) {
      hint = " (the peer had no receive posted)";
    } else if (wc.status == IBV_WC_WR_FLUSH_ERR) {
      hint = " (the queue pair went into the error state)";
    }
    std::ostringstream vendor;
    vendor << std::hex << wc.vendor_err;
    failLocked(std::string(what) + " completed with " + driver_.api().statusText(wc.status) +
               ", vendor error 0x" + vendor.str() + hint);
    reportLocked();
    return;
  }
  if (failed_) return;
  try {
    switch (kind) {
      case WorkKind::kData: {
        const uint32_t slot = workValue(wc.wr_id);
        send_->completed(slot);
        messaging::OutFramePtr frame = std::move(in_flight_[slot]);
        in_flight_[slot] = nullptr;
        if (frame) messenger().completedLocked(index(), 1);
        break;
      }
      case WorkKind::kCredit:
        break;
      case WorkKind::kRead:
      case WorkKind::kWrite: {
        auto& table = kind == WorkKind::kWrite ? writes_ : reads_;
        const uint32_t slot = workValue(wc.wr_id);
        if (slot >= table.size() || !table[slot].busy) {
          throw ProtocolError("a one-sided completion for an idle slot " + std::to_string(slot));
        }
        const uint64_t cookie = table[slot].cookie;
        table[slot] = OneSided{};
        messenger().oneSidedDoneLocked(index(), cookie);
        break;
      }
      case WorkKind::kRecv: {
        // A write with immediate consumes one receive and scatters nothing: no buffers needed.
        ibv_recv_wr wr{};
        wr.wr_id = makeWorkId(id(), WorkKind::kRecv, 0);
        ibv_recv_wr* bad = nullptr;
        if (const int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) {
          throw Error(std::string("ibv_post_recv failed: ") + std::strerror(rc));
        }
        ++posted_;
        takeReceiveLocked(wc, true);
        break;
      }
    }
  } catch (const ProtocolError& e) {
    messenger().protocolErrorLocked(index(), name() + ": " + e.what());
    return;
  } catch (const Error& e) {
    failLocked(e.what());
    reportLocked();
    return;
  }
  if (failed_ || shut_) {
    reportLocked();
    return;
  }
  // A send-queue entry or a slot came free: what waits for room goes first, then the messenger.
  postControlsLocked();
  returnCreditsLocked(false);
  if (controls_.empty()) messenger().roomLocked(index());
}

void RdmaLane::lateFrameLocked(const ibv_wc& wc) {
  // The peer's write completed, so the peer counts the frame delivered (Delivery::kCompletion)
  // and will not send it again: it is in our ring, and taken even though the lane is failing
  // (its receive completed before the flushes), so that the failover report counts it.
  // Nothing is posted again; credits go nowhere.
  try {
    takeReceiveLocked(wc, false);
  } catch (const ProtocolError& e) {
    messenger().protocolErrorLocked(index(), name() + ": " + e.what());
  }
}

void RdmaLane::takeReceiveLocked(const ibv_wc& wc, bool live) {
  if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) throw ProtocolError("a write without immediate data");
  const Immediate imm = decodeImmediate(ntohl(wc.imm_data));
  if (imm.kind == ImmKind::kCredit) {
    if (live) send_->grant(imm.value);
    return;
  }
  onFrameLocked(imm.value, wc.byte_len);
}

void RdmaLane::onFrameLocked(uint32_t slot, uint32_t byte_len) {
  recv_->arrived(slot);  // ProtocolError when out of ring order
  const uint8_t* base = recv_ring_.data + size_t{slot} * local_.slot_bytes;
  messaging::FrameHeader header;
  std::memcpy(&header, base, kHeaderBytes);
  // Everything in the header is checked before a byte of it is used.
  messaging::validateFrameHeader(header, local_.slot_bytes - kHeaderBytes);
  if (byte_len != kHeaderBytes + header.length) {
    throw ProtocolError("a write of " + std::to_string(byte_len) + " bytes for a frame of " +
                        std::to_string(header.length));
  }
  messaging::Messenger::Landing landing = messenger().arrivingLocked(index(), header);
  if (header.length > 0 && !landing.discard && landing.target != nullptr) {
    std::memcpy(landing.target, base + kHeaderBytes, header.length);
  }
  messenger().landedLocked(index(), header, landing);
  recv_->release(slot);
}

}  // namespace railshard::transport::links::ibverbs
