#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/config.h"
#include "base/types.h"
#include "transport/message_tag.h"

namespace railshard {

namespace collectives {
class CudaDeviceOps;
struct Context;
}  // namespace collectives
class HierarchicalAllreduce;
class Membership;
class Planner;

// Where a call's buffers live and, for device buffers, the CUDA stream it is ordered on
// (Communicator::Placement).
struct Placement {
  MemoryKind memory = MemoryKind::kAuto;
  void* stream = nullptr;  // cudaStream_t; nullptr = the legacy default stream
};

// Collectives on CUDA device buffers (docs/gpu.md): the two-level all-reduce with NCCL inside
// a host where it can run (core/hierarchical_allreduce.h), else the staging algorithms over the
// communicator's messengers — pinned host buffers on the wire, reductions on the device —
// ordered on the caller's stream. Never run on a GPU here (none in CI): CUDA is opened at run
// time, and without a device nothing below is reached.
class DevicePath {
 public:
  // What a device collective needs of its communicator: its sequence numbers, the algorithm's
  // name, and one collective run as a host one runs (headers, deadlines, errors, the trace).
  struct Call {
    uint64_t& sequence;
    Planner& planner;
    std::function<void(const transport::MessageTag&, Duration, size_t, const char*,
                       const std::function<void(const collectives::Context&)>&)>
        run;
  };

  DevicePath(const Config& config, const Membership& membership);
  ~DevicePath();
  DevicePath(const DevicePath&) = delete;
  DevicePath& operator=(const DevicePath&) = delete;

  // True when the call's buffers are device memory (placement.memory, or asked of CUDA for
  // kAuto); ConfigError for kDevice without CUDA, InvalidArgument for a host/device mix. Null
  // buffers (count 0, a non-root's broadcast send) do not count; count 0 is always host
  // (nothing is moved, and every rank must agree on the path).
  bool onDevice(const char* collective, const Placement& placement, const void* send,
                const void* recv, size_t count) const;
  void allreduce(const Call& call, const void* send, void* recv, size_t count, DataType dtype,
                 ReduceOp op, void* stream, Duration timeout);
  void reduceScatter(const Call& call, const void* send, void* recv, size_t recv_count,
                     DataType dtype, ReduceOp op, void* stream, Duration timeout);
  void allgather(const Call& call, const void* send, void* recv, size_t send_count, DataType dtype,
                 void* stream, Duration timeout);
  void broadcast(const Call& call, const void* send, void* recv, size_t count, DataType dtype,
                 int root, void* stream, Duration timeout);
  // Communicator::waitForDevice.
  void waitForDevice(void* stream, int device, Duration limit);

 private:
  // The staging machinery for `device`, made on first use; makes `device` current.
  collectives::CudaDeviceOps& deviceOps(int device);
  // One staging collective: begin(stream), run `fn`, end(stream) — also when `fn` fails, so
  // that the user's stream stays ordered after whatever device work the failed collective left
  // queued.
  void runStaged(
      const Call& call, const transport::MessageTag& tag, Duration timeout, size_t bytes,
      const char* algorithm, int device, void* stream,
      const std::function<void(const collectives::Context&, collectives::CudaDeviceOps&)>& fn);
  // The two-level all-reduce, decided (collectively, through the store) on the first device
  // all-reduce; null when it cannot run here (hierarchical_why_ says why).
  HierarchicalAllreduce* hierarchical(int device, Duration timeout);
  // Host of every rank, by rank: from the cluster graph, else exchanged through the store.
  std::vector<std::string> hostOfEveryRank(Duration timeout);
  // Why NCCL cannot run: two ranks of one host on the same GPU ("" when none), from every
  // rank's PCI bus id exchanged through the store.
  std::string sharedGpu(const std::vector<std::string>& hosts, int device, Duration timeout);

  const Config& config_;
  const Membership& membership_;
  std::unique_ptr<collectives::CudaDeviceOps> device_ops_;
  int device_ops_device_ = -1;
  std::unique_ptr<HierarchicalAllreduce> hierarchical_;
  bool hierarchical_decided_ = false;
  std::string hierarchical_why_;
  // Set when building the two-level all-reduce failed: every later device all-reduce raises it
  // (falling back to staging on some ranks only would leave the ranks on different paths).
  std::exception_ptr hierarchical_error_;
};

}  // namespace railshard
