// kernels/cuda/reduce.h: one grid-stride kernel per (dtype, op) and per dtype for divide,
// all instances of the body in reduce_kernels.cuh. See that file for how a call is split into
// scalar head, 16-byte vectors and scalar tail.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <string>

#include "base/error.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/reduce_kernels.cuh"

namespace railshard::kernels::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;

template <typename F>
__global__ void __launch_bounds__(kThreadsPerBlock)
    elementwiseKernel(void* dst, const void* a, const void* b, detail::Plan plan, F f) {
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  detail::runThread(dst, a, b, plan, f, thread, threads);
}

[[noreturn]] void fail(const char* call, cudaError_t status) {
  (void)cudaGetLastError();
  throw Error(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ")");
}

// Blocks that fill every SM of the current device once (as many resident threads as it
// holds): enough loads in flight to saturate HBM, and a grid-stride loop does the rest.
// Looked up once per device; devices beyond the table are asked every time.
int maxBlocks() {
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> cache{};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) fail("cudaGetDevice", status);
  if (device >= 0 && device < kCachedDevices) {
    if (const int cached = cache[device].load(std::memory_order_relaxed)) return cached;
  }
  int sms = 0;
  int threads_per_sm = 0;
  status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) fail("cudaDeviceGetAttribute", status);
  status = cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device);
  if (status != cudaSuccess) fail("cudaDeviceGetAttribute", status);
  const int blocks_per_sm =
      threads_per_sm / kThreadsPerBlock > 0 ? threads_per_sm / kThreadsPerBlock : 1;
  const int blocks = (sms > 0 ? sms : 1) * blocks_per_sm;
  if (device >= 0 && device < kCachedDevices) {
    cache[device].store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

template <typename F>
void launch(void* dst, const void* a, const void* b, size_t count, const F& f, Stream stream) {
  const detail::Plan plan =
      detail::makePlan(dst, a, F::kBinary ? b : nullptr, count, sizeof(typename F::Storage));
  // A small count gets only the blocks it can use, so tiny reductions cost one short block.
  const size_t wanted = (detail::parallelism(plan) + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const size_t limit = static_cast<size_t>(maxBlocks());
  const unsigned blocks = static_cast<unsigned>(wanted < limit ? (wanted > 0 ? wanted : 1) : limit);
  elementwiseKernel<F>
      <<<blocks, kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(dst, a, b, plan, f);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) fail("cudaLaunchKernel", status);
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
            Stream stream) {
  if (!available()) throw ConfigError(unavailableReason());
  if (!isValid(dtype)) {
    throw InvalidArgument("cuda::reduce: invalid dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (!isValid(op)) {
    throw InvalidArgument("cuda::reduce: invalid op " + std::to_string(static_cast<int>(op)));
  }
  if (count == 0) return;
  detail::visitReducer(dtype, op, [&](const auto& f) { launch(dst, a, b, count, f, stream); });
}

void divide(void* data, size_t count, DataType dtype, size_t divisor, Stream stream) {
  if (!available()) throw ConfigError(unavailableReason());
  if (divisor == 0) throw InvalidArgument("cuda::divide: divisor is 0");
  if (divisor > static_cast<size_t>(INT64_MAX)) {
    throw InvalidArgument("cuda::divide: divisor " + std::to_string(divisor) + " is too large");
  }
  if (!isValid(dtype)) {
    throw InvalidArgument("cuda::divide: invalid dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (count == 0) return;
  detail::visitDivider(dtype, divisor,
                       [&](const auto& f) { launch(data, data, nullptr, count, f, stream); });
}

}  // namespace railshard::kernels::cuda
