#pragma once

#include <cstddef>

#include "core/base/types.h"

namespace railshard::kernels {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b (in-place accumulation); other
// overlaps are undefined. kAvg reduces as kSum: the caller divides once at the end
// (divide()), so that avg is exactly sum/n however many steps the algorithm takes.
// f16/bf16 are computed in f32 and rounded once per call.
void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// data[i] /= divisor (avg's final step). Integers divide truncating toward zero.
void divide(void* data, size_t count, DataType dtype, size_t divisor);

}  // namespace railshard::kernels
