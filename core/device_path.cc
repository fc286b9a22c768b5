// Collectives on CUDA device buffers (docs/gpu.md): which calls take this path and how.
//  - all-reduce with several ranks on a host, NCCL loadable everywhere and the same number of
//    ranks per host: the two-level all-reduce (core/hierarchical_allreduce.h);
//  - everything else: the staging algorithms (core/collectives/device_staging.h) over this
//    communicator's transport — pinned host buffers on the wire, reductions on the device —
//    ordered on the caller's stream through CudaDeviceOps.
// The shared-memory engine is host memory only, so device collectives always run over the
// transport (run's over_transport), with the same headers and deadlines as host ones.
#include "core/device_path.h"

#include <functional>
#include <string>

#include "base/error.h"
#include "base/logging.h"
#include "core/collective_tag.h"
#include "core/collectives/cuda_device_ops.h"
#include "core/collectives/device_staging.h"
#include "core/hierarchical_allreduce.h"
#include "core/membership.h"
#include "core/planner.h"
#include "core/topology/topology.h"
#include "kernels/cuda/device_runtime.h"
#include "transport/links/shm/host_identity.h"

namespace railshard {
namespace {

namespace cuda = kernels::cuda;

const char* kindName(cuda::PointerKind kind) {
  return kind == cuda::PointerKind::kDevice ? "device" : "host";
}

// The device of a call's buffers (count > 0 here, so they are not null).
int deviceOf(const void* send, const void* recv) {
  const void* any = recv != nullptr ? recv : send;
  const int device = any != nullptr ? cuda::pointerDevice(any) : -1;
  return device >= 0 ? device : cuda::currentDevice();
}

// Polls `event` (recorded on the stream to wait for) until done, checking `healthy` between
// polls, within `deadline`.
void waitForEvent(cuda::Event event, const std::function<void()>& healthy, Deadline deadline,
                  const char* what) {
  collectives::pollUntilDone(
      [&] {
        if (healthy) healthy();
        return cuda::eventDone(event);
      },
      deadline, what);
}

}  // namespace

DevicePath::DevicePath(const Config& config, const Membership& membership)
    : config_(config), membership_(membership) {}

DevicePath::~DevicePath() = default;

bool DevicePath::onDevice(const char* collective, const Placement& placement, const void* send,
                          const void* recv, size_t count) const {
  // Nothing to move: the host path, on every rank alike whatever pointers each passed (an
  // empty tensor's may be null on one rank and not on another).
  if (count == 0 && placement.memory != MemoryKind::kDevice) return false;
  switch (placement.memory) {
    case MemoryKind::kHost:
      return false;
    case MemoryKind::kDevice:
      if (!cuda::available()) {
        throw ConfigError(std::string(collective) + ": device buffers were given, but " +
                          cuda::unavailableReason());
      }
      // A host pointer here would be read by copies and kernels as device memory: refuse it
      // while the cost is one query.
      for (const auto& [what, pointer] : {std::pair{"send", send}, std::pair{"recv", recv}}) {
        if (pointer != nullptr && cuda::pointerKind(pointer) != cuda::PointerKind::kDevice) {
          throw InvalidArgument(std::string(collective) + ": MemoryKind::kDevice, but " + what +
                                " is host memory");
        }
      }
      return count > 0;
    case MemoryKind::kAuto:
      break;
    default:
      throw InvalidArgument(std::string(collective) + ": unknown memory kind " +
                            std::to_string(static_cast<int>(placement.memory)));
  }
  // Without a usable device every pointer is host memory; asking CUDA costs about a
  // microsecond, so host-only processes never do.
  if (!cuda::available()) return false;
  const cuda::PointerKind send_kind =
      send != nullptr ? cuda::pointerKind(send) : cuda::PointerKind::kHost;
  const cuda::PointerKind recv_kind =
      recv != nullptr ? cuda::pointerKind(recv) : cuda::PointerKind::kHost;
  if (send != nullptr && recv != nullptr && send_kind != recv_kind) {
    throw InvalidArgument(std::string(collective) + ": send is " + kindName(send_kind) +
                          " memory but recv is " + kindName(recv_kind) +
                          " memory; both must be of one kind");
  }
  return (send != nullptr ? send_kind : recv_kind) == cuda::PointerKind::kDevice;
}

collectives::CudaDeviceOps& DevicePath::deviceOps(int device) {
  // The calling thread may be on another device (a process group's worker thread starts on
  // device 0): everything below runs on the buffers' device, which stays current.
  cuda::setDevice(device);
  // One set of streams, events and staging buffers per communicator, rebuilt only when the
  // caller moves to another device (rare: a rank normally owns one GPU).
  if (!device_ops_ || device_ops_device_ != device) {
    device_ops_.reset();
    device_ops_ = std::make_unique<collectives::CudaDeviceOps>(device);
    device_ops_device_ = device;
  }
  return *device_ops_;
}

std::vector<std::string> DevicePath::hostOfEveryRank(Duration timeout) {
  const int size = membership_.size();
  std::vector<std::string> hosts(static_cast<size_t>(size));
  const topology::Topology* graph = membership_.topology();
  if (graph != nullptr && graph->worldSize() == size) {
    for (int r = 0; r < size; ++r) hosts[static_cast<size_t>(r)] = graph->rank(r).host;
    return hosts;
  }
  Store& store = *membership_.store();
  const std::string prefix = membership_.keyPrefix() + "/device/host/";
  store.setString(prefix + std::to_string(membership_.rank()),
                  transport::links::shm::hostIdentity(), timeout);
  for (int r = 0; r < size; ++r) {
    hosts[static_cast<size_t>(r)] = store.getString(prefix + std::to_string(r), timeout);
  }
  return hosts;
}

std::string DevicePath::sharedGpu(const std::vector<std::string>& hosts, int device,
                                  Duration timeout) {
  // NCCL refuses two ranks on one GPU; ranks that share one (a test on a single-GPU machine,
  // oversubscribed jobs) use the staging path. Every rank sees the same list, so all decide
  // alike without a vote.
  Store& store = *membership_.store();
  const std::string prefix = membership_.keyPrefix() + "/device/gpu/";
  store.setString(prefix + std::to_string(membership_.rank()), cuda::pciBusId(device), timeout);
  std::vector<std::string> gpus(static_cast<size_t>(membership_.size()));
  for (int r = 0; r < membership_.size(); ++r) {
    gpus[static_cast<size_t>(r)] = store.getString(prefix + std::to_string(r), timeout);
  }
  for (size_t a = 0; a < gpus.size(); ++a) {
    for (size_t b = a + 1; b < gpus.size(); ++b) {
      if (hosts[a] == hosts[b] && gpus[a] == gpus[b]) {
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share GPU " +
               gpus[a] + " on host " + hosts[a] + " (NCCL needs a GPU of its own per rank)";
      }
    }
  }
  return {};
}

void DevicePath::runStaged(
    const Call& call, const transport::MessageTag& tag, Duration timeout, size_t bytes,
    const char* algorithm, int device, void* stream,
    const std::function<void(const collectives::Context&, collectives::CudaDeviceOps&)>& fn) {
  collectives::CudaDeviceOps& ops = deviceOps(device);
  ops.begin(stream);
  try {
    call.run(tag, timeout, bytes, algorithm,
             [&](const collectives::Context& context) { fn(context, ops); });
  } catch (...) {
    try {
      ops.end(stream);
    } catch (...) {
      // The collective's own error says more than a failure to order the stream after it.
    }
    throw;
  }
  ops.end(stream);
}

void DevicePath::waitForDevice(void* stream, int device, Duration limit) {
  if (!cuda::available()) {
    throw ConfigError("waitForDevice: " + cuda::unavailableReason());
  }
  if (device >= 0) cuda::setDevice(device);
  cuda::Event event = cuda::createEvent();
  try {
    cuda::recordEvent(event, stream);
    std::function<void()> healthy;
    if (hierarchical_) healthy = [this] { hierarchical_->checkHealthy(); };
    try {
      waitForEvent(event, healthy, deadlineAfter(limit), "the device work of the collectives");
    } catch (const TimeoutError& e) {
      // Stop NCCL kernels that wait for a peer that will never come, so the stream drains.
      if (hierarchical_) hierarchical_->abort(e.what());
      throw;
    }
  } catch (...) {
    cuda::destroyEvent(event);
    throw;
  }
  cuda::destroyEvent(event);
}

HierarchicalAllreduce* DevicePath::hierarchical(int device, Duration timeout) {
  if (hierarchical_error_) std::rethrow_exception(hierarchical_error_);
  if (hierarchical_decided_) {
    if (!hierarchical_ && config_.nccl == NcclMode::kOn) {
      throw ConfigError("RAILSHARD_NCCL=on, but the two-level all-reduce cannot run: " +
                        hierarchical_why_);
    }
    return hierarchical_.get();
  }
  hierarchical_decided_ = true;
  // Every rank reaches the same decision without talking when it needs no store round: the
  // configuration and the store's presence are the same on every rank.
  if (config_.nccl == NcclMode::kOff) {
    hierarchical_why_ = "RAILSHARD_NCCL=off";
  } else if (membership_.store() == nullptr) {
    hierarchical_why_ = "the communicator was created without a store";
  } else {
    HierarchicalAllreduce::Params params;
    params.store = membership_.store();
    params.key_prefix = membership_.keyPrefix();
    params.rank = membership_.rank();
    params.size = membership_.size();
    params.hosts = hostOfEveryRank(timeout);
    params.config = config_;
    params.advertise_host = membership_.advertiseHost();
    params.device = device;
    try {
      hierarchical_why_ = sharedGpu(params.hosts, device, timeout);
      if (hierarchical_why_.empty()) {
        hierarchical_ = HierarchicalAllreduce::create(params, hierarchical_why_);
      }
    } catch (...) {
      hierarchical_error_ = std::current_exception();
      throw;
    }
  }
  if (hierarchical_) {
    RS_LOG_INFO("rank {}: device all-reduce: {}", membership_.rank(), hierarchical_->describe());
  } else {
    if (config_.nccl == NcclMode::kOn) {
      throw ConfigError("RAILSHARD_NCCL=on, but the two-level all-reduce cannot run: " +
                        hierarchical_why_);
    }
    RS_LOG_INFO("rank {}: device all-reduce: pinned-host staging ({})", membership_.rank(),
                hierarchical_why_);
  }
  return hierarchical_.get();
}

void DevicePath::allreduce(const Call& call, const void* send, void* recv, size_t count,
                           DataType dtype, ReduceOp op, void* stream, Duration timeout) {
  const int device = deviceOf(send, recv);
  const int size = membership_.size();
  if (size > 1) {
    cuda::setDevice(device);
    if (HierarchicalAllreduce* two_level = hierarchical(device, timeout)) {
      ++call.sequence;  // every rank takes this path alike: sequence numbers stay in step
      call.planner.ran("hierarchical");
      two_level->allreduce(send, recv, count, dtype, op, stream,
                           std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      return;
    }
  }
  const auto tag = makeTag(CollectiveKind::kAllreduce, call.sequence++, dtype, op, count, 0);
  call.planner.ran(size == 1 ? "device_local" : "device_ring");
  runStaged(call, tag, timeout, count * sizeOf(dtype), call.planner.last().data(), device, stream,
            [&](const collectives::Context& context, collectives::CudaDeviceOps& ops) {
              collectives::deviceRingAllreduce(context, ops, send, recv, count, dtype, op);
            });
}

void DevicePath::reduceScatter(const Call& call, const void* send, void* recv, size_t recv_count,
                               DataType dtype, ReduceOp op, void* stream, Duration timeout) {
  const auto tag =
      makeTag(CollectiveKind::kReduceScatter, call.sequence++, dtype, op, recv_count, 0);
  const size_t bytes = recv_count * static_cast<size_t>(membership_.size()) * sizeOf(dtype);
  runStaged(call, tag, timeout, bytes, "device_ring", deviceOf(send, recv), stream,
            [&](const collectives::Context& context, collectives::CudaDeviceOps& ops) {
              collectives::deviceRingReduceScatter(context, ops, send, recv, recv_count, dtype, op);
            });
}

void DevicePath::allgather(const Call& call, const void* send, void* recv, size_t send_count,
                           DataType dtype, void* stream, Duration timeout) {
  const auto tag =
      makeTag(CollectiveKind::kAllgather, call.sequence++, dtype, ReduceOp::kSum, send_count, 0);
  const size_t bytes = send_count * static_cast<size_t>(membership_.size()) * sizeOf(dtype);
  runStaged(call, tag, timeout, bytes, "device_ring", deviceOf(send, recv), stream,
            [&](const collectives::Context& context, collectives::CudaDeviceOps& ops) {
              collectives::deviceAllgather(context, ops, send, recv, send_count, dtype);
            });
}

void DevicePath::broadcast(const Call& call, const void* send, void* recv, size_t count,
                           DataType dtype, int root, void* stream, Duration timeout) {
  const auto tag = makeTag(CollectiveKind::kBroadcast, call.sequence++, dtype, ReduceOp::kSum,
                           count, static_cast<uint32_t>(root));
  runStaged(call, tag, timeout, count * sizeOf(dtype), "device_chain",
            deviceOf(membership_.rank() == root ? send : nullptr, recv), stream,
            [&](const collectives::Context& context, collectives::CudaDeviceOps& ops) {
              collectives::deviceBroadcast(context, ops, send, recv, count, dtype, root);
            });
}

}  // namespace railshard
