#pragma once

// CUDA reductions, the device counterpart of kernels/reduce.h with the same contract:
// dst[i] = a[i] op b[i] (dst may alias a or b), kAvg reduces as kSum and divide() is the
// final step, f16/bf16 computed in f32 and rounded to nearest even once per call, integers
// wrap, min/max keep a[i] unless b[i] is strictly smaller/larger (NaN in a wins, NaN in b is
// ignored). Results are bit-identical to the CPU kernels except which NaN comes out.
// Buffers are device memory, any alignment (16-byte vector loads where the three pointers
// allow it); the kernel is launched on `stream` and this returns without waiting.
// Raises ConfigError when CUDA is not available (see device_runtime.h), InvalidArgument for
// an invalid dtype/op.
#include <cstddef>

#include "base/types.h"
#include "kernels/cuda/device_runtime.h"

namespace railshard::kernels::cuda {

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
            Stream stream);

// data[i] /= divisor, as kernels::divide.
void divide(void* data, size_t count, DataType dtype, size_t divisor, Stream stream);

}  // namespace railshard::kernels::cuda
