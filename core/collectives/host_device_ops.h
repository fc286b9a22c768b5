#pragma once

// DeviceOps for "device memory that is host memory": the staging algorithms run on a CPU with
// the CPU kernels, for the test suite and for builds or machines without a GPU.
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "core/collectives/device_ops.h"

namespace railshard::collectives {

// Work runs at once when enqueued (memcpy, kernels::reduce/divide); waitFor returns at once.
class HostDeviceOps : public DeviceOps {
 public:
  void copyToHost(void* host, const void* device, size_t bytes) override;
  void copyToDevice(void* device, const void* host, size_t bytes) override;
  void copyOnDevice(void* dst, const void* src, size_t bytes) override;
  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
              ReduceOp op) override;
  void divide(void* data, size_t count, DataType dtype, size_t divisor) override;

  Ticket mark() override { return ++marked_; }
  void waitFor(Ticket ticket, Deadline deadline, const char* what) override;

  void* deviceScratch(size_t slot, size_t bytes) override;
  void* pinned(size_t slot, size_t bytes) override;

 private:
  static void* grow(std::vector<std::vector<uint8_t>>& buffers, size_t slot, size_t bytes);

  Ticket marked_ = 0;
  std::vector<std::vector<uint8_t>> scratch_;
  std::vector<std::vector<uint8_t>> pinned_;
};

// A device that lags behind the host as far as the interface allows: enqueued work is only
// queued, and runs (in order) when a waitFor() covers it or flush() is called. The
// destination of a copy to pinned memory is overwritten with garbage when the copy is
// enqueued (unless queued work still touches it), since its contents are undefined until the
// copy is waited for. So an algorithm that sends pinned memory before waiting for the copy
// that fills it, receives into pinned memory a queued copy still reads, or returns before its
// last copy into the result is waited for, computes wrong results here, even where
// HostDeviceOps (and a fast GPU, most of the time) would hide the missing wait.
class DeferredDeviceOps : public HostDeviceOps {
 public:
  static constexpr uint8_t kGarbage = 0xa5;

  // Queued work is dropped, not run: after a failed collective the buffers it names may
  // already be gone.
  ~DeferredDeviceOps() override = default;

  void copyToHost(void* host, const void* device, size_t bytes) override;
  void copyToDevice(void* device, const void* host, size_t bytes) override;
  void copyOnDevice(void* dst, const void* src, size_t bytes) override;
  void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
              ReduceOp op) override;
  void divide(void* data, size_t count, DataType dtype, size_t divisor) override;

  // The number of operations enqueued so far; waitFor(t) runs the first t.
  Ticket mark() override { return enqueued_; }
  // InvalidArgument for a ticket mark() never returned.
  void waitFor(Ticket ticket, Deadline deadline, const char* what) override;

  // Runs all queued work.
  void flush();
  // Operations enqueued and not yet run.
  size_t pending() const { return queue_.size(); }

 private:
  struct Range {
    const uint8_t* begin = nullptr;
    size_t bytes = 0;
  };
  struct Work {
    std::array<Range, 3> touches;
    std::function<void()> run;
  };

  void enqueue(std::array<Range, 3> touches, std::function<void()> run);
  bool touchedByQueued(Range range) const;

  std::deque<Work> queue_;
  Ticket enqueued_ = 0;
  Ticket done_ = 0;
};

}  // namespace railshard::collectives
