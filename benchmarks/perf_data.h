#pragma once

#include <cstddef>
#include <cstdint>

#include "core/base/types.h"

namespace railshard::bench {

// Validation data in the spirit of nccl-tests: every rank fills its input from a formula of
// (rank, index), and the expected result is computed from the same formula. Values are small
// integers so any reduction order is exact in every dtype; avg is checked with a tolerance.
void fillInput(void* buffer, size_t count, DataType dtype, ReduceOp op, int rank);
// Number of elements of `result` that differ from the reduction over `size` ranks.
size_t countWrong(const void* result, size_t count, DataType dtype, ReduceOp op, int size);

}  // namespace railshard::bench
