#pragma once

#include <cstddef>

#include "base/types.h"

namespace railshard {
class Communicator;
}

namespace railshard::dispatch {

// With unequal shares the plain average of the ranks' gradients is wrong: a rank that saw 10
// samples would count as much as one that saw 40. `grad` holds this rank's mean gradient over
// its `local_samples` (any number, 0 included); afterwards every rank holds the mean over all
// samples of the step — the gradient one machine would compute on the whole batch (to
// rounding). Scales by local_samples, sums with one all-reduce, divides by the global count
// (`global_samples`, or 0 to have it summed too, which costs a second small all-reduce).
// float32 and float64 (InvalidArgument for other types: reduce low-precision gradients in
// float32). ConfigError-free: errors are those of the all-reduce.
void allreduceSampleMean(Communicator& comm, void* grad, size_t count, DataType dtype,
                         size_t local_samples, size_t global_samples = 0);

}  // namespace railshard::dispatch
