#pragma once

// DeviceOps on a CUDA device through kernels::cuda (no CUDA headers here, so this compiles in
// every build; without CUDA the constructor raises ConfigError).
//
// Usage for one collective on device buffers (like NCCL's stream semantics, the host never
// blocks on the user's stream):
//   ops.begin(stream);  // the collective's device work starts after the stream's earlier work
//   deviceRingAllreduce(ctx, ops, send, recv, count, dtype, op);
//   ops.end(stream);    // the stream's later work sees the results
#include <cstddef>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "core/collectives/device_ops.h"
#include "kernels/cuda/device_runtime.h"

namespace railshard::collectives {

// Polls done() until it returns true, yielding the CPU (ranks may outnumber cores): a few
// yields, then sleeps growing to 100 us. TimeoutError naming `what` and the time waited once
// `deadline` passes.
void pollUntilDone(const std::function<bool()>& done, Deadline deadline, const char* what);

// One per communicator and device: an internal stream all enqueued work runs on, a pool of
// events for tickets, and device scratch and pinned buffers cached across collectives. Calls
// must come from one thread at a time.
class CudaDeviceOps : public DeviceOps {
 public:
  // Work runs on `device`, which becomes the calling thread's current device.
  explicit CudaDeviceOps(int device);
  ~CudaDeviceOps() override;
  CudaDeviceOps(const CudaDeviceOps&) = delete;
  CudaDeviceOps& operator=(const CudaDeviceOps&) = delete;

  // Makes `device` current on the calling thread and orders the internal stream after the work
  // enqueued on `user_stream` so far.
  void begin(kernels::cuda::Stream user_stream);
  // Orders `user_stream`'s later work after everything enqueued here so far.
  void end(kernels::cuda::Stream user_stream);

  void copyToHost(void* host, const void* device, size_t bytes) override;
  void copyToDevice(void* device, const void* host, size_t bytes) override;
  void copyOnDevice(void* dst, const void* src, size_t bytes) override;
  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
              ReduceOp op) override;
  void divide(void* data, size_t count, DataType dtype, size_t divisor) override;

  Ticket mark() override;
  void waitFor(Ticket ticket, Deadline deadline, const char* what) override;

  void* deviceScratch(size_t slot, size_t bytes) override;
  void* pinned(size_t slot, size_t bytes) override;

 private:
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };

  void copy(void* dst, const void* src, size_t bytes);
  // Returns to the pool the events of tickets up to `ticket`, known to be done.
  void retire(Ticket ticket);
  void releaseAll() noexcept;

  int device_;
  kernels::cuda::Stream stream_ = nullptr;
  kernels::cuda::Event begin_event_ = nullptr;
  kernels::cuda::Event end_event_ = nullptr;
  std::vector<kernels::cuda::Event> free_events_;
  std::deque<std::pair<Ticket, kernels::cuda::Event>> marked_;  // oldest first
  Ticket last_ticket_ = 0;
  Ticket done_ticket_ = 0;  // every ticket up to this one is known to be done
  std::vector<Buffer> scratch_;
  std::vector<Buffer> pinned_;
};

}  // namespace railshard::collectives
