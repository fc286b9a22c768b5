// GPU buffers in the RDMA transport. A send from CUDA device memory is registered with every
// rail's protection domain (dmabuf, else peer memory: device_registration.h) and written
// straight from GPU memory; when that is impossible the pieces are copied through the
// registered host staging slots, and the log says so once. Receives into device memory are
// copied from the host receive ring by the driver.
//
// NEVER RUN ON A GPU: this machine has none (docs/rdma.md). Without an NVIDIA driver cuda_ is
// null and none of this is reached.

#include <cstring>

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/device_registration.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

namespace {
// GPU registrations kept per rail (idle ones beyond this are deregistered, oldest first).
constexpr size_t kDeviceCacheBytes = size_t{8} << 30;
}  // namespace

void IbverbsTransport::prepareDeviceSendLocked(Peer& peer, SendOp& op) {
  op.device = true;
  op.leases.resize(rails_.size());
  try {
    for (const Lane* lane : peer.lanes) {
      Rail& rail = *rails_[static_cast<size_t>(lane->rail)];
      if (!rail.device_cache) {
        ibv_pd* pd = rail.pd;
        rail.device_cache = std::make_unique<RegistrationCache>(
            [this, pd](uintptr_t start, size_t length) {
              std::string method;
              Registration r = registerDeviceMemory(api_, *cuda_, pd, start, length, method);
              RS_LOG_DEBUG("rank {}: GPU memory registered for RDMA by {}", options_.rank, method);
              return r;
            },
            [this](const Registration& r) { api_.dereg_mr(static_cast<ibv_mr*>(r.handle)); },
            kDeviceCacheBytes);
      }
      op.leases[static_cast<size_t>(lane->rail)] = rail.device_cache->acquire(op.data, op.bytes());
    }
  } catch (const Error& e) {
    op.staged = true;
    op.leases.clear();
    if (!staging_logged_) {
      staging_logged_ = true;
      RS_LOG_WARN(
          "rank {}: GPUDirect RDMA unavailable, staging GPU buffers through host memory: {}",
          options_.rank, e.what());
    }
  }
}

bool IbverbsTransport::copyOutLocked(const SendOp& op, uint8_t* host, size_t offset,
                                     size_t length) {
  if (!op.device) {
    std::memcpy(host, op.data + offset, length);
    return true;
  }
  std::string why;
  if (cuda_->copyToHost(host, op.data + offset, length, why)) return true;
  failLocked(ErrorKind::kGeneric, "rank " + std::to_string(options_.rank) +
                                      ": copying a GPU send buffer to host memory failed: " + why);
  return false;
}

bool IbverbsTransport::copyInLocked(const RecvOp& op, size_t offset, const uint8_t* host,
                                    size_t length) {
  if (!op.device) {
    std::memcpy(op.data + offset, host, length);
    return true;
  }
  std::string why;
  if (cuda_->copyToDevice(op.data + offset, host, length, why)) return true;
  failLocked(ErrorKind::kGeneric, "rank " + std::to_string(options_.rank) +
                                      ": copying into a GPU receive buffer failed: " + why);
  return false;
}

}  // namespace railshard::transport::ibverbs
