// --backend gloo: Gloo (Debian's libgloo-dev, a 2022 snapshot, version 0.5.0) over its TCP
// transport — the library behind torch.distributed's "gloo" backend on CPUs. Ranks meet
// through the same store railshard uses (launcher::bootstrapStore), so it runs under
// railshard-launch (or mpirun, Slurm, torchrun) exactly like the railshard backend.
//
// Algorithms (--gloo-algo):
//   ring  gloo::allreduce with the ring algorithm: what torch's ProcessGroupGloo calls for
//         CPU tensors. Reduce-scatter + all-gather, segments of at most 1 MiB, two in flight;
//         takes separate input and output buffers.
//   hd    gloo::AllreduceHalvingDoubling<T>: recursive halving/doubling, log2(n) steps, so
//         fewer hops for small messages. In place only: out-of-place copies send to recv
//         first, inside the timed call. Its buffers are registered with the pairs when it is
//         built, so one instance is kept for the last (buffer, count, dtype, op), as Gloo
//         intends (build once, run many times); building it is not timed.
//   auto  hd below kAutoRingBytes, ring from there on (default).
// Reductions are Gloo's own (gloo/math.h), as users of Gloo get them; avg is not a Gloo op, so
// it runs as sum and each rank divides its result locally, inside the timed call.
#include <gloo/algorithm.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <climits>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "base/error.h"
#include "benchmarks/gloo_store.h"
#include "benchmarks/perf_backend.h"
#include "kernels/reduce.h"
#include "launcher/init.h"

namespace railshard::bench {
namespace {

// Where auto switches from halving-doubling to ring. Measured here (2 cores, 2026-11-30,
// float sum, 32 KiB..32 MiB, np 2 and 4, two sweeps each, machine shared with builds): below
// 2 MiB hd was faster at both world sizes, by up to 10-20x at 32-512 KiB, where the ring's
// 2 x size segments each cost a wake-up of Gloo's event-loop thread (a 4 ms tick when the
// core is busy); at 2 MiB they tied; from 8 MiB the ring's pipelining won (about 1.3-1.6x).
constexpr size_t kAutoRingBytes = size_t{4} << 20;

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &gloo::sum<T>;
    case ReduceOp::kProd:
      return &gloo::product<T>;
    case ReduceOp::kMin:
      return &gloo::min<T>;
    case ReduceOp::kMax:
      return &gloo::max<T>;
  }
  return nullptr;
}

template <typename T>
const gloo::ReductionFunction<T>* reductionFunction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return gloo::ReductionFunction<T>::sum;
    case ReduceOp::kProd:
      return gloo::ReductionFunction<T>::product;
    case ReduceOp::kMin:
      return gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax:
      return gloo::ReductionFunction<T>::max;
  }
  return nullptr;
}

// Calls fn.template operator()<T>() with the Gloo element type of `dtype`. bfloat16 has no
// Gloo type (checkSupported rejects it before any call reaches here).
template <typename Fn>
void withGlooType(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32:
      return fn.template operator()<float>();
    case DataType::kFloat64:
      return fn.template operator()<double>();
    case DataType::kFloat16:
      return fn.template operator()<gloo::float16>();
    case DataType::kInt32:
      return fn.template operator()<int32_t>();
    case DataType::kInt64:
      return fn.template operator()<int64_t>();
    case DataType::kUInt8:
      return fn.template operator()<uint8_t>();
    case DataType::kBFloat16:
      break;
  }
  throwUnsupported("gloo", "datatype " + std::string(name(dtype)));
}

class GlooBackend : public PerfBackend {
 public:
  explicit GlooBackend(const PerfOptions& options) : algo_(options.gloo_algo) {
    launcher::Bootstrap boot = launcher::bootstrapStore();
    rank_ = boot.rank;
    size_ = boot.size;
    store_ = boot.store;
    server_ = boot.server_keepalive;
    // The address peers reach this rank at, chosen as for railshard's own data connections
    // (RAILSHARD_SOCKET_IFNAME, else the route to the store host, loopback on one host).
    host_ = boot.advertise_host.empty() ? "127.0.0.1" : boot.advertise_host;
    gloo::transport::tcp::attr attr;
    attr.hostname = host_;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context_->setTimeout(boot.config.timeout);
    if (size_ > 1) {
      GlooStore store(store_, "allreduce_perf/gloo/", boot.config.connect_timeout);
      context_->connectFullMesh(store, device_);
    }
  }

  ~GlooBackend() override {
    // Reached without shutdown() only when a collective failed; tear down with a short
    // bound rather than hang in the failure path.
    if (context_) teardown(std::chrono::seconds(5));
  }

