#include "benchmarks/perf_data.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/communicator.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/half.h"

namespace railshard::bench {
namespace {

double value(int rank, size_t i, DataType dtype, ReduceOp op) {
  const bool is_unsigned = dtype == DataType::kUInt8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<double>((static_cast<size_t>(rank) * 5 + i) % 7) - (is_unsigned ? 0 : 3);
    case ReduceOp::kProd:
      return ((static_cast<size_t>(rank) + i) % 3 == 0) ? (is_unsigned ? 2 : -1) : 1;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<double>((static_cast<size_t>(rank) * 11 + i * 3) % 13) -
             (is_unsigned ? 0 : 6);
  }
  return 0;
}

void store(void* buffer, size_t i, DataType dtype, double v) {
  switch (dtype) {
    case DataType::kFloat32:
      static_cast<float*>(buffer)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(buffer)[i] = v;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buffer)[i] = kernels::floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buffer)[i] = kernels::floatToBf16(static_cast<float>(v));
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(buffer)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

double load(const void* buffer, size_t i, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return static_cast<const float*>(buffer)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(buffer)[i];
    case DataType::kFloat16:
      return kernels::halfToFloat(static_cast<const uint16_t*>(buffer)[i]);
    case DataType::kBFloat16:
      return kernels::bf16ToFloat(static_cast<const uint16_t*>(buffer)[i]);
    case DataType::kInt32:
      return static_cast<const int32_t*>(buffer)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(buffer)[i]);
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(buffer)[i];
  }
  return 0;
}

bool isFloat(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

}  // namespace

void fillInput(void* buffer, size_t count, DataType dtype, ReduceOp op, int rank) {
  for (size_t i = 0; i < count; ++i) store(buffer, i, dtype, value(rank, i, dtype, op));
}

size_t countWrong(const void* result, size_t count, DataType dtype, ReduceOp op, int size) {
  size_t wrong = 0;
  uint8_t cell[8];
  for (size_t i = 0; i < count; ++i) {
    double acc = value(0, i, dtype, op);
    for (int r = 1; r < size; ++r) {
      const double v = value(r, i, dtype, op);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
      if (op == ReduceOp::kProd) acc *= v;
      if (op == ReduceOp::kMin) acc = std::min(acc, v);
      if (op == ReduceOp::kMax) acc = std::max(acc, v);
    }
    if (dtype == DataType::kUInt8) acc = static_cast<double>(static_cast<int64_t>(acc) & 0xff);
    if (op == ReduceOp::kAvg) {
      acc = isFloat(dtype) ? acc / size : static_cast<double>(static_cast<int64_t>(acc) / size);
    }
    store(cell, 0, dtype, acc);
    const double expected = load(cell, 0, dtype);
    const double got = load(result, i, dtype);
    const double tolerance =
        (op == ReduceOp::kAvg && isFloat(dtype)) ? 1e-2 * std::fabs(expected) + 1e-6 : 0;
    if (!(std::fabs(got - expected) <= tolerance)) ++wrong;
  }
  return wrong;
}

PerfBuffers::PerfBuffers(size_t bytes, MemoryKind memory, void* stream, bool shared)
    : stream_(stream), shared_(shared) {
  if (shared_) {
    host_send_ = static_cast<uint8_t*>(Communicator::allocateSharedBuffer(bytes));
    try {
      host_recv_ = static_cast<uint8_t*>(Communicator::allocateSharedBuffer(bytes));
    } catch (...) {
      Communicator::freeSharedBuffer(host_send_);
      throw;
    }
  } else {
    // Page-aligned, as PyTorch's CPU tensors (64 bytes) and shared buffers are: a heap block
    // 16 bytes past a page start would time unaligned vector loads, which users do not see.
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    host_send_ = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded));
    host_recv_ = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded));
    if (host_send_ == nullptr || host_recv_ == nullptr) {
      std::free(host_send_);
      std::free(host_recv_);
      throw std::bad_alloc();
    }
  }
  if (memory != MemoryKind::kDevice) return;
  device_send_ = kernels::cuda::allocateDevice(bytes);
  try {
    device_recv_ = kernels::cuda::allocateDevice(bytes);
  } catch (...) {
    kernels::cuda::freeDevice(device_send_);
    throw;
  }
}

PerfBuffers::~PerfBuffers() {
  if (shared_) {
    Communicator::freeSharedBuffer(host_recv_);
    Communicator::freeSharedBuffer(host_send_);
  } else {
    std::free(host_recv_);
    std::free(host_send_);
  }
  if (device_send_ == nullptr) return;
  try {
    kernels::cuda::synchronizeStream(stream_);  // nothing may still write them
    kernels::cuda::freeDevice(device_recv_);
    kernels::cuda::freeDevice(device_send_);
  } catch (...) {
    // A failed device is already being reported; freeing is best effort.
  }
}

void PerfBuffers::fill(size_t count, DataType dtype, ReduceOp op, int rank, bool in_place) {
  const size_t bytes = count * sizeOf(dtype);
  uint8_t* host = in_place ? host_recv_ : host_send_;
  fillInput(host, count, dtype, op, rank);
  if (!in_place) std::memset(host_recv_, 0, bytes);
  if (device_send_ == nullptr) return;
  void* device = in_place ? device_recv_ : device_send_;
  kernels::cuda::copyAsync(device, host, bytes, stream_);
  if (!in_place) kernels::cuda::memsetAsync(device_recv_, 0, bytes, stream_);
  // The host buffers are reused for the check; the data must be on the device first.
  kernels::cuda::synchronizeStream(stream_);
}

size_t PerfBuffers::wrong(size_t count, DataType dtype, ReduceOp op, int size) {
  if (device_recv_ != nullptr) {
    kernels::cuda::copyAsync(host_recv_, device_recv_, count * sizeOf(dtype), stream_);
    kernels::cuda::synchronizeStream(stream_);
  }
  return countWrong(host_recv_, count, dtype, op, size);
}

}  // namespace railshard::bench
