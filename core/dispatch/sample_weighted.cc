#include "core/dispatch/sample_weighted.h"

#include <cstdint>

#include "base/error.h"
#include "core/communicator.h"

namespace railshard::dispatch {

namespace {

template <typename T>
void scale(void* data, size_t count, double factor) {
  T* values = static_cast<T*>(data);
  const T f = static_cast<T>(factor);
  for (size_t i = 0; i < count; ++i) values[i] *= f;
}

void scaleAny(void* data, size_t count, DataType dtype, double factor) {
  if (dtype == DataType::kFloat32) {
    scale<float>(data, count, factor);
  } else {
    scale<double>(data, count, factor);
  }
}

}  // namespace

void allreduceSampleMean(Communicator& comm, void* grad, size_t count, DataType dtype,
                         size_t local_samples, size_t global_samples) {
  if (dtype != DataType::kFloat32 && dtype != DataType::kFloat64) {
    throw InvalidArgument("allreduceSampleMean: " + std::string(name(dtype)) +
                          " gradients are not supported; reduce them in float32 or float64");
  }
  if (global_samples == 0) {
    int64_t total = static_cast<int64_t>(local_samples);
    comm.allreduce(&total, 1, DataType::kInt64, ReduceOp::kSum);
    global_samples = static_cast<size_t>(total);
  }
  if (global_samples == 0) {
    throw InvalidArgument("allreduceSampleMean: the step has no samples on any rank");
  }
  if (local_samples > global_samples) {
    throw InvalidArgument("allreduceSampleMean: " + std::to_string(local_samples) +
                          " local samples but only " + std::to_string(global_samples) +
                          " in the whole step");
  }
  // sum_r n_r * mean_r = sum of all per-sample gradients; divided by N it is the batch mean.
  scaleAny(grad, count, dtype, static_cast<double>(local_samples));
  comm.allreduce(grad, count, dtype, ReduceOp::kSum);
  scaleAny(grad, count, dtype, 1.0 / static_cast<double>(global_samples));
}

}  // namespace railshard::dispatch
