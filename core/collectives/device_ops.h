#pragma once

// What a collective on device buffers asks of "the device": copies between device and pinned
// host memory, reductions, and points in the device's work queue the host can wait for. The
// staging algorithms (device_staging.h) are written against this interface only, so their
// pipeline logic — chunk order, which pinned slot holds what, which wait guards which send —
// runs unchanged on a real GPU (CudaDeviceOps, CUDA runtime) and in the CPU-only test suite
// (HostDeviceOps: the same calls done synchronously with memcpy and the CPU kernels).
#include <cstddef>
#include <cstdint>

#include "base/clock.h"
#include "base/types.h"

namespace railshard::collectives {

class DeviceOps {
 public:
  // A point in the device's queue: everything enqueued before mark() returned it.
  using Ticket = uint64_t;

  virtual ~DeviceOps() = default;

  // Enqueue work, in order; each returns without waiting. `host` pointers are from pinned().
  virtual void copyToHost(void* host, const void* device, size_t bytes) = 0;
  virtual void copyToDevice(void* device, const void* host, size_t bytes) = 0;
  // Device to device.
  virtual void copyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  // dst = a op b on device memory (kernels::cuda::reduce's contract).
  virtual void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
                      ReduceOp op) = 0;
  virtual void divide(void* data, size_t count, DataType dtype, size_t divisor) = 0;

  // Marks the work enqueued so far; tickets grow.
  virtual Ticket mark() = 0;
  // Blocks until the work before `ticket` is done; TimeoutError after `deadline` naming
  // `what`. Blocking waits must yield the CPU (ranks may be oversubscribed).
  virtual void waitFor(Ticket ticket, Deadline deadline, const char* what) = 0;

  // Reusable buffers, valid until the next call with the same slot and a larger size (or
  // destruction): device scratch and page-locked host memory the transports send from and
  // receive into.
  virtual void* deviceScratch(size_t slot, size_t bytes) = 0;
  virtual void* pinned(size_t slot, size_t bytes) = 0;
};

}  // namespace railshard::collectives
