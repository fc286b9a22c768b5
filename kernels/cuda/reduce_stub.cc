// kernels/cuda/reduce.h for a build without CUDA: there is no device memory to reduce, so
// every call raises ConfigError with device_runtime's reason ("built without CUDA ...").
#include "base/error.h"
#include "kernels/cuda/reduce.h"

namespace railshard::kernels::cuda {

void reduce(void*, const void*, const void*, size_t, DataType, ReduceOp, Stream) {
  throw ConfigError(unavailableReason());
}

void divide(void*, size_t, DataType, size_t, Stream) {
  throw ConfigError(unavailableReason());
}

}  // namespace railshard::kernels::cuda