  std::string_view name() const override { return "gloo"; }
  std::string describe() const override {
    const std::string algorithm = algo_ == "ring" ? "ring (gloo::allreduce)"
                                  : algo_ == "hd" ? "halving-doubling (AllreduceHalvingDoubling)"
                                                  : "auto (halving-doubling below " +
                                                        std::to_string(kAutoRingBytes >> 20) +
                                                        " MiB, ring from there)";
    return "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) +
           "." + std::to_string(GLOO_VERSION_PATCH) + " (libgloo-dev), tcp on " + host_ +
           ", algorithm " + algorithm + ", " + std::to_string(size_) +
           " ranks; avg = sum then a local divide";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void checkSupported(DataType dtype, ReduceOp) const override {
    if (dtype == DataType::kBFloat16) {
      throwUnsupported(name(), "datatype bfloat16", "Gloo has no bfloat16 type");
    }
  }

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    const size_t bytes = count * sizeOf(dtype);
    if (count == 0) return;  // Gloo refuses empty buffers; nothing to reduce anyway
    if (size_ == 1) {
      // Gloo's ring needs a neighbour; with one rank the result is the input.
      if (send != recv) std::memcpy(recv, send, bytes);
    } else if (algo_ == "ring" || (algo_ == "auto" && bytes >= kAutoRingBytes)) {
      withGlooType(dtype, [&]<typename T>() { ring<T>(send, recv, count, op); });
    } else {
      if (send != recv) std::memcpy(recv, send, bytes);
      withGlooType(dtype, [&]<typename T>() { halvingDoubling<T>(recv, count, dtype, op); });
    }
    if (op == ReduceOp::kAvg) kernels::divide(recv, count, dtype, static_cast<size_t>(size_));
  }

  void barrier() override {
    if (size_ == 1) return;
    gloo::BarrierOptions options(context_);
    gloo::barrier(options);
  }

  double combine(double value, Combine how) override {
    if (how == Combine::kRoot && rank_ != 0) value = 0;  // the sum is then rank 0's value
    const ReduceOp op = how == Combine::kMin   ? ReduceOp::kMin
                        : how == Combine::kMax ? ReduceOp::kMax
                                               : ReduceOp::kSum;
    if (size_ > 1) ring<double>(&value, &value, 1, op);
    return how == Combine::kAvg ? value / size_ : value;
  }
  int64_t sumInt64(int64_t value) override {
    if (size_ > 1) ring<int64_t>(&value, &value, 1, ReduceOp::kSum);
    return value;
  }

  bool shutdown(std::chrono::milliseconds limit) override {
    // Every rank is done with the data before any pair closes, so no peer sees a reset
    // mid-transfer; after this barrier nobody reads the store either.
    barrier();
    return teardown(limit);
  }

 private:
  template <typename T>
  void ring(const void* send, void* recv, size_t count, ReduceOp op) {
    gloo::AllreduceOptions options(context_);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    // Gloo reads the input only; its API takes non-const pointers.
    if (send != recv) options.setInput(static_cast<T*>(const_cast<void*>(send)), count);
    options.setOutput(static_cast<T*>(recv), count);
    options.setReduceFunction(reduceFn<T>(op));
    gloo::allreduce(options);
  }

  template <typename T>
  void halvingDoubling(void* buffer, size_t count, DataType dtype, ReduceOp op) {
    if (!hd_ || hd_buffer_ != buffer || hd_count_ != count || hd_dtype_ != dtype || hd_op_ != op) {
      if (count > static_cast<size_t>(INT_MAX)) {
        throw InvalidArgument("gloo halving-doubling: count " + std::to_string(count) +
                              " exceeds Gloo's int count");
      }
      hd_.reset();  // its buffers go before the new ones are registered
      hd_ = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(
          context_, std::vector<T*>{static_cast<T*>(buffer)}, static_cast<int>(count),
          reductionFunction<T>(op));
      hd_buffer_ = buffer;
      hd_count_ = count;
      hd_dtype_ = dtype;
      hd_op_ = op;
    }
    hd_->run();
  }

  // FIELD-NOTES: Gloo's teardown (torch 1.13) sometimes hangs with 3 processes on 2 cores.
  // Its pairs close in the context's and device's destructors, so they run on a helper
  // thread that gets `limit`; when it is not done by then the thread is left behind and the
  // caller exits without waiting (the kernel closes the sockets).
  bool teardown(std::chrono::milliseconds limit) {
    hd_.reset();
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    std::thread closer([context = std::move(context_), device = std::move(device_),
                        store = std::move(store_), server = std::move(server_), done]() mutable {
      context.reset();
      device.reset();
      store.reset();
      server.reset();
      done->set_value();
    });
    if (finished.wait_for(limit) == std::future_status::ready) {
      closer.join();
      return true;
    }
    closer.detach();
    return false;
  }

  std::string algo_;
  int rank_ = 0;
  int size_ = 1;
  std::string host_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<void> server_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::unique_ptr<gloo::Algorithm> hd_;
  void* hd_buffer_ = nullptr;
  size_t hd_count_ = 0;
  DataType hd_dtype_ = DataType::kFloat32;
  ReduceOp hd_op_ = ReduceOp::kSum;
};

}  // namespace

std::unique_ptr<PerfBackend> makeGlooBackend(const PerfOptions& options) {
  return std::make_unique<GlooBackend>(options);
}

}  // namespace railshard::bench
