// --backend railshard (the default): the world Communicator that init() builds from whatever
// launched the process (railshard-launch, mpirun, Slurm, torchrun). With --device cuda the
// buffers are on this rank's GPU and every all-reduce is ordered on one stream of ours
// (Communicator::Placement); the communicator picks its device path.
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "benchmarks/perf_backend.h"
#include "core/collectives/host_layout.h"
#include "core/communicator.h"
#include "core/topology/topology.h"
#include "kernels/cuda/device_runtime.h"
#include "launcher/init.h"
#include "transport/transport.h"

namespace railshard::bench {
namespace {

class RailshardBackend : public PerfBackend {
 public:
  explicit RailshardBackend(const PerfOptions& options) : comm_(init()) {
    if (options.memory != MemoryKind::kDevice) return;
    device_ = selectDevice(comm_->rank());
    stream_ = kernels::cuda::createStream();
  }
  ~RailshardBackend() override {
    if (stream_ == nullptr) return;
    try {
      kernels::cuda::destroyStream(stream_);
    } catch (...) {
      // Teardown after a device failure; the failure itself is what gets reported.
    }
  }

  std::string_view name() const override { return "railshard"; }
  std::string describe() const override {
    // Which transport the communicator chose, and what was asked for (RAILSHARD_TRANSPORT).
    // With several hosts: the layout, and shared memory inside each host plus the rails.
    const auto* layout = comm_->hostLayout();
    // Between hosts: the transport's own name ("tcp", or "ibverbs" over RDMA).
    const std::string between = comm_->transport().name();
    const std::string over = comm_->usesSharedMemory()       ? "shm"
                             : comm_->usesHostSharedMemory() ? "shm inside hosts + " + between
                                                             : between;
    return std::string("railshard over ") + over +
           (layout != nullptr && layout->hostCount() > 1 ? ", " + layout->describe() : "") +
           " (RAILSHARD_TRANSPORT=" + std::string(railshard::name(comm_->config().transport)) +
           "), " + std::to_string(comm_->size()) + " ranks, chunk " +
           std::to_string(comm_->config().chunk_bytes) + " bytes" +
           (device_ >= 0 ? ", device buffers on cuda:" + std::to_string(device_) : "");
  }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  std::vector<std::string> hosts() const override {
    const topology::Topology* topology = comm_->topology();
    if (topology == nullptr) return {};
    std::vector<std::string> hosts;
    for (const int world_rank : comm_->worldRanks()) {
      if (world_rank >= topology->worldSize()) return {};
      hosts.push_back(topology->rank(world_rank).host);
    }
    return hosts;
  }

  // The ring's slowest hop in the topology the communicator was built with (the ring
  // all-reduce moves busbw over every hop, so no algorithm here can beat it for long), or on
  // one host the measured shared-memory copy rate.
  tracing::LinkLimit linkLimit() const override { return comm_->linkLimit(); }

  // Every dtype and op of base/types.h is native.
  void checkSupported(DataType, ReduceOp) const override {}

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    if (stream_ == nullptr) {
      comm_->allreduce(send, recv, count, dtype, op);
    } else {
      comm_->allreduce(send, recv, count, dtype, op,
                       Communicator::Placement{MemoryKind::kDevice, stream_});
    }
  }
  void barrier() override { comm_->barrier(); }
  void* stream() const override { return stream_; }
  void synchronize() override {
    // Bounded, unlike cudaStreamSynchronize (a lost peer must not hang the benchmark).
    if (stream_ != nullptr) comm_->waitForDevice(stream_);
  }

  double combine(double value, Combine how) override {
    switch (how) {
      case Combine::kRoot:
        comm_->broadcast(&value, 1, DataType::kFloat64, 0);
        break;
      case Combine::kAvg:
        comm_->allreduce(&value, 1, DataType::kFloat64, ReduceOp::kAvg);
        break;
      case Combine::kMin:
        comm_->allreduce(&value, 1, DataType::kFloat64, ReduceOp::kMin);
        break;
      case Combine::kMax:
        comm_->allreduce(&value, 1, DataType::kFloat64, ReduceOp::kMax);
        break;
    }
    return value;
  }
  int64_t sumInt64(int64_t value) override {
    comm_->allreduce(&value, 1, DataType::kInt64, ReduceOp::kSum);
    return value;
  }

 private:
  std::unique_ptr<Communicator> comm_;
  int device_ = -1;                         // with device buffers: the GPU selectDevice() chose
  kernels::cuda::Stream stream_ = nullptr;  // with device buffers: ours, non-blocking
};

}  // namespace

std::unique_ptr<PerfBackend> makeRailshardBackend(const PerfOptions& options) {
  return std::make_unique<RailshardBackend>(options);
}

}  // namespace railshard::bench
