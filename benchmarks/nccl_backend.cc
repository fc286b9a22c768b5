// --backend nccl: ncclAllReduce on device buffers, the reference for GPU all-reduce. Ranks meet
// through the same store railshard uses (launcher::bootstrapStore), so it runs under
// railshard-launch, mpirun, Slurm or torchrun like the other backends; rank 0 makes the
// ncclUniqueId and publishes it there. NCCL is railshard's own dlopen'd NcclApi
// (core/collectives/nccl_api.h), so this binary loads on machines without libnccl and says so.
//
// Device buffers only: --backend nccl implies --device cuda (an explicit --device host is an
// error, see perf_options.cc). Each rank uses GPU local rank % devices (selectDevice()).
// allreduce() returns once NCCL has taken the work; synchronize() waits for the stream with a
// deadline (Config::timeout) and NCCL's asynchronous errors checked, so a lost peer ends the run
// with an error rather than a hang. The host values of the harness (times, #wrong, barriers)
// go through NCCL too, via an 8-byte device scratch buffer, as nccl-tests do.
//
// NEVER RUN ON A GPU here: the build machine has none; docs/gpu.md.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "base/error.h"
#include "benchmarks/perf_backend.h"
#include "core/collectives/nccl_api.h"
#include "kernels/cuda/device_runtime.h"
#include "launcher/init.h"

namespace railshard::bench {
namespace {

using collectives::NcclApi;
namespace nccl = collectives::nccl;
namespace cuda = kernels::cuda;

const NcclApi& loadNccl() {
  const NcclApi* api = NcclApi::get();
  if (api == nullptr) throw ConfigError("--backend nccl: " + NcclApi::unavailableReason());
  return *api;
}

class NcclBackend : public PerfBackend {
 public:
  NcclBackend() : api_(loadNccl()) {
    launcher::Bootstrap boot = launcher::bootstrapStore();
    rank_ = boot.rank;
    size_ = boot.size;
    timeout_ = boot.config.timeout;
    server_ = boot.server_keepalive;
    device_ = selectDevice(rank_);

    const std::string key = "allreduce_perf/nccl/id";
    nccl::UniqueId id{};
    if (rank_ == 0) {
      api_.check(api_.getUniqueId(&id), "ncclGetUniqueId");
      boot.store->set(key, Store::Bytes(id.internal, id.internal + sizeof(id.internal)),
                      boot.config.connect_timeout);
    } else {
      const Store::Bytes bytes = boot.store->get(key, boot.config.connect_timeout);
      if (bytes.size() != sizeof(id.internal)) {
        throw ProtocolError("--backend nccl: the ncclUniqueId in the store has " +
                            std::to_string(bytes.size()) + " bytes");
      }
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    stream_ = cuda::createStream();
    event_ = cuda::createEvent();
    scratch_ = cuda::allocateDevice(sizeof(double));
    comm_ = api_.initRank(size_, id, rank_, deadlineAfter(boot.config.connect_timeout),
                          "--backend nccl");
  }

  ~NcclBackend() override {
    try {
      // Reached without shutdown() only after a failure: abort, which never waits for peers.
      if (comm_ != nullptr) api_.commAbort(comm_);
      if (scratch_ != nullptr) cuda::freeDevice(scratch_);
      if (event_ != nullptr) cuda::destroyEvent(event_);
      if (stream_ != nullptr) cuda::destroyStream(stream_);
    } catch (...) {
      // Best effort: the failure that brought us here is what gets reported.
    }
  }

  std::string_view name() const override { return "nccl"; }
  std::string describe() const override {
    return "nccl " + api_.versionString() + " (" + api_.path() + ", dlopen), " +
           std::to_string(size_) + " ranks, device buffers on cuda:" + std::to_string(device_) +
           ", non-blocking communicator";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Every railshard dtype and op has an NCCL counterpart (nccl::dataType / redOp).
  void checkSupported(DataType, ReduceOp) const override {}

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    api_.check(
        api_.allReduce(send, recv, count, nccl::dataType(dtype), nccl::redOp(op), comm_, stream_),
        "ncclAllReduce", comm_);
    api_.waitReady(comm_, deadlineAfter(timeout_), "ncclAllReduce");
  }
  void barrier() override { reduceHost<int32_t>(0, DataType::kInt32, ReduceOp::kSum); }
  void* stream() const override { return stream_; }
  void synchronize() override { waitStream("synchronizing the stream"); }

  double combine(double value, Combine how) override {
    switch (how) {
      case Combine::kRoot: {
        cuda::copyAsync(scratch_, &value, sizeof(value), stream_);
        api_.check(api_.broadcast(scratch_, scratch_, 1, nccl::dataType(DataType::kFloat64), 0,
                                  comm_, stream_),
                   "ncclBroadcast", comm_);
        api_.waitReady(comm_, deadlineAfter(timeout_), "ncclBroadcast");
        waitStream("ncclBroadcast");
        cuda::copy(&value, scratch_, sizeof(value));
        return value;
      }
      case Combine::kAvg:
        return reduceHost<double>(value, DataType::kFloat64, ReduceOp::kSum) / size_;
      case Combine::kMin:
        return reduceHost<double>(value, DataType::kFloat64, ReduceOp::kMin);
      case Combine::kMax:
        return reduceHost<double>(value, DataType::kFloat64, ReduceOp::kMax);
    }
    return value;
  }
  int64_t sumInt64(int64_t value) override {
    return reduceHost<int64_t>(value, DataType::kInt64, ReduceOp::kSum);
  }

  bool shutdown(std::chrono::milliseconds) override {
    barrier();  // nobody is still in a collective when the communicators go
    api_.check(api_.commDestroy(comm_), "ncclCommDestroy");
    comm_ = nullptr;
    return true;
  }

 private:
  // One value all-reduced through the scratch buffer. The copy back waits for the stream first
  // (bounded), so a lost peer cannot block it.
  template <typename T>
  T reduceHost(T value, DataType dtype, ReduceOp op) {
    cuda::copyAsync(scratch_, &value, sizeof(T), stream_);
    api_.check(api_.allReduce(scratch_, scratch_, 1, nccl::dataType(dtype), nccl::redOp(op), comm_,
                              stream_),
               "ncclAllReduce", comm_);
    api_.waitReady(comm_, deadlineAfter(timeout_), "ncclAllReduce");
    waitStream("ncclAllReduce of a host value");
    cuda::copy(&value, scratch_, sizeof(T));
    return value;
  }

  // cudaStreamSynchronize with a deadline: polls an event, checking NCCL's asynchronous error
  // (a peer that failed) meanwhile; TimeoutError after RAILSHARD_TIMEOUT.
  void waitStream(const char* what) {
    cuda::recordEvent(event_, stream_);
    const Deadline deadline = deadlineAfter(timeout_);
    for (auto pause = std::chrono::microseconds(5); !cuda::eventDone(event_);) {
      api_.checkAsync(comm_, what);
      if (Clock::now() >= deadline) {
        throw TimeoutError("--backend nccl: " + std::string(what) + " did not finish within " +
                           std::to_string(timeout_.count()) + " ms (a peer stopped?)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(500));
    }
  }

  const NcclApi& api_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::chrono::milliseconds timeout_{};
  std::shared_ptr<void> server_;  // rank 0: the store server, kept for the run
  nccl::Comm comm_ = nullptr;
  cuda::Stream stream_ = nullptr;
  cuda::Event event_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<PerfBackend> makeNcclBackend(const PerfOptions&) {
  return std::make_unique<NcclBackend>();
}

}  // namespace railshard::bench
