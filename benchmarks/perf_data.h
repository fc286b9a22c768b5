#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/types.h"

namespace railshard::bench {

// Validation data in the spirit of nccl-tests: every rank fills its input from a formula of
// (rank, index), and the expected result is computed from the same formula. Values are small
// integers so any reduction order is exact in every dtype; avg is checked with a tolerance.
void fillInput(void* buffer, size_t count, DataType dtype, ReduceOp op, int rank);
// Number of elements of `result` that differ from the reduction over `size` ranks.
size_t countWrong(const void* result, size_t count, DataType dtype, ReduceOp op, int size);

// The send and receive buffers of a sweep, `bytes` each, in host memory or on the current CUDA
// device (allocated there, so select the device first). Device buffers are filled and checked
// through host buffers with the same data and checks as host mode, copied on `stream` (the
// backend's) outside the timed loop.
class PerfBuffers {
 public:
  // `shared`: host buffers from Communicator::allocateSharedBuffer.
  PerfBuffers(size_t bytes, MemoryKind memory, void* stream, bool shared = false);
  ~PerfBuffers();
  PerfBuffers(const PerfBuffers&) = delete;
  PerfBuffers& operator=(const PerfBuffers&) = delete;

  // What the collective reads and writes.
  void* send() { return device_send_ != nullptr ? device_send_ : host_send_; }
  void* recv() { return device_recv_ != nullptr ? device_recv_ : host_recv_; }

  // In place: recv() gets rank's input. Out of place: send() gets it and recv() is zeroed.
  void fill(size_t count, DataType dtype, ReduceOp op, int rank, bool in_place);
  // countWrong() of recv() once the work on the stream is done.
  size_t wrong(size_t count, DataType dtype, ReduceOp op, int size);

 private:
  void* stream_;
  bool shared_ = false;
  uint8_t* host_send_ = nullptr;
  uint8_t* host_recv_ = nullptr;
  void* device_send_ = nullptr;
  void* device_recv_ = nullptr;
};

}  // namespace railshard::bench
