// --backend railshard (the default): the world Communicator that init() builds from whatever
// launched the process (railshard-launch, mpirun, Slurm, torchrun).
#include <memory>
#include <string>

#include "benchmarks/perf_backend.h"
#include "core/communicator.h"
#include "launcher/init.h"

namespace railshard::bench {
namespace {

class RailshardBackend : public PerfBackend {
 public:
  RailshardBackend() : comm_(init()) {}

  std::string_view name() const override { return "railshard"; }
  std::string describe() const override {
    // Which transport the communicator chose, and what was asked for (RAILSHARD_TRANSPORT).
    return std::string("railshard over ") + (comm_->usesSharedMemory() ? "shm" : "tcp") +
           " (RAILSHARD_TRANSPORT=" + comm_->config().transport + "), " +
           std::to_string(comm_->size()) + " ranks, chunk " +
           std::to_string(comm_->config().chunk_bytes) + " bytes";
  }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  // Every dtype and op of core/base/types.h is native.
  void checkSupported(DataType, ReduceOp) const override {}

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    comm_->allreduce(send, recv, count, dtype, op);
  }
  void barrier() override { comm_->barrier(); }

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
};

}  // namespace

std::unique_ptr<PerfBackend> makeRailshardBackend(const PerfOptions&) {
  return std::make_unique<RailshardBackend>();
}

}  // namespace railshard::bench
